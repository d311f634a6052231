package fabric

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// SwitchTelemetry is the NVSwitch telemetry of a fourth-generation
// (HGX B200) system, where SXids no longer apply: DCGM reads the port and
// ASIC counters through NVSDM (DCGM 4.x modules/nvswitch,
// DcgmNvsdmManager) and dcgm-exporter serves them as Prometheus text.
type SwitchTelemetry struct {
	Switches map[string]*SwitchSample
}

// SwitchSample is one NVSwitch's ASIC counters and its ports.
type SwitchSample struct {
	ID string
	// TempC and SlowdownC are DCGM_FI_DEV_NVSWITCH_TEMP_CELSIUS and
	// _TEMP_SLOWDOWN_CELSIUS (-1 when absent).
	TempC, SlowdownC float64
	// ResetRequired is DCGM_FI_DEV_NVSWITCH_RESET_REQUIRED (-1 absent).
	ResetRequired float64
	Ports         map[int]*PortSample
}

// PortSample is one NVSwitch port's counters.
type PortSample struct {
	Port int
	// Status is DCGM_FI_DEV_NVSWITCH_LINK_STATUS: -1 unknown, 0 off,
	// 1 safe, 2 active, 3 error (absent: -2).
	Status float64
	// Type is DCGM_FI_DEV_NVSWITCH_LINK_TYPE (NVSDM: CA 1, switch 2,
	// GPU 5; NSCQ: GPU 1, switch 2; 0 absent).
	Type float64
	// RemotePCI is built from the LINK_REMOTE_PCIE_* fields when present.
	RemotePCI string
	// Counters by short name (replay, recovery, crc, flit, ecc, fatal,
	// nonfatal).
	Counters map[string]float64
}

// telemetryCounters maps the DCGM field names (current and deprecated
// aliases) of the per-port error counters to short names.
var telemetryCounters = map[string]string{
	"DCGM_FI_DEV_NVSWITCH_LINK_REPLAY_ERROR_TOTAL":   "replay",
	"DCGM_FI_DEV_NVSWITCH_LINK_REPLAY_ERRORS":        "replay",
	"DCGM_FI_DEV_NVSWITCH_LINK_RECOVERY_ERROR_TOTAL": "recovery",
	"DCGM_FI_DEV_NVSWITCH_LINK_RECOVERY_ERRORS":      "recovery",
	"DCGM_FI_DEV_NVSWITCH_LINK_CRC_ERROR_TOTAL":      "crc",
	"DCGM_FI_DEV_NVSWITCH_LINK_CRC_ERRORS":           "crc",
	"DCGM_FI_DEV_NVSWITCH_LINK_FLIT_ERROR_TOTAL":     "flit",
	"DCGM_FI_DEV_NVSWITCH_LINK_FLIT_ERRORS":          "flit",
	"DCGM_FI_DEV_NVSWITCH_LINK_ECC_ERROR_TOTAL":      "ecc",
	"DCGM_FI_DEV_NVSWITCH_LINK_ECC_ERRORS":           "ecc",
	"DCGM_FI_DEV_NVSWITCH_LINK_FATAL_ERRORS":         "fatal",
	"DCGM_FI_DEV_NVSWITCH_LINK_NON_FATAL_ERRORS":     "nonfatal",
}

// ParseTelemetry reads the Prometheus text exposition of dcgm-exporter
// (labels nvswitch="nvswitch0" or "0", nvlink="5").
func ParseTelemetry(r io.Reader) (*SwitchTelemetry, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("nvswitch telemetry: %w", err)
	}
	t := &SwitchTelemetry{Switches: map[string]*SwitchSample{}}
	sw := func(id string) *SwitchSample {
		s := t.Switches[id]
		if s == nil {
			s = &SwitchSample{ID: id, TempC: -1, SlowdownC: -1, ResetRequired: -1, Ports: map[int]*PortSample{}}
			t.Switches[id] = s
		}
		return s
	}
	remote := map[string]map[string]float64{} // "sw/port" → field → value
	for name, fam := range fams {
		if !strings.HasPrefix(name, "DCGM_FI_DEV_NVSWITCH_") {
			continue
		}
		for _, m := range fam.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			id := labels["nvswitch"]
			if id == "" {
				continue
			}
			if !strings.HasPrefix(id, "nvswitch") {
				id = "nvswitch" + id
			}
			v := value(m)
			link, hasLink := labels["nvlink"]
			if !hasLink {
				s := sw(id)
				switch name {
				case "DCGM_FI_DEV_NVSWITCH_TEMP_CELSIUS":
					s.TempC = v
				case "DCGM_FI_DEV_NVSWITCH_TEMP_SLOWDOWN_CELSIUS":
					s.SlowdownC = v
				case "DCGM_FI_DEV_NVSWITCH_RESET_REQUIRED":
					s.ResetRequired = v
				}
				continue
			}
			n, err := strconv.Atoi(link)
			if err != nil {
				continue
			}
			s := sw(id)
			ps := s.Ports[n]
			if ps == nil {
				ps = &PortSample{Port: n, Status: -2, Counters: map[string]float64{}}
				s.Ports[n] = ps
			}
			switch {
			case name == "DCGM_FI_DEV_NVSWITCH_LINK_STATUS":
				ps.Status = v
			case name == "DCGM_FI_DEV_NVSWITCH_LINK_TYPE":
				ps.Type = v
			case strings.HasPrefix(name, "DCGM_FI_DEV_NVSWITCH_LINK_REMOTE_PCIE_"):
				k := id + "/" + link
				if remote[k] == nil {
					remote[k] = map[string]float64{}
				}
				remote[k][strings.TrimPrefix(name, "DCGM_FI_DEV_NVSWITCH_LINK_REMOTE_PCIE_")] = v
			default:
				if c, ok := telemetryCounters[name]; ok {
					ps.Counters[c] = v
				}
			}
		}
	}
	for k, f := range remote {
		id, port, _ := strings.Cut(k, "/")
		n, _ := strconv.Atoi(port)
		if _, ok := f["BUS"]; ok {
			t.Switches[id].Ports[n].RemotePCI = fmt.Sprintf("%04x:%02x:%02x.%x", int(f["DOMAIN"]), int(f["BUS"]), int(f["DEVICE"]), int(f["FUNCTION"]))
		}
	}
	return t, nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// SortedSwitches lists the switch ids in order.
func (t *SwitchTelemetry) SortedSwitches() []string {
	var ids []string
	for id := range t.Switches {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// TelemetrySource reads NVSwitch telemetry.
type TelemetrySource interface {
	Read(ctx context.Context) (*SwitchTelemetry, error)
}

// ExporterSource scrapes dcgm-exporter's /metrics endpoint.
type ExporterSource struct {
	URL    string
	Client *http.Client
}

// Read implements TelemetrySource.
func (e ExporterSource) Read(ctx context.Context) (*SwitchTelemetry, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.URL, nil)
	if err != nil {
		return nil, fmt.Errorf("nvswitch telemetry %s: %w", e.URL, err)
	}
	c := e.Client
	if c == nil {
		c = &http.Client{Timeout: 10 * time.Second}
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("nvswitch telemetry %s: %w", e.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("nvswitch telemetry %s: HTTP %d", e.URL, resp.StatusCode)
	}
	return ParseTelemetry(resp.Body)
}

// RecordedSource replays recorded dcgm-exporter outputs: each Read returns
// the next file (the last one again once all were read). It backs tests
// and `fabric parse`.
type RecordedSource struct {
	Files []string
	next  int
}

// Read implements TelemetrySource.
func (r *RecordedSource) Read(context.Context) (*SwitchTelemetry, error) {
	if len(r.Files) == 0 {
		return nil, fmt.Errorf("nvswitch telemetry: no recorded files")
	}
	i := r.next
	if i >= len(r.Files) {
		i = len(r.Files) - 1
	} else {
		r.next++
	}
	f, err := os.Open(r.Files[i])
	if err != nil {
		return nil, fmt.Errorf("nvswitch telemetry: %w", err)
	}
	defer f.Close()
	return ParseTelemetry(f)
}
