package fabric

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestAuditFailureFailsCheck: nvswitch-audit failing (exit status,
// timeout) while FM runs fails the check, as fmpm's failure does; it was
// dropped, and the reachability matrix went unchecked without a word.
// Conditions the last good audit found stand: none is lifted because the
// audit could not run, none is raised. While FM is stopped (the service
// conditions report it) its failure does not fail the check as well.
func TestAuditFailureFailsCheck(t *testing.T) {
	n := h100Node(t, nil)
	n.healthy()
	n.r.out["nvswitch-audit"] = testdata(t, "audit/a100-degraded.txt")
	if got := shortsOf(n.poll(0), CheckReach); !strings.Contains(got, "NVSWITCH-ROUTING-UNREACHABLE:fatal") {
		t.Fatalf("first poll: reachability events %q, want GPUs 6 and 7 unreachable", got)
	}
	evs := n.poll(0) // nothing new: the audit runs once per topology interval
	if got := shortsOf(evs, CheckReach); got != "" {
		t.Fatalf("second poll: %q", got)
	}
	first := n.r.called("nvswitch-audit")
	if first == 0 {
		t.Fatal("nvswitch-audit not run")
	}
	check := func(name, wantErr string) {
		t.Helper()
		n.now = n.now.Add(11 * time.Minute)
		evs, err := n.c.Check(context.Background())
		if wantErr == "" && err != nil {
			t.Fatalf("%s: check error %v, want none", name, err)
		}
		if wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)) {
			t.Fatalf("%s: check error %v, want %q", name, err, wantErr)
		}
		if got := shortsOf(evs, CheckReach); got != "" {
			t.Fatalf("%s: reachability events %q, want none (the last audit's conditions stand)", name, got)
		}
	}
	n.r.err["nvswitch-audit"] = errors.New("exit status 1")
	check("audit failing, FM running", "nvswitch-audit")
	n.r.err["nvswitch-audit"] = context.DeadlineExceeded
	check("audit timing out, FM running", "nvswitch-audit")
	n.r.out["systemctl show"] = showFailed
	check("audit failing, FM stopped", "")
	if got := n.r.called("nvswitch-audit"); got != first+3 {
		t.Fatalf("nvswitch-audit ran %d times, want %d", got, first+3)
	}
}
