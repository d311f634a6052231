package quarantine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// item is one decoded record.
type item struct {
	rec     *kgo.Record
	ev      *datamodels.HealthEvent
	cluster string
	node    string
	// ignored says which overrides of the event were ignored and why
	// (its submitter is not an operator); every action of the event says so.
	ignored string
}

type seqResult struct {
	actions  []*faultlinev1.Action
	deferred []item
	failed   error
	// applied: each retry record applied, with its actions.
	applied map[string][]*faultlinev1.Action
}

// retriedActions are a retry record's actions kept for its batch's redo.
type retriedActions struct {
	acts []*faultlinev1.Action
	at   time.Time
}

// recordKey names a record by its place in the log.
func recordKey(r *kgo.Record) string {
	return fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset)
}

// keepRetried keeps the actions of a failed retry batch's applied records
// for its redo; kept actions older than an hour (a batch this replica no
// longer redoes: its partition moved) are dropped.
func (h *Handler) keepRetried(results []seqResult) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	for k, r := range h.retried {
		if now.Sub(r.at) > time.Hour {
			delete(h.retried, k)
		}
	}
	for _, r := range results {
		for k, acts := range r.applied {
			h.retried[k] = retriedActions{acts: acts, at: now}
		}
	}
}

// takeRetried returns (and forgets) the kept actions of a retry record.
func (h *Handler) takeRetried(r *kgo.Record) ([]*faultlinev1.Action, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := recordKey(r)
	kept, ok := h.retried[k]
	delete(h.retried, k)
	return kept.acts, ok
}

// Handle handles a batch of the events topic.
func (h *Handler) Handle(ctx context.Context, recs []*kgo.Record) (pipeline.Result, error) {
	return h.handle(ctx, recs, false)
}

// HandleRetry handles a batch of the retry topics: it waits for each
// cluster up to Config.RetryWait and fails the batch (to be retried) while
// one is down — a batch of one cluster's RetryTopic, held by the pipeline
// while the other clusters' go on.
func (h *Handler) HandleRetry(ctx context.Context, recs []*kgo.Record) (pipeline.Result, error) {
	return h.handle(ctx, recs, true)
}

// RetryHandler returns HandleRetry as a pipeline.Handler.
func (h *Handler) RetryHandler() pipeline.Handler { return pipeline.HandlerFunc(h.HandleRetry) }

func (h *Handler) handle(ctx context.Context, recs []*kgo.Record, retry bool) (pipeline.Result, error) {
	evs, dead := pipeline.DecodeEvents(recs)
	items := make([]item, len(evs))
	for i, e := range evs {
		it := item{rec: e.Rec, ev: e.Event, cluster: e.Cluster, node: e.Node, ignored: gateOverrides(e.Event)}
		if it.ignored != "" {
			h.m.overridesIgnored.WithLabelValues(it.cluster).Inc()
			h.log.Warn("overrides ignored: not sent by an operator", "cluster", it.cluster, "node", it.node,
				"event", it.ev.GetId(), "submitter", it.ev.GetSubmitter().GetName(), "ignored", it.ignored)
		}
		items[i] = it
	}
	wait := h.cfg.ClusterWait
	if retry {
		wait = h.cfg.RetryWait
	}
	deadline := time.Now().Add(wait)
	var stale pipeline.Stale // the records not acted on for their age (staleAge)
	fast := h.whileFast(ctx, retry)
	defer fast.Stop()
	results := pipeline.ByKey(items, func(it item) string { return string(it.rec.Key) }, h.cfg.Workers,
		func(seq []item) seqResult { return h.handleSeq(ctx, seq, retry, deadline, &stale, fast) })
	res := pipeline.Result{Dead: dead}
	var (
		failed []error
		acts   []*faultlinev1.Action
	)
	for _, r := range results {
		if r.failed != nil && !slices.ContainsFunc(failed, func(e error) bool { return e.Error() == r.failed.Error() }) {
			failed = append(failed, r.failed) // the nodes waiting on one cluster share its error
		}
		acts = append(acts, r.actions...)
		for _, a := range r.actions {
			rec, err := pipeline.ActionRecord(a)
			if err != nil {
				return pipeline.Result{}, err
			}
			res.Out = append(res.Out, rec)
		}
		for _, it := range r.deferred {
			res.Out = append(res.Out, retryRecord(it.cluster, it.rec))
			h.m.deferred.WithLabelValues(it.cluster).Inc()
		}
	}
	h.logStale(&stale, retry)
	if len(failed) > 0 {
		h.keepRetried(results)
		return pipeline.Result{}, fmt.Errorf("quarantine retry batch: %w", errors.Join(failed...))
	}
	if ids := unsaidIDs(acts); len(ids) > 0 {
		res.Produced = func() { h.track(ids, true) } // resay only removes them from their nodes
	}
	return res, nil
}

// handleSeq handles one node's records in order (stale ones, counted in
// stale, recorded without acting: staleAge), each other through
// clusters.Registry.Try. A cluster in trouble is waited for until
// deadline (clusters.Gate.Wait: one that cannot be reached is probed, not
// waited for); past it (or when the batch runs out of time) the node's
// remaining records are deferred to RetryTopic (deferRest), or, in the
// retry consumer, the batch fails to be retried. A record is judged stale
// once, when first read from the events topic: what the retry consumer
// reads was fresh when deferred and held for its cluster since — an API
// server down for longer than max_event_age must still get its faults
// cordoned once it answers, or their nodes stay in service (a GPU off
// the bus reports once).
//
// A cluster that turns slow while the batch works for it (the events
// consumer, beside other clusters: whileFast) has its requests in flight
// abandoned and its records deferred as a slow cluster's are, the batch
// not held by it.
func (h *Handler) handleSeq(ctx context.Context, items []item, retry bool, deadline time.Time, stale *pipeline.Stale, fast *clusters.FastContexts) seqResult {
	var r seqResult
	cluster := items[0].cluster
	cl, err := h.reg.Get(cluster)
	switch {
	case errors.Is(err, clusters.ErrUnknownCluster):
		cl = nil // decided and recorded as dry-run
	case err != nil:
		// A kubeconfig that cannot be loaded: the cluster's trouble.
		h.log.Warn("cluster client unavailable", "cluster", cluster, "err", err)
		if retry {
			r.failed = err
			return r
		}
		h.markDeferring(cluster)
		h.deferRest(&r, items, cl, stale)
		return r
	}
	live := cl != nil && cl.Kube != nil
	if live && !retry && h.retries != nil && h.retries.waits(items[0].rec.Key) {
		// An older record of this node waits on a retry topic (deferred by
		// any replica): this one goes behind it.
		h.deferRest(&r, items, cl, stale)
		return r
	}
	if live {
		ctx = fast.Get(cl)
	}
	for i, it := range items {
		if retry {
			// First: a record this batch applied before it failed says
			// what it did.
			if acts, ok := h.takeRetried(it.rec); ok {
				r.actions = append(r.actions, acts...)
				r.keep(it, acts)
				continue
			}
		} else if live && (h.deferring(cluster) || h.slow(cl, len(items)-i)) {
			h.deferRest(&r, items[i:], cl, stale)
			return r
		} else if h.decideStale(&r, it, cl, stale) {
			continue
		}
		for {
			var acts []*faultlinev1.Action
			at := h.reg.Try(ctx, cluster, func(ctx context.Context, cl *clusters.Client) (err error) {
				acts, err = h.process(ctx, cl, it)
				return err
			})
			if at.Err == nil {
				r.actions = append(r.actions, acts...)
				if retry {
					r.keep(it, acts)
				}
				break
			}
			if !at.Retriable {
				h.log.Warn("quarantine failed", "cluster", cluster, "node", it.node, "event", it.ev.GetId(), "err", at.Err)
				kind := events.KindQuarantine
				if it.ev.GetIsHealthy() {
					kind = events.KindUnquarantine
				}
				r.actions = append(r.actions, h.action(it, kind, events.OutcomeFailed, at.Err.Error(), "", cl))
				break
			}
			if ctx.Err() != nil || clusters.Throttled(at.Err) {
				// The batch ran out of time (or the processor is stopping,
				// or the client's rate limiter would wait past the batch's
				// deadline): not the cluster's fault; defer the rest.
				if retry {
					r.failed = fmt.Errorf("cluster %s: %w", cluster, cmp.Or(ctx.Err(), at.Err))
					return r
				}
				if !clusters.TurnedSlow(ctx) || !h.slow(cl, len(items)-i) {
					h.markDeferring(cluster) // keep the node's later records behind these
				}
				h.deferRest(&r, items[i:], cl, stale)
				return r
			}
			if at.Ran {
				h.m.apiErrors.WithLabelValues(cluster).Inc()
				h.log.Warn("cluster API error; will retry", "cluster", cluster, "node", it.node, "retry_at", at.RetryAt, "err", at.Err)
			}
			if !at.RetryAt.IsZero() && at.Client.Gate.Wait(ctx, deadline) || ctx.Err() != nil {
				continue // its backoff over, or the cluster answers again; or out of time (above)
			}
			h.markDeferring(cluster)
			if retry {
				r.failed = fmt.Errorf("cluster %s: unreachable: %w", cluster, at.Err)
				return r
			}
			h.log.Warn("cluster unreachable; deferring records", "cluster", cluster, "node", it.node,
				"records", len(items)-i, "err", at.Err)
			h.deferRest(&r, items[i:], cl, stale)
			return r
		}
	}
	return r
}

// decideStale records it, when stale (staleAge), as not acted on:
// nothing to write on the node and no API request, so decided here even
// while its cluster is deferring or down.
func (h *Handler) decideStale(r *seqResult, it item, cl *clusters.Client, stale *pipeline.Stale) bool {
	age, ok := h.staleAge(it, h.now())
	if ok {
		r.actions = append(r.actions, h.staleSkip(it, age, cl))
		stale.Add(it.cluster, age)
	}
	return ok
}

// deferRest defers items to their cluster's RetryTopic, but for the stale
// ones, decided here: the retry consumer does not judge age (handleSeq).
// Deciding them ahead of the node's deferred records keeps its order: they
// write nothing.
func (h *Handler) deferRest(r *seqResult, items []item, cl *clusters.Client, stale *pipeline.Stale) {
	for _, it := range items {
		if !h.decideStale(r, it, cl, stale) {
			r.deferred = append(r.deferred, it)
		}
	}
}

// keep records an applied retry record's actions.
func (r *seqResult) keep(it item, acts []*faultlinev1.Action) {
	if r.applied == nil {
		r.applied = map[string][]*faultlinev1.Action{}
	}
	r.applied[recordKey(it.rec)] = acts
}

// slow reports whether cl's writes take longer than SlowCluster on
// average, with other clusters served beside it (alone, its slowness
// holds no one else's work: deferring it would only add a detour); a
// cluster found slow is marked deferring (its later records go behind
// these), and said once as it turns so.
func (h *Handler) slow(cl *clusters.Client, records int) bool {
	gauge := h.m.clusterSlow.WithLabelValues(cl.Name)
	if !cl.Gate.Slow(h.cfg.SlowCluster) || !h.reg.Several() {
		gauge.Set(0)
		return false
	}
	gauge.Set(1)
	if !h.deferring(cl.Name) {
		h.log.Warn("cluster slow; deferring its records to its retry topic", "cluster", cl.Name,
			"write_latency", cl.Gate.Latency().Round(time.Millisecond), "slow_cluster", h.cfg.SlowCluster, "records", records)
	}
	h.markDeferring(cl.Name)
	return true
}

// whileFast returns the batch's contexts by cluster: the events consumer's
// end once their cluster turns slow, where the role serves several; the
// retry consumer's, and a lone cluster's, are ctx (it waits for them).
func (h *Handler) whileFast(ctx context.Context, retry bool) *clusters.FastContexts {
	var limit time.Duration
	if !retry && h.reg.Several() {
		limit = h.cfg.SlowCluster
	}
	return clusters.NewFastContexts(ctx, limit)
}

func (h *Handler) deferring(cluster string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return time.Now().Before(h.deferUntil[cluster])
}

func (h *Handler) markDeferring(cluster string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.deferUntil[cluster] = time.Now().Add(2 * h.cfg.RetryWait)
}

// HeaderRetryAttempt counts how often a record was deferred.
const HeaderRetryAttempt = "faultline-retry-attempt"

// retryRecord is r deferred to its cluster's RetryTopic, one more attempt
// counted.
func retryRecord(cluster string, r *kgo.Record) *kgo.Record {
	attempt := 0
	var hdrs []kgo.RecordHeader
	for _, hd := range r.Headers {
		if hd.Key == HeaderRetryAttempt {
			attempt, _ = strconv.Atoi(string(hd.Value))
			continue
		}
		hdrs = append(hdrs, hd)
	}
	hdrs = append(hdrs, kgo.RecordHeader{Key: HeaderRetryAttempt, Value: []byte(strconv.Itoa(attempt + 1))})
	return &kgo.Record{Topic: RetryTopic(cluster), Key: r.Key, Value: r.Value, Headers: hdrs}
}
