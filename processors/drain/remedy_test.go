package drain

import (
	"testing"
	"time"
)

// TestJoinKeepsTheStrongerRemedy: a drain has one result, so a fault
// joining it takes the trigger only when it asks for more: escalation to
// support over a replacement, over a bare-metal restart, over a VM
// restart, over diagnostics or a custom remediation. Before, every
// remediation but none and a GPU's reset ranked the same and the newest
// won: a CONTACT_SUPPORT node was rebooted for a RESTART_VM that joined
// it, and a REPLACE_VM joined by RUN_DCGMEUD (no template) was never
// remediated. A diagnostic or custom fault joining a reboot leaves the
// reboot: taking the trigger left the reboot never done (its fault seldom
// repeats), the lesser loss being the diagnostic.
func TestJoinKeepsTheStrongerRemedy(t *testing.T) {
	tr := func(action string) Trigger { return Trigger{CheckName: "chk-" + action, RecommendedAction: action} }
	custom := func(name string) Trigger {
		t := tr("CUSTOM")
		t.CustomAction = name
		return t
	}
	for _, tc := range []struct {
		name      string
		have, add Trigger
		want      Trigger
	}{
		{"RESTART_VM under CONTACT_SUPPORT", tr("CONTACT_SUPPORT"), tr("RESTART_VM"), tr("CONTACT_SUPPORT")},
		{"RUN_DCGMEUD under REPLACE_VM", tr("REPLACE_VM"), tr("RUN_DCGMEUD"), tr("REPLACE_VM")},
		{"RESTART_BM under REPLACE_VM", tr("REPLACE_VM"), tr("RESTART_BM"), tr("REPLACE_VM")},
		{"RESTART_VM under RESTART_BM", tr("RESTART_BM"), tr("RESTART_VM"), tr("RESTART_BM")},
		{"RUN_FIELDDIAG joining RESTART_VM: the reboot", tr("RESTART_VM"), tr("RUN_FIELDDIAG"), tr("RESTART_VM")},
		{"CUSTOM joining RESTART_VM: the reboot", tr("RESTART_VM"), custom("flash"), tr("RESTART_VM")},
		{"RUN_DCGMEUD joining RESTART_BM: the reboot", tr("RESTART_BM"), tr("RUN_DCGMEUD"), tr("RESTART_BM")},
		{"CUSTOM under CONTACT_SUPPORT", tr("CONTACT_SUPPORT"), custom("flash"), tr("CONTACT_SUPPORT")},
		{"REPLACE_VM over RESTART_VM", tr("RESTART_VM"), tr("REPLACE_VM"), tr("REPLACE_VM")},
		{"CONTACT_SUPPORT over REPLACE_VM", tr("REPLACE_VM"), tr("CONTACT_SUPPORT"), tr("CONTACT_SUPPORT")},
		{"RESTART_VM over RUN_DCGMEUD", tr("RUN_DCGMEUD"), tr("RESTART_VM"), tr("RESTART_VM")},
		{"RESTART_VM over COMPONENT_RESET", tr("COMPONENT_RESET"), tr("RESTART_VM"), tr("RESTART_VM")},
		{"NONE under RUN_DCGMEUD", tr("RUN_DCGMEUD"), tr("NONE"), tr("RUN_DCGMEUD")},
		{"another diagnostic keeps the drain's", tr("RUN_DCGMEUD"), tr("RUN_FIELDDIAG"), tr("RUN_DCGMEUD")},
		{"another custom keeps the drain's", custom("flash"), custom("reseat"), custom("flash")},
		{"the same remediation: the newest fault's", tr("RESTART_BM"), Trigger{CheckName: "other", RecommendedAction: "RESTART_BM"},
			Trigger{CheckName: "other", RecommendedAction: "RESTART_BM"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.have.join(tc.add); got.RecommendedAction != tc.want.RecommendedAction ||
				got.CustomAction != tc.want.CustomAction || got.CheckName != tc.want.CheckName {
				t.Fatalf("join = %s/%s (%s), want %s/%s (%s)", got.RecommendedAction, got.CustomAction, got.CheckName,
					tc.want.RecommendedAction, tc.want.CustomAction, tc.want.CheckName)
			}
		})
	}
}

// TestCoveredByAStrongerRemedy: a fault generated or decided before a
// drain finished is covered by it when the drain asked for as much as
// the fault or more (the trigger the fault would have left, had it joined
// the drain a moment earlier); one that asks for more starts a drain of
// its own. Before, only the same remediation was covered: a RESTART_VM
// repeat after a CONTACT_SUPPORT drain drained the node again and had
// the escalated node rebooted. A reboot covers no diagnostic or custom
// fault (a CUSTOM flash after a RESTART_VM drain was answered "covered"
// and never done).
func TestCoveredByAStrongerRemedy(t *testing.T) {
	drained := func(action string) *State {
		return &State{ID: "old", Phase: PhaseSucceeded, FinishedAt: t0, Trigger: Trigger{RecommendedAction: action},
			Seen: []string{"e1"}, Pods: map[string]*PodState{}}
	}
	fault := func(action string) opts {
		return opts{trig: Trigger{CheckName: "c", RecommendedAction: action}, already: true, decidedAt: t0.Add(-time.Second)}
	}
	for _, tc := range []struct {
		name       string
		have, add  string
		wantCovers bool
	}{
		{"RESTART_VM after CONTACT_SUPPORT", "CONTACT_SUPPORT", "RESTART_VM", true},
		{"RUN_DCGMEUD after REPLACE_VM", "REPLACE_VM", "RUN_DCGMEUD", true},
		{"NONE after RESTART_VM", "RESTART_VM", "NONE", true},
		{"COMPONENT_RESET after RESTART_BM", "RESTART_BM", "COMPONENT_RESET", true},
		{"the same", "RESTART_VM", "RESTART_VM", true},
		{"REPLACE_VM after RESTART_VM", "RESTART_VM", "REPLACE_VM", false},
		{"CONTACT_SUPPORT after REPLACE_VM", "REPLACE_VM", "CONTACT_SUPPORT", false},
		{"RUN_FIELDDIAG after RUN_DCGMEUD", "RUN_DCGMEUD", "RUN_FIELDDIAG", false},
		{"RESTART_VM after COMPONENT_RESET", "COMPONENT_RESET", "RESTART_VM", false},
		{"CUSTOM after RESTART_VM", "RESTART_VM", "CUSTOM", false},
		{"RUN_FIELDDIAG after RESTART_VM", "RESTART_VM", "RUN_FIELDDIAG", false},
		{"RUN_DCGMEUD after RESTART_BM", "RESTART_BM", "RUN_DCGMEUD", false},
		{"CUSTOM after CONTACT_SUPPORT", "CONTACT_SUPPORT", "CUSTOM", true},
		{"COMPONENT_RESET after RESTART_VM", "RESTART_VM", "COMPONENT_RESET", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := drained(tc.have).covers(fault(tc.add)); got != tc.wantCovers {
				t.Fatalf("covers = %v, want %v", got, tc.wantCovers)
			}
		})
	}
}
