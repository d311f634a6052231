//go:build cgo

package gpu

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML is the real Source: NVIDIA's management library, loaded at run time
// (dlopen of libnvidia-ml.so.1) by go-nvml. It evaluates the conditions of
// DCGM's health watches and names them with DCGM's error codes.
type NVML struct {
	mu     sync.Mutex
	inited bool
	replay map[string]replaySample // uuid → last PCIe replay counter
	links  map[string]bool         // "uuid/link" → was active
	gpus   []GPU                   // the GPUs of the last successful read (Inventory)
	// ReplayPerMinute is the PCIe replay rate that raises
	// DCGM_FR_PCI_REPLAY_RATE (DCGM's default limit is 8 per minute).
	ReplayPerMinute float64
	now             func() time.Time
}

type replaySample struct {
	n int
	t time.Time
}

// NewNVML returns the NVML Source.
func NewNVML() *NVML {
	return &NVML{replay: map[string]replaySample{}, links: map[string]bool{}, ReplayPerMinute: 8, now: time.Now}
}

// Health implements Source.
func (s *NVML) Health(ctx context.Context) ([]Incident, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.inited {
		switch r := nvml.Init(); r {
		case nvml.SUCCESS:
			s.inited = true
		case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED, nvml.ERROR_NO_PERMISSION:
			if r == nvml.ERROR_NO_PERMISSION {
				return nil, fmt.Errorf("nvml init: %s", nvml.ErrorString(r))
			}
			return nil, ErrNotPresent
		default:
			return nil, fmt.Errorf("nvml init: %s", nvml.ErrorString(r))
		}
	}
	n, r := nvml.DeviceGetCount()
	if r != nvml.SUCCESS {
		s.inited = false
		nvml.Shutdown()
		return nil, fmt.Errorf("nvml device count: %s", nvml.ErrorString(r))
	}
	var out []Incident
	gpus := make([]GPU, 0, n)
	for i := 0; i < n; i++ {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		d, r := nvml.DeviceGetHandleByIndex(i)
		if r != nvml.SUCCESS {
			out = append(out, Incident{GPU: i, System: "Pcie", Health: "FAIL", Code: "DCGM_FR_NVML_API",
				Message: "cannot get a handle for the GPU: " + nvml.ErrorString(r)})
			gpus = append(gpus, GPU{Index: i})
			continue
		}
		incs, g := s.device(i, d)
		out = append(out, incs...)
		gpus = append(gpus, g)
	}
	s.gpus = gpus
	return out, nil
}

// GPUs implements Inventory. Pcie is unknown on a GPU until its second
// replay-counter sample (a rate); Nvlink while one of its links has been
// seen inactive since this process started and never active (a link is
// reported down only once seen up: inactive at the first read may be a
// link down since before the restart, or one not in use).
func (s *NVML) GPUs() []GPU {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.gpus)
}

func (s *NVML) device(i int, d nvml.Device) ([]Incident, GPU) {
	uuid, _ := d.GetUUID()
	pci := ""
	if p, r := d.GetPciInfo(); r == nvml.SUCCESS {
		var b strings.Builder
		for _, c := range p.BusId {
			if c == 0 {
				break
			}
			b.WriteByte(byte(c))
		}
		pci = strings.ToLower(b.String())
	}
	inc := func(system, health, code, msg string, args ...any) Incident {
		return Incident{GPU: i, UUID: uuid, PCI: pci, System: system, Health: health, Code: code, Message: fmt.Sprintf(msg, args...)}
	}
	var out []Incident
	g := GPU{Index: i, UUID: uuid, PCI: pci}
	// Memory: volatile DBEs, row remapping.
	if v, r := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); r == nvml.SUCCESS && v > 0 {
		out = append(out, inc("Mem", "FAIL", "DCGM_FR_VOLATILE_DBE_DETECTED", "Detected %d volatile double-bit ECC error(s)", v))
	}
	if _, unc, pending, failed, r := d.GetRemappedRows(); r == nvml.SUCCESS {
		switch {
		case failed:
			out = append(out, inc("Mem", "FAIL", "DCGM_FR_ROW_REMAP_FAILURE", "Row remapping failed (%d uncorrectable rows remapped)", unc))
		case pending:
			out = append(out, inc("Mem", "FAIL", "DCGM_FR_PENDING_ROW_REMAP", "Row remapping pending; reset the GPU to apply it"))
		}
	}
	// PCIe: replay rate.
	if n, r := d.GetPcieReplayCounter(); r == nvml.SUCCESS {
		now := s.now()
		if prev, ok := s.replay[uuid]; ok && now.After(prev.t) && n >= prev.n {
			rate := float64(n-prev.n) / now.Sub(prev.t).Minutes()
			if rate > s.ReplayPerMinute {
				out = append(out, inc("Pcie", "WARN", "DCGM_FR_PCI_REPLAY_RATE", "Detected %.0f PCIe replays per minute (limit %.0f)", rate, s.ReplayPerMinute))
			}
		}
		if _, ok := s.replay[uuid]; !ok {
			g.Unknown = append(g.Unknown, "Pcie")
		}
		s.replay[uuid] = replaySample{n, now}
	}
	// NVLink: a link that was active and is not any more.
	for l := 0; l < nvml.NVLINK_MAX_LINKS; l++ {
		st, r := d.GetNvLinkState(l)
		if r != nvml.SUCCESS {
			continue
		}
		key := fmt.Sprintf("%s/%d", uuid, l)
		active := st == nvml.FEATURE_ENABLED
		if was, seen := s.links[key]; seen && was && !active {
			out = append(out, inc("Nvlink", "FAIL", "DCGM_FR_NVLINK_DOWN", "NVLink %d is down", l))
			continue // keep it marked active so the incident stands
		}
		s.links[key] = active
		if !active && !slices.Contains(g.Unknown, "Nvlink") {
			g.Unknown = append(g.Unknown, "Nvlink")
		}
	}
	// Thermal and power.
	if t, r := d.GetTemperature(nvml.TEMPERATURE_GPU); r == nvml.SUCCESS {
		if lim, r := d.GetTemperatureThreshold(nvml.TEMPERATURE_THRESHOLD_SLOWDOWN); r == nvml.SUCCESS && lim > 0 && t >= lim {
			out = append(out, inc("Thermal", "WARN", "DCGM_FR_TEMP_VIOLATION", "Temperature %d C at or above the slowdown threshold %d C", t, lim))
		}
	}
	if reasons, r := d.GetCurrentClocksThrottleReasons(); r == nvml.SUCCESS {
		if reasons&(nvml.ClocksThrottleReasonHwThermalSlowdown|nvml.ClocksThrottleReasonSwThermalSlowdown) != 0 {
			out = append(out, inc("Thermal", "WARN", "DCGM_FR_CLOCKS_EVENT_THERMAL", "Clocks slowed down for temperature (reasons 0x%x)", reasons))
		}
		if reasons&nvml.ClocksThrottleReasonHwPowerBrakeSlowdown != 0 {
			out = append(out, inc("Power", "WARN", "DCGM_FR_CLOCKS_EVENT_POWER", "Clocks slowed down by the power brake (reasons 0x%x)", reasons))
		}
	}
	return out, g
}
