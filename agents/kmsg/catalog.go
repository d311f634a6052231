package kmsg

import (
	_ "embed"
	"encoding/json"
	"fmt"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

//go:embed xid_catalog.json
var xidCatalogJSON []byte

//go:embed sxid_catalog.json
var sxidCatalogJSON []byte

// XIDInfo is one row of the XID catalog (xid_catalog.json).
type XIDInfo struct {
	Code          int    `json:"code"`
	Mnemonic      string `json:"mnemonic"`
	Description   string `json:"description"`
	Immediate     string `json:"immediate"`
	Investigatory string `json:"investigatory"`
	// SeverityInLine marks codes (NVLink-5, 144-150) whose log line says
	// "Fatal" or "Nonfatal" itself; a non-fatal line resolves to NONE.
	SeverityInLine bool `json:"severityInLine"`
	// Action is Immediate resolved through the catalog's bucketActions.
	Action datamodels.RecommendedAction `json:"-"`
}

// SXIDInfo is one row of the SXid tables (sxid_catalog.json).
type SXIDInfo struct {
	Code     int    `json:"code"`
	Class    string `json:"class"` // nonfatal, fatal, always_fatal
	Text     string `json:"text"`
	Recovery string `json:"recovery"`
	// Action overrides the class's action when set in the data file.
	Action datamodels.RecommendedAction `json:"-"`
}

// Catalog holds the XID and SXid tables the parser resolves codes with.
type Catalog struct {
	XIDs  map[int]XIDInfo
	SXIDs map[int]SXIDInfo
	// sxidClass holds each class's default action and recovery text.
	sxidClass map[string]sxidClass
}

type sxidClass struct {
	Action   string `json:"action"`
	Recovery string `json:"recovery"`
}

// DefaultCatalog returns the catalog built from the embedded data files.
func DefaultCatalog() (*Catalog, error) {
	return LoadCatalog(xidCatalogJSON, sxidCatalogJSON)
}

// LoadCatalog builds a catalog from the JSON of an XID and an SXid data file.
func LoadCatalog(xidJSON, sxidJSON []byte) (*Catalog, error) {
	var xf struct {
		BucketActions map[string]string `json:"bucketActions"`
		XIDs          []XIDInfo         `json:"xids"`
	}
	if err := json.Unmarshal(xidJSON, &xf); err != nil {
		return nil, fmt.Errorf("xid catalog: %w", err)
	}
	c := &Catalog{XIDs: make(map[int]XIDInfo, len(xf.XIDs)), SXIDs: map[int]SXIDInfo{}}
	for _, x := range xf.XIDs {
		name, ok := xf.BucketActions[x.Immediate]
		if !ok {
			return nil, fmt.Errorf("xid catalog: code %d: bucket %q has no action", x.Code, x.Immediate)
		}
		a, err := actionByName(name)
		if err != nil {
			return nil, fmt.Errorf("xid catalog: code %d: %w", x.Code, err)
		}
		x.Action = a
		c.XIDs[x.Code] = x
	}
	var sf struct {
		Classes map[string]sxidClass `json:"classes"`
		SXIDs   []struct {
			SXIDInfo
			ActionName string `json:"action"`
		} `json:"sxids"`
	}
	if err := json.Unmarshal(sxidJSON, &sf); err != nil {
		return nil, fmt.Errorf("sxid catalog: %w", err)
	}
	c.sxidClass = sf.Classes
	for _, s := range sf.SXIDs {
		cl, ok := sf.Classes[s.Class]
		if !ok {
			return nil, fmt.Errorf("sxid catalog: code %d: unknown class %q", s.Code, s.Class)
		}
		name := cl.Action
		if s.ActionName != "" {
			name = s.ActionName
		}
		a, err := actionByName(name)
		if err != nil {
			return nil, fmt.Errorf("sxid catalog: code %d: %w", s.Code, err)
		}
		info := s.SXIDInfo
		info.Action = a
		if info.Recovery == "" {
			info.Recovery = cl.Recovery
		}
		c.SXIDs[s.Code] = info
	}
	return c, nil
}

// XID returns the catalog row of code; an unknown code gets a row whose
// action is CONTACT_SUPPORT, as the catalog's users are told to do.
func (c *Catalog) XID(code int) (XIDInfo, bool) {
	x, ok := c.XIDs[code]
	if !ok {
		return XIDInfo{Code: code, Mnemonic: fmt.Sprintf("XID_%d", code), Description: "Unknown Xid",
			Immediate: "CONTACT_SUPPORT", Action: datamodels.RecommendedAction_CONTACT_SUPPORT}, false
	}
	return x, true
}

// SXID returns the table row of an SXid code. For a code in no table the
// line's own Fatal/Non-fatal word decides: non-fatal resolves to NONE, fatal
// to CONTACT_SUPPORT.
func (c *Catalog) SXID(code int, fatal bool) (SXIDInfo, bool) {
	s, ok := c.SXIDs[code]
	if ok {
		return s, true
	}
	if fatal {
		return SXIDInfo{Code: code, Class: "fatal", Text: "unlisted SXid", Action: datamodels.RecommendedAction_CONTACT_SUPPORT,
			Recovery: c.sxidClass["fatal"].Recovery}, false
	}
	return SXIDInfo{Code: code, Class: "nonfatal", Text: "unlisted SXid", Action: datamodels.RecommendedAction_NONE,
		Recovery: c.sxidClass["nonfatal"].Recovery}, false
}

func actionByName(name string) (datamodels.RecommendedAction, error) {
	v, ok := datamodels.RecommendedAction_value[name]
	if !ok {
		return 0, fmt.Errorf("unknown recommended action %q", name)
	}
	return datamodels.RecommendedAction(v), nil
}
