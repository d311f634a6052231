package quarantine

import (
	"fmt"
	"time"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// staleAge reports how long ago the gateway received the item's event,
// when that is more than Config.MaxEventAge and the event would otherwise
// be acted on: an unhealthy event (a recovery lifts whatever its age) that
// is not STORE_ONLY or STORE_AND_ANALYSE (recorded as such). The age is
// the control plane's (the gateway's receivedTimestamp against this
// processor's clock), never an agent's: a spooled fault sent late has a
// fresh received time. An event without one (an older record) is not
// compared, nor is anything when MaxEventAge is 0. Asked of the events
// consumer's records only, when first read (handleSeq): what the retry
// consumer reads was held, not replayed.
func (h *Handler) staleAge(it item, now time.Time) (time.Duration, bool) {
	if h.cfg.MaxEventAge <= 0 || it.ev.GetIsHealthy() || events.NeverActs(it.ev) {
		return 0, false
	}
	rt := it.ev.GetReceivedTimestamp()
	if rt == nil || !rt.IsValid() {
		return 0, false
	}
	age := now.Sub(rt.AsTime())
	return age, age > h.cfg.MaxEventAge
}

// staleSkip is the action of a stale event: recorded, counted, nothing
// changed on the node (the store role has stored it as any other).
func (h *Handler) staleSkip(it item, age time.Duration, cl *clusters.Client) *faultlinev1.Action {
	h.m.stale.WithLabelValues(it.cluster).Inc()
	return h.action(it, events.KindQuarantine, events.OutcomeSkipped, fmt.Sprintf(
		"event received at %s, %s ago: older than quarantine.max_event_age (%s), a stale event (a replayed or long-delayed record), not acted on",
		it.ev.GetReceivedTimestamp().AsTime().UTC().Format(time.RFC3339Nano), age.Round(time.Second), h.cfg.MaxEventAge), "", cl)
}

// logStale says once per batch what it did not act on for its age, so an
// operator who wants such events acted on knows to raise the age.
func (h *Handler) logStale(s *pipeline.Stale, retry bool) {
	s.Log(h.log, "stale events not acted on: received longer ago than quarantine.max_event_age (raise it to act on them)",
		"max_event_age", h.cfg.MaxEventAge, "retry", retry)
}
