// Package requeue lets a stateless processor role come back to a piece of
// long-running work (a drain that waits for pods, a reboot that waits for
// its resource's condition) without holding a Kafka batch open: the role
// produces a record to its own requeue topic with a not-before time, and
// consumes that topic as well. The record is produced with the batch's
// outputs before the batch's offsets are committed, so a processor that
// dies mid-work leaves either the original record or the requeue record
// uncommitted, and whichever replica picks it up resumes from the state
// kept in Kubernetes. A batch handled again after its outputs were
// produced produces them again: a requeue record it handed on unchanged
// (Forward) then circulates twice, until the two copies meet in a batch
// and are merged (ByNode); one it stepped gets a new not-before and is
// not merged: the node's work has a second follow-up, each look reading
// the node's state first.
package requeue

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

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
	// HeaderCluster names the cluster the work waits for: it met the
	// cluster in trouble (Again.Cluster).
	HeaderCluster = "faultline-requeue-cluster"
)

// Again says when to look at a piece of work again.
type Again struct {
	// At is when; zero: the work is done.
	At time.Time
	// Cluster, when set, names the cluster the work waits for — it met the
	// cluster in trouble (backing off, unreachable), At is when the
	// cluster's backoff ends — rather than waiting for itself. Such work is
	// looked at before At once the cluster may be tried again (ByNode): an
	// unreachable cluster's backoff grows to 30s, and it may answer long
	// before.
	Cluster string
	// Slow: the step was abandoned, its cluster turning slow while it ran
	// (clusters.FastContexts): the work goes to the slow lane unchanged,
	// the node's later work in the batch with it (ByNode).
	Slow bool
	// Headers are the role's own headers of the requeue record (Record),
	// besides requeue's: what the work's next look needs to know that the
	// record's value does not say (the drain role: which drain the work
	// was admitted to). Nil: none. A record handed on unchanged (Forward)
	// keeps the headers it had.
	Headers []kgo.RecordHeader
}

// Record returns a record for topic that carries rec's key and value (the
// work's original trigger) and again.Headers, and may be handled from
// again.At on, or once again.Cluster may be tried.
func Record(topic string, rec *kgo.Record, again Again) *kgo.Record {
	r := &kgo.Record{
		Topic: topic,
		Key:   rec.Key,
		Value: rec.Value,
		Headers: []kgo.RecordHeader{
			{Key: HeaderNotBefore, Value: []byte(strconv.FormatInt(again.At.UnixMilli(), 10))},
			{Key: HeaderAttempt, Value: []byte(strconv.Itoa(Attempt(rec) + 1))},
		},
	}
	if again.Cluster != "" {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderCluster, Value: []byte(again.Cluster)})
	}
	r.Headers = append(r.Headers, again.Headers...)
	return r
}

// header returns the value of rec's header key ("" when absent).
func header(rec *kgo.Record, key string) string {
	for _, h := range rec.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// NotBefore returns the record's not-before time; zero for a record that
// was not requeued.
func NotBefore(rec *kgo.Record) time.Time {
	ms, err := strconv.ParseInt(header(rec, HeaderNotBefore), 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// Attempt returns how often the record's work was requeued (0 for an
// original record).
func Attempt(rec *kgo.Record) int {
	n, _ := strconv.Atoi(header(rec, HeaderAttempt))
	return n
}

// AfterTrouble reports whether the record was requeued after its step met
// the cluster in trouble (Again.Cluster): what that step did on the cluster
// before it failed — a write the apiserver took, its answer lost — may not
// have been said.
func AfterTrouble(rec *kgo.Record) bool {
	return header(rec, HeaderCluster) != ""
}

// Forward returns rec handed on unchanged to topic: the same key, value
// and headers, so the same not-before time and attempt count (Record
// counts an attempt; a record handed on was not looked at). A record that
// was not requeued (an original trigger) stays one: no not-before, attempt
// 0.
func Forward(topic string, rec *kgo.Record) *kgo.Record {
	return &kgo.Record{
		Topic:   topic,
		Key:     rec.Key,
		Value:   rec.Value,
		Headers: append([]kgo.RecordHeader(nil), rec.Headers...),
	}
}

// Hold is the longest the requeue topic rests after ByNode handed on a
// record that was not due. ByNode hands such a record on at once,
// unchanged (Forward), and asks the runner (pipeline.Result.Rest) not to
// fetch the requeue topic again until the earliest not-before time it saw,
// but for no longer than Hold: the topic's other records may be due
// sooner. The rest keeps a record that is not due from going round the
// topic as fast as the role can poll — each trip costs up to Hold — while
// the role's other topic (new work) is fetched and handled meanwhile:
// neither new work nor the role's next poll waits for a follow-up.
//
// The cost: a follow-up is re-produced (and its offset committed) about
// once per Hold until it is due — ~15 times for remediate's 15s
// poll_interval, ~5 for drain's 5s — so one small record per second per
// node in progress on the requeue topic (1000 remediations in progress:
// ~1000 records/s; faultline_processor_produced_total{topic=<the role's
// requeue topic>} counts them), and a follow-up may be looked at up to
// Hold after it is due when the topic rests for a later one. 1s keeps
// that well under a role's poll intervals while keeping the re-produced
// records per node low. A redelivered batch's copy of a follow-up (see
// the package doc) is re-produced beside it until the two meet in one
// batch, then merged (ByNode), usually at the next trip.
const Hold = time.Second

// Turn is how long a batch of a requeued role goes on starting work: a
// node's item not started by then is handed on unchanged to the role's
// requeue topic, the node's later items in the batch with it, in order
// (ByNode). A node's items are stepped one after the other, and a batch
// ends — produces what its steps decided — only when its last node is
// done: on a slow cluster's lane, a node whose faults repeat (each a new
// drain of several requests, seconds each) makes a chain that held every
// other node's finished work in the batch, and, longer than the role's
// batch_timeout, failed the batch again and again. Past Turn the rest of
// each chain waits for a later batch, and the work done is produced. Far
// above what a batch of a cluster that answers in milliseconds takes.
const Turn = 10 * time.Second

// FetchMaxWait is the fetch wait of a requeued role's consumer
// (pipeline.Config.FetchMaxWait): a rested requeue topic is fetched again
// with the next fetch request after its rest, at most this long later
// when the role is idle.
const FetchMaxWait = 250 * time.Millisecond

// ByNode handles a batch of work items of a requeued role (pipeline.ByKey:
// each node's items in order, the nodes concurrently, at most workers at a
// time). A requeue record that is a byte-identical copy of an earlier one
// in the batch (a redelivered batch's follow-up produced twice) is
// dropped, merged into it; original records never are. An item whose
// record is not due yet (a requeue record's not-before time) is handed on
// unchanged (Forward), and so are the node's
// later items in the batch, in order, so no item of a node runs ahead of
// an earlier one — unless the record waits for its cluster (HeaderCluster)
// and ready says the cluster may be tried now (nil: never): then it is due.
// On shutdown (ctx ended) the records not yet handled are handed on
// unchanged too. An item that is due but for which aside names a topic
// (its cluster is slow: Lane.Aside; nil or "": never) is handed on
// unchanged to that topic, and the node's later items in the batch with
// it, in order. So is an item not started within turn of the batch's
// start (0: no bound; Turn), to topic. Otherwise it calls step and collects the actions step
// returns and, when step asks to look again, a requeue record to topic
// (Record: one more attempt); a step abandoned as its cluster turned slow
// (Again.Slow) hands its item and the node's later ones on unchanged, in
// order, to aside's topic. It returns what the batch must produce and,
// when it handed on a record that was not due, until when topic should
// rest (the earliest such not-before time, at most Hold from now; zero
// otherwise).
func ByNode[T any](ctx context.Context, workers int, topic string, turn time.Duration, now func() time.Time,
	ready func(ctx context.Context, cluster string) bool, aside func(T) string, items []T, rec func(T) *kgo.Record,
	step func(context.Context, T) ([]*faultlinev1.Action, Again)) ([]*kgo.Record, time.Time, error) {
	type out struct {
		acts    []*faultlinev1.Action
		requeue []*kgo.Record
		due     time.Time // the earliest not-before of a record not due
	}
	start := time.Now()
	items = merge(items, rec)
	results := pipeline.ByKey(items, func(it T) string { return string(rec(it).Key) }, workers, func(items []T) (o out) {
		for i, it := range items {
			if turn > 0 && time.Since(start) > turn {
				// The batch's turn is over: the node's items not
				// started wait for a later batch, in order, unchanged.
				for _, later := range items[i:] {
					o.requeue = append(o.requeue, Forward(topic, rec(later)))
				}
				return o
			}
			r := rec(it)
			if nb := NotBefore(r); ctx.Err() != nil || nb.After(now()) && !clusterBack(ctx, ready, r) {
				// Not due, or shutting down: hand this item and the
				// node's later ones on, in order. Running a later one
				// first could act on the node (a new drain or
				// remediation) while the earlier work is still pending.
				for _, later := range items[i:] {
					o.requeue = append(o.requeue, Forward(topic, rec(later)))
				}
				if ctx.Err() == nil {
					o.due = nb
				}
				return o
			}
			if to := aside(it); to != "" {
				// Its cluster is slow: this item and the node's later
				// ones go to the slow lane, in order, unchanged.
				for _, later := range items[i:] {
					o.requeue = append(o.requeue, Forward(to, rec(later)))
				}
				return o
			}
			acts, again := step(ctx, it)
			o.acts = append(o.acts, acts...)
			if again.Slow {
				// Abandoned as its cluster turned slow: this item and the
				// node's later ones to the slow lane (or, with none, back
				// to topic), in order, unchanged.
				to := aside(it)
				if to == "" {
					to = topic
				}
				for _, later := range items[i:] {
					o.requeue = append(o.requeue, Forward(to, rec(later)))
				}
				return o
			}
			if !again.At.IsZero() {
				o.requeue = append(o.requeue, Record(topic, r, again))
			}
		}
		return o
	})
	var (
		produce []*kgo.Record
		rest    time.Time
	)
	for _, r := range results {
		for _, a := range r.acts {
			rec, err := pipeline.ActionRecord(a)
			if err != nil {
				return nil, time.Time{}, err
			}
			produce = append(produce, rec)
		}
		produce = append(produce, r.requeue...)
		if !r.due.IsZero() && (rest.IsZero() || r.due.Before(rest)) {
			rest = r.due
		}
	}
	if limit := now().Add(Hold); rest.After(limit) {
		rest = limit
	}
	return produce, rest, nil
}

// merge returns items without the requeue records (HeaderNotBefore) that
// are copies of an earlier one in the batch: the same topic, key, value
// and headers, in order. A batch redelivered after its follow-ups were
// produced (a crash before its offsets were committed) hands them on
// again: the copies, on the same partition (the node's key) and handed on
// about once per Hold each, meet in a batch and become one follow-up
// again. Two copies are the same work at the same look (the same trigger,
// attempt, not-before, cluster and role headers), and every step reads the
// node's state first: what the copy would have stepped, the first steps.
// An original record (no not-before) is never dropped: duplicates of the
// trigger are the upstream's to tell apart. The dropped copy's offset is
// committed with its batch.
func merge[T any](items []T, rec func(T) *kgo.Record) []T {
	kept := make([]T, 0, len(items))
	seen := map[string]bool{}
	for _, it := range items {
		if r := rec(it); header(r, HeaderNotBefore) != "" {
			id := identity(r)
			if seen[id] {
				continue
			}
			seen[id] = true
		}
		kept = append(kept, it)
	}
	return kept
}

// identity returns r's topic, key, value and headers, each length-prefixed,
// as one string: equal exactly for byte-identical records.
func identity(r *kgo.Record) string {
	b := make([]byte, 0, len(r.Topic)+len(r.Key)+len(r.Value)+64)
	add := func(p []byte) {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	add([]byte(r.Topic))
	add(r.Key)
	add(r.Value)
	for _, h := range r.Headers {
		add([]byte(h.Key))
		add(h.Value)
	}
	return string(b)
}

// clusterBack reports whether r waits for a cluster (HeaderCluster) that
// may be tried now.
func clusterBack(ctx context.Context, ready func(context.Context, string) bool, r *kgo.Record) bool {
	c := header(r, HeaderCluster)
	return c != "" && ready != nil && ready(ctx, c)
}

// maxRedo bounds how often Step redoes a step that met a conflict.
const maxRedo = 20

// Step is one look at a piece of requeued work on its cluster
// (clusters.Registry.Try: the cluster's gate decides whether step runs,
// step's error decides the gate). It returns step's actions and when to
// look again: step's choice or, when the cluster is in trouble (backing
// off, failing, its client not built), when it may be tried again —
// fallback where that is unknown or not in the future (by reg's clock) —
// naming the cluster (Again.Cluster).
// The cluster's trouble is logged, naming what the work is ("drain"), and
// counted in apiErrors by cluster; an error that is the work's own is
// returned, for the role to record as a failed action. A step whose write
// met a conflict (another writer changed what it read: a replica, the
// node's work in another batch, a controller) is redone at once, up to
// maxRedo times, counted in conflicts (nil: not counted): it reads again,
// and every call it repeats is idempotent. A step whose ctx ended as its
// cluster turned slow (clusters.FastContexts) returns Again.Slow.
func Step(ctx context.Context, reg *clusters.Registry, cluster, node, what string, fallback time.Time,
	log *slog.Logger, apiErrors, conflicts *prometheus.CounterVec,
	step func(ctx context.Context, cl *clusters.Client) ([]*faultlinev1.Action, time.Time, error)) ([]*faultlinev1.Action, Again, error) {
	var (
		acts  []*faultlinev1.Action
		again time.Time
	)
	at := reg.Try(ctx, cluster, func(ctx context.Context, cl *clusters.Client) (err error) {
		for attempt := 1; ; attempt++ {
			acts, again, err = step(ctx, cl)
			if !apierrors.IsConflict(err) || attempt == maxRedo {
				return err
			}
			if conflicts != nil {
				conflicts.WithLabelValues(cluster).Inc()
			}
		}
	})
	switch {
	case at.Err == nil:
		return acts, Again{At: again}, nil
	case !at.Retriable:
		return acts, Again{}, at.Err
	case clusters.TurnedSlow(ctx):
		return acts, Again{Slow: true}, nil
	}
	if !at.RetryAt.After(reg.Now()) {
		// Unknown, or already past (a time that is due at once would
		// bring the work straight back to a cluster still in trouble).
		at.RetryAt = fallback
	}
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		// Cut short by the role's shutdown, not an error of the cluster's:
		// requeued without counting one (a batch's timeout still counts:
		// the cluster may be what made it run out).
	case at.Ran:
		apiErrors.WithLabelValues(cluster).Inc()
		log.Warn("cluster API error; "+what+" requeued", "cluster", cluster, "node", node, "retry_at", at.RetryAt, "err", at.Err)
	case at.Client == nil:
		log.Warn("cluster client unavailable; "+what+" requeued", "cluster", cluster, "node", node, "err", at.Err)
	}
	return acts, Again{At: at.RetryAt, Cluster: cluster}, nil
}

// Handle is the Handle of a requeued role whose work starts from actions
// (drain, remediate): it decodes the batch (pipeline.DecodeActions; a
// record that does not decode, or whose key and payload disagree, is dead),
// keeps the actions keep accepts, and hands them to step through ByNode
// (work waiting for its cluster is due once reg may try the cluster; a
// slow cluster's work goes to lane's topic: nil on the slow lane itself,
// which steps everything; where reg serves several clusters, a cluster
// that turns slow while the batch works for it has its steps abandoned and
// their work handed to the lane too).
func Handle(ctx context.Context, recs []*kgo.Record, keep func(*faultlinev1.Action) bool, workers int, topic string,
	now func() time.Time, reg *clusters.Registry, lane *Lane, step func(context.Context, pipeline.ActionRec) ([]*faultlinev1.Action, Again)) (pipeline.Result, error) {
	acts, dead := pipeline.DecodeActions(recs, keep)
	aside := func(pipeline.ActionRec) string { return "" }
	if lane != nil {
		aside = func(a pipeline.ActionRec) string { return lane.Aside(reg, a.Cluster) }
		if reg.Several() {
			// A cluster turning slow while the batch works for it is not
			// waited for: its steps are abandoned (Step: Again.Slow), their
			// work handed to the lane.
			fast := clusters.NewFastContexts(ctx, lane.Limit)
			defer fast.Stop()
			inner := step
			step = func(ctx context.Context, a pipeline.ActionRec) ([]*faultlinev1.Action, Again) {
				if cl, err := reg.Get(a.Cluster); err == nil {
					ctx = fast.Get(cl)
				}
				return inner(ctx, a)
			}
		}
	}
	out, rest, err := ByNode(ctx, workers, topic, Turn, now, reg.Ready, aside, acts, func(a pipeline.ActionRec) *kgo.Record { return a.Rec }, step)
	if err != nil {
		return pipeline.Result{}, err
	}
	res := pipeline.Result{Out: out, Dead: dead}
	if !rest.IsZero() {
		res.Rest = map[string]time.Time{topic: rest}
	}
	return res, nil
}

// Lane is a requeued role's slow lane: a cluster whose API writes take
// longer than Limit on average (clusters.Gate.Slow), with other clusters
// served beside it, has its work handed to Topic instead of stepped, and
// a second consumer group of the role steps it there (Handle with no
// lane), its follow-ups back on the role's requeue topic. A batch waits
// for its slowest node, and a step is several requests in turn (a drain
// reads the node, lists and evicts its pods, writes its state): one API
// server answering each of them seconds late would hold every cluster's
// drains or remediations behind its own. On the lane the slow cluster's
// work goes at its own pace, holding only what is on the lane (other
// slow clusters'). Its writes there keep its average current: once fast
// again, its work is stepped on the main path. A node's later work that
// reaches the main path while its earlier work is still on the lane (the
// cluster turned fast between the two) may run first; every step reads
// the node's state first, as a restarted replica's would.
type Lane struct {
	// Topic is the lane's topic.
	Topic string
	// Limit is the write latency over which a cluster is slow; 0: never.
	Limit time.Duration
	// Handed counts the handovers to Topic, by cluster: one per node and
	// batch, the node's later work in the batch going with it (nil: not
	// counted).
	Handed *prometheus.CounterVec
	// Log says when a cluster's work first goes to the lane, and again
	// at most once a minute while it does.
	Log *slog.Logger

	mu   sync.Mutex
	said map[string]time.Time
}

// LanePipeline returns the runner settings of a role's slow lane
// consumer: main's (the role's own consumer), reading topic in a group of
// its own (role "<role>-slow").
func LanePipeline(main pipeline.Config, topic string) pipeline.Config {
	main.Role, main.Topics = main.Role+"-slow", []string{topic}
	return main
}

// Aside returns the lane's topic when cluster's work goes to the lane (see
// Lane), "" when it is stepped here.
func (l *Lane) Aside(reg *clusters.Registry, cluster string) string {
	if l.Limit <= 0 {
		return ""
	}
	cl, err := reg.Get(cluster)
	if err != nil || !cl.Gate.Slow(l.Limit) || !reg.Several() {
		return ""
	}
	if l.Handed != nil {
		l.Handed.WithLabelValues(cluster).Inc()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := time.Now(); now.Sub(l.said[cluster]) >= time.Minute {
		if l.said == nil {
			l.said = map[string]time.Time{}
		}
		l.said[cluster] = now
		if l.Log != nil {
			l.Log.Warn("cluster slow; its work goes to the slow lane", "cluster", cluster,
				"write_latency", cl.Gate.Latency().Round(time.Millisecond), "slow_cluster", l.Limit, "topic", l.Topic)
		}
	}
	return l.Topic
}
