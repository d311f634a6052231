// Package requeue lets a stateless processor role come back to a piece of
// long-running work (a drain that waits for pods, a reboot that waits for
// its resource's condition) without holding a Kafka batch open: the role
// produces a record to its own requeue topic with a not-before time, and
// consumes that topic as well. The record is produced with the batch's
// outputs before the batch's offsets are committed, so a processor that
// dies mid-work leaves either the original record or the requeue record
// uncommitted, and whichever replica picks it up resumes from the state
// kept in Kubernetes.
package requeue

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// Header names of requeue records.
const (
	// HeaderNotBefore is the earliest time (Unix milliseconds) the record
	// may be handled.
	HeaderNotBefore = "faultline-not-before"
	// HeaderAttempt counts how often the work was requeued.
	HeaderAttempt = "faultline-requeue-attempt"
)

// Record returns a record for topic that carries rec's key and value (the
// work's original trigger) and may be handled from notBefore on.
func Record(topic string, rec *kgo.Record, notBefore time.Time) *kgo.Record {
	return &kgo.Record{
		Topic: topic,
		Key:   rec.Key,
		Value: rec.Value,
		Headers: []kgo.RecordHeader{
			{Key: HeaderNotBefore, Value: []byte(strconv.FormatInt(notBefore.UnixMilli(), 10))},
			{Key: HeaderAttempt, Value: []byte(strconv.Itoa(Attempt(rec) + 1))},
		},
	}
}

// NotBefore returns the record's not-before time; zero for a record that
// was not requeued.
func NotBefore(rec *kgo.Record) time.Time {
	for _, h := range rec.Headers {
		if h.Key == HeaderNotBefore {
			ms, err := strconv.ParseInt(string(h.Value), 10, 64)
			if err != nil {
				return time.Time{}
			}
			return time.UnixMilli(ms)
		}
	}
	return time.Time{}
}

// Attempt returns how often the record's work was requeued (0 for an
// original record).
func Attempt(rec *kgo.Record) int {
	for _, h := range rec.Headers {
		if h.Key == HeaderAttempt {
			n, _ := strconv.Atoi(string(h.Value))
			return n
		}
	}
	return 0
}

// Wait blocks until the record's not-before time as seen by now, at most
// max (so a batch timeout is never exceeded), or until ctx ends. It
// reports false when ctx ended.
func Wait(ctx context.Context, rec *kgo.Record, now func() time.Time, max time.Duration) bool {
	nb := NotBefore(rec)
	if nb.IsZero() {
		return ctx.Err() == nil
	}
	d := min(nb.Sub(now()), max)
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// MaxWait is the longest ByNode waits for a record's not-before time; a
// role's batch timeout must exceed it.
const MaxWait = 20 * time.Second

// ByNode handles a batch of work items of a requeued role (pipeline.ByKey:
// each node's items in order, the nodes concurrently, at most workers at a
// time). For each item it waits until the item's record may be handled (a
// requeue record's not-before time, at most MaxWait; on shutdown the record is
// handed on unchanged), calls step, and collects the actions step returns
// and, when step asks to look again, a requeue record to topic. It returns
// what the batch must produce.
func ByNode[T any](ctx context.Context, workers int, topic string, now func() time.Time,
	items []T, rec func(T) *kgo.Record,
	step func(context.Context, T) ([]*faultlinev1.Action, time.Time)) ([]*kgo.Record, error) {
	type out struct {
		acts    []*faultlinev1.Action
		requeue []*kgo.Record
	}
	results := pipeline.ByKey(items, func(it T) string { return string(rec(it).Key) }, workers, func(items []T) (o out) {
		for _, it := range items {
			r := rec(it)
			if !Wait(ctx, r, now, MaxWait) {
				// Shutting down: hand the work on unchanged.
				o.requeue = append(o.requeue, Record(topic, r, NotBefore(r)))
				continue
			}
			acts, again := step(ctx, it)
			o.acts = append(o.acts, acts...)
			if !again.IsZero() {
				o.requeue = append(o.requeue, Record(topic, r, again))
			}
		}
		return o
	})
	var produce []*kgo.Record
	for _, r := range results {
		for _, a := range r.acts {
			rec, err := pipeline.ActionRecord(a)
			if err != nil {
				return nil, err
			}
			produce = append(produce, rec)
		}
		produce = append(produce, r.requeue...)
	}
	return produce, nil
}

// Step is one look at a piece of requeued work on its cluster
// (clusters.Registry.Try: the cluster's gate decides whether step runs,
// step's error decides the gate). It returns step's actions and when to
// look again: step's choice or, when the cluster is in trouble (backing
// off, failing, its client not built), when it may be tried again —
// fallback where that is unknown. The cluster's trouble is logged, naming
// what the work is ("drain"), and counted in apiErrors by cluster; an error
// that is the work's own is returned, for the role to record as a failed
// action.
func Step(ctx context.Context, reg *clusters.Registry, cluster, node, what string, fallback time.Time,
	log *slog.Logger, apiErrors *prometheus.CounterVec,
	step func(ctx context.Context, cl *clusters.Client) ([]*faultlinev1.Action, time.Time, error)) ([]*faultlinev1.Action, time.Time, error) {
	var (
		acts  []*faultlinev1.Action
		again time.Time
	)
	at := reg.Try(ctx, cluster, func(ctx context.Context, cl *clusters.Client) (err error) {
		acts, again, err = step(ctx, cl)
		return err
	})
	switch {
	case at.Err == nil:
		return acts, again, nil
	case !at.Retriable:
		return acts, time.Time{}, at.Err
	}
	if at.RetryAt.IsZero() {
		at.RetryAt = fallback
	}
	switch {
	case at.Ran:
		apiErrors.WithLabelValues(cluster).Inc()
		log.Warn("cluster API error; "+what+" requeued", "cluster", cluster, "node", node, "retry_at", at.RetryAt, "err", at.Err)
	case at.Client == nil:
		log.Warn("cluster client unavailable; "+what+" requeued", "cluster", cluster, "node", node, "err", at.Err)
	}
	return acts, at.RetryAt, nil
}

// Handle is the Handle of a requeued role whose work starts from actions
// (drain, remediate): it decodes the batch (pipeline.DecodeActions; a
// record that does not decode, or whose key and payload disagree, is dead),
// keeps the actions keep accepts, and hands them to step through ByNode.
func Handle(ctx context.Context, recs []*kgo.Record, keep func(*faultlinev1.Action) bool, workers int, topic string,
	now func() time.Time, step func(context.Context, pipeline.ActionRec) ([]*faultlinev1.Action, time.Time)) (pipeline.Result, error) {
	acts, dead := pipeline.DecodeActions(recs, keep)
	out, err := ByNode(ctx, workers, topic, now, acts, func(a pipeline.ActionRec) *kgo.Record { return a.Rec }, step)
	if err != nil {
		return pipeline.Result{}, err
	}
	return pipeline.Result{Out: out, Dead: dead}, nil
}
