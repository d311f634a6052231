// Package correlate is the correlation processor role (`faultline process
// --role=correlate`), NVSentinel's Health Events Analyzer re-designed: time-window
// rules declared in a rules file, each a CEL trigger over incoming events
// (or actions), a ClickHouse window query, a threshold and the template of
// the derived HealthEvent it emits back to the events topic.
//
// The role is stateless. Per batch, each rule runs one query over the events
// table plus the batch itself (sent as an external table, so a triggering
// event counts in its own window before the store has written it). Whether a
// verdict already stands (stabilization) is read from the events table — the
// last derived event of the rule for the group — overlaid with a short-lived
// memory of what this replica emitted that the store may not have written
// yet. Derived event ids are deterministic (rule, group, previous derived
// event of the group, polarity), so two replicas (or a redelivered batch)
// emitting the same verdict emit the same id and the history holds it once.
// A sweep (Handler.Sweep) evaluates what time alone changes: a port that
// stays DOWN, a window that no longer holds.
package correlate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/celbound"
	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
	"github.com/faultline/faultline/schemas/validate"
)

// Agent is the agent name of derived events.
const Agent = "faultline-correlate"

// Modes of a derived event (metadata "mode").
const (
	ModeLive       = "live"
	ModeShadow     = "shadow"
	ModeSuppressed = "suppressed"
)

// Metadata keys of derived events.
const (
	MetaMode      = "mode"
	MetaGroup     = "group"
	MetaValue     = "value"
	MetaThreshold = "threshold"
	MetaWindow    = "window"
	MetaTrigger   = "trigger_id"
	MetaSuppress  = "suppressed_by"
)

// Handler evaluates the rules over batches of records.
type Handler struct {
	conn    clickhouse.Conn
	rules   []*Rule
	byName  map[string]*Rule
	now     func() time.Time
	log     *slog.Logger
	ttl     time.Duration
	metrics *Metrics

	unstored *unstored // earlier batches' records the store may not have written

	mu        sync.Mutex
	cache     map[string]prior
	errLogged map[string]time.Time // rule -> when its next trigger error is logged

	// Ownership shares the sweep between replicas (events partitions).
	pipeline.Ownership

	// EvaluateAll runs the window query for every trigger, also those
	// whose result cannot change anything (a verdict standing inside its
	// stabilization, a sweep-onset rule with none standing); those are
	// still not decided on, so the derived events are the same. For
	// measuring the worst case (loadtest/correlatebench), not production.
	EvaluateAll bool
}

// Metrics are the role's own metrics.
type Metrics struct {
	derived       *prometheus.CounterVec
	query         *prometheus.HistogramVec
	triggerErrors *prometheus.CounterVec
	triggers      *prometheus.CounterVec
	forgotten     prometheus.Counter
	splits        *prometheus.CounterVec
	orphans       prometheus.Gauge
	sweepErrors   *prometheus.CounterVec
}

// NewMetrics registers the metrics on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		derived:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_correlate_derived_total", Help: "Derived events emitted, by rule, polarity (verdict, recovery) and mode (live, shadow, suppressed)."}, []string{"rule", "kind", "mode"}),
		query:         prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "faultline_correlate_query_seconds", Help: "Time of one rule query, by rule and pass (value: the window values of a batch or sweep, with their cause ids unless the rule reads them apart; causes: the cause ids of new verdicts, for a rule with causes = verdicts).", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}, []string{"rule", "pass"}),
		triggerErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_correlate_trigger_errors_total", Help: "Rule triggers that failed on a record (missing key, type error, cost limit); the record did not trigger the rule."}, []string{"rule"}),
		triggers:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_correlate_triggers_total", Help: "Rule triggers, by rule and outcome (evaluated: its window query ran; skipped: its result could not change the standing verdict)."}, []string{"rule", "outcome"}),
		forgotten:     prometheus.NewCounter(prometheus.CounterOpts{Name: "faultline_correlate_unstored_forgotten_total", Help: "Records of earlier batches forgotten before the store had written them (over the memory's bound): a window evaluated meanwhile may miss them."}),
		splits:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_correlate_query_splits_total", Help: "Rule queries ClickHouse refused for its memory limit and that ran again for each half of their triggers, by rule."}, []string{"rule"}),
		orphans:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "faultline_correlate_orphan_verdicts", Help: "Standing live or suppressed verdicts, of the groups this replica sweeps, of rules no longer in the rules file (or whose emit.check_name changed), at the last sweep: nothing recovers them."}),
		sweepErrors:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_correlate_sweep_errors_total", Help: "Sweeps of a rule that failed (its candidates or window query), by rule; the sweep went on with the other rules."}, []string{"rule"}),
	}
	if reg != nil {
		reg.MustRegister(m.derived, m.query, m.triggerErrors, m.triggers, m.forgotten, m.splits, m.orphans, m.sweepErrors)
	}
	return m
}

// New returns a handler for the rules, querying through conn. now is the
// clock (time.Now in production); ttl is Config.CacheTTL.
func New(conn clickhouse.Conn, rules []*Rule, now func() time.Time, ttl time.Duration, log *slog.Logger, m *Metrics) *Handler {
	if m == nil {
		m = NewMetrics(nil)
	}
	h := &Handler{conn: conn, rules: suppressorsFirst(rules), byName: map[string]*Rule{}, now: now, log: log, ttl: ttl, metrics: m, cache: map[string]prior{}, errLogged: map[string]time.Time{},
		unstored: &unstored{maxAge: ttl, max: maxUnstored, maxBytes: maxUnstoredBytes, seedWait: seedWait, now: now, forgot: m.forgotten, next: map[pipeline.TopicPart]int64{}}}
	h.Ownership.Topic = events.TopicEvents
	for _, r := range rules {
		h.byName[r.Name] = r
		m.splits.WithLabelValues(r.Name) // exported from the start (at 0), so an alert's increase sees the first split
		m.sweepErrors.WithLabelValues(r.Name)
		m.triggerErrors.WithLabelValues(r.Name)
	}
	return h
}

// PartitionsRevoked implements pipeline.PartitionObserver: the sweep's
// share, and the records of the partitions that were not read back yet,
// are the next owner's.
func (h *Handler) PartitionsRevoked(topic string, partitions []int32) {
	h.Ownership.PartitionsRevoked(topic, partitions)
	h.unstored.revoked(topic, partitions)
}

// suppressorsFirst orders the rules that suppress others (named in a
// suppressed_by) before the rest, each part in file order.
func suppressorsFirst(rules []*Rule) []*Rule {
	sup := map[string]bool{}
	for _, r := range rules {
		for _, by := range r.Spec.SuppressedBy {
			sup[by] = true
		}
	}
	out := slices.Clone(rules)
	slices.SortStableFunc(out, func(a, b *Rule) int {
		switch {
		case sup[a.Name] == sup[b.Name]:
			return 0
		case sup[a.Name]:
			return -1
		}
		return 1
	})
	return out
}

// item is one decoded record.
type item struct {
	ev      *datamodels.HealthEvent
	act     *faultlinev1.Action
	cluster string
	node    string
	atMS    int64
	// recvMS is when the record reached faultline (an event's
	// receivedTimestamp, the gateway's clock; an action's time).
	recvMS int64
	// vars are the CEL variables of a record that can trigger (set by
	// decode; nil for derived and STORE_ONLY events), read by the rules'
	// triggers concurrently; fits: they fit celbound's sizes (the
	// triggers run without the cost tracker where that proves the limit).
	vars map[string]any
	fits bool
}

// trigger is one evaluation of a rule: a group at a time.
type trigger struct {
	tid      string
	cluster  string
	node     string // the trigger's node (queries join on it for node/entity scope)
	gkey     string
	entities []*datamodels.Entity
	class    string
	check    string
	atMS     int64
	recvMS   int64 // the trigger's receivedTimestamp (item.recvMS); 0: atMS
	// ownMS is the trigger's own time where prepare judges it after its
	// group's recovery (atMS moved past it); 0: atMS.
	ownMS    int64
	sourceID string
	dnode    string // node of the derived event
	dentity  string // entity key of the derived event
	// machine is the trigger's machine (events.MetaSystemUUID), given
	// to a node's derived event: the quarantine role does not act on a
	// verdict a Node object's earlier machine triggered.
	machine   string
	fromSweep bool
	// recoverOnly: a sweep's trigger for a live or suppressed verdict of a
	// rule now shadowed, evaluated in its own mode for its recovery only.
	recoverOnly bool
}

// result is a rule query's row for one trigger.
type result struct {
	value  float64
	causes []string
	lastMS int64
}

// prior is the last derived event of a rule for a group.
type prior struct {
	id      string
	healthy bool
	tMS     int64
	// recvMS is when its trigger reached faultline (the derived event's
	// receivedTimestamp, the gateway's clock; 0: unknown): the
	// stabilization is measured on that clock too, as tMS is the
	// trigger's agent's, which may run hours behind.
	recvMS int64
	mode   string
	seen   time.Time // when this replica emitted it (cache only)
	// trig is the id of the event that made this replica emit it, and
	// before/hadBefore what stood before: a batch retried after its
	// outputs failed to be produced re-emits the same derived event
	// instead of taking its own unproduced output for the standing state.
	trig   string
	trigMS int64 // the own time (trigger.own) of the event trig
	before *prior
}

// Handle evaluates every rule over the batch and returns the derived
// events to produce. Undecodable records are the store's to dead-letter;
// here they are skipped.
//
// The rules' window queries run concurrently; their decisions are taken in
// rule order, the rules that suppress others first, so a fabric incident
// found in this batch already suppresses the per-node verdicts of the same
// batch; then the cause ids of the new verdicts are read, concurrently.
func (h *Handler) Handle(ctx context.Context, recs []*kgo.Record) (pipeline.Result, error) {
	items, dead, err := decode(recs, h.log)
	if err != nil {
		return pipeline.Result{}, err
	}
	h.expireCache()
	var (
		batch batchRows
		bg    errgroup.Group // the batch tables' rows beside the triggers
	)
	bg.Go(pipeline.Safe(func() error { batch.add(recs); return nil }))
	trigs := make([][]trigger, len(h.rules))
	var tg errgroup.Group // the rules' triggers on every core before the queries start
	tg.SetLimit(runtime.GOMAXPROCS(0))
	for i, r := range h.rules {
		tg.Go(pipeline.Safe(func() error { trigs[i] = h.triggers(r, items); return nil }))
	}
	if err := errors.Join(tg.Wait(), bg.Wait()); err != nil {
		return pipeline.Result{}, err
	}
	clusterWide := map[string]bool{} // clusters a cluster-scope rule counts over in this batch
	for i, r := range h.rules {
		if r.Scope == ScopeCluster {
			for _, t := range trigs[i] {
				clusterWide[t.cluster] = true
			}
		}
	}
	switch err := h.unstored.refresh(ctx, recs); {
	case errors.Is(err, errProgressUnknown):
		h.log.Info("store progress unknown", "err", err)
	case err != nil:
		h.log.Warn("unstored records of earlier batches not all known; a window may miss some", "err", err)
	}
	batch.add(h.unstored.of(recs, clusterWide))
	bt, err := batch.tables()
	if err != nil {
		return pipeline.Result{}, err
	}
	plans := make([]*plan, len(h.rules))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(queryParallelism)
	for i, r := range h.rules {
		if len(trigs[i]) == 0 {
			continue
		}
		g.Go(pipeline.Safe(func() (err error) {
			plans[i], err = h.prepare(gctx, r, trigs[i], bt)
			return err
		}))
	}
	if err := g.Wait(); err != nil {
		return pipeline.Result{}, err
	}
	decided := make([][]emission, len(plans))
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(queryParallelism)
	for i, pl := range plans {
		if pl == nil {
			continue
		}
		var err error
		if decided[i], err = h.decide(ctx, pl); err != nil {
			return pipeline.Result{}, err
		}
		g.Go(pipeline.Safe(func() error { return h.causes(gctx, pl.r, decided[i], bt) }))
	}
	if err := g.Wait(); err != nil {
		return pipeline.Result{}, err
	}
	var out []*kgo.Record
	for i, pl := range plans {
		if pl == nil {
			continue
		}
		derived, err := h.emit(pl.r, decided[i])
		if err != nil {
			return pipeline.Result{}, err
		}
		out = append(out, derived...)
	}
	h.unstored.add(recs)
	return pipeline.Result{Out: out, Dead: dead}, nil
}

// maxUnstored and maxUnstoredBytes bound the records of earlier batches
// remembered until the store writes them, by count and by the bytes of
// their keys and values (at the store's usual lag of a second or two a
// replica holds a few thousand). Records of ~400 bytes meet the count
// first, at ~40 MB; the gateway's largest events (~200 KB: 64 metadata
// values of 2 KiB, 64 entities) meet the bytes, at ~1,300 records —
// 100,000 of them were ~20 GB.
const (
	maxUnstored      = 100_000
	maxUnstoredBytes = 256 << 20
)

// SetStoreProgress sets how the handler learns which records the store
// has written (Open: the store group's committed offsets); without it
// earlier batches' records are remembered for correlate.cache_ttl.
func (h *Handler) SetStoreProgress(p StoreProgress) { h.unstored.progress = p }

// SetReadBack sets how the handler reads back, for a partition handed over
// to it, the records below its first batch that the store has not written
// (Open: from Kafka); without it a handed-over partition's memory starts
// empty.
func (h *Handler) SetReadBack(r ReadBack) { h.unstored.readBack = r }

// queryParallelism bounds the rule queries one batch runs at once.
const queryParallelism = 4

// decodePart is the fewest records decode gives a part of its own.
const decodePart = 1000

// decode decodes the records the rules read, in as many parts at once as
// there are cores (each part in order, the parts joined in order: what
// one pass gives). A record whose key and payload disagree is
// dead-lettered (pipeline.EventKey, ActionKey); otherwise undecodable
// records are the store's to dead-letter, here they are skipped. The
// error is a part's panic.
func decode(recs []*kgo.Record, log *slog.Logger) ([]item, []pipeline.Dead, error) {
	n := max(1, min(runtime.GOMAXPROCS(0), len(recs)/decodePart))
	items, dead := make([][]item, n), make([][]pipeline.Dead, n)
	size := (len(recs) + n - 1) / n
	var g errgroup.Group
	for i := range n {
		part := recs[min(i*size, len(recs)):min((i+1)*size, len(recs))]
		g.Go(pipeline.Safe(func() error { items[i], dead[i] = decodeInOrder(part, log); return nil }))
	}
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	return slices.Concat(items...), slices.Concat(dead...), nil
}

// decodeInOrder is decode in one pass.
func decodeInOrder(recs []*kgo.Record, log *slog.Logger) ([]item, []pipeline.Dead) {
	items := make([]item, 0, len(recs))
	var dead []pipeline.Dead
	for _, rec := range recs {
		check := pipeline.EventKey
		if rec.Topic == events.TopicActions {
			check = pipeline.ActionKey
		}
		cluster, node, err := check(rec)
		if errors.Is(err, pipeline.ErrKeyMismatch) {
			dead = append(dead, pipeline.Dead{Record: rec, Reason: err})
			continue
		}
		if err != nil {
			log.Debug("record skipped", "offset", rec.Offset, "err", err)
			continue
		}
		switch rec.Topic {
		case events.TopicActions:
			a, err := events.UnmarshalAction(rec.Value)
			if err != nil || a.GetId() == "" {
				log.Debug("action skipped", "offset", rec.Offset, "err", err)
				continue
			}
			it := item{act: a, cluster: cluster, node: node, vars: map[string]any{"action": ActionVars(a)}}
			it.fits = celbound.Fits(it.vars)
			ts := rec.Timestamp
			if a.GetTimestamp() != nil {
				ts = a.GetTimestamp().AsTime()
			}
			it.atMS, it.recvMS = ts.UnixMilli(), ts.UnixMilli()
			items = append(items, it)
		default:
			ev, err := events.Unmarshal(rec.Value)
			if err != nil || ev.GetId() == "" {
				log.Debug("event skipped", "offset", rec.Offset, "err", err)
				continue
			}
			it := item{ev: ev, cluster: cluster, node: node}
			if !events.IsDerived(ev) && !events.StoreOnly(ev) {
				it.vars = map[string]any{"event": events.Vars(ev)}
				it.fits = celbound.Fits(it.vars)
			}
			ts := rec.Timestamp
			if ev.GetReceivedTimestamp() != nil {
				ts = ev.GetReceivedTimestamp().AsTime()
			}
			it.recvMS = ts.UnixMilli()
			if ev.GetGeneratedTimestamp() != nil {
				ts = ev.GetGeneratedTimestamp().AsTime()
			}
			it.atMS = ts.UnixMilli()
			items = append(items, it)
		}
	}
	return items, dead
}

// triggers returns the rule's evaluations for the batch, in batch order.
// Derived and STORE_ONLY events never trigger (no loops; processing
// strategy honoured).
func (h *Handler) triggers(r *Rule, items []item) []trigger {
	var out []trigger
	for i := range items {
		it := &items[i]
		if it.vars == nil {
			continue // a derived or STORE_ONLY event
		}
		if r.Source == SourceActions {
			if it.act == nil || !h.matches(r, it) {
				continue
			}
			out = append(out, trigger{
				tid: strconv.Itoa(len(out)), cluster: it.cluster, node: it.node, atMS: it.atMS, recvMS: it.recvMS, sourceID: it.act.GetId(),
				entities: []*datamodels.Entity{{EntityType: events.EntityNode, EntityValue: it.node}},
				check:    it.act.GetCheckName(), dnode: it.node, dentity: events.EntityNode + "=" + it.node,
			})
			continue
		}
		ev := it.ev
		if ev == nil || !h.matches(r, it) {
			continue
		}
		t := trigger{tid: strconv.Itoa(len(out)), cluster: it.cluster, node: it.node, atMS: it.atMS, recvMS: it.recvMS, sourceID: ev.GetId(),
			class: ev.GetComponentClass(), check: ev.GetCheckName(), machine: ev.GetMetadata()[events.MetaSystemUUID]}
		switch r.Scope {
		case ScopeEntity:
			t.gkey = events.EntityKey(ev)
			t.entities = ev.GetEntitiesImpacted()
			t.dnode, t.dentity = it.node, t.gkey
		case ScopeNode:
			t.entities = []*datamodels.Entity{{EntityType: events.EntityNode, EntityValue: it.node}}
			t.dnode, t.dentity = it.node, events.EntityNode+"="+it.node
		case ScopeCluster:
			t.gkey = Signature(ev)
			t.entities = []*datamodels.Entity{{EntityType: EntityFabric, EntityValue: t.gkey}}
			t.dnode, t.dentity = ClusterNode, EntityFabric+"="+t.gkey
		}
		out = append(out, t)
	}
	return out
}

// matches evaluates r's trigger; an error is counted, logged (at most once
// a minute per rule) and a non-match.
func (h *Handler) matches(r *Rule, it *item) bool {
	ok, err := r.matches(it.vars, it.fits)
	if err == nil {
		return ok
	}
	h.metrics.triggerErrors.WithLabelValues(r.Name).Inc()
	h.mu.Lock()
	logIt := !h.now().Before(h.errLogged[r.Name])
	if logIt {
		h.errLogged[r.Name] = h.now().Add(time.Minute)
	}
	h.mu.Unlock()
	if logIt {
		h.log.Warn("rule trigger failed; the record does not trigger the rule", "rule", r.Name, "err", err)
	}
	return false
}

// Signature is the fault signature of cluster-scoped rules:
// "checkName|firstErrorCode" (the SQL computes the same).
func Signature(ev *datamodels.HealthEvent) string {
	code := ""
	if len(ev.GetErrorCode()) > 0 {
		code = ev.GetErrorCode()[0]
	}
	return ev.GetCheckName() + "|" + code
}

// plan is one rule's evaluation of a set of triggers, up to its decisions:
// the standing verdicts of their groups, the triggers that can change
// anything, and their window values.
type plan struct {
	r       *Rule
	trigs   []trigger
	priors  map[string]prior
	results map[string]result
}

// evaluate runs the rule for the triggers (a sweep's) and returns the
// derived events. When it fails after deciding, what decide remembered as
// emitted is undone: a sweep's trigger has no source id for priorFor to
// tell its own unproduced verdict by, so the next sweep took it for
// standing and derived nothing until correlate.cache_ttl had passed.
func (h *Handler) evaluate(ctx context.Context, r *Rule, trigs []trigger, bt *batchTables) ([]*kgo.Record, error) {
	pl, err := h.prepare(ctx, r, trigs, bt)
	if err != nil {
		return nil, err
	}
	was := h.cachedOf(r, pl.trigs)
	ems, err := h.decide(ctx, pl)
	if err == nil {
		err = h.causes(ctx, r, ems, bt)
	}
	var out []*kgo.Record
	if err == nil {
		out, err = h.emit(r, ems)
	}
	if err != nil {
		h.restore(r, was, pl.priors)
		return nil, err
	}
	return out, nil
}

// prepare reads the standing verdicts of the triggers' groups first, drops
// the triggers whose evaluation cannot change anything (the group's verdict
// stands and cannot recover yet: inside its stabilization window, or the
// rule does not recover, or recovers in the sweep only and this is no
// sweep — unless the verdict is suppressed, no suppressor stands any more
// and this is a sweep, when it may go live (decide); or the rule's
// verdicts start only in the sweep, or the trigger may only recover
// (recoverOnly), and none stands),
// then runs the window query for the rest without their cause
// ids, which decide asks for only where a verdict starts.
func (h *Handler) prepare(ctx context.Context, r *Rule, trigs []trigger, bt *batchTables) (*plan, error) {
	priors, err := h.priors(ctx, r, trigs)
	if err != nil {
		return nil, err
	}
	sameGPU(r, priors, trigs)
	pl := &plan{r: r, priors: priors}
	// A trigger is evaluated, skipped, or (a sweep's, its group's verdict
	// suppressed and unable to recover yet) evaluated only if no
	// suppressor stands: then the verdict may go live.
	const (
		skip = iota
		evaluate
		ifUnsuppressed
	)
	what := make([]int, len(trigs))
	var promote []trigger
	for i, t := range trigs {
		p, has := priorFor(priors, t)
		standing := has && !p.healthy
		switch {
		case standing && t.atMS <= p.tMS:
		case standing && (!r.Recover || (r.SweepRecovery && !t.fromSweep) || t.atMS-p.tMS < r.Stabilization.Milliseconds() || p.stabilizing(r, t)):
			if p.mode == ModeSuppressed && !r.Shadow && t.fromSweep && !t.recoverOnly {
				what[i] = ifUnsuppressed
				promote = append(promote, t)
			}
		case !standing && (r.SweepOnset && !t.fromSweep || t.recoverOnly):
		default:
			what[i] = evaluate
			if has && !t.fromSweep && t.atMS <= p.tMS {
				// A late trigger (generated before its group's recovery,
				// which is at the sweep's clock; arrived after it: a
				// spool replayed, an agent's clock behind) is judged just
				// after the recovery: its window still holds it, and a
				// verdict it starts sorts after the recovery. Judged at
				// its own time, it could start none, and nothing after
				// it judged its window again.
				trigs[i].ownMS, trigs[i].atMS = t.atMS, p.tMS+1
			}
		}
	}
	var suppressed map[string]string
	if len(promote) > 0 {
		if suppressed, err = h.suppressions(ctx, r, promote); err != nil {
			return nil, err
		}
	}
	for i, t := range trigs {
		_, still := suppressed[t.cluster]
		if what[i] == evaluate || (what[i] == ifUnsuppressed && !still) {
			pl.trigs = append(pl.trigs, t)
		}
	}
	h.metrics.triggers.WithLabelValues(r.Name, "evaluated").Add(float64(len(pl.trigs)))
	h.metrics.triggers.WithLabelValues(r.Name, "skipped").Add(float64(len(trigs) - len(pl.trigs)))
	run := pl.trigs
	if h.EvaluateAll {
		run = trigs
	}
	if len(run) == 0 {
		return pl, nil
	}
	pl.results, err = h.runRule(ctx, r, run, bt, passValue)
	return pl, err
}

// priorFor is the standing state a trigger is decided against. A batch
// retried after its outputs failed to be produced finds its own unproduced
// verdict in this replica's memory: it is decided against what stood
// before, and so re-emits the same derived event.
func priorFor(priors map[string]prior, t trigger) (prior, bool) {
	p, has := priors[t.groupKey()]
	if has && p.trig != "" && p.trig == t.sourceID && p.trigMS == t.own() {
		if p.before == nil {
			return prior{}, false
		}
		return *p.before, true
	}
	return p, has
}

// own is the trigger's own time (ownMS).
func (t trigger) own() int64 {
	if t.ownMS != 0 {
		return t.ownMS
	}
	return t.atMS
}

// recv is the trigger's received time (recvMS; atMS where unknown).
func (t trigger) recv() int64 {
	if t.recvMS != 0 {
		return t.recvMS
	}
	return t.atMS
}

// stabilizing reports whether the verdict is still inside r's
// stabilization on the received clock: less of it has passed between its
// trigger's arrival and t's (a sweep's: now). tMS is the agent's clock: a
// node whose clock ran hours behind (NTP unreachable) stamped its verdict
// hours in the past, and the sweep, on the correlator's clock, recovered
// it at once — a flapping NIC back in service 30 s after its cordon. Only
// a verdict stamped before it was received is judged so: one of unknown
// received time (0), or a sweep's (received = stamped), or one stamped by
// an agent running ahead (a recovery generated after a sweep's verdict
// but received before it was recovered at once, not held until the
// sweep's clock passed it) is judged on tMS alone.
func (p prior) stabilizing(r *Rule, t trigger) bool {
	return p.recvMS > p.tMS && t.recv()-p.recvMS < r.Stabilization.Milliseconds()
}

func (t trigger) groupKey() string { return t.cluster + "\x00" + t.dnode + "\x00" + t.dentity }

// emission is a derived event decided on, before it is built.
type emission struct {
	t       trigger
	res     result
	id      string // DerivedID
	healthy bool
	mode    string
	by      string // suppressing rule (mode suppressed)
}

// decide turns a plan's window values into the derived events to emit, in
// trigger order (a verdict taken by one trigger stands for the next of its
// group), and remembers them as standing.
func (h *Handler) decide(ctx context.Context, pl *plan) ([]emission, error) {
	r := pl.r
	var (
		ems        []emission
		suppressed map[string]string // cluster -> suppressing rule
		err        error
	)
	var held map[string]map[string]bool // cluster -> nodes still holding suppressed verdicts (read once)
	for _, t := range pl.trigs {
		res := pl.results[t.tid]
		holds := res.value >= r.Threshold
		p, has := priorFor(pl.priors, t)
		standing := has && !p.healthy
		em := emission{t: t, res: res}
		switch {
		case holds && !standing && (!has || t.atMS > p.tMS):
			em.mode = ModeLive
			if r.Shadow {
				em.mode = ModeShadow
			} else if len(r.Spec.SuppressedBy) > 0 {
				if suppressed == nil {
					if suppressed, err = h.suppressions(ctx, r, pl.trigs); err != nil {
						return nil, err
					}
				}
				if by, ok := suppressed[t.cluster]; ok {
					em.mode, em.by = ModeSuppressed, by
				}
			}
		case !holds && standing && r.Recover && (!r.SweepRecovery || t.fromSweep) && t.atMS > p.tMS &&
			t.atMS-max(res.lastMS, p.tMS) >= r.Stabilization.Milliseconds() && !p.stabilizing(r, t):
			em.healthy, em.mode = true, p.mode
		case holds && standing && p.mode == ModeSuppressed && !r.Shadow && t.fromSweep && !t.recoverOnly && t.atMS > p.tMS:
			// A suppressed verdict that still holds once no suppressor
			// stands is the node's own: it goes live, chained on the
			// suppressed one — unless as many of the cluster's nodes
			// as the suppressor's threshold still hold (the incident
			// recovered as its events stopped, not its ports: all of
			// them live at once is the stampede suppression prevents).
			if least, ok := h.suppressorThreshold(r); ok {
				if held == nil {
					if held, err = h.holdingSuppressed(ctx, pl); err != nil {
						return nil, err
					}
				}
				if float64(len(held[t.cluster])) >= least {
					continue
				}
			}
			if suppressed == nil {
				if suppressed, err = h.suppressions(ctx, r, pl.trigs); err != nil {
					return nil, err
				}
			}
			if _, ok := suppressed[t.cluster]; ok {
				continue
			}
			em.mode = ModeLive
		default:
			continue
		}
		em.id = DerivedID(r.Name, t.cluster, t.dnode, t.dentity, p.id, em.healthy)
		np := prior{id: em.id, healthy: em.healthy, tMS: t.atMS, recvMS: t.recv(), mode: em.mode, seen: h.now(), trig: t.sourceID, trigMS: t.own()}
		if has {
			b := p
			b.before = nil
			np.before = &b
		}
		pl.priors[t.groupKey()] = np
		h.remember(r, t.groupKey(), np)
		ems = append(ems, em)
	}
	return ems, nil
}

// suppressorThreshold is the least threshold of the rules named in r's
// suppressed_by: as many of a cluster's nodes still holding r's
// suppressed verdicts would be an incident of their own.
func (h *Handler) suppressorThreshold(r *Rule) (least float64, ok bool) {
	for _, name := range r.Spec.SuppressedBy {
		if by := h.byName[name]; by != nil && (!ok || by.Threshold < least) {
			least, ok = by.Threshold, true
		}
	}
	return least, ok
}

// emit builds and encodes the derived events.
func (h *Handler) emit(r *Rule, ems []emission) ([]*kgo.Record, error) {
	out := make([]*kgo.Record, 0, len(ems))
	for _, em := range ems {
		ev := h.derive(r, em)
		b, err := events.Marshal(ev)
		if err != nil {
			return nil, fmt.Errorf("rule %s: encode derived event: %w", r.Name, err)
		}
		kind := "verdict"
		if em.healthy {
			kind = "recovery"
		}
		h.metrics.derived.WithLabelValues(r.Name, kind, em.mode).Inc()
		h.log.Info("derived event", "rule", r.Name, "kind", kind, "mode", em.mode, "cluster", em.t.cluster,
			"node", em.t.dnode, "entity", em.t.dentity, "value", em.res.value, "id", ev.GetId())
		out = append(out, &kgo.Record{Topic: events.TopicEvents, Key: events.Key(em.t.cluster, em.t.dnode), Value: b})
	}
	return out, nil
}

// causes fills in the cause ids of the verdicts among ems for a rule that
// reads them apart (Rule.CausesApart; the value pass carries the others'):
// the rule query once more, with cause ids, for their triggers only.
func (h *Handler) causes(ctx context.Context, r *Rule, ems []emission, bt *batchTables) error {
	if !r.CausesApart {
		return nil
	}
	var trigs []trigger
	for _, em := range ems {
		if !em.healthy {
			trigs = append(trigs, em.t)
		}
	}
	if len(trigs) == 0 {
		return nil
	}
	res, err := h.runRule(ctx, r, trigs, bt, passCauses)
	if err != nil {
		return err
	}
	for i := range ems {
		if !ems[i].healthy {
			ems[i].res.causes = res[ems[i].t.tid].causes
		}
	}
	return nil
}

// derive builds a derived event.
func (h *Handler) derive(r *Rule, em emission) *datamodels.HealthEvent {
	t, res, mode := em.t, em.res, em.mode
	vars := Vars{Rule: r.Name, Cluster: t.cluster, Node: t.dnode, Entity: t.dentity, Check: t.check,
		Value: res.value, Threshold: r.Threshold, Window: r.Window}
	if r.Scope == ScopeCluster {
		vars.Entity = t.gkey
	}
	class := r.Spec.Emit.ComponentClass
	if class == "" {
		class = t.class
	}
	ts := timestamppb.New(time.UnixMilli(t.atMS).UTC())
	// Received: when its trigger reached faultline (the gateway's clock),
	// not the trigger's generatedTimestamp (an agent's): the quarantine
	// role tells an earlier machine's events from a Node object's own by
	// the received time (an event of a new machine's boot, generated
	// before its Node registered, is its own).
	recv := ts
	if t.recvMS != 0 {
		recv = timestamppb.New(time.UnixMilli(t.recvMS).UTC())
	}
	ev := &datamodels.HealthEvent{
		Version:            1,
		Id:                 em.id,
		Agent:              Agent,
		ComponentClass:     class,
		CheckName:          r.CheckName,
		EntitiesImpacted:   t.entities,
		GeneratedTimestamp: ts,
		ReceivedTimestamp:  recv,
		Cluster:            t.cluster,
		DerivedBy:          r.Name,
		ProcessingStrategy: r.Strategy,
		// Derived by faultline itself: the pipeline's role, the rule's name
		// (pipeline events never carry overrides, and none would be honoured).
		Submitter: &datamodels.Submitter{Name: r.Name, Role: datamodels.SubmitterRole_SUBMITTER_ROLE_PIPELINE},
		Metadata: map[string]string{
			MetaMode: mode, MetaGroup: t.gkey, MetaValue: strconv.FormatFloat(res.value, 'f', -1, 64),
			MetaThreshold: strconv.FormatFloat(r.Threshold, 'f', -1, 64), MetaWindow: r.Window.String(),
		},
	}
	if t.dnode != ClusterNode {
		ev.NodeName = t.dnode
		events.SetSystemUUID(ev, t.machine, validate.MaxMetadata)
	}
	if t.sourceID != "" {
		ev.Metadata[MetaTrigger] = t.sourceID
	}
	if mode != ModeLive {
		ev.ProcessingStrategy = datamodels.ProcessingStrategy_STORE_ONLY
	}
	if em.by != "" {
		ev.Metadata[MetaSuppress] = em.by
	}
	if em.healthy {
		ev.IsHealthy = true
		ev.RecommendedAction = datamodels.RecommendedAction_NONE
		ev.Message = render(r.recovery, vars)
		return ev
	}
	ev.IsFatal = r.Spec.Emit.IsFatal
	ev.RecommendedAction = r.Action
	ev.Message = render(r.message, vars)
	causes := append([]string(nil), res.causes...)
	if t.sourceID != "" && !slices.Contains(causes, t.sourceID) {
		causes = append(causes, t.sourceID)
	}
	sort.Strings(causes)
	ev.CauseIds = causes
	ev.ErrorCode = []string{r.Name}
	return ev
}

// DerivedID is the deterministic id of a derived event (a UUIDv8 text):
// a hash of the rule, the group (cluster, node, entity key), the id of the
// group's previous derived event ("" for the first) and the polarity.
func DerivedID(rule, cluster, node, entity, prevID string, healthy bool) string {
	pol := "fault"
	if healthy {
		pol = "recovery"
	}
	return events.HashID("faultline-correlate/v1", rule, cluster, node, entity, prevID, pol)
}

// remember keeps an emitted verdict until the store has written it.
func (h *Handler) remember(r *Rule, key string, p prior) {
	h.mu.Lock()
	h.cache[r.Name+"\x00"+key] = p
	h.mu.Unlock()
}

func (h *Handler) cached(r *Rule, key string) (prior, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	p, ok := h.cache[r.Name+"\x00"+key]
	return p, ok
}

// cachedOf returns what this replica remembers of the rule for the groups
// of trigs (a group it remembers nothing of: a zero prior).
func (h *Handler) cachedOf(r *Rule, trigs []trigger) map[string]prior {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]prior, len(trigs))
	for _, t := range trigs {
		out[t.groupKey()] = h.cache[r.Name+"\x00"+t.groupKey()]
	}
	return out
}

// restore puts back what was remembered of the rule's groups (cachedOf)
// where the memory still holds what decide remembered (decided, the
// plan's priors after decide): a batch may have remembered a verdict of
// the group since.
func (h *Handler) restore(r *Rule, was, decided map[string]prior) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for key, old := range was {
		k := r.Name + "\x00" + key
		cur, ok := h.cache[k]
		d := decided[key]
		if !ok || cur.id != d.id || cur.tMS != d.tMS || cur.healthy != d.healthy || !cur.seen.Equal(d.seen) {
			continue
		}
		if old.id == "" {
			delete(h.cache, k)
		} else {
			h.cache[k] = old
		}
	}
}

func (h *Handler) expireCache() {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, p := range h.cache {
		if now.Sub(p.seen) > h.ttl {
			delete(h.cache, k)
		}
	}
}

// ActionVars is the CEL `action` variable.
func ActionVars(a *faultlinev1.Action) map[string]any {
	det := make(map[string]any, len(a.GetDetails()))
	for k, v := range a.GetDetails() {
		det[k] = v
	}
	return map[string]any{
		"id": a.GetId(), "cluster": a.GetCluster(), "node": a.GetNode(), "role": a.GetRole(),
		"kind": a.GetKind(), "outcome": a.GetOutcome(), "reason": a.GetReason(), "rule": a.GetRule(),
		"eventIds": toAny(a.GetEventIds()), "dryRun": a.GetDryRun(), "details": det,
		"checkName": a.GetCheckName(), "recommendedAction": a.GetRecommendedAction(),
	}
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// gpuOf reads a GPU's entity key as the kmsg agent writes it: "PCI=<pci>"
// (the UUID not known yet) or "PCI=<pci>,GPU=<uuid>"; ok is false for any
// other key.
func gpuOf(key string) (pci, gpu string, ok bool) {
	rest, ok := strings.CutPrefix(key, events.EntityPCI+"=")
	if !ok {
		return "", "", false
	}
	pci, tail, two := strings.Cut(rest, ",")
	if two {
		if gpu, ok = strings.CutPrefix(tail, events.EntityGPU+"="); !ok || gpu == "" || strings.Contains(gpu, ",") {
			return "", "", false
		}
	}
	if pci == "" {
		return "", "", false
	}
	return pci, gpu, true
}

// gpuGroup reads a group key (cluster\x00node\x00entity) whose entity
// names a GPU (gpuOf): id is the GPU's identity on its node
// (cluster\x00node\x00pci), the same for each spelling of its entity.
func gpuGroup(key string) (id, entity string, ok bool) {
	parts := strings.SplitN(key, "\x00", 3)
	if len(parts) != 3 {
		return "", "", false
	}
	pci, _, ok := gpuOf(parts[2])
	if !ok {
		return "", "", false
	}
	return parts[0] + "\x00" + parts[1] + "\x00" + pci, parts[2], true
}

// sameGPU gives an entity-scope trigger on a GPU (gpuOf) the group of the
// GPU's verdict under another spelling of its entity key, where the window
// queries count the two as one GPU (sql/rules/xid_count.sql: the same PCI
// address and not two different UUIDs on the node): the kmsg agent names a
// GPU "PCI=…" until it knows its UUID and "PCI=…,GPU=…" afterwards (or
// "PCI=…" again once restarted), and NVSentinel's syslog monitor "PCI=…"
// always. Keyed by the exact spelling, one GPU's Xids started a second
// verdict under the second spelling, and the sweep recovered both. A
// trigger keeps its own group where its verdict stands; else it takes, in
// order: the newest standing verdict of another spelling; the spelling an
// earlier trigger of the GPU took in these triggers (so one batch starts
// one verdict); the newest of its own recovered verdict and those of the
// other spellings that it is late against (generated at or before their
// recovery: it is then judged after that recovery, prepare) or that name
// the UUID it lacks. A trigger naming the UUID after every recovery keeps
// its own spelling: taking an old recovered
// verdict's "PCI=…" alone, a GPU's later verdicts no longer named its UUID
// (remediation, drain's reset scope and pod matching found no GPU).
// priors holds the other spellings' groups (priors reads them).
func sameGPU(r *Rule, priors map[string]prior, trigs []trigger) {
	if r.Scope != ScopeEntity {
		return
	}
	known := map[string][]string{} // gpuGroup's id -> the entity keys of priors
	for k := range priors {
		if id, e, ok := gpuGroup(k); ok {
			known[id] = append(known[id], e)
		}
	}
	taken := map[string][]string{} // the spellings these triggers took, by GPU
	for i := range trigs {
		t := &trigs[i]
		id, _, ok := gpuGroup(t.groupKey())
		if !ok {
			continue
		}
		_, gpu, _ := gpuOf(t.dentity)
		priorOf := func(e string) prior { return priors[t.cluster+"\x00"+t.dnode+"\x00"+e] }
		same := func(e string) bool {
			_, g, _ := gpuOf(e)
			return e != t.dentity && (gpu == "" || g == "" || g == gpu)
		}
		// names: e names the GPU's UUID where the trigger does not (a
		// "PCI=…" alone: NVSentinel's syslog monitor, kmsg before it
		// learns the UUID), the newest UUID with a verdict at that
		// address, within MaxStanding: its recovered verdict is taken
		// even after the recovery, or the new verdict would name no
		// UUID. Older, it may be a GPU since replaced at the same address
		// (the new UUID's trigger would start a second verdict).
		names := func(e string, q prior) bool {
			_, g, _ := gpuOf(e)
			if gpu != "" || g == "" || q.tMS < t.atMS-MaxStanding.Milliseconds() {
				return false
			}
			for _, o := range known[id] {
				if _, og, _ := gpuOf(o); og != "" && og != g && priorOf(o).tMS >= q.tMS {
					return false
				}
			}
			return true
		}
		pick := t.dentity
		if p, has := priors[t.groupKey()]; !has || p.healthy {
			var best prior
			found := false
			for _, e := range known[id] {
				if q := priorOf(e); same(e) && !q.healthy && (!found || q.tMS > best.tMS) {
					pick, best, found = e, q, true
				}
			}
			if !found {
				if j := slices.IndexFunc(taken[id], same); j >= 0 {
					pick, found = taken[id][j], true
				}
			}
			if !found {
				best, found = p, has
				for _, e := range known[id] {
					if q := priorOf(e); same(e) && (t.atMS <= q.tMS || names(e, q)) && (!found || q.tMS > best.tMS) {
						pick, best, found = e, q, true
					}
				}
			}
		}
		if pick != t.dentity {
			t.dentity, t.entities = pick, gpuEntities(pick)
		}
		if !slices.Contains(taken[id], pick) {
			taken[id] = append(taken[id], pick)
		}
	}
}

// gpuEntities are the impacted entities of a GPU's entity key (gpuOf).
func gpuEntities(key string) []*datamodels.Entity {
	pci, gpu, _ := gpuOf(key)
	out := []*datamodels.Entity{{EntityType: events.EntityPCI, EntityValue: pci}}
	if gpu != "" {
		out = append(out, &datamodels.Entity{EntityType: events.EntityGPU, EntityValue: gpu})
	}
	return out
}
