package drain

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/requeue"
	"github.com/faultline/faultline/schemas/events"
)

// TestStaleTriggers: a quarantine first read longer than
// drain.max_trigger_age after it was decided (a replay of the actions
// topic, a long delay) starts no drain: one skipped action, nothing asked
// of the cluster; a drain in progress (its requeued record) goes on
// whatever its age; a trigger without a timestamp is not compared; 0 is
// no limit.
func TestStaleTriggers(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	requeued := func(r *kgo.Record) *kgo.Record {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: requeue.HeaderAttempt, Value: []byte("3")})
		return r
	}
	for _, tc := range []struct {
		name   string
		maxAge time.Duration
		rec    *kgo.Record
		stale  bool
	}{
		{"decided a minute ago", 6 * time.Hour, decidedAt(quarantineAction("n1", "e1", "RESTART_VM", nil), now.Add(-time.Minute)), false},
		{"decided 3 days ago (a replay)", 6 * time.Hour, decidedAt(quarantineAction("n1", "e1", "RESTART_VM", nil), now.Add(-72*time.Hour)), true},
		{"just past the age", 6 * time.Hour, decidedAt(quarantineAction("n1", "e1", "RESTART_VM", nil), now.Add(-6*time.Hour-time.Second)), true},
		{"exactly at the age", 6 * time.Hour, decidedAt(quarantineAction("n1", "e1", "RESTART_VM", nil), now.Add(-6*time.Hour)), false},
		{"a drain in progress, requeued", 6 * time.Hour, requeued(decidedAt(quarantineAction("n1", "e1", "RESTART_VM", nil), now.Add(-20*time.Hour))), false},
		{"no timestamp", 6 * time.Hour, quarantineAction("n1", "e1", "RESTART_VM", nil), false},
		{"no limit", 0, decidedAt(quarantineAction("n1", "e1", "RESTART_VM", nil), now.Add(-72*time.Hour)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxTriggerAge = tc.maxAge
			h, err := New(cfg, clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			a, err := events.UnmarshalAction(tc.rec.Value)
			if err != nil {
				t.Fatal(err)
			}
			tr := trigger{rec: tc.rec, src: a, cluster: cluster, node: "n1", eventID: "e1"}
			if _, stale := h.staleAge(tr, now); stale != tc.stale {
				t.Fatalf("stale %v, want %v", stale, tc.stale)
			}
			if !tc.stale {
				return
			}
			// The whole batch: one skipped action, no requeue, the
			// cluster (not configured here) never asked.
			acts, rq := handle(t, h, tc.rec)
			if len(acts) != 1 || acts[0].Outcome != events.OutcomeSkipped || len(rq) != 0 {
				t.Fatalf("actions %s, %d requeued; want one skipped", outcomes(acts), len(rq))
			}
		})
	}
}
