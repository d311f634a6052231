package correlate

import (
	"testing"
	"time"
)

// TestLateTriggersAfterRecovery: a recovery's time is the sweep's clock, a
// trigger's its agent's generatedTimestamp; events generated before a
// recovery that arrive after it (a spool replayed, an agent's clock
// behind) are judged just after the recovery, with themselves in the
// window: they start a verdict where the window then holds, and nothing
// where it does not (an event stored before the recovery, resent).
func TestLateTriggersAfterRecovery(t *testing.T) {
	s := server(t)
	m, h := time.Minute, time.Hour
	for _, tc := range []struct {
		name  string
		steps func(c string) []step
	}{
		{"two late Xid 31 in one batch", func(c string) []step {
			return []step{
				{evs: evs(xid(c, "n1", 0, 31, false, 1)), want: none},
				{evs: evs(xid(c, "n1", 1*h, 31, false, 1)), want: "RepeatedXID31OnSameGPU:fault"},
				{sweep: 26 * h, want: "RepeatedXID31OnSameGPU:recovery"},
				{evs: evs(xid(c, "n1", 25*h+50*m, 31, false, 1), xid(c, "n1", 25*h+55*m, 31, false, 1)), want: "RepeatedXID31OnSameGPU:fault"},
				{sweep: 27 * h, want: none},
				{sweep: 50 * h, want: "RepeatedXID31OnSameGPU:recovery"},
			}
		}},
		{"late Xid 31 one per batch", func(c string) []step {
			return []step{
				{evs: evs(xid(c, "n1", 0, 31, false, 1)), want: none},
				{evs: evs(xid(c, "n1", 1*h, 31, false, 1)), want: "RepeatedXID31OnSameGPU:fault"},
				{sweep: 26 * h, want: "RepeatedXID31OnSameGPU:recovery"},
				{evs: evs(xid(c, "n1", 25*h+50*m, 31, false, 1)), want: none},
				{evs: evs(xid(c, "n1", 25*h+55*m, 31, false, 1)), want: "RepeatedXID31OnSameGPU:fault"},
			}
		}},
		{"an event counted before the recovery, resent after it", func(c string) []step {
			first, second := xid(c, "n1", 0, 31, false, 1), xid(c, "n1", 1*h, 31, false, 1)
			first.Id, second.Id = nextID(), nextID() // resent under the same ids
			return []step{
				{evs: evs(first), want: none},
				{evs: evs(second), want: "RepeatedXID31OnSameGPU:fault"},
				{sweep: 26 * h, want: "RepeatedXID31OnSameGPU:recovery"},
				{evs: evs(first, second), want: none},
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster("late")
			hs := newHarness(t, s, DefaultRules, nil)
			hs.cluster = c
			runSteps(t, hs, tc.steps(c))
		})
	}
}

// TestLateTriggerRetriedBatch: a batch of late triggers whose verdict
// failed to be produced is retried: it derives the same verdict again
// (not its own unproduced verdict taken for standing).
func TestLateTriggerRetriedBatch(t *testing.T) {
	s := server(t)
	m, h := time.Minute, time.Hour
	c := newCluster("late")
	hs := newHarness(t, s, DefaultRules, nil)
	hs.cluster = c
	runSteps(t, hs, []step{
		{evs: evs(xid(c, "n1", 0, 31, false, 1)), want: none},
		{evs: evs(xid(c, "n1", 1*h, 31, false, 1)), want: "RepeatedXID31OnSameGPU:fault"},
		{sweep: 26 * h, want: "RepeatedXID31OnSameGPU:recovery"},
	})
	recs := records(t, evs(xid(c, "n1", 25*h+50*m, 31, false, 1), xid(c, "n1", 25*h+55*m, 31, false, 1)))
	first := hs.handle(recs) // its outputs fail to be produced
	retried := hs.storeDerived(recs, hs.handle(recs))
	if len(first) != 1 || len(retried) != 1 {
		t.Fatalf("derived %d, then %d on the retry; want the verdict each time", len(first), len(retried))
	}
	if got := describe(retried); got != "RepeatedXID31OnSameGPU:fault" {
		t.Fatalf("retry derived %q", got)
	}
	if want, got := mustUnmarshal(t, first[0].Value).GetId(), retried[0].GetId(); got != want {
		t.Fatalf("retry derived id %s, want the first try's %s", got, want)
	}
}
