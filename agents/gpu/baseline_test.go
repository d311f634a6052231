package gpu

import (
	"context"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/processors/quarantine"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// A GPU's events of one watch (Mem: fatal COMPONENT_RESET, Thermal: not fatal).
var (
	gpuA = GPU{Index: 0, UUID: "GPU-A", PCI: "00000000:1b:00.0"}
	gpuB = GPU{Index: 1, UUID: "GPU-B", PCI: "00000000:43:00.0"}
)

func incident(g GPU, system, code string) Incident {
	return Incident{GPU: g.Index, UUID: g.UUID, PCI: g.PCI, System: system, Health: "FAIL", Code: code, Message: "recorded"}
}

func memDBE(g GPU) Incident { return incident(g, "Mem", "DCGM_FR_VOLATILE_DBE_DETECTED") }

// healthyOn is the summary of the per-GPU baseline of watches ("Mem Pcie",
// "" for all) on the GPUs ids, in the order the check sends it.
func healthyOn(watches string, ids ...string) string {
	ws := strings.Fields(watches)
	if len(ws) == 0 {
		ws = Watches
	}
	var s []string
	for _, w := range ws {
		for _, id := range ids {
			s = append(s, healthyAt(w, id))
		}
	}
	return strings.Join(s, " ")
}

// healthyAt is a GPU's baseline of a watch: under its UUID, and under its
// index at its PCI address (gpuA and gpuB have one).
func healthyAt(watch, id string) string {
	s := "Gpu" + watch + "Watch:healthy@" + id
	if byIndex, ok := map[string]string{"GPU-A": "gpu0", "GPU-B": "gpu1"}[id]; ok {
		s += " Gpu" + watch + "Watch:healthy@" + byIndex
	}
	return s
}

// node plays the quarantine processor's bookkeeping of one node
// (processors/quarantine State: AddFault for an unhealthy event,
// Recover for a healthy one, keyed by check and entities, a recovery
// older than the fault's last occurrence ignored).
type node struct {
	st      *quarantine.State
	lifted  []string // every fault key a recovery removed, in order
	stale   []string // recoveries ignored as older than the fault
	unknown []string // unhealthy events of no check (should not happen)
}

func newNode() *node { return &node{st: &quarantine.State{Faults: map[string]*quarantine.Fault{}}} }

func (n *node) apply(evs []*datamodels.HealthEvent) {
	for _, ev := range evs {
		at := ev.GetGeneratedTimestamp().AsTime()
		if ev.GetIsHealthy() {
			removed, stale := n.st.Recover(ev.GetCheckName(), events.EntityParts(ev), at)
			n.lifted = append(n.lifted, removed...)
			n.stale = append(n.stale, stale...)
			continue
		}
		if ev.GetCheckName() == "" {
			n.unknown = append(n.unknown, ev.String())
		}
		f := quarantine.Fault{Check: ev.GetCheckName(), Entity: events.EntityKey(ev), Since: at, LastSeen: at, Cordon: ev.GetIsFatal()}
		n.st.AddFault(quarantine.FaultKey(f.Check, f.Entity), f, "")
	}
}

func (n *node) faults() string {
	var k []string
	for key := range n.st.Faults {
		k = append(k, key)
	}
	sort.Strings(k)
	return strings.Join(k, " ")
}

// TestBaselineAfterRestart: a new Check (the agent restarted, or the node
// rebooted) knows nothing of the faults an earlier one raised; its first
// successful read reports what is healthy, so the quarantine lifts those
// faults — one event per GPU read and watch with no incident (an unhealthy
// GPU's fault stands, never lifted in between; so does a GPU's the source
// does not list: gone before the restart), one without entity per watch
// healthy on every GPU only when the source names no inventory; none while
// the source is not up (booting) or cannot tell yet (GPU.Unknown), and
// only once.
func TestBaselineAfterRestart(t *testing.T) {
	const connOK = "GpuDcgmConnectivityFailure:healthy "
	lost := func(g GPU) Incident {
		return Incident{GPU: g.Index, UUID: g.UUID, PCI: g.PCI, System: "Pcie", Health: "FAIL", Code: CodeGPULost, Message: "recorded"}
	}
	for _, tc := range []struct {
		name     string
		before   [][]Incident  // the earlier process's reads (GPUs A and B inventoried)
		after    []ReplayStep  // the new process's reads
		expected []GPU         // Config.Expected of the new process
		uptime   time.Duration // of the new process's node (default an hour)
		want     []string      // the new process's events, one string a read
		faults   string        // the faults standing at the end
		never    string        // a fault that must never be lifted on the way
	}{{
		name:   "restart, all healthy now: the fault is lifted",
		before: [][]Incident{{memDBE(gpuA)}},
		after:  []ReplayStep{{GPUs: []GPU{gpuA, gpuB}}, {GPUs: []GPU{gpuA, gpuB}}},
		want:   []string{connOK + healthyOn("", "GPU-A", "GPU-B"), ""},
	}, {
		name:   "reboot: the source is not up while booting, then healthy",
		before: [][]Incident{{memDBE(gpuA), incident(gpuB, "Thermal", "DCGM_FR_CLOCKS_EVENT_THERMAL")}},
		after: []ReplayStep{{Error: "Host engine connection invalid/disconnected"}, {NotPresent: true},
			{GPUs: []GPU{gpuA, gpuB}}},
		uptime: time.Minute,
		want:   []string{"", "", connOK + healthyOn("", "GPU-A", "GPU-B")},
	}, {
		name:   "one GPU still unhealthy: the other's fault is lifted, its own stands",
		before: [][]Incident{{memDBE(gpuA), memDBE(gpuB)}},
		after:  []ReplayStep{{Incidents: []Incident{memDBE(gpuA)}, GPUs: []GPU{gpuA, gpuB}}, {Incidents: []Incident{memDBE(gpuA)}}},
		want: []string{connOK + "GpuMemWatch:DCGM_FR_VOLATILE_DBE_DETECTED!/COMPONENT_RESET@GPU-A " +
			healthyAt("Mem", "GPU-B") + " " + healthyOn("Pcie Nvlink Thermal Power Inforom", "GPU-A", "GPU-B"), ""},
		faults: "GpuMemWatch|GPU=GPU-A,PCI=00000000:1b:00.0",
		never:  "GpuMemWatch|GPU=GPU-A,PCI=00000000:1b:00.0",
	}, {
		name:   "a GPU gone before the restart: its faults stand, the other's are lifted",
		before: [][]Incident{{memDBE(gpuA), memDBE(gpuB)}, {memDBE(gpuA), lost(gpuB)}},
		after:  []ReplayStep{{GPUs: []GPU{gpuA}}, {GPUs: []GPU{gpuA}}},
		want:   []string{connOK + healthyOn("", "GPU-A"), ""},
		faults: "GpuMemWatch|GPU=GPU-B,PCI=00000000:43:00.0 GpuPcieWatch|GPU=GPU-B,PCI=00000000:43:00.0",
		never:  "GpuPcieWatch|GPU=GPU-B,PCI=00000000:43:00.0",
	}, {
		name:     "a GPU gone before the restart, expected: reported lost, baselined when it reads again",
		before:   [][]Incident{{memDBE(gpuB)}, {lost(gpuB)}},
		expected: []GPU{gpuA, {Index: 1, UUID: "GPU-B", PCI: "0000:43:00.0"}},
		after:    []ReplayStep{{GPUs: []GPU{gpuA}}, {GPUs: []GPU{gpuA}}, {GPUs: []GPU{gpuA, gpuB}}, {GPUs: []GPU{gpuA, gpuB}}},
		want: []string{connOK + "GpuPcieWatch:DCGM_FR_FALLEN_OFF_BUS!/RESTART_BM@GPU-B " + healthyOn("", "GPU-A"), "",
			"GpuPcieWatch:healthy@GPU-B " + healthyOn("Mem Nvlink Thermal Power Inforom", "GPU-B"), ""},
	}, {
		// The earlier process could not read the lost GPU's UUID
		// (GPU_IS_LOST in a process that never saw it): its fault named
		// the GPU by index at its PCI address. Repaired, it reads again.
		name:   "a GPU lost under its index, repaired: its fault is lifted",
		before: [][]Incident{{{GPU: 1, PCI: gpuB.PCI, System: "Pcie", Health: "FAIL", Code: CodeGPULost, Message: "recorded"}}},
		after:  []ReplayStep{{GPUs: []GPU{gpuA, gpuB}}, {GPUs: []GPU{gpuA, gpuB}}},
		want:   []string{connOK + healthyOn("", "GPU-A", "GPU-B"), ""},
	}, {
		// GPU-B gives no handle at the new process's first read (nothing
		// names it: no metadata): the other GPU's baseline goes out, GPU-B
		// waits under its index and is baselined by its UUID when it reads.
		name:   "a GPU without handle at the restart: baselined when it reads",
		before: [][]Incident{{memDBE(gpuB)}},
		after: []ReplayStep{
			{Incidents: []Incident{{GPU: 1, System: "Pcie", Health: "FAIL", Code: "DCGM_FR_NVML_API", Message: "no handle"}},
				GPUs: []GPU{gpuA, {Index: 1, Unknown: Watches}}},
			{GPUs: []GPU{gpuA, gpuB}}, {GPUs: []GPU{gpuA, gpuB}}},
		want: []string{connOK + "GpuPcieWatch:DCGM_FR_NVML_API!/CONTACT_SUPPORT@gpu1 " + healthyOn("", "GPU-A"),
			"GpuPcieWatch:healthy@gpu1 " + healthyOn("", "GPU-B"), ""},
		faults: "",
	}, {
		name:   "no inventory: the GPUs of the incidents",
		before: [][]Incident{{memDBE(gpuA), memDBE(gpuB), incident(gpuA, "Thermal", "DCGM_FR_CLOCKS_EVENT_THERMAL")}},
		after:  []ReplayStep{{Incidents: []Incident{memDBE(gpuA), incident(gpuB, "Thermal", "DCGM_FR_TEMP_VIOLATION")}}},
		want: []string{connOK + "GpuMemWatch:DCGM_FR_VOLATILE_DBE_DETECTED!/COMPONENT_RESET@GPU-A " +
			"GpuThermalWatch:DCGM_FR_TEMP_VIOLATION!/CONTACT_SUPPORT@GPU-B " + healthyAt("Mem", "GPU-B") + " GpuPcieWatch:healthy GpuNvlinkWatch:healthy " +
			healthyAt("Thermal", "GPU-A") + " GpuPowerWatch:healthy GpuInforomWatch:healthy"},
		faults: "GpuMemWatch|GPU=GPU-A,PCI=00000000:1b:00.0 GpuThermalWatch|GPU=GPU-B,PCI=00000000:43:00.0",
		never:  "GpuMemWatch|GPU=GPU-A,PCI=00000000:1b:00.0",
	}, {
		name:   "a watch the source cannot tell yet waits for the read that can",
		before: [][]Incident{{incident(gpuB, "Pcie", "DCGM_FR_PCI_REPLAY_RATE")}},
		after: []ReplayStep{{GPUs: []GPU{gpuA, {Index: 1, UUID: "GPU-B", PCI: gpuB.PCI, Unknown: []string{"Pcie"}}}},
			{GPUs: []GPU{gpuA, gpuB}}, {GPUs: []GPU{gpuA, gpuB}}},
		want: []string{connOK + healthyOn("Mem", "GPU-A", "GPU-B") + " " + healthyAt("Pcie", "GPU-A") + " " +
			healthyOn("Nvlink Thermal Power Inforom", "GPU-A", "GPU-B"), healthyAt("Pcie", "GPU-B"), ""},
		faults: "",
	}, {
		// GPU-B's NVLink unknown for the process's life (a link unused):
		// GPU-A's baseline does not wait for it.
		name:   "still unknown: its fault stands, the other GPU's is lifted",
		before: [][]Incident{{incident(gpuA, "Nvlink", "DCGM_FR_NVLINK_DOWN"), incident(gpuB, "Nvlink", "DCGM_FR_NVLINK_DOWN")}},
		after:  []ReplayStep{{GPUs: []GPU{gpuA, {Index: 1, UUID: "GPU-B", PCI: gpuB.PCI, Unknown: []string{"Nvlink"}}}}},
		want: []string{connOK + healthyOn("Mem Pcie", "GPU-A", "GPU-B") + " " + healthyAt("Nvlink", "GPU-A") + " " +
			healthyOn("Thermal Power Inforom", "GPU-A", "GPU-B"), ""},
		faults: "GpuNvlinkWatch|GPU=GPU-B,PCI=00000000:43:00.0",
	}, {
		name:   "a connectivity failure of the earlier process",
		before: [][]Incident{nil},
		after:  []ReplayStep{{GPUs: []GPU{gpuA}}},
		want:   []string{connOK + healthyOn("", "GPU-A")},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Date(2024, 10, 28, 10, 0, 0, 0, time.UTC)
			clock := func() time.Time { return now }
			n := newNode()
			// The earlier process: its reads after boot; the last
			// case's lost its source (a connectivity failure).
			steps := make([]ReplayStep, len(tc.before))
			for i, incs := range tc.before {
				steps[i] = ReplayStep{Incidents: incs, GPUs: []GPU{gpuA, gpuB}}
				if incs == nil {
					steps[i] = ReplayStep{Error: "Host engine connection invalid/disconnected"}
				}
			}
			old, err := New(Config{Source: &Replay{Steps: steps}, Now: clock,
				Uptime: func() (time.Duration, error) { return time.Hour, nil }})
			if err != nil {
				t.Fatal(err)
			}
			for range steps {
				evs, err := old.Check(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				// The earlier process's own baseline is not what is tested.
				n.apply(slices.DeleteFunc(evs, func(ev *datamodels.HealthEvent) bool { return ev.GetIsHealthy() }))
				now = now.Add(30 * time.Second)
			}
			if n.faults() == "" {
				t.Fatal("the earlier process raised no fault")
			}
			// The restart: a new Check, the node's quarantine state kept.
			uptime := tc.uptime
			if uptime == 0 {
				uptime = time.Hour
			}
			var expected func() []GPU
			if tc.expected != nil {
				expected = func() []GPU { return tc.expected }
			}
			c, err := New(Config{Source: &Replay{Steps: tc.after}, Now: clock, Expected: expected,
				Uptime: func() (time.Duration, error) { return uptime, nil }})
			if err != nil {
				t.Fatal(err)
			}
			for i := range tc.want {
				evs, err := c.Check(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if got := summary(evs); got != tc.want[i] {
					t.Errorf("read %d after the restart:\n got  %s\n want %s", i, got, tc.want[i])
				}
				for _, ev := range evs {
					if ts := ev.GetGeneratedTimestamp().AsTime(); !ts.Equal(now) {
						t.Errorf("read %d: %s generated %v, want the read's time %v", i, ev.GetCheckName(), ts, now)
					}
				}
				n.apply(evs)
				now = now.Add(30 * time.Second)
			}
			if got := n.faults(); got != tc.faults {
				t.Errorf("faults standing after the restart:\n got  %q\n want %q (the node stays quarantined)", got, tc.faults)
			}
			if tc.never != "" && slices.Contains(n.lifted, tc.never) {
				t.Errorf("%s was lifted on the way (it flapped): lifted %v", tc.never, n.lifted)
			}
			if len(n.stale) > 0 || len(n.unknown) > 0 {
				t.Errorf("stale recoveries %v, events without check %v", n.stale, n.unknown)
			}
		})
	}
}

// TestBaselineOncePerProcess: the baseline is of the process, not of the
// source's state: a source lost after boot and back reports only the
// transitions (its own connectivity recovery, the incidents that changed),
// never another baseline.
func TestBaselineOncePerProcess(t *testing.T) {
	now := time.Date(2024, 10, 28, 10, 0, 0, 0, time.UTC)
	steps := []ReplayStep{{GPUs: []GPU{gpuA, gpuB}}, {Error: "lost"}, {Incidents: []Incident{memDBE(gpuB)}, GPUs: []GPU{gpuA, gpuB}},
		{NotPresent: true}, {GPUs: []GPU{gpuA, gpuB}}}
	c, err := New(Config{Source: &Replay{Steps: steps}, Now: func() time.Time { return now },
		Uptime: func() (time.Duration, error) { return time.Hour, nil }})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{
		"GpuDcgmConnectivityFailure:healthy " + healthyOn("", "GPU-A", "GPU-B"),
		"GpuDcgmConnectivityFailure:DCGM-CONNECTIVITY-FAILURE/CONTACT_SUPPORT@dcgm",
		"GpuDcgmConnectivityFailure:healthy@dcgm GpuMemWatch:DCGM_FR_VOLATILE_DBE_DETECTED!/COMPONENT_RESET@GPU-B",
		"",
		"GpuMemWatch:healthy@GPU-B",
		"",
	} {
		evs, err := c.Check(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got := summary(evs); got != want {
			t.Errorf("read %d:\n got  %s\n want %s", i, got, want)
		}
	}
}

// TestNVMLBaseline (a machine with an NVIDIA driver only): NVML names
// every GPU; the PCIe replay rate is unknown at the first read and known
// at the second, so a new Check baselines GpuPcieWatch one read later.
func TestNVMLBaseline(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err != nil {
		t.Skip("no NVIDIA driver here")
	}
	src := NewNVML()
	inv, ok := any(src).(Inventory)
	if !ok {
		t.Skip("built without cgo")
	}
	c, err := New(Config{Source: src})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		evs, err := c.Check(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("read %d: %s; GPUs %+v", i, summary(evs), inv.GPUs())
		if len(inv.GPUs()) == 0 {
			t.Fatalf("read %d: NVML named no GPU", i)
		}
		if i > 0 {
			for _, g := range inv.GPUs() {
				if slices.Contains(g.Unknown, "Pcie") {
					t.Errorf("read %d: GPU %d: Pcie still unknown after a second sample", i, g.Index)
				}
			}
		}
		time.Sleep(time.Second)
	}
	if c.pending["Pcie"] {
		t.Error("GpuPcieWatch never baselined")
	}
}
