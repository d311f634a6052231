package fabric

import (
	"strconv"
	"testing"
	"time"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestServiceBootGrace: FM that systemd has not started yet this boot is
// not a fault within the boot grace; one started and stopped, or never
// started past the grace, is.
func TestServiceBootGrace(t *testing.T) {
	const (
		inactive = "FabricManagerService:FM-SERVICE-INACTIVE:fatal@0000:05:00.0"
		healthy  = "FabricManagerService::healthy@0000:05:00.0"
	)
	type step struct {
		show, want string
	}
	for _, tc := range []struct {
		name   string
		uptime time.Duration // at the first poll; 0: /proc/stat unreadable
		steps  []step
	}{
		{"booting: FM not started yet, then running", 2 * time.Minute, []step{
			{showNeverStarted, ""}, {showNeverStartedNA, ""}, {showStarting, ""}, {showActive, ""}}},
		{"booting: FM never started past the grace", 8 * time.Minute, []step{
			{showNeverStarted, ""}, {showNeverStarted, ""}, {showNeverStarted, ""}, {showNeverStarted, ""}, {showNeverStarted, inactive}}},
		{"up for long: FM never started", 2 * time.Hour, []step{{showNeverStarted, inactive}, {showActive, healthy}}},
		{"booting: FM started and stopped is reported", 2 * time.Minute, []step{{showStopped, inactive}}},
		{"boot time unknown: reported", 0, []step{{showNeverStarted, inactive}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := h100Node(t, nil)
			if tc.uptime > 0 {
				n.write("proc/stat", "cpu  1 2 3 4\nbtime "+strconv.FormatInt(n.now.Add(-tc.uptime).Unix(), 10)+"\n")
			}
			c, err := New(n.c.cfg) // reads the boot's start
			if err != nil {
				t.Fatal(err)
			}
			n.c = c
			for i, st := range tc.steps {
				n.r.out["systemctl show"] = st.show
				adv := time.Duration(0)
				if i > 0 {
					adv = 30 * time.Second
				}
				if got := shorts(n.poll(adv)); got != st.want {
					t.Fatalf("poll %d: %q\nwant %q", i, got, st.want)
				}
			}
		})
	}
}

// TestServiceBootGraceKeepsPreviousFailure: the previous boot's FM failure
// neither turns into FM-SERVICE-INACTIVE nor clears while the rebooted node
// has not started FM yet — also while the NVSwitch driver has not probed
// its switches yet (count 0, the host looks like one without a fabric):
// it was cleared then, and a failure of this boot's FM cordoned the node
// again a minute later.
func TestServiceBootGraceKeepsPreviousFailure(t *testing.T) {
	for _, tc := range []struct {
		name     string
		switches []string
		shows    []string
	}{
		{"FM not started yet", h100Switches, []string{showNeverStarted, showStarting}},
		{"no NVSwitch probed yet", nil, []string{showNeverStarted}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := NewEvaluator(EvalConfig{})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Date(2024, 10, 28, 11, 1, 0, 0, time.UTC)
			e.Resume(Standing{Conditions: map[string]*datamodels.HealthEvent{"svc|service": e.ev(now.Add(-time.Hour), classNVSwitch, CheckService,
				"FM-SERVICE-FAILED", true, datamodels.RecommendedAction_RESTART_BM, "failed", e.nodeEntities(), nil)}}, now.Add(-time.Minute), true)
			for i, show := range tc.shows {
				s := NewSnapshot(now.Add(time.Duration(i) * 30 * time.Second))
				s.NVSwitchCount, s.NVSwitchPCIs = len(tc.switches), tc.switches
				s.Service = ParseSystemctlShow(show, time.UTC)
				for _, ev := range e.Evaluate(s) {
					if ev.CheckName == CheckService {
						t.Fatalf("poll %d: %s", i, shorts([]*datamodels.HealthEvent{ev}))
					}
				}
			}
		})
	}
}
