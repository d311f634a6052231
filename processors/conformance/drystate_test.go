package conformance

import (
	"testing"
	"time"

	"github.com/faultline/faultline/schemas/events"
)

func TestFoldDry(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	s0, s1 := t0.Format(time.RFC3339), t0.Add(48*time.Hour).Format(time.RFC3339)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	drift := func(node, since, actual string, d time.Duration) dryAction {
		return dryAction{node: node, kind: events.KindConformanceDrift, outcome: events.OutcomeDryRun, at: at(d),
			since: since, expected: "exp", actual: actual, group: "c/h100"}
	}
	act := func(node, kind, outcome, since string, d time.Duration) dryAction {
		return dryAction{node: node, kind: kind, outcome: outcome, at: at(d), since: since, group: "c/h100"}
	}
	tests := []struct {
		name string
		acts []dryAction
		want map[string]State
	}{
		{"a drift", []dryAction{drift("n", s0, "a1", 0)},
			map[string]State{"n": {Since: t0, Group: "h100", Expected: "exp", Actual: "a1"}}},
		{"pool-less group", []dryAction{{node: "n", kind: events.KindConformanceDrift, at: t0, since: s0, expected: "e", actual: "a", group: "c"}},
			map[string]State{"n": {Since: t0, Group: "cluster", Expected: "e", Actual: "a"}}},
		{"hardware groups: the pool is the group value", []dryAction{
			{node: "n", kind: events.KindConformanceDrift, at: t0, since: s0, expected: "e", actual: "a", group: "c/h100{nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3}"},
			{node: "m", kind: events.KindConformanceDrift, at: t0, since: s0, expected: "e", actual: "a", group: "c{nvidia.com/gpu.machine=DGX-H100}"}},
			map[string]State{"n": {Since: t0, Group: "h100", Expected: "e", Actual: "a"}, "m": {Since: t0, Group: "cluster", Expected: "e", Actual: "a"}}},
		{"sensitive: drained and escalated, recorded in one sweep (same time, any order)", []dryAction{
			act("n", events.KindEscalate, events.OutcomeDryRun, s0, 0), act("n", events.KindConformanceDrain, events.OutcomeDryRun, s0, 0), drift("n", s0, "a1", 0)},
			map[string]State{"n": {Since: t0, Group: "h100", Expected: "exp", Actual: "a1", Sensitive: true, Drained: true, Escalated: true}}},
		{"another fingerprint of the same drift keeps its flags", []dryAction{
			drift("n", s0, "a1", 0), act("n", events.KindConformanceDrain, events.OutcomeDryRun, s0, 0), drift("n", s0, "a2", time.Hour)},
			map[string]State{"n": {Since: t0, Group: "h100", Expected: "exp", Actual: "a2", Sensitive: true, Drained: true}}},
		{"awaiting approval", []dryAction{
			drift("n", s0, "a1", 0), act("n", events.KindConformanceDrain, events.OutcomeDryRun, s0, 0),
			act("n", events.KindConformanceUndrain, events.OutcomeInProgress, s0, time.Hour)},
			map[string]State{"n": {Since: t0, Group: "h100", Expected: "exp", Actual: "a1", Sensitive: true, Drained: true, Awaiting: true}}},
		{"drifted again while awaiting: a new fingerprint, no longer awaiting", []dryAction{
			drift("n", s0, "a1", 0), act("n", events.KindConformanceDrain, events.OutcomeDryRun, s0, 0),
			act("n", events.KindConformanceUndrain, events.OutcomeInProgress, s0, time.Hour), drift("n", s0, "a3", 2*time.Hour)},
			map[string]State{"n": {Since: t0, Group: "h100", Expected: "exp", Actual: "a3", Sensitive: true, Drained: true, Resumed: 1}}},
		{"drifted again while awaiting, to the same fingerprint, then awaiting again", []dryAction{
			drift("n", s0, "a1", 0), act("n", events.KindConformanceDrain, events.OutcomeDryRun, s0, 0),
			act("n", events.KindConformanceUndrain, events.OutcomeInProgress, s0, time.Hour), drift("n", s0, "a1", 2*time.Hour),
			act("n", events.KindConformanceUndrain, events.OutcomeInProgress, s0, 3*time.Hour)},
			map[string]State{"n": {Since: t0, Group: "h100", Expected: "exp", Actual: "a1", Sensitive: true, Drained: true, Awaiting: true, Resumed: 1}}},
		{"restored: no state", []dryAction{
			drift("n", s0, "a1", 0), act("n", events.KindEscalate, events.OutcomeDryRun, s0, 25*time.Hour),
			act("n", events.KindConformanceRestored, events.OutcomeDryRun, s0, 26*time.Hour)},
			map[string]State{}},
		{"a later drift after a return starts afresh", []dryAction{
			drift("n", s0, "a1", 0), act("n", events.KindEscalate, events.OutcomeDryRun, s0, 25*time.Hour),
			act("n", events.KindConformanceRestored, events.OutcomeDryRun, s0, 26*time.Hour), drift("n", s1, "a4", 48*time.Hour)},
			map[string]State{"n": {Since: t0.Add(48 * time.Hour), Group: "h100", Expected: "exp", Actual: "a4"}}},
		{"another drift's actions are stale", []dryAction{
			act("n", events.KindConformanceDrain, events.OutcomeDryRun, s0, 0), drift("n", s1, "a4", 48*time.Hour),
			act("n", events.KindEscalate, events.OutcomeDryRun, s0, 49*time.Hour), act("n", events.KindConformanceRestored, events.OutcomeDryRun, s0, 50*time.Hour),
			act("m", events.KindEscalate, events.OutcomeDryRun, s0, 0)},
			map[string]State{"n": {Since: t0.Add(48 * time.Hour), Group: "h100", Expected: "exp", Actual: "a4"}}},
		{"an unreadable start is skipped", []dryAction{drift("n", "yesterday", "a1", 0), drift("m", s0, "a1", 0)},
			map[string]State{"m": {Since: t0, Group: "h100", Expected: "exp", Actual: "a1"}}},
		{"nodes apart", []dryAction{drift("n", s0, "a1", 0), drift("m", s1, "a2", 0), act("m", events.KindEscalate, events.OutcomeDryRun, s1, time.Hour)},
			map[string]State{"n": {Since: t0, Group: "h100", Expected: "exp", Actual: "a1"},
				"m": {Since: t0.Add(48 * time.Hour), Group: "h100", Expected: "exp", Actual: "a2", Escalated: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := foldDry("c", tt.acts)
			if len(got) != len(tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			for node, w := range tt.want {
				g, ok := got[node]
				if !ok || !g.Since.Equal(w.Since) {
					t.Fatalf("%s: got %+v, want %+v", node, g, w)
				}
				g.Since = w.Since
				if g != w {
					t.Fatalf("%s: got %+v, want %+v", node, g, w)
				}
			}
		})
	}
}
