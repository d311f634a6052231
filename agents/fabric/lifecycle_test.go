package fabric

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// dropGPU removes the blocks of the GPUs with these bus ids ("3A:00.0")
// from nvidia-smi -q output: the GPUs fell off the bus.
func dropGPU(out string, pcis ...string) string {
	var keep []string
	skip := false
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "GPU ") {
			skip = false
			for _, p := range pcis {
				if strings.HasSuffix(strings.TrimRight(l, "\r"), p) {
					skip = true
				}
			}
		}
		if !skip {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// healthySMI is h100-560-layout.txt with every GPU registered and at full
// bandwidth.
func healthySMI(t *testing.T) string {
	r := strings.NewReplacer("In Progress", "Completed", ": N/A", ": Success", "Degraded", "Full")
	return r.Replace(testdata(t, "smi/h100-560-layout.txt"))
}

// TestGPUAbsentIsNotRecovered: a GPU with a fabric fault that drops out of
// nvidia-smi -q (fell off the bus) keeps its condition; it clears when the
// GPU is seen healthy again. Absence is not health.
func TestGPUAbsentIsNotRecovered(t *testing.T) {
	const gpu2, gpu6 = "GPU-d100d100-0000-0000-0000-000000000002", "GPU-d100d100-0000-0000-0000-000000000006"
	type step struct {
		smi  string
		want string
	}
	faulty := testdata(t, "smi/h100-560-layout.txt")
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"both faulty GPUs fall off the bus, then come back healthy", []step{
			{faulty, "GPUFabricState:FABRIC-PROBE-TIMEOUT:fatal@" + gpu2 + " GPUFabricHealth:FABRIC-BANDWIDTH-DEGRADED:nonfatal@" + gpu6},
			{dropGPU(faulty, "3A:00.0", "BA:00.0"), ""},
			{dropGPU(faulty, "3A:00.0", "BA:00.0"), ""},
			{healthySMI(t), "GPUFabricHealth::healthy@" + gpu6 + " GPUFabricState::healthy@" + gpu2},
		}},
		{"no GPU listed at all", []step{
			{faulty, "GPUFabricState:FABRIC-PROBE-TIMEOUT:fatal@" + gpu2 + " GPUFabricHealth:FABRIC-BANDWIDTH-DEGRADED:nonfatal@" + gpu6},
			{"==============NVSMI LOG==============\n\nAttached GPUs : 0\n", ""},
			{faulty, ""},
		}},
		{"a faulty GPU absent, another comes back healthy", []step{
			{faulty, "GPUFabricState:FABRIC-PROBE-TIMEOUT:fatal@" + gpu2 + " GPUFabricHealth:FABRIC-BANDWIDTH-DEGRADED:nonfatal@" + gpu6},
			{dropGPU(healthySMI(t), "3A:00.0"), "GPUFabricHealth::healthy@" + gpu6},
			{healthySMI(t), "GPUFabricState::healthy@" + gpu2},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := h100Node(t, nil)
			n.r.out["systemctl show"] = showActive
			for i, st := range tc.steps {
				n.r.out["nvidia-smi -q"] = st.smi
				if got := shorts(n.poll(30 * time.Second)); got != st.want {
					t.Fatalf("poll %d: %q\nwant %q", i, got, st.want)
				}
			}
		})
	}
}

// naGPU sets the Fabric State, Status and Bandwidth of the GPUs with these
// bus ids ("3A:00.0"), or of every GPU when none is named, to N/A in
// nvidia-smi -q output: they no longer say anything of their fabric.
func naGPU(out string, pcis ...string) string {
	lines := strings.Split(out, "\n")
	on := false
	for i, l := range lines {
		if strings.HasPrefix(l, "GPU ") {
			on = len(pcis) == 0
			for _, p := range pcis {
				on = on || strings.HasSuffix(strings.TrimRight(l, "\r"), p)
			}
		}
		k, _, ok := strings.Cut(l, ":")
		if f := strings.TrimSpace(k); on && ok && (f == "State" || f == "Status" || f == "Bandwidth") {
			lines[i] = k + ": N/A"
		}
	}
	return strings.Join(lines, "\n")
}

// shortsOf is shorts of the events of these checks only.
func shortsOf(evs []*datamodels.HealthEvent, checks ...string) string {
	var keep []*datamodels.HealthEvent
	for _, ev := range evs {
		if slices.Contains(checks, ev.CheckName) {
			keep = append(keep, ev)
		}
	}
	return shorts(keep)
}

// TestGPUFabricNAIsNotRecovered: a GPU with a fabric fault whose Fabric
// State turns N/A on a host that still has a fabric says nothing of its
// fabric (N/A is the normal state of a GPU without an NVLink fabric, not
// of one that was registering): its condition stands until it reads
// again. On a host that no longer shows a fabric (no NVSwitch, no GPU
// with a fabric state) N/A is normal and the condition clears.
func TestGPUFabricNAIsNotRecovered(t *testing.T) {
	const gpu2, gpu6 = "GPU-d100d100-0000-0000-0000-000000000002", "GPU-d100d100-0000-0000-0000-000000000006"
	const both = "GPUFabricState:FABRIC-PROBE-TIMEOUT:fatal@" + gpu2 + " GPUFabricHealth:FABRIC-BANDWIDTH-DEGRADED:nonfatal@" + gpu6
	type step struct {
		smi      string
		noSwitch bool // the NVSwitches are gone from the host
		want     string
	}
	faulty := testdata(t, "smi/h100-560-layout.txt")
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"both faulty GPUs read N/A, then register healthy", []step{
			{smi: faulty, want: both},
			{smi: naGPU(faulty, "3A:00.0", "BA:00.0")},
			{smi: naGPU(faulty, "3A:00.0", "BA:00.0")},
			{smi: healthySMI(t), want: "GPUFabricHealth::healthy@" + gpu6 + " GPUFabricState::healthy@" + gpu2},
		}},
		{"every GPU reads N/A on the NVSwitch host", []step{
			{smi: faulty, want: both},
			{smi: naGPU(faulty)},
			{smi: faulty},
		}},
		{"N/A, then still registering: the timeout stands", []step{
			{smi: faulty, want: both},
			{smi: naGPU(faulty, "3A:00.0")},
			{smi: faulty},
		}},
		{"the host no longer shows a fabric: N/A is normal, cleared", []step{
			{smi: faulty, want: both},
			{smi: naGPU(faulty), noSwitch: true, want: "GPUFabricHealth::healthy@" + gpu6 + " GPUFabricState::healthy@" + gpu2},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := h100Node(t, nil)
			n.r.out["systemctl show"] = showActive
			for i, st := range tc.steps {
				if st.noSwitch {
					if err := os.RemoveAll(filepath.Join(n.dir, "proc/driver/nvidia-nvswitch")); err != nil {
						t.Fatal(err)
					}
				}
				n.r.out["nvidia-smi -q"] = st.smi
				if got := shortsOf(n.poll(30*time.Second), CheckState, CheckHealth); got != st.want {
					t.Fatalf("poll %d: %q\nwant %q", i, got, st.want)
				}
			}
		})
	}
}

// TestGPUAbsentAfterRebootClears: the previous boot's fabric condition of
// a GPU the rebooted node no longer lists clears through the reboot path
// (the exclusion conditions report a GPU that failed to enumerate).
func TestGPUAbsentAfterRebootClears(t *testing.T) {
	const gpu2 = "GPU-d100d100-0000-0000-0000-000000000002"
	for _, tc := range []struct {
		name    string
		newBoot bool
		want    string
	}{
		{"agent restarted, same boot", false, ""},
		{"node rebooted", true, "GPUFabricState::healthy@" + gpu2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := NewEvaluator(EvalConfig{})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Date(2024, 10, 28, 11, 0, 0, 0, time.UTC)
			e.Resume(Standing{Conditions: map[string]*datamodels.HealthEvent{"gpu|state|" + gpu2: e.ev(now.Add(-time.Hour), classGPU, CheckState,
				"FABRIC-PROBE-TIMEOUT", true, datamodels.RecommendedAction_RESTART_BM, "timeout", gpuEntities(gpu2, "0000:3a:00.0"), nil)}}, now.Add(-5*time.Minute), tc.newBoot)
			s := NewSnapshot(now)
			s.SMI = ParseSMI(dropGPU(healthySMI(t), "3A:00.0"))
			var got []string
			for _, ev := range e.Evaluate(s) {
				if ev.CheckName == CheckState || ev.CheckName == CheckHealth {
					got = append(got, shorts([]*datamodels.HealthEvent{ev}))
				}
			}
			if g := strings.Join(got, " "); g != tc.want {
				t.Fatalf("%q, want %q", g, tc.want)
			}
		})
	}
}

// TestGPUReRegistrationTimedFromItsReset: a GPU that completed its fabric
// registration in this FM run and goes back to In Progress (a GPU reset,
// the FM guide's recovery of a fatal SXid on an access port) is timed from
// when it was first seen In Progress again, not from FM's start (hours
// ago): a brief re-registration is not a probe timeout. A GPU that never
// completed in this FM run, or one of a new FM run, is timed from FM's
// start.
func TestGPUReRegistrationTimedFromItsReset(t *testing.T) {
	const gpu2 = "GPU-d100d100-0000-0000-0000-000000000002"
	const timeout = "GPUFabricState:FABRIC-PROBE-TIMEOUT:fatal@" + gpu2
	registering := strings.ReplaceAll(testdata(t, "smi/h100-560-layout.txt"), "Degraded", "Full") // GPU 3A:00.0 In Progress, N/A
	// FM restarted at 11:00:01, twenty minutes before the last step's poll.
	restarted := strings.Replace(showActive, "10:00:01", "11:00:01", 1)
	type step struct {
		advance time.Duration
		smi     string
		show    string
		want    string
		source  string // the timeout's pending_since_source
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"reset after registration: timed from the reset", []step{
			{advance: 30 * time.Second, smi: healthySMI(t)},
			{advance: 30 * time.Second, smi: registering},
			{advance: 2 * time.Minute, smi: registering},
			{advance: 30 * time.Second, smi: healthySMI(t)},
			{advance: time.Hour, smi: registering},
			{advance: 6 * time.Minute, smi: registering, want: timeout, source: "first seen"},
		}},
		{"never registered in this FM run: timed from FM's start", []step{
			{advance: 30 * time.Second, smi: registering, want: timeout, source: "FM start-up"},
		}},
		{"registered in a previous FM run: timed from this run's start", []step{
			{advance: 30 * time.Second, smi: healthySMI(t)},
			{advance: 50 * time.Minute, smi: registering, show: restarted, want: timeout, source: "FM start-up"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := h100Node(t, nil)
			for i, st := range tc.steps {
				n.r.out["systemctl show"] = showActive
				if st.show != "" {
					n.r.out["systemctl show"] = st.show
				}
				n.r.out["nvidia-smi -q"] = st.smi
				evs := n.poll(st.advance)
				if got := shortsOf(evs, CheckState); got != st.want {
					t.Fatalf("poll %d: %q\nwant %q", i, got, st.want)
				}
				for _, ev := range evs {
					if ev.CheckName == CheckState && ev.Metadata["pending_since_source"] != st.source {
						t.Fatalf("poll %d: pending since %q (%s), want %q", i, ev.Metadata["pending_since_source"], ev.Metadata["pending_since"], st.source)
					}
				}
			}
		})
	}
}
