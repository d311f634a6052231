package fabric

import (
	"testing"
	"time"
)

const (
	// showNeverStarted: the unit has not been started this boot (systemd
	// keeps no timestamp of it).
	showNeverStarted   = "Id=nvidia-fabricmanager.service\nLoadState=loaded\nActiveState=inactive\nSubState=dead\nResult=success\nMainPID=0\nActiveEnterTimestamp=\nInactiveExitTimestamp=\n"
	showNeverStartedNA = "Id=nvidia-fabricmanager.service\nLoadState=loaded\nActiveState=inactive\nSubState=dead\nResult=success\nMainPID=0\nActiveEnterTimestamp=n/a\nInactiveExitTimestamp=n/a\n"
	// showStopped: started this boot, then stopped.
	showStopped = "Id=nvidia-fabricmanager.service\nLoadState=loaded\nActiveState=inactive\nSubState=dead\nResult=success\nMainPID=0\nActiveEnterTimestamp=Mon 2024-10-28 10:28:30 UTC\nInactiveExitTimestamp=Mon 2024-10-28 10:28:29 UTC\n"
	// showAutoRestart: Restart= is waiting to start the failed unit again.
	showAutoRestart = "Id=nvidia-fabricmanager.service\nLoadState=loaded\nActiveState=activating\nSubState=auto-restart\nResult=exit-code\nMainPID=0\nActiveEnterTimestamp=\nInactiveExitTimestamp=Mon 2024-10-28 10:29:00 UTC\n"
	showStarting    = "Id=nvidia-fabricmanager.service\nLoadState=loaded\nActiveState=activating\nSubState=start\nResult=success\nMainPID=0\nActiveEnterTimestamp=\nInactiveExitTimestamp=Mon 2024-10-28 10:29:00 UTC\n"
)

// TestServiceAutoRestart: a unit that Restart= keeps starting again after
// it failed (activating/auto-restart) keeps its failure standing until it
// runs again, instead of alternating fatal/healthy every poll.
func TestServiceAutoRestart(t *testing.T) {
	const (
		failed  = "FabricManagerService:FM-SERVICE-FAILED:fatal@0000:05:00.0"
		healthy = "FabricManagerService::healthy@0000:05:00.0"
	)
	type step struct {
		show, want string
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"auto-restart loop stays failed", []step{
			{showFailed, failed}, {showAutoRestart, ""}, {showFailed, ""}, {showAutoRestart, ""}, {showStarting, ""}, {showActive, healthy}}},
		{"auto-restart, then stopped: inactive replaces failed", []step{
			{showFailed, failed}, {showAutoRestart, ""}, {showStopped, "FabricManagerService:FM-SERVICE-INACTIVE:fatal@0000:05:00.0"}}},
		{"activating with nothing standing", []step{{showAutoRestart, ""}, {showActive, ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := h100Node(t, nil)
			for i, st := range tc.steps {
				n.r.out["systemctl show"] = st.show
				if got := shorts(n.poll(30 * time.Second)); got != st.want {
					t.Fatalf("poll %d: %q\nwant %q", i, got, st.want)
				}
			}
		})
	}
}
