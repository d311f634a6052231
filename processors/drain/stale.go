package drain

import (
	"fmt"
	"time"

	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/requeue"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// staleAge reports how long ago the trigger's quarantine was decided (the
// action's timestamp: the quarantine role's clock), when the trigger is
// read for the first time — not a drain in progress coming back through
// TopicRequeue, which goes on whatever its age (an AllowCompletion drain
// may run for completion_timeout) — and that is more than MaxTriggerAge.
// A trigger without a timestamp is not compared, nor is anything when
// MaxTriggerAge is 0.
func (h *Handler) staleAge(t trigger, now time.Time) (time.Duration, bool) {
	ts := t.src.GetTimestamp()
	if h.cfg.MaxTriggerAge <= 0 || requeue.Attempt(t.rec) > 0 || ts == nil || !ts.IsValid() {
		return 0, false
	}
	age := now.Sub(ts.AsTime())
	return age, age > h.cfg.MaxTriggerAge
}

// staleSkip is the action of a stale trigger: recorded and counted; no
// drain started or joined, nothing read or written on the node.
func (h *Handler) staleSkip(t trigger, age time.Duration) *faultlinev1.Action {
	h.m.staleTriggers.WithLabelValues(t.cluster).Inc()
	return h.action(t, nil, events.OutcomeSkipped, fmt.Sprintf(
		"quarantine decided at %s, %s ago: older than drain.max_trigger_age (%s), a stale trigger (a replayed or long-delayed record), not acted on",
		t.src.GetTimestamp().AsTime().UTC().Format(time.RFC3339Nano), age.Round(time.Second), h.cfg.MaxTriggerAge),
		pipeline.ActionID(t.cluster, t.node, t.eventID, "stale"))
}

// logStale says once per batch what it did not act on for its age, so an
// operator who wants such quarantines drained knows to raise the age.
func (h *Handler) logStale(s *pipeline.Stale) {
	s.Log(h.log, "stale triggers not acted on: quarantines decided longer ago than drain.max_trigger_age (raise it to drain them)",
		"max_trigger_age", h.cfg.MaxTriggerAge)
}
