package fabric

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/faultline/faultline/agents/kmsg"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

//go:embed fm_catalog.json
var fmCatalogJSON []byte

// Fabric modes of FABRIC_MODE (fabricmanager.cfg), the keys of a
// handling's actions.
const (
	ModeBareMetal = "bare_metal" // FABRIC_MODE=0 (also full passthrough)
	ModeShared    = "shared"     // FABRIC_MODE=1, Shared NVSwitch
	ModeVGPU      = "vgpu"       // FABRIC_MODE=2, vGPU
)

// Handling is one recovery class of the guide: what the error does and
// what to do about it, per fabric mode.
type Handling struct {
	Guide    string                                  `json:"guide"`
	Impact   string                                  `json:"impact"`
	Recovery string                                  `json:"recovery"`
	Fatal    bool                                    `json:"fatal"`
	Actions  map[string]datamodels.RecommendedAction `json:"-"`
}

// Action is the handling's recommended action under a fabric mode.
func (h *Handling) Action(mode string) datamodels.RecommendedAction {
	if a, ok := h.Actions[mode]; ok {
		return a
	}
	return h.Actions[ModeBareMetal]
}

// MessageRule is one Fabric Manager / NVLSM log message class
// (fm_catalog.json "messages"). A message matches when it contains every
// All substring, at least one Any substring (when Any is set), no None
// substring, and its level is one of Levels (when set and known).
type MessageRule struct {
	ID     string   `json:"id"`
	Source string   `json:"source"` // fm, nvlsm or any
	All    []string `json:"all"`
	Any    []string `json:"any"`
	None   []string `json:"none"`
	Levels []string `json:"levels"`
	// Marker names a life-cycle line: fm_start, fm_ready, nvlsm_ready.
	Marker   string `json:"marker"`
	Check    string `json:"check"`
	Code     string `json:"code"`
	Handling string `json:"handling"`
	// State: "fmrun" conditions last until FM reports a successful
	// configuration again, "nvlsm" until NVLSM reports the subnet up,
	// "oneoff" events are single occurrences.
	State string `json:"state"`
	// HA names the high-availability failure kind the message reports:
	// access, trunk, nvswitch or gpu.
	HA string `json:"ha"`
	// Exclusion: gpu_candidate, nvswitch_candidate, nvswitch_excluded.
	Exclusion string `json:"exclusion"`
	// Special selects code paths the data cannot express: nothing_to_do.
	Special string `json:"special"`
	// Requires "trunks": the rule applies only to platforms with trunk
	// NVLinks (HGX A100 with two baseboards).
	Requires string `json:"requires"`
}

func (r *MessageRule) matches(source, level, low string) bool {
	if r.Source != "any" && r.Source != source {
		return false
	}
	if len(r.Levels) > 0 && level != "" {
		ok := false
		for _, l := range r.Levels {
			if l == level {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	for _, s := range r.All {
		if !strings.Contains(low, s) {
			return false
		}
	}
	if len(r.Any) > 0 {
		ok := false
		for _, s := range r.Any {
			if strings.Contains(low, s) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	for _, s := range r.None {
		if strings.Contains(low, s) {
			return false
		}
	}
	return true
}

// PartitionCode is one FM SDK return code (Table 18).
type PartitionCode struct {
	Name      string `json:"name"`
	Value     int    `json:"value"`
	Guide     string `json:"guide"`
	Condition string `json:"condition"`
	Recovery  string `json:"recovery"`
	Fatal     bool   `json:"fatal"`
	actions   map[string]datamodels.RecommendedAction
}

// Action is the code's recommended action under a fabric mode.
func (p *PartitionCode) Action(mode string) datamodels.RecommendedAction {
	if a, ok := p.actions[mode]; ok {
		return a
	}
	return p.actions[ModeBareMetal]
}

// HARule is one cell of the high-availability tables: what FM does on a
// failure kind under a platform, fabric mode and *_FAILURE_MODE value
// (Value -1: the platform ignores the setting).
type HARule struct {
	Platform    string   `json:"platform"`
	Modes       []string `json:"modes"`
	Kind        string   `json:"kind"`
	Value       int      `json:"value"`
	Code        string   `json:"code"`
	Consequence string   `json:"consequence"`
	Bandwidth   string   `json:"bandwidth"`
	Partitions  []int    `json:"partitions"`
	Fatal       bool     `json:"fatal"`
	Recovery    string   `json:"recovery"`
	Action      datamodels.RecommendedAction
}

// Catalog is the compiled fm_catalog.json plus the SXid tables of
// agents/kmsg.
type Catalog struct {
	Handling   map[string]*Handling
	Messages   []*MessageRule
	Partitions map[string]*PartitionCode
	HA         []*HARule
	// AbortCUDA describes ABORT_CUDA_JOBS_ON_FM_EXIT per platform and
	// value ("any" when the platform ignores it).
	AbortCUDA map[string]map[string]string
	SXID      *kmsg.Catalog
}

// DefaultCatalog compiles the embedded catalog.
func DefaultCatalog() (*Catalog, error) { return LoadCatalog(fmCatalogJSON) }

// LoadCatalog compiles a catalog file; every handling, check and action
// named in it must exist.
func LoadCatalog(b []byte) (*Catalog, error) {
	var f struct {
		Handling map[string]struct {
			Handling
			Actions map[string]string `json:"actions"`
		} `json:"handling"`
		Messages   []*MessageRule `json:"messages"`
		Partitions []struct {
			PartitionCode
			Action       string            `json:"action"`
			ActionByMode map[string]string `json:"action_by_mode"`
		} `json:"partition_codes"`
		HA []struct {
			HARule
			Action string `json:"action"`
		} `json:"ha"`
		AbortCUDA map[string]map[string]string `json:"abort_cuda_jobs_on_fm_exit"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("fm catalog: %w", err)
	}
	c := &Catalog{Handling: map[string]*Handling{}, Partitions: map[string]*PartitionCode{}, AbortCUDA: f.AbortCUDA}
	for name, h := range f.Handling {
		hh := h.Handling
		hh.Actions = map[string]datamodels.RecommendedAction{}
		for _, m := range []string{ModeBareMetal, ModeShared, ModeVGPU} {
			a, err := action(h.Actions[m])
			if err != nil {
				return nil, fmt.Errorf("fm catalog: handling %s: %s: %w", name, m, err)
			}
			hh.Actions[m] = a
		}
		c.Handling[name] = &hh
	}
	seen := map[string]bool{}
	for i, m := range f.Messages {
		if m.ID == "" || seen[m.ID] {
			return nil, fmt.Errorf("fm catalog: messages[%d]: id %q empty or repeated", i, m.ID)
		}
		seen[m.ID] = true
		switch m.Source {
		case "fm", "nvlsm", "any":
		default:
			return nil, fmt.Errorf("fm catalog: message %s: source %q (fm, nvlsm or any)", m.ID, m.Source)
		}
		if len(m.All) == 0 && len(m.Any) == 0 {
			return nil, fmt.Errorf("fm catalog: message %s: matches everything", m.ID)
		}
		switch m.Marker {
		case "", "fm_start", "fm_ready", "nvlsm_ready", "ignore":
		default:
			return nil, fmt.Errorf("fm catalog: message %s: marker %q (fm_start, fm_ready, nvlsm_ready or ignore)", m.ID, m.Marker)
		}
		switch m.HA {
		case "", "access", "trunk", "nvswitch", "gpu":
		default:
			return nil, fmt.Errorf("fm catalog: message %s: ha %q (access, trunk, nvswitch or gpu)", m.ID, m.HA)
		}
		if m.Marker == "" {
			if m.Check == "" || m.Code == "" {
				return nil, fmt.Errorf("fm catalog: message %s: check and code required", m.ID)
			}
			if m.Handling != "" && c.Handling[m.Handling] == nil {
				return nil, fmt.Errorf("fm catalog: message %s: unknown handling %q", m.ID, m.Handling)
			}
			if m.Handling == "" && m.Exclusion == "" {
				return nil, fmt.Errorf("fm catalog: message %s: needs a handling or an exclusion", m.ID)
			}
			switch m.State {
			case "fmrun", "nvlsm", "oneoff":
			default:
				return nil, fmt.Errorf("fm catalog: message %s: state %q (fmrun, nvlsm or oneoff)", m.ID, m.State)
			}
		}
		c.Messages = append(c.Messages, m)
	}
	for _, p := range f.Partitions {
		pc := p.PartitionCode
		pc.actions = map[string]datamodels.RecommendedAction{}
		for _, m := range []string{ModeBareMetal, ModeShared, ModeVGPU} {
			name := p.Action
			if p.ActionByMode != nil {
				name = p.ActionByMode[m]
			}
			a, err := action(name)
			if err != nil {
				return nil, fmt.Errorf("fm catalog: partition code %s: %w", p.Name, err)
			}
			pc.actions[m] = a
		}
		c.Partitions[pc.Name] = &pc
	}
	for _, h := range f.HA {
		r := h.HARule
		a, err := action(h.Action)
		if err != nil {
			return nil, fmt.Errorf("fm catalog: ha %s: %w", r.Code, err)
		}
		r.Action = a
		c.HA = append(c.HA, &r)
	}
	sx, err := kmsg.DefaultCatalog()
	if err != nil {
		return nil, err
	}
	c.SXID = sx
	return c, nil
}

// matchText is a message as rules see it: lower case, without file paths
// ("/usr/share/nvidia/nvswitch/fabricmanager.cfg" names no NVSwitch).
func matchText(msg string) string {
	if !strings.Contains(msg, "/") {
		return " " + strings.ToLower(msg) + " "
	}
	f := strings.Fields(strings.ToLower(msg))
	for i, w := range f {
		if strings.Count(w, "/") >= 2 {
			f[i] = "<path>"
		}
	}
	return " " + strings.Join(f, " ") + " "
}

// Match returns the first message rule a message matches, or nil.
func (c *Catalog) Match(source, level, msg string) *MessageRule {
	low := matchText(msg)
	for _, m := range c.Messages {
		if m.matches(source, level, low) {
			return m
		}
	}
	return nil
}

// PartitionByValue returns the partition code with a numeric fmReturn_t.
func (c *Catalog) PartitionByValue(v int) *PartitionCode {
	for _, p := range c.Partitions {
		if p.Value == v {
			return p
		}
	}
	return nil
}

// HARuleFor returns the high-availability cell for a platform, fabric mode,
// failure kind and configured mode value, or nil when the platform has no
// such failure (H100 trunk links).
func (c *Catalog) HARuleFor(platform, mode, kind string, value int) *HARule {
	var any *HARule
	for _, r := range c.HA {
		if r.Platform != platform || r.Kind != kind {
			continue
		}
		inMode := false
		for _, m := range r.Modes {
			if m == mode {
				inMode = true
			}
		}
		if !inMode {
			continue
		}
		if r.Value == value {
			return r
		}
		if r.Value == -1 {
			any = r
		}
	}
	return any
}

func action(name string) (datamodels.RecommendedAction, error) {
	v, ok := datamodels.RecommendedAction_value[name]
	if !ok {
		return 0, fmt.Errorf("unknown recommended action %q", name)
	}
	return datamodels.RecommendedAction(v), nil
}
