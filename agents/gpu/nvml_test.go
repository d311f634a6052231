//go:build cgo

package gpu

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// fakeGPU is one GPU of go-nvml's mock, healthy until a test changes its
// answers: dbe volatile double-bit ECC errors, fail the queries that fail
// (by method name, "handle" for the device's handle), replays the PCIe
// replay counter, link0 NVLink 0's state (the GPU has that one link, or
// with twoLinks NVLink 1 too, link1 its state), mig
// its MIG mode (current), noRemap a GPU without row remapping (pre-Ampere:
// page retirement instead, pending and sbePages/dbePages retired pages),
// inforom ValidateInforom's answer (SUCCESS when zero), validations the
// times it was called.
type fakeGPU struct {
	uuid, bus          string
	dbe                uint64
	replays            int
	link0, link1       nvml.EnableState
	twoLinks           bool
	mig                int
	noRemap            bool
	pending            nvml.EnableState
	sbePages, dbePages int
	inforom            nvml.Return
	validations        int
	fail               map[string]nvml.Return
}

func (g *fakeGPU) ret(query string) nvml.Return {
	if r, ok := g.fail[query]; ok {
		return r
	}
	return nvml.SUCCESS
}

func (g *fakeGPU) device() *mock.Device {
	return &mock.Device{
		GetUUIDFunc: func() (string, nvml.Return) {
			if r := g.ret("GetUUID"); r != nvml.SUCCESS {
				return "", r
			}
			return g.uuid, nvml.SUCCESS
		},
		GetPciInfoFunc: func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for i, c := range g.bus {
				p.BusId[i] = int8(c)
			}
			return p, g.ret("GetPciInfo")
		},
		GetTotalEccErrorsFunc: func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
			return g.dbe, g.ret("GetTotalEccErrors")
		},
		GetRemappedRowsFunc: func() (int, int, bool, bool, nvml.Return) {
			if g.noRemap {
				return 0, 0, false, false, nvml.ERROR_NOT_SUPPORTED
			}
			return 0, 0, false, false, g.ret("GetRemappedRows")
		},
		GetRetiredPagesPendingStatusFunc: func() (nvml.EnableState, nvml.Return) {
			if !g.noRemap {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			return g.pending, g.ret("GetRetiredPagesPendingStatus")
		},
		GetRetiredPagesFunc: func(cause nvml.PageRetirementCause) ([]uint64, nvml.Return) {
			if !g.noRemap {
				return nil, nvml.ERROR_NOT_SUPPORTED
			}
			n := g.sbePages
			if cause == nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR {
				n = g.dbePages
			}
			return make([]uint64, n), g.ret("GetRetiredPages")
		},
		ValidateInforomFunc: func() nvml.Return {
			g.validations++
			if r := g.ret("ValidateInforom"); r != nvml.SUCCESS {
				return r
			}
			return g.inforom
		},
		GetMigModeFunc:           func() (int, int, nvml.Return) { return g.mig, g.mig, g.ret("GetMigMode") },
		GetPcieReplayCounterFunc: func() (int, nvml.Return) { return g.replays, g.ret("GetPcieReplayCounter") },
		GetNvLinkStateFunc: func(l int) (nvml.EnableState, nvml.Return) {
			switch {
			case l == 1 && g.twoLinks:
				return g.link1, g.ret("GetNvLinkState")
			case l > 0:
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return g.link0, g.ret("GetNvLinkState")
		},
		GetTemperatureFunc:          func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 40, g.ret("GetTemperature") },
		GetTemperatureThresholdFunc: func(nvml.TemperatureThresholds) (uint32, nvml.Return) { return 90, nvml.SUCCESS },
		GetCurrentClocksThrottleReasonsFunc: func() (uint64, nvml.Return) {
			return 0, g.ret("GetCurrentClocksThrottleReasons")
		},
	}
}

// fakeNVML is an NVML Source over the mock's library with gpus, its clock
// a minute later at each read, logging into logs.
func fakeNVML(logs *strings.Builder, gpus ...*fakeGPU) *NVML {
	s := NewNVML()
	now := time.Date(2024, 10, 28, 10, 0, 0, 0, time.UTC)
	s.now = func() time.Time { return now }
	s.Logger = slog.New(slog.NewTextHandler(logs, nil))
	s.lib = &mock.Interface{
		InitFunc:           func() nvml.Return { now = now.Add(time.Minute); return nvml.SUCCESS },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { now = now.Add(time.Minute); return len(gpus), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if r := gpus[i].ret("handle"); r != nvml.SUCCESS {
				return nil, r
			}
			return gpus[i].device(), nvml.SUCCESS
		},
	}
	return s
}

// TestNVMLFailedReadIsNotHealthy: an NVML query that fails says nothing
// of its condition: a volatile DBE reported fatal stands through a poll
// whose ECC read fails (ERROR_UNKNOWN), one whose UUID read fails, one
// whose UUID and PCI reads fail (the GPU last read at its index, not
// "gpu0") and one that gets no handle for the GPU — no recovery, no fatal
// raised again after it (a flap that lifted and applied the node's
// quarantine) — and recovers when a read says so. The failures are logged.
func TestNVMLFailedReadIsNotHealthy(t *testing.T) {
	a := &fakeGPU{uuid: "GPU-A", bus: "00000000:1B:00.0", link0: nvml.FEATURE_ENABLED}
	var logs strings.Builder
	c, err := New(Config{Source: fakeNVML(&logs, a), Uptime: func() (time.Duration, error) { return time.Hour, nil }})
	if err != nil {
		t.Fatal(err)
	}
	for i, step := range []struct {
		what string
		dbe  uint64
		fail map[string]nvml.Return
		want string // the GpuMemWatch events
		log  string
	}{
		{"a DBE", 2, nil, "GpuMemWatch:DCGM_FR_VOLATILE_DBE_DETECTED!/COMPONENT_RESET@GPU-A", ""},
		{"the ECC read fails", 0, map[string]nvml.Return{"GetTotalEccErrors": nvml.ERROR_UNKNOWN}, "", "GetTotalEccErrors"},
		{"the DBE read again", 2, nil, "", ""},
		{"the UUID read fails", 2, map[string]nvml.Return{"GetUUID": nvml.ERROR_UNKNOWN}, "", "UUID"},
		{"the UUID and PCI reads fail", 2, map[string]nvml.Return{"GetUUID": nvml.ERROR_UNKNOWN, "GetPciInfo": nvml.ERROR_UNKNOWN}, "", ""},
		{"no handle for the GPU", 0, map[string]nvml.Return{"handle": nvml.ERROR_IN_USE}, "", ""},
		{"read, still a DBE", 2, nil, "", ""},
		{"cleared", 0, nil, "GpuMemWatch:healthy@GPU-A", ""},
	} {
		a.dbe, a.fail = step.dbe, step.fail
		logs.Reset()
		evs, err := c.Check(context.Background())
		if err != nil {
			t.Fatalf("step %d (%s): %v", i, step.what, err)
		}
		var mem []string
		for _, s := range strings.Fields(summary(evs)) {
			if strings.HasPrefix(s, "GpuMemWatch:") && s != "GpuMemWatch:healthy" { // not the baseline
				mem = append(mem, s)
			}
		}
		if got := strings.Join(mem, " "); got != step.want {
			t.Errorf("step %d (%s): Mem events %q, want %q (all: %s)", i, step.what, got, step.want, summary(evs))
		}
		if step.log != "" && (!strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), step.log)) {
			t.Errorf("step %d (%s): log %q, want a warning naming %s", i, step.what, logs.String(), step.log)
		}
	}
}

// TestNVMLGPUsWithoutUUID: two GPUs whose UUID cannot be read do not
// share the state kept by GPU (replay counter samples, NVLink states):
// GPU 1's unused NVLink is not taken for GPU 0's gone down, nor the two
// counters' difference for a replay rate; each is known by its index.
func TestNVMLGPUsWithoutUUID(t *testing.T) {
	noUUID := map[string]nvml.Return{"GetUUID": nvml.ERROR_UNKNOWN}
	g0 := &fakeGPU{bus: "00000000:1B:00.0", replays: 5000, link0: nvml.FEATURE_ENABLED, fail: noUUID}
	g1 := &fakeGPU{bus: "00000000:43:00.0", replays: 0, link0: nvml.FEATURE_DISABLED, fail: noUUID}
	var logs strings.Builder
	s := fakeNVML(&logs, g0, g1)
	for poll := range 3 {
		incs, err := s.Health(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(incs) != 0 {
			t.Fatalf("poll %d: incidents %+v", poll, incs)
		}
	}
	if !strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("UUID read failures not logged: %s", logs.String())
	}
	gpus := s.GPUs()
	if len(gpus) != 2 || gpus[0].UUID != "" || gpus[1].UUID != "" {
		t.Errorf("inventory %+v", gpus)
	}
}

// TestNVMLBaselineWaitsForAnswer: a watch whose query fails at a new
// process's first read is not baselined healthy (that would lift the fault
// an earlier process raised) until a read answers.
func TestNVMLBaselineWaitsForAnswer(t *testing.T) {
	a := &fakeGPU{uuid: "GPU-A", bus: "00000000:1B:00.0", link0: nvml.FEATURE_ENABLED,
		fail: map[string]nvml.Return{"GetRemappedRows": nvml.ERROR_GPU_IS_LOST}}
	var logs strings.Builder
	c, err := New(Config{Source: fakeNVML(&logs, a), Uptime: func() (time.Duration, error) { return time.Hour, nil }})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{false, false, true, false} {
		if i == 2 {
			a.fail = nil
		}
		evs, err := c.Check(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(" "+summary(evs)+" ", " GpuMemWatch:healthy@GPU-A "); got != want {
			t.Errorf("read %d: Mem baseline %v, want %v: %s", i, got, want, summary(evs))
		}
	}
}

// ents is the entities of ev as "Type=value,...".
func ents(ev *datamodels.HealthEvent) string {
	var s []string
	for _, e := range ev.EntitiesImpacted {
		s = append(s, e.EntityType+"="+e.EntityValue)
	}
	return strings.Join(s, ",")
}

// lostGPU fails every query of g with GPU_IS_LOST, its UUID and PCI info
// too unless cached (NVML may answer them from what it read before).
func lostGPU(g *fakeGPU, cached bool) {
	g.fail = map[string]nvml.Return{}
	for _, q := range []string{"GetUUID", "GetPciInfo", "GetTotalEccErrors", "GetRemappedRows", "GetPcieReplayCounter",
		"GetNvLinkState", "GetTemperature", "GetCurrentClocksThrottleReasons", "GetMigMode", "ValidateInforom"} {
		if !cached || q != "GetUUID" && q != "GetPciInfo" {
			g.fail[q] = nvml.ERROR_GPU_IS_LOST
		}
	}
}

// TestNVMLLostGPUIsFatal: a GPU fallen off the bus keeps its handle but
// every query answers GPU_IS_LOST: not a flaky read but a fatal
// DCGM_FR_FALLEN_OFF_BUS (RESTART_BM) naming the GPU as last read, once;
// when it reads again, its healthy event with the same entities.
func TestNVMLLostGPUIsFatal(t *testing.T) {
	for _, cached := range []bool{false, true} {
		t.Run(fmt.Sprintf("uuid cached %v", cached), func(t *testing.T) { testLostGPU(t, cached) })
	}
}

func testLostGPU(t *testing.T, cached bool) {
	a := &fakeGPU{uuid: "GPU-A", bus: "00000000:1B:00.0", link0: nvml.FEATURE_ENABLED}
	var logs strings.Builder
	c, err := New(Config{Source: fakeNVML(&logs, a), Uptime: func() (time.Duration, error) { return time.Hour, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Check(context.Background()); err != nil { // the baseline
		t.Fatal(err)
	}
	var fault string
	for i, step := range []struct {
		what string
		lost bool
		want string
	}{
		{"lost", true, "GpuPcieWatch:DCGM_FR_FALLEN_OFF_BUS!/RESTART_BM@GPU-A"},
		{"still lost", true, ""},
		{"reads again", false, "GpuPcieWatch:healthy@GPU-A"},
	} {
		a.fail = nil
		if step.lost {
			lostGPU(a, cached)
		}
		evs, err := c.Check(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, ev := range evs {
			if ev.Metadata["baseline"] == "" {
				got = append(got, summary([]*datamodels.HealthEvent{ev}))
				if i == 0 {
					fault = ents(ev)
				} else if e := ents(ev); e != fault {
					t.Errorf("step %d (%s): entities %s, want the fault's %s", i, step.what, e, fault)
				}
			}
		}
		if g := strings.Join(got, " "); g != step.want {
			t.Errorf("step %d (%s): events %q, want %q", i, step.what, g, step.want)
		}
	}
	if fault != "GPU=GPU-A,PCI=00000000:1b:00.0" {
		t.Errorf("fault entities %s", fault)
	}
}

// TestNVMLMissingGPUKeepsFault: GPU-A has a fatal DBE; DeviceGetCount fails
// once (NVML re-inits) and NVML then lists only GPU-B: GPU-A's fault is not
// lifted (it was not read) and GPU-A is reported missing, fatal; listed and
// read again without a DBE, both are lifted with the faults' entities.
func TestNVMLMissingGPUKeepsFault(t *testing.T) {
	a := &fakeGPU{uuid: "GPU-A", bus: "00000000:1B:00.0", link0: nvml.FEATURE_ENABLED, dbe: 2}
	b := &fakeGPU{uuid: "GPU-B", bus: "00000000:43:00.0", link0: nvml.FEATURE_ENABLED}
	var logs strings.Builder
	s := fakeNVML(&logs, a, b)
	list := []*fakeGPU{a, b}
	countFails := false
	s.lib = &mock.Interface{
		InitFunc:     func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc: func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) {
			if countFails {
				return 0, nvml.ERROR_UNKNOWN
			}
			return len(list), nvml.SUCCESS
		},
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) { return list[i].device(), nvml.SUCCESS },
	}
	c, err := New(Config{Source: s, Uptime: func() (time.Duration, error) { return time.Hour, nil }})
	if err != nil {
		t.Fatal(err)
	}
	for i, step := range []struct {
		what       string
		list       []*fakeGPU
		countFails bool
		dbe        uint64
		want       string // the events but baselines and connectivity
	}{
		{"a DBE on GPU-A", []*fakeGPU{a, b}, false, 2, "GpuMemWatch:DCGM_FR_VOLATILE_DBE_DETECTED!/COMPONENT_RESET@GPU-A"},
		{"the count fails", []*fakeGPU{a, b}, true, 2, ""},
		{"only GPU-B listed", []*fakeGPU{b}, false, 2, "GpuPcieWatch:DCGM_FR_FALLEN_OFF_BUS!/RESTART_BM@GPU-A"},
		{"still only GPU-B", []*fakeGPU{b}, false, 0, ""},
		{"GPU-A back, no DBE", []*fakeGPU{a, b}, false, 0, "GpuMemWatch:healthy@GPU-A GpuPcieWatch:healthy@GPU-A"},
	} {
		list, countFails, a.dbe = step.list, step.countFails, step.dbe
		evs, _ := c.Check(context.Background())
		var got []string
		for _, ev := range evs {
			if ev.Metadata["baseline"] == "" && ev.CheckName != CheckConnectivity {
				got = append(got, summary([]*datamodels.HealthEvent{ev}))
				if e := ents(ev); e != "GPU=GPU-A,PCI=00000000:1b:00.0" {
					t.Errorf("step %d (%s): %s entities %s", i, step.what, ev.CheckName, e)
				}
			}
		}
		if g := strings.Join(got, " "); g != step.want {
			t.Errorf("step %d (%s): events %q, want %q", i, step.what, g, step.want)
		}
	}
}

// TestNVMLUnusedLinkBaselinesOthers: GPU-A's NVLink 0 is disabled since
// the process started (unused, or down before it: GpuNvlinkWatch unknown
// on GPU-A for the process's life); GPU-B's is up. GPU-B's
// GpuNvlinkWatch baseline comes at the first read, so that an NVLINK_DOWN
// fault of an earlier process on GPU-B is lifted; GPU-A gets none.
func TestNVMLUnusedLinkBaselinesOthers(t *testing.T) {
	a := &fakeGPU{uuid: "GPU-A", bus: "00000000:1B:00.0", link0: nvml.FEATURE_DISABLED}
	b := &fakeGPU{uuid: "GPU-B", bus: "00000000:43:00.0", link0: nvml.FEATURE_ENABLED}
	var logs strings.Builder
	c, err := New(Config{Source: fakeNVML(&logs, a, b), Uptime: func() (time.Duration, error) { return time.Hour, nil }})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"GpuNvlinkWatch:healthy@GPU-B GpuNvlinkWatch:healthy@gpu1", "", ""} {
		evs, err := c.Check(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, s := range strings.Fields(summary(evs)) {
			if strings.HasPrefix(s, "GpuNvlinkWatch:") {
				got = append(got, s)
			}
		}
		if g := strings.Join(got, " "); g != want {
			t.Errorf("read %d: Nvlink events %q, want %q (all: %s)", i, g, want, summary(evs))
		}
	}
}

// TestNVMLNoHandleFaultLifted: a handle NVML does not give for a poll or
// two as a GPU being reset does (TIMEOUT, IN_USE, RESET_REQUIRED:
// nvidia-smi -r of the GPU's own COMPONENT_RESET running) is a failed
// query, not a fault: no
// event, what the GPU had (a DBE) stands. A handle that fails
// handleFailPolls polls in a row is fatal DCGM_FR_NVML_API, named as the
// GPU last read (UUID and PCI address: named by its index alone, the GPU
// listed under its UUID, it stood for ever), lifted when the GPU reads
// again.
func TestNVMLNoHandleFaultLifted(t *testing.T) {
	for _, r := range []nvml.Return{nvml.ERROR_TIMEOUT, nvml.ERROR_IN_USE, nvml.ERROR_RESET_REQUIRED} {
		t.Run(nvml.ErrorString(r), func(t *testing.T) {
			a := &fakeGPU{uuid: "GPU-A", bus: "00000000:1B:00.0", link0: nvml.FEATURE_ENABLED}
			var logs strings.Builder
			c, err := New(Config{Source: fakeNVML(&logs, a), Uptime: func() (time.Duration, error) { return time.Hour, nil }})
			if err != nil {
				t.Fatal(err)
			}
			n := newNode()
			for poll, step := range []struct {
				dbe    uint64
				handle bool // fails
				want   string
			}{
				{0, false, ""},
				{2, false, "GpuMemWatch:DCGM_FR_VOLATILE_DBE_DETECTED!/COMPONENT_RESET@GPU-A"},
				{0, true, ""},
				{0, true, ""},
				{2, false, ""},
				{0, true, ""},
				{0, true, ""},
				{0, true, "GpuPcieWatch:DCGM_FR_NVML_API!/CONTACT_SUPPORT@GPU-A"},
				{0, true, ""},
				{0, false, "GpuMemWatch:healthy@GPU-A GpuPcieWatch:healthy@GPU-A"},
				{0, false, ""},
			} {
				a.fail, a.dbe = nil, step.dbe
				if step.handle {
					a.fail = map[string]nvml.Return{"handle": r}
				}
				evs, err := c.Check(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				n.apply(evs)
				var got []string
				for _, ev := range evs {
					if ev.Metadata["baseline"] == "" && ev.CheckName != CheckConnectivity {
						got = append(got, summary([]*datamodels.HealthEvent{ev}))
						if e := ents(ev); e != "GPU=GPU-A,PCI=00000000:1b:00.0" {
							t.Errorf("poll %d: %s entities %s", poll, ev.CheckName, e)
						}
					}
				}
				if g := strings.Join(got, " "); g != step.want {
					t.Errorf("poll %d: events %q, want %q", poll, g, step.want)
				}
			}
			if f := n.faults(); f != "" {
				t.Errorf("faults standing: %s", f)
			}
			if !strings.Contains(logs.String(), "level=WARN") {
				t.Errorf("handle failure not logged: %s", logs.String())
			}
		})
	}
}

// TestNVMLNoHandleFatalAtOnce: any other failure to give a handle
// (ERROR_UNKNOWN: some drivers answer so for a GPU fallen off the bus
// before this NVML session; ERROR_INSUFFICIENT_POWER, ...) is not a GPU
// being reset: fatal DCGM_FR_NVML_API at the first poll, lifted when the
// GPU reads again.
func TestNVMLNoHandleFatalAtOnce(t *testing.T) {
	for _, r := range []nvml.Return{nvml.ERROR_UNKNOWN, nvml.ERROR_INSUFFICIENT_POWER} {
		t.Run(nvml.ErrorString(r), func(t *testing.T) {
			a := &fakeGPU{uuid: "GPU-A", bus: "00000000:1B:00.0", link0: nvml.FEATURE_ENABLED}
			var logs strings.Builder
			c, err := New(Config{Source: fakeNVML(&logs, a), Uptime: func() (time.Duration, error) { return time.Hour, nil }})
			if err != nil {
				t.Fatal(err)
			}
			n := newNode()
			for poll, step := range []struct {
				handle bool // fails
				want   string
			}{
				{false, ""},
				{true, "GpuPcieWatch:DCGM_FR_NVML_API!/CONTACT_SUPPORT@GPU-A"},
				{true, ""},
				{false, "GpuPcieWatch:healthy@GPU-A"},
			} {
				a.fail = nil
				if step.handle {
					a.fail = map[string]nvml.Return{"handle": r}
				}
				if got := pollNVML(t, c, n, "GpuPcieWatch", false); got != step.want {
					t.Errorf("poll %d: events %q, want %q", poll, got, step.want)
				}
			}
			if f := n.faults(); f != "" {
				t.Errorf("faults standing: %s", f)
			}
		})
	}
}

// TestNVMLUnidentifiedGPU: a process whose first read tells nothing of
// GPU 0 (no handle, or lost: every query GPU_IS_LOST, UUID and PCI info
// included) faults it; the GPU repaired, its fault is lifted — by the same
// process when it reads it, by a new one (after the reboot) only where the
// fault named the GPU: with the node's GPU metadata, the one GPU it lists
// that NVML does not. Without metadata the fault is named "GPU=gpu0" and
// only the process that raised it lifts it: a baseline by index alone
// could lift another GPU's (after a reboot without a GPU the indexes
// shift). After a reboot without the GPU, its fault stands.
func TestNVMLUnidentifiedGPU(t *testing.T) {
	metadata := []GPU{{Index: 0, UUID: "GPU-A", PCI: "0000:1b:00.0"}, {Index: 1, UUID: "GPU-B", PCI: "0000:43:00.0"}}
	noHandle := func(g *fakeGPU) { g.fail = map[string]nvml.Return{"handle": nvml.ERROR_UNKNOWN} }
	lost := func(g *fakeGPU) { lostGPU(g, false) }
	for _, tc := range []struct {
		name     string
		broken   func(*fakeGPU)
		expected []GPU
		reboot   bool // else the same process reads the repaired GPU
		without  bool // GPU-A not enumerated after the reboot
		faults   string
	}{
		{"no handle, same process", noHandle, nil, false, false, ""},
		{"lost, same process", lost, nil, false, false, ""},
		{"no handle, metadata, same process", noHandle, metadata, false, false, ""},
		{"no handle, metadata, reboot", noHandle, metadata, true, false, ""},
		{"lost, metadata, reboot", lost, metadata, true, false, ""},
		{"lost, no metadata, reboot: stands", lost, nil, true, false, "GpuPcieWatch|GPU=gpu0"},
		{"lost, metadata, reboot without it: stands", lost, metadata, true, true,
			"GpuPcieWatch|GPU=GPU-A,PCI=00000000:1b:00.0"},
		{"lost, no metadata, reboot without it: stands", lost, nil, true, true, "GpuPcieWatch|GPU=gpu0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &fakeGPU{uuid: "GPU-A", bus: "00000000:1B:00.0", link0: nvml.FEATURE_ENABLED}
			b := &fakeGPU{uuid: "GPU-B", bus: "00000000:43:00.0", link0: nvml.FEATURE_ENABLED}
			var expected func() []GPU
			if tc.expected != nil {
				expected = func() []GPU { return tc.expected }
			}
			var logs strings.Builder
			cfg := Config{Source: fakeNVML(&logs, a, b), Expected: expected, Uptime: func() (time.Duration, error) { return time.Hour, nil }}
			c, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			n := newNode()
			check := func(what string) {
				t.Helper()
				evs, err := c.Check(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				n.apply(evs)
				t.Logf("%s: %s", what, summary(evs))
			}
			tc.broken(a)
			for i := range handleFailPolls {
				check(fmt.Sprintf("broken, read %d", i))
			}
			if n.faults() == "" {
				t.Fatal("no fault raised")
			}
			a.fail = nil
			if tc.reboot {
				gpus := []*fakeGPU{a, b}
				if tc.without {
					gpus = []*fakeGPU{b}
				}
				cfg.Source = fakeNVML(&logs, gpus...)
				if c, err = New(cfg); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 3 {
				check(fmt.Sprintf("repaired, read %d", i))
			}
			if got := n.faults(); got != tc.faults {
				t.Errorf("faults standing %q, want %q", got, tc.faults)
			}
			if len(n.stale) > 0 {
				t.Errorf("stale recoveries %v", n.stale)
			}
		})
	}
}

// TestNVMLReleasedAfterEachRead: NVML is shut down at the end of every
// read, whatever it found, so that between polls the agent holds no GPU
// (nvidia-smi -r refused a reset "in use by another client", the driver
// module stayed held through a driver upgrade); an Init that failed is not
// shut down.
func TestNVMLReleasedAfterEachRead(t *testing.T) {
	for _, tc := range []struct {
		name       string
		init       nvml.Return
		countFails bool
		inits      int
	}{
		{"reads", nvml.SUCCESS, false, 3},
		{"the count fails", nvml.SUCCESS, true, 3},
		{"no driver", nvml.ERROR_DRIVER_NOT_LOADED, false, 0},
		{"init fails", nvml.ERROR_UNKNOWN, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &fakeGPU{uuid: "GPU-A", bus: "00000000:1B:00.0", link0: nvml.FEATURE_ENABLED}
			var logs strings.Builder
			s := fakeNVML(&logs, a)
			held := 0 // Inits not shut down
			inits := 0
			lib := s.lib.(*mock.Interface)
			lib.InitFunc = func() nvml.Return {
				if tc.init == nvml.SUCCESS {
					held++
					inits++
				}
				return tc.init
			}
			lib.ShutdownFunc = func() nvml.Return { held--; return nvml.SUCCESS }
			count := lib.DeviceGetCountFunc
			lib.DeviceGetCountFunc = func() (int, nvml.Return) {
				if tc.countFails {
					return 0, nvml.ERROR_UNKNOWN
				}
				return count()
			}
			for poll := range 3 {
				s.Health(context.Background())
				if held != 0 {
					t.Fatalf("poll %d: NVML held (%d Init not shut down)", poll, held)
				}
			}
			if inits != tc.inits {
				t.Errorf("%d successful Init, want %d", inits, tc.inits)
			}
		})
	}
}

// TestNVMLLostHandle: a GPU fallen off the bus whose handle NVML does not
// give (GPU_IS_LOST: NVML initialised after it was lost, as at every read
// or after an agent restart) is fatal DCGM_FR_FALLEN_OFF_BUS, RESTART_BM —
// as when its handle answers GPU_IS_LOST — not DCGM_FR_NVML_API,
// CONTACT_SUPPORT, which flipped the recommended action of the same fault
// to a human. It is named as last read, else by the node's GPU metadata,
// else by its index; read again, it is lifted.
func TestNVMLLostHandle(t *testing.T) {
	metadata := []GPU{{Index: 0, UUID: "GPU-A", PCI: "0000:1b:00.0"}, {Index: 1, UUID: "GPU-B", PCI: "0000:43:00.0"}}
	for _, tc := range []struct {
		name     string
		handle   nvml.Return
		readOnce bool // the process read the GPU before it was lost
		expected []GPU
		want     string
	}{
		{"lost after a read", nvml.ERROR_GPU_IS_LOST, true, nil, "GpuPcieWatch:DCGM_FR_FALLEN_OFF_BUS!/RESTART_BM@GPU-A"},
		{"lost at the first read, metadata", nvml.ERROR_GPU_IS_LOST, false, metadata, "GpuPcieWatch:DCGM_FR_FALLEN_OFF_BUS!/RESTART_BM@GPU-A"},
		{"lost at the first read", nvml.ERROR_GPU_IS_LOST, false, nil, "GpuPcieWatch:DCGM_FR_FALLEN_OFF_BUS!/RESTART_BM@gpu0"},
		{"not found after a read", nvml.ERROR_GPU_NOT_FOUND, true, nil, "GpuPcieWatch:DCGM_FR_FALLEN_OFF_BUS!/RESTART_BM@GPU-A"},
		{"a reset's answer: a failed query", nvml.ERROR_IN_USE, true, nil, ""},
		{"unknown error: NVML_API at once", nvml.ERROR_UNKNOWN, true, nil, "GpuPcieWatch:DCGM_FR_NVML_API!/CONTACT_SUPPORT@GPU-A"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &fakeGPU{uuid: "GPU-A", bus: "00000000:1B:00.0", link0: nvml.FEATURE_ENABLED}
			b := &fakeGPU{uuid: "GPU-B", bus: "00000000:43:00.0", link0: nvml.FEATURE_ENABLED}
			var expected func() []GPU
			if tc.expected != nil {
				expected = func() []GPU { return tc.expected }
			}
			var logs strings.Builder
			c, err := New(Config{Source: fakeNVML(&logs, a, b), Expected: expected, Uptime: func() (time.Duration, error) { return time.Hour, nil }})
			if err != nil {
				t.Fatal(err)
			}
			n := newNode()
			poll := func() string {
				t.Helper()
				evs, err := c.Check(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				n.apply(evs)
				var got []string
				for _, ev := range evs {
					if ev.Metadata["baseline"] == "" && ev.CheckName != CheckConnectivity {
						got = append(got, summary([]*datamodels.HealthEvent{ev}))
					}
				}
				return strings.Join(got, " ")
			}
			if tc.readOnce {
				poll()
			}
			a.fail = map[string]nvml.Return{"handle": tc.handle}
			if got := poll(); got != tc.want {
				t.Errorf("lost: events %q, want %q", got, tc.want)
			}
			if got := poll(); got != "" {
				t.Errorf("still lost: events %q, want none", got)
			}
			a.fail = nil
			poll()
			poll()
			if f := n.faults(); f != "" {
				t.Errorf("read again: faults standing %s", f)
			}
		})
	}
}

// pollNVML runs one poll of c, applies its events to n and returns those of
// check (baselines too when baselines) as summary writes them.
func pollNVML(t *testing.T, c *Check, n *node, check string, baselines bool) string {
	t.Helper()
	evs, err := c.Check(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n.apply(evs)
	var got []string
	for _, ev := range evs {
		if ev.CheckName == check && (baselines || ev.Metadata["baseline"] == "") {
			got = append(got, summary([]*datamodels.HealthEvent{ev}))
		}
	}
	return strings.Join(got, " ")
}

// linkForgets are what makes the NVLink states of GPU a forgotten (the
// links retrain after it): gone, from one poll, until back is called.
func linkForgets() []struct {
	name string
	gone func(s *NVML, a *fakeGPU) (back func())
} {
	return []struct {
		name string
		gone func(s *NVML, a *fakeGPU) (back func())
	}{
		{"driver not loaded", func(s *NVML, _ *fakeGPU) func() {
			lib := s.lib.(*mock.Interface)
			init := lib.InitFunc
			lib.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
			return func() { lib.InitFunc = init }
		}},
		{"init fails", func(s *NVML, _ *fakeGPU) func() {
			lib := s.lib.(*mock.Interface)
			init := lib.InitFunc
			lib.InitFunc = func() nvml.Return { return nvml.ERROR_UNKNOWN }
			return func() { lib.InitFunc = init }
		}},
		{"count fails", func(s *NVML, _ *fakeGPU) func() {
			lib := s.lib.(*mock.Interface)
			count := lib.DeviceGetCountFunc
			lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
			return func() { lib.DeviceGetCountFunc = count }
		}},
		{"no handle (reset)", func(_ *NVML, a *fakeGPU) func() {
			a.fail = map[string]nvml.Return{"handle": nvml.ERROR_IN_USE}
			return func() { a.fail = nil }
		}},
		{"lost", func(_ *NVML, a *fakeGPU) func() {
			lostGPU(a, true)
			return func() { a.fail = nil }
		}},
		{"MIG on, then off", func(_ *NVML, a *fakeGPU) func() {
			a.mig = nvml.DEVICE_MIG_ENABLE
			return func() { a.mig = nvml.DEVICE_MIG_DISABLE }
		}},
	}
}

// TestNVMLNvlinkAfterDriverGone: after the driver went away (GPU Operator
// upgrade: Init answers DRIVER_NOT_LOADED or fails, or the count fails),
// after a GPU reset (its handle failing meanwhile), a GPU lost or MIG mode
// on then off, NVLinks
// are inactive until Fabric Manager retrains them: that is not "was
// active, now down" (fatal NVLINK_DOWN, COMPONENT_RESET, on a healthy
// GPU) while they train (linkRetrain: here, three reads). One seen active
// again and then inactive at two reads in a row is down, and lifted when
// active.
func TestNVMLNvlinkAfterDriverGone(t *testing.T) {
	for _, tc := range linkForgets() {
		t.Run(tc.name, func(t *testing.T) {
			a := &fakeGPU{uuid: "GPU-A", bus: "00000000:1B:00.0", link0: nvml.FEATURE_ENABLED}
			var logs strings.Builder
			s := fakeNVML(&logs, a)
			c, err := New(Config{Source: s, Uptime: func() (time.Duration, error) { return time.Hour, nil }})
			if err != nil {
				t.Fatal(err)
			}
			n := newNode()
			poll := func() string { t.Helper(); return pollNVML(t, c, n, "GpuNvlinkWatch", false) }
			poll() // the baseline, link 0 active
			back := tc.gone(s, a)
			poll()
			back()
			a.link0 = nvml.FEATURE_DISABLED // training
			for i := range 3 {
				if got := poll(); got != "" {
					t.Errorf("back, link 0 training, read %d: Nvlink events %q, want none", i, got)
				}
			}
			a.link0 = nvml.FEATURE_ENABLED
			if got := poll(); got != "" {
				t.Errorf("trained: Nvlink events %q, want none", got)
			}
			a.link0 = nvml.FEATURE_DISABLED
			for i, want := range []string{"", "GpuNvlinkWatch:DCGM_FR_NVLINK_DOWN!/COMPONENT_RESET@GPU-A", ""} {
				if got := poll(); got != want {
					t.Errorf("down, read %d: Nvlink events %q, want %q", i, got, want)
				}
			}
			a.link0 = nvml.FEATURE_ENABLED
			if got := poll(); got != "GpuNvlinkWatch:healthy@GPU-A" {
				t.Errorf("up again: Nvlink events %q, want its recovery", got)
			}
			if f := n.faults(); f != "" && tc.name != "lost" {
				t.Errorf("faults standing: %s", f)
			}
		})
	}
}

// TestNVMLNvlinkDeadAfterForget: a link seen active whose state was
// forgotten (driver reload, GPU reset, GPU lost, MIG on then off) and that
// never trains again is down: its watch unknown while it may be training
// (linkRetrain), then DCGM_FR_NVLINK_DOWN, standing while it reads
// inactive. Taken for a link never seen active (unused), it was never
// reported: a dead NVLink, possibly broken by the reset of the remediation.
func TestNVMLNvlinkDeadAfterForget(t *testing.T) {
	for _, tc := range linkForgets() {
		t.Run(tc.name, func(t *testing.T) {
			a := &fakeGPU{uuid: "GPU-A", bus: "00000000:1B:00.0", link0: nvml.FEATURE_ENABLED}
			var logs strings.Builder
			s := fakeNVML(&logs, a)
			c, err := New(Config{Source: s, Uptime: func() (time.Duration, error) { return time.Hour, nil }})
			if err != nil {
				t.Fatal(err)
			}
			n := newNode()
			poll := func() string { t.Helper(); return pollNVML(t, c, n, "GpuNvlinkWatch", false) }
			poll() // the baseline, link 0 active
			back := tc.gone(s, a)
			poll()
			back()
			a.link0 = nvml.FEATURE_DISABLED // dead
			var raised []int
			for i := range 20 {
				switch got := poll(); got {
				case "":
				case "GpuNvlinkWatch:DCGM_FR_NVLINK_DOWN!/COMPONENT_RESET@GPU-A":
					raised = append(raised, i)
				default:
					t.Errorf("back, link 0 dead, read %d: Nvlink events %q", i, got)
				}
				if gpus := s.GPUs(); i == 0 && (len(gpus) != 1 || !slices.Contains(gpus[0].Unknown, "Nvlink")) {
					t.Errorf("back, link 0 dead, read 0: inventory %+v, want Nvlink unknown (it may be training)", gpus)
				}
			}
			// The fake clock moves two minutes a read: the window is over
			// at the fourth read.
			if !slices.Equal(raised, []int{3}) {
				t.Errorf("back, link 0 dead: NVLINK_DOWN raised at reads %v, want [3] (once, after the retrain window)", raised)
			}
			if f := n.faults(); !strings.Contains(f, "GpuNvlinkWatch") {
				t.Errorf("link 0 dead: faults %q, want its NVLINK_DOWN", f)
			}
			a.link0 = nvml.FEATURE_ENABLED
			if got := poll(); got != "GpuNvlinkWatch:healthy@GPU-A" {
				t.Errorf("active: Nvlink events %q, want its recovery", got)
			}
		})
	}
}

// TestNVMLNvlinkFaultStandsUntilActive: an NVLINK_DOWN fault stands
// through the driver going away and coming back with the link inactive
// (forgotten: down or still training, not known) — no recovery while the
// watch cannot tell — and is lifted when the link reads active.
func TestNVMLNvlinkFaultStandsUntilActive(t *testing.T) {
	a := &fakeGPU{uuid: "GPU-A", bus: "00000000:1B:00.0", link0: nvml.FEATURE_ENABLED}
	var logs strings.Builder
	s := fakeNVML(&logs, a)
	c, err := New(Config{Source: s, Uptime: func() (time.Duration, error) { return time.Hour, nil }})
	if err != nil {
		t.Fatal(err)
	}
	n := newNode()
	poll := func() string { t.Helper(); return pollNVML(t, c, n, "GpuNvlinkWatch", false) }
	poll()
	a.link0 = nvml.FEATURE_DISABLED
	poll()
	if got := poll(); got != "GpuNvlinkWatch:DCGM_FR_NVLINK_DOWN!/COMPONENT_RESET@GPU-A" {
		t.Fatalf("down: Nvlink events %q", got)
	}
	lib := s.lib.(*mock.Interface)
	init := lib.InitFunc
	lib.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
	poll()
	lib.InitFunc = init
	for i := range 3 {
		if got := poll(); got != "" {
			t.Errorf("driver back, link inactive, read %d: Nvlink events %q, want none (the fault stands)", i, got)
		}
	}
	if f := n.faults(); !strings.Contains(f, "GpuNvlinkWatch") {
		t.Errorf("NVLINK_DOWN lifted while the link is inactive: faults %q", f)
	}
	a.link0 = nvml.FEATURE_ENABLED
	if got := poll(); got != "GpuNvlinkWatch:healthy@GPU-A" {
		t.Errorf("active: Nvlink events %q, want its recovery", got)
	}
}

// TestNVMLNvlinkUnusedLinkLiftsFault: GPU-A uses NVLink 0; NVLink 1
// exists and is never active (a PCIe card with a partial NVLink bridge, an
// uncabled link). Link 0 down at two reads is NVLINK_DOWN, lifted at the
// first read that finds it active: the unused link, never seen active and
// with no fault of its own, does not keep it. It still keeps the GPU's
// first Nvlink baseline (down since before the process, or unused: not
// known healthy). A fault that stands when the driver goes away still
// stands while link 0 reads inactive after it, and is lifted when active.
func TestNVMLNvlinkUnusedLinkLiftsFault(t *testing.T) {
	a := &fakeGPU{uuid: "GPU-A", bus: "00000000:1B:00.0", link0: nvml.FEATURE_ENABLED, twoLinks: true, link1: nvml.FEATURE_DISABLED}
	var logs strings.Builder
	s := fakeNVML(&logs, a)
	c, err := New(Config{Source: s, Uptime: func() (time.Duration, error) { return time.Hour, nil }})
	if err != nil {
		t.Fatal(err)
	}
	n := newNode()
	if got := pollNVML(t, c, n, "GpuNvlinkWatch", true); got != "" {
		t.Errorf("first read: Nvlink events %q, want none (link 1 never active: no baseline)", got)
	}
	poll := func() string { t.Helper(); return pollNVML(t, c, n, "GpuNvlinkWatch", false) }
	down := func() {
		t.Helper()
		a.link0 = nvml.FEATURE_DISABLED
		for i, want := range []string{"", "GpuNvlinkWatch:DCGM_FR_NVLINK_DOWN!/COMPONENT_RESET@GPU-A"} {
			if got := poll(); got != want {
				t.Fatalf("link 0 down, read %d: Nvlink events %q, want %q", i, got, want)
			}
		}
	}
	down()
	a.link0 = nvml.FEATURE_ENABLED
	for i, want := range []string{"GpuNvlinkWatch:healthy@GPU-A", "", "", "", ""} {
		if got := poll(); got != want {
			t.Errorf("link 0 up, read %d: Nvlink events %q, want %q", i, got, want)
		}
	}
	if f := n.faults(); f != "" {
		t.Errorf("faults standing: %s", f)
	}

	down()
	lib := s.lib.(*mock.Interface)
	init := lib.InitFunc
	lib.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
	poll()
	lib.InitFunc = init
	for i := range 3 {
		if got := poll(); got != "" {
			t.Errorf("driver back, link 0 inactive, read %d: Nvlink events %q, want none (the fault stands)", i, got)
		}
	}
	if f := n.faults(); !strings.Contains(f, "GpuNvlinkWatch") {
		t.Errorf("NVLINK_DOWN lifted while link 0 is inactive: faults %q", f)
	}
	a.link0 = nvml.FEATURE_ENABLED
	if got := poll(); got != "GpuNvlinkWatch:healthy@GPU-A" {
		t.Errorf("link 0 active: Nvlink events %q, want its recovery", got)
	}
}

// TestNVMLNvlinkUnderMIG: MIG mode turns NVLink off: a GPU in MIG mode
// reads no link, its Nvlink watch is healthy — an NVLINK_DOWN fault that
// stands is lifted, a new process baselines it — and its link states are
// forgotten (MIG off again, the links inactive while they may train,
// linkRetrain, are no fault).
func TestNVMLNvlinkUnderMIG(t *testing.T) {
	a := &fakeGPU{uuid: "GPU-A", bus: "00000000:1B:00.0", link0: nvml.FEATURE_ENABLED}
	var logs strings.Builder
	cfg := Config{Source: fakeNVML(&logs, a), Uptime: func() (time.Duration, error) { return time.Hour, nil }}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := newNode()
	poll := func() string { t.Helper(); return pollNVML(t, c, n, "GpuNvlinkWatch", false) }
	poll()
	a.link0 = nvml.FEATURE_DISABLED
	poll()
	if got := poll(); got != "GpuNvlinkWatch:DCGM_FR_NVLINK_DOWN!/COMPONENT_RESET@GPU-A" {
		t.Fatalf("down: Nvlink events %q", got)
	}
	a.mig = nvml.DEVICE_MIG_ENABLE
	for i, want := range []string{"GpuNvlinkWatch:healthy@GPU-A", "", ""} {
		if got := poll(); got != want {
			t.Errorf("MIG on, read %d: Nvlink events %q, want %q", i, got, want)
		}
	}
	a.mig = nvml.DEVICE_MIG_DISABLE
	for i := range 3 {
		if got := poll(); got != "" {
			t.Errorf("MIG off, link inactive, read %d: Nvlink events %q, want none", i, got)
		}
	}
	if f := n.faults(); f != "" {
		t.Errorf("faults standing: %s", f)
	}

	// A new process, MIG on: the Nvlink fault of the one before is lifted.
	a.mig = nvml.DEVICE_MIG_ENABLE
	n.apply([]*datamodels.HealthEvent{c.event(Incident{GPU: 0, UUID: "GPU-A", PCI: "00000000:1b:00.0", System: "Nvlink",
		Health: "FAIL", Code: "DCGM_FR_NVLINK_DOWN", Message: "earlier process"})})
	cfg.Source = fakeNVML(&logs, a)
	if c, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	if got := pollNVML(t, c, n, "GpuNvlinkWatch", true); !strings.Contains(got, "GpuNvlinkWatch:healthy@GPU-A") {
		t.Errorf("new process, MIG on: Nvlink events %q, want its baseline", got)
	}
	if f := n.faults(); f != "" {
		t.Errorf("new process: faults standing: %s", f)
	}
}

// TestNVMLRetiredPages: a GPU without row remapping (pre-Ampere: V100,
// T4; GetRemappedRows NOT_SUPPORTED) retires pages instead, read as DCGM's
// memory watch does: a retirement pending is DCGM_FR_PENDING_PAGE_RETIREMENTS
// (WARN), DCGM_FR_DBE_PENDING_PAGE_RETIREMENTS (FAIL) with volatile DBEs;
// 63 retired pages or more (SBE and DBE) DCGM_FR_RETIRED_PAGES_LIMIT. A GPU
// with row remapping is not asked; a failed read keeps its last answer.
func TestNVMLRetiredPages(t *testing.T) {
	for _, tc := range []struct {
		name          string
		g             fakeGPU
		fail          map[string]nvml.Return
		before, codes string // the Mem incidents of a read of g with the fails' queries answering, then failing
	}{
		{"no retirement", fakeGPU{noRemap: true, sbePages: 10, dbePages: 2}, nil, "", ""},
		{"pending", fakeGPU{noRemap: true, pending: nvml.FEATURE_ENABLED}, nil, "DCGM_FR_PENDING_PAGE_RETIREMENTS/WARN", ""},
		{"pending with a DBE", fakeGPU{noRemap: true, pending: nvml.FEATURE_ENABLED, dbe: 1}, nil,
			"DCGM_FR_VOLATILE_DBE_DETECTED/FAIL DCGM_FR_DBE_PENDING_PAGE_RETIREMENTS/FAIL", ""},
		{"62 pages", fakeGPU{noRemap: true, sbePages: 60, dbePages: 2}, nil, "", ""},
		{"63 pages", fakeGPU{noRemap: true, sbePages: 60, dbePages: 3}, nil, "DCGM_FR_RETIRED_PAGES_LIMIT/FAIL", ""},
		{"row remapping: pages not read", fakeGPU{pending: nvml.FEATURE_ENABLED, sbePages: 100}, nil, "", ""},
		{"pending, then its read fails", fakeGPU{noRemap: true, pending: nvml.FEATURE_ENABLED},
			map[string]nvml.Return{"GetRetiredPagesPendingStatus": nvml.ERROR_UNKNOWN},
			"DCGM_FR_PENDING_PAGE_RETIREMENTS/WARN", "DCGM_FR_PENDING_PAGE_RETIREMENTS/WARN"},
		{"63 pages, then a read fails", fakeGPU{noRemap: true, sbePages: 63},
			map[string]nvml.Return{"GetRetiredPages": nvml.ERROR_UNKNOWN},
			"DCGM_FR_RETIRED_PAGES_LIMIT/FAIL", "DCGM_FR_RETIRED_PAGES_LIMIT/FAIL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.g
			g.uuid, g.bus, g.link0 = "GPU-A", "00000000:1B:00.0", nvml.FEATURE_ENABLED
			var logs strings.Builder
			s := fakeNVML(&logs, &g)
			mem := func() string {
				t.Helper()
				incs, err := s.Health(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, in := range incs {
					if in.System == "Mem" {
						got = append(got, in.Code+"/"+in.Health)
					}
				}
				return strings.Join(got, " ")
			}
			if got := mem(); got != tc.before {
				t.Errorf("Mem incidents %q, want %q", got, tc.before)
			}
			if tc.fail != nil {
				g.fail, g.pending, g.sbePages, g.dbePages = tc.fail, 0, 0, 0
				if got := mem(); got != tc.codes {
					t.Errorf("read failing: Mem incidents %q, want %q", got, tc.codes)
				}
				if gpus := s.GPUs(); len(gpus) != 1 || !slices.Contains(gpus[0].Unknown, "Mem") {
					t.Errorf("read failing: inventory %+v, want Mem unknown", gpus)
				}
			}
		})
	}
}

// TestNVMLInforom: the InfoROM is validated (ValidateInforom, as DCGM's
// diagnostic does): CORRUPTED_INFOROM is DCGM_FR_CORRUPT_INFOROM (not
// fatal, CONTACT_SUPPORT), lifted when valid; a validation that fails is
// unknown: no GpuInforomWatch baseline (it was sent at each start, never
// measured) until it answers; NOT_SUPPORTED is an answer.
func TestNVMLInforom(t *testing.T) {
	a := &fakeGPU{uuid: "GPU-A", bus: "00000000:1B:00.0", link0: nvml.FEATURE_ENABLED,
		fail: map[string]nvml.Return{"ValidateInforom": nvml.ERROR_UNKNOWN}}
	var logs strings.Builder
	s := fakeNVML(&logs, a)
	later := hourly(s)
	c, err := New(Config{Source: s, Uptime: func() (time.Duration, error) { return time.Hour, nil }})
	if err != nil {
		t.Fatal(err)
	}
	n := newNode()
	for i, step := range []struct {
		fail    bool
		inforom nvml.Return
		want    string
	}{
		{true, nvml.SUCCESS, ""},
		{false, nvml.ERROR_NOT_SUPPORTED, "GpuInforomWatch:healthy@GPU-A GpuInforomWatch:healthy@gpu0"},
		{false, nvml.ERROR_CORRUPTED_INFOROM, "GpuInforomWatch:DCGM_FR_CORRUPT_INFOROM/CONTACT_SUPPORT@GPU-A"},
		{true, nvml.SUCCESS, ""},
		{false, nvml.SUCCESS, "GpuInforomWatch:healthy@GPU-A"},
	} {
		a.fail, a.inforom = nil, step.inforom
		if step.fail {
			a.fail = map[string]nvml.Return{"ValidateInforom": nvml.ERROR_UNKNOWN}
		}
		if got := pollNVML(t, c, n, "GpuInforomWatch", true); got != step.want {
			t.Errorf("read %d: Inforom events %q, want %q", i, got, step.want)
		}
		later() // validated again
	}
}

// hourly makes s's clock an hour later at each call of the func it returns.
func hourly(s *NVML) (later func()) {
	var skew time.Duration
	now := s.now
	s.now = func() time.Time { return now().Add(skew) }
	return func() { skew += time.Hour }
}

// TestNVMLInforomHourly: the InfoROM is validated at most once an hour per
// GPU, as DCGM samples it (validating it every 30 s poll is costly): the
// first read validates, the reads of the next hour keep its answer, the
// first read an hour later validates again. A validation that does not
// answer is tried again at the next read (the watch unknown meanwhile).
func TestNVMLInforomHourly(t *testing.T) {
	a := &fakeGPU{uuid: "GPU-A", bus: "00000000:1B:00.0", link0: nvml.FEATURE_ENABLED}
	var logs strings.Builder
	s := fakeNVML(&logs, a)
	later := hourly(s)
	c, err := New(Config{Source: s, Uptime: func() (time.Duration, error) { return time.Hour, nil }})
	if err != nil {
		t.Fatal(err)
	}
	n := newNode()
	step := func(name, want string, validations int) {
		t.Helper()
		if got := pollNVML(t, c, n, "GpuInforomWatch", true); got != want {
			t.Errorf("%s: Inforom events %q, want %q", name, got, want)
		}
		if a.validations != validations {
			t.Errorf("%s: %d validations, want %d", name, a.validations, validations)
		}
	}
	step("first read", "GpuInforomWatch:healthy@GPU-A GpuInforomWatch:healthy@gpu0", 1)
	a.inforom = nvml.ERROR_CORRUPTED_INFOROM
	for range 5 {
		step("within the hour", "", 1)
	}
	later()
	step("an hour later", "GpuInforomWatch:DCGM_FR_CORRUPT_INFOROM/CONTACT_SUPPORT@GPU-A", 2)
	step("within the hour", "", 2)
	later()
	a.fail = map[string]nvml.Return{"ValidateInforom": nvml.ERROR_UNKNOWN}
	step("an hour later, failing", "", 3)
	step("failed: tried again", "", 4)
	a.fail, a.inforom = nil, nvml.SUCCESS
	step("answers", "GpuInforomWatch:healthy@GPU-A", 5)
	step("within the hour", "", 5)

	// Reflashed and the driver reloaded within the hour: validated again
	// at the first read after, not taken from the corrupt answer.
	later()
	a.inforom = nvml.ERROR_CORRUPTED_INFOROM
	step("corrupt", "GpuInforomWatch:DCGM_FR_CORRUPT_INFOROM/CONTACT_SUPPORT@GPU-A", 6)
	lib := s.lib.(*mock.Interface)
	init := lib.InitFunc
	lib.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }
	pollNVML(t, c, n, "GpuInforomWatch", true)
	lib.InitFunc, a.inforom = init, nvml.SUCCESS
	step("reflashed, driver back", "GpuInforomWatch:healthy@GPU-A", 7)
}
