package fabric

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
)

// sharedA100 is a snapshot of an HGX A100 in Shared NVSwitch mode at now:
// its nvswitch-audit matrix, and its active partitions when fmpm is given
// ("" : fmpm -l gave nothing).
func sharedA100(t *testing.T, now time.Time, fmpm string) *Snapshot {
	t.Helper()
	s := NewSnapshot(now)
	s.NVSwitchCount = 6
	s.Config = ParseFMConfig(testdata(t, "config/a100-shared.cfg"))
	s.SMI = ParseSMI(testdata(t, "smi/a100-535-layout.txt"))
	a, err := ParseAudit(testdata(t, "audit/a100-partitions-csv.txt"))
	if err != nil {
		t.Fatal(err)
	}
	s.Audit = a
	if fmpm != "" {
		p, err := ParsePartitions(testdata(t, fmpm))
		if err != nil {
			t.Fatal(err)
		}
		s.Partitions = p
	}
	return s
}

// TestAuditPartitionsUnknown: in Shared NVSwitch / vGPU mode the zeros of
// nvswitch-audit's matrix between GPUs of different partitions are normal;
// without fmpm's partition list (fmpm missing or failing) the agent cannot
// tell them from missing routes, and does not report every GPU
// unreachable. An isolation breach found while the partitions were known
// stands meanwhile.
func TestAuditPartitionsUnknown(t *testing.T) {
	const breach4, breach8 = "NVSwitchReachability:NVSWITCH-ROUTING-ISOLATION-BREACH:fatal@physical:4", "NVSwitchReachability:NVSWITCH-ROUTING-ISOLATION-BREACH:fatal@physical:8"
	for _, tc := range []struct {
		name  string
		fmpm  []string
		wants []string
	}{
		{"partitions never known", []string{"", ""}, []string{"", ""}},
		{"breach found, then partitions unknown", []string{"fmpm/a100-shared-degraded.json", "", "fmpm/a100-shared-degraded.json"},
			[]string{breach4 + " " + breach8, "", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := NewEvaluator(EvalConfig{})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Date(2024, 10, 28, 12, 0, 0, 0, time.UTC)
			for i, f := range tc.fmpm {
				now = now.Add(10 * time.Minute)
				if got := shortsOf(e.Evaluate(sharedA100(t, now, f)), CheckReach); got != tc.wants[i] {
					t.Fatalf("snapshot %d: %q\nwant %q", i, got, tc.wants[i])
				}
			}
		})
	}
}

// TestFMPMFailureIsReported: in Shared NVSwitch mode a failing fmpm -l
// fails the check (faultline_agent_check_success 0, the runner logs it);
// an fmpm that is not installed is logged as a warning, once an hour.
func TestFMPMFailureIsReported(t *testing.T) {
	var logs bytes.Buffer
	n := h100Node(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	n.healthy()
	n.write("fabricmanager.cfg", testdata(t, "config/a100-shared.cfg"))
	n.r.err["fmpm -l"] = errors.New("exit status 1")
	if _, err := n.c.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "fmpm -l") {
		t.Fatalf("fmpm failing: check error %v, want fmpm's", err)
	}
	delete(n.r.err, "fmpm -l")
	for i, advance := range []time.Duration{time.Minute, time.Minute, time.Hour} {
		n.poll(advance)
		if got, want := strings.Count(logs.String(), "fmpm not installed"), []int{1, 1, 2}[i]; got != want {
			t.Fatalf("poll %d: %d warnings of fmpm, want %d:\n%s", i, got, want, logs.String())
		}
	}
}

// TestAuditPartitionsUnknownKeepsFaults: a route fault within an active
// partition (GPUs 1 and 2 of partition 7 not routed to each other) found
// while the partitions were known stands while they are not (fmpm failing
// once): it is neither reported healthy nor raised again, so the node's
// quarantine does not flap.
func TestAuditPartitionsUnknownKeepsFaults(t *testing.T) {
	const (
		breach4  = "NVSwitchReachability:NVSWITCH-ROUTING-ISOLATION-BREACH:fatal@physical:4"
		breach8  = "NVSwitchReachability:NVSWITCH-ROUTING-ISOLATION-BREACH:fatal@physical:8"
		missing1 = "NVSwitchReachability:NVSWITCH-ROUTING-UNREACHABLE:fatal@physical:1"
		missing2 = "NVSwitchReachability:NVSWITCH-ROUTING-UNREACHABLE:fatal@physical:2"
	)
	e, err := NewEvaluator(EvalConfig{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2024, 10, 28, 12, 0, 0, 0, time.UTC)
	for i, f := range []string{"fmpm/a100-shared-degraded.json", "", "fmpm/a100-shared-degraded.json"} {
		now = now.Add(10 * time.Minute)
		s := sharedA100(t, now, f)
		s.Audit.Links[[2]int{1, 2}], s.Audit.Links[[2]int{2, 1}] = 0, 0
		var want []string
		if i == 0 {
			want = []string{breach4, breach8, missing1, missing2}
		}
		evs := e.Evaluate(s)
		got := strings.Fields(shortsOf(evs, CheckReach))
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("snapshot %d: %q\nwant %q", i, got, want)
		}
	}
}

// TestFMPMFailsWithFMStopped: fmpm -l gets its list from FM; while FM is
// stopped (FM-SERVICE-FAILED reported) its failure does not fail the
// check as well.
func TestFMPMFailsWithFMStopped(t *testing.T) {
	n := h100Node(t, nil)
	n.healthy()
	n.write("fabricmanager.cfg", testdata(t, "config/a100-shared.cfg"))
	n.r.out["systemctl show"] = showFailed
	n.r.err["fmpm -l"] = errors.New("exit status 1")
	if _, err := n.c.Check(context.Background()); err != nil {
		t.Fatalf("FM stopped, fmpm failing: check error %v, want none", err)
	}
	n.r.out["systemctl show"] = showActive
	if _, err := n.c.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "fmpm -l") {
		t.Fatalf("FM running, fmpm failing: check error %v, want fmpm's", err)
	}
}
