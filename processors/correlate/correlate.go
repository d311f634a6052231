// Package correlate is the correlation processor role (`faultline process
// --role=correlate`), the Health Events Analyzer of the seeds: time-window
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
	"crypto/sha256"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
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

	mu    sync.Mutex
	cache map[string]prior
}

// Metrics are the role's own metrics.
type Metrics struct {
	derived *prometheus.CounterVec
	query   *prometheus.HistogramVec
}

// NewMetrics registers the metrics on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		derived: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_correlate_derived_total", Help: "Derived events emitted, by rule, polarity (verdict, recovery) and mode (live, shadow, suppressed)."}, []string{"rule", "kind", "mode"}),
		query:   prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "faultline_correlate_query_seconds", Help: "Time of one rule query.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}, []string{"rule"}),
	}
	if reg != nil {
		reg.MustRegister(m.derived, m.query)
	}
	return m
}

// New returns a handler for the rules, querying through conn. now is the
// clock (time.Now in production); ttl is Config.CacheTTL.
func New(conn clickhouse.Conn, rules []*Rule, now func() time.Time, ttl time.Duration, log *slog.Logger, m *Metrics) *Handler {
	if m == nil {
		m = NewMetrics(nil)
	}
	h := &Handler{conn: conn, rules: rules, byName: map[string]*Rule{}, now: now, log: log, ttl: ttl, metrics: m, cache: map[string]prior{}}
	for _, r := range rules {
		h.byName[r.Name] = r
	}
	return h
}

// item is one decoded record.
type item struct {
	ev      *datamodels.HealthEvent
	act     *faultlinev1.Action
	cluster string
	node    string
	atMS    int64
	vars    map[string]any
}

// trigger is one evaluation of a rule: a group at a time.
type trigger struct {
	tid       string
	cluster   string
	node      string // the trigger's node (queries join on it for node/entity scope)
	gkey      string
	entities  []*datamodels.Entity
	class     string
	check     string
	atMS      int64
	sourceID  string
	dnode     string // node of the derived event
	dentity   string // entity key of the derived event
	fromSweep bool
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
	mode    string
	seen    time.Time // when this replica emitted it (cache only)
	// trig is the id of the event that made this replica emit it, and
	// before/hadBefore what stood before: a batch retried after its
	// outputs failed to be produced re-emits the same derived event
	// instead of taking its own unproduced output for the standing state.
	trig   string
	before *prior
}

// Handle evaluates every rule over the batch and returns the derived
// events to produce. Undecodable records are the store's to dead-letter;
// here they are skipped.
func (h *Handler) Handle(ctx context.Context, recs []*kgo.Record) (pipeline.Result, error) {
	items := decode(recs, h.log)
	h.expireCache()
	var bt batchTables
	var out []*kgo.Record
	for _, r := range h.rules {
		trigs := h.triggers(r, items)
		if len(trigs) == 0 {
			continue
		}
		if bt.items == nil {
			bt.items = items
		}
		recs, err := h.evaluate(ctx, r, trigs, &bt)
		if err != nil {
			return pipeline.Result{}, err
		}
		out = append(out, recs...)
	}
	return pipeline.Result{Out: out}, nil
}

func decode(recs []*kgo.Record, log *slog.Logger) []item {
	items := make([]item, 0, len(recs))
	for _, rec := range recs {
		keyCluster, keyNode, _ := events.SplitKey(rec.Key)
		switch rec.Topic {
		case events.TopicActions:
			a, err := events.UnmarshalAction(rec.Value)
			if err != nil || a.GetId() == "" {
				log.Debug("action skipped", "offset", rec.Offset, "err", err)
				continue
			}
			it := item{act: a, cluster: a.GetCluster(), node: a.GetNode()}
			if it.cluster == "" {
				it.cluster = keyCluster
			}
			if it.node == "" {
				it.node = keyNode
			}
			ts := rec.Timestamp
			if a.GetTimestamp() != nil {
				ts = a.GetTimestamp().AsTime()
			}
			it.atMS = ts.UnixMilli()
			items = append(items, it)
		default:
			ev, err := events.Unmarshal(rec.Value)
			if err != nil || ev.GetId() == "" {
				log.Debug("event skipped", "offset", rec.Offset, "err", err)
				continue
			}
			it := item{ev: ev, cluster: ev.GetCluster(), node: ev.GetNodeName()}
			if it.cluster == "" {
				it.cluster = keyCluster
			}
			if it.node == "" {
				it.node = keyNode
			}
			if it.cluster == "" {
				continue
			}
			ts := rec.Timestamp
			if ev.GetReceivedTimestamp() != nil {
				ts = ev.GetReceivedTimestamp().AsTime()
			}
			if ev.GetGeneratedTimestamp() != nil {
				ts = ev.GetGeneratedTimestamp().AsTime()
			}
			it.atMS = ts.UnixMilli()
			items = append(items, it)
		}
	}
	return items
}

// triggers returns the rule's evaluations for the batch, in batch order.
// Derived and STORE_ONLY events never trigger (no loops; processing
// strategy honoured).
func (h *Handler) triggers(r *Rule, items []item) []trigger {
	var out []trigger
	for i := range items {
		it := &items[i]
		if r.Source == SourceActions {
			if it.act == nil {
				continue
			}
			if it.vars == nil {
				it.vars = map[string]any{"action": ActionVars(it.act)}
			}
			if !r.matches(it.vars) {
				continue
			}
			out = append(out, trigger{
				tid: strconv.Itoa(len(out)), cluster: it.cluster, node: it.node, atMS: it.atMS, sourceID: it.act.GetId(),
				entities: []*datamodels.Entity{{EntityType: events.EntityNode, EntityValue: it.node}},
				check:    it.act.GetCheckName(), dnode: it.node, dentity: events.EntityNode + "=" + it.node,
			})
			continue
		}
		ev := it.ev
		if ev == nil || events.IsDerived(ev) || events.StoreOnly(ev) {
			continue
		}
		if it.vars == nil {
			it.vars = map[string]any{"event": events.Vars(ev)}
		}
		if !r.matches(it.vars) {
			continue
		}
		t := trigger{tid: strconv.Itoa(len(out)), cluster: it.cluster, node: it.node, atMS: it.atMS, sourceID: ev.GetId(),
			class: ev.GetComponentClass(), check: ev.GetCheckName()}
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

// Signature is the fault signature of cluster-scoped rules:
// "checkName|firstErrorCode" (the SQL computes the same).
func Signature(ev *datamodels.HealthEvent) string {
	code := ""
	if len(ev.GetErrorCode()) > 0 {
		code = ev.GetErrorCode()[0]
	}
	return ev.GetCheckName() + "|" + code
}

// evaluate runs the rule's query for the triggers and turns the results
// into derived events.
func (h *Handler) evaluate(ctx context.Context, r *Rule, trigs []trigger, bt *batchTables) ([]*kgo.Record, error) {
	results, err := h.runRule(ctx, r, trigs, bt)
	if err != nil {
		return nil, err
	}
	priors, err := h.priors(ctx, r, trigs)
	if err != nil {
		return nil, err
	}
	var (
		out        []*kgo.Record
		suppressed map[string]string // cluster -> suppressing rule
	)
	for _, t := range trigs {
		res := results[t.tid]
		holds := res.value >= r.Threshold
		key := t.cluster + "\x00" + t.dnode + "\x00" + t.dentity
		p, has := priors[key]
		if has && p.trig != "" && p.trig == t.sourceID && p.tMS == t.atMS {
			if p.before == nil {
				p, has = prior{}, false
			} else {
				p = *p.before
			}
		}
		standing := has && !p.healthy
		var ev *datamodels.HealthEvent
		switch {
		case holds && !standing && (!has || t.atMS > p.tMS):
			mode := ModeLive
			if r.Shadow {
				mode = ModeShadow
			} else if len(r.Spec.SuppressedBy) > 0 {
				if suppressed == nil {
					if suppressed, err = h.suppressions(ctx, r, trigs); err != nil {
						return nil, err
					}
				}
				if _, ok := suppressed[t.cluster]; ok {
					mode = ModeSuppressed
				}
			}
			ev = h.derive(r, t, res, p.id, false, mode)
			if mode == ModeSuppressed {
				ev.Metadata[MetaSuppress] = suppressed[t.cluster]
			}
		case !holds && standing && r.Recover && t.atMS > p.tMS &&
			t.atMS-max(res.lastMS, p.tMS) >= r.Stabilization.Milliseconds():
			ev = h.derive(r, t, res, p.id, true, p.mode)
		default:
			continue
		}
		np := prior{id: ev.GetId(), healthy: ev.GetIsHealthy(), tMS: t.atMS, mode: ev.GetMetadata()[MetaMode], seen: h.now(), trig: t.sourceID}
		if has {
			b := p
			b.before = nil
			np.before = &b
		}
		priors[key] = np
		h.remember(r, key, np)
		b, err := events.Marshal(ev)
		if err != nil {
			return nil, fmt.Errorf("rule %s: encode derived event: %w", r.Name, err)
		}
		kind := "verdict"
		if ev.GetIsHealthy() {
			kind = "recovery"
		}
		h.metrics.derived.WithLabelValues(r.Name, kind, np.mode).Inc()
		h.log.Info("derived event", "rule", r.Name, "kind", kind, "mode", np.mode, "cluster", t.cluster,
			"node", t.dnode, "entity", t.dentity, "value", res.value, "id", ev.GetId())
		out = append(out, &kgo.Record{Topic: events.TopicEvents, Key: events.Key(t.cluster, t.dnode), Value: b})
	}
	return out, nil
}

// derive builds a derived event. Its id is a function of the rule, the
// group, the previous derived event of the group and the polarity, so
// whoever emits this verdict emits the same id.
func (h *Handler) derive(r *Rule, t trigger, res result, prevID string, healthy bool, mode string) *datamodels.HealthEvent {
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
	ev := &datamodels.HealthEvent{
		Version:            1,
		Id:                 DerivedID(r.Name, t.cluster, t.dnode, t.dentity, prevID, healthy),
		Agent:              Agent,
		ComponentClass:     class,
		CheckName:          r.CheckName,
		EntitiesImpacted:   t.entities,
		GeneratedTimestamp: ts,
		ReceivedTimestamp:  ts,
		Cluster:            t.cluster,
		DerivedBy:          r.Name,
		ProcessingStrategy: r.Strategy,
		Metadata: map[string]string{
			MetaMode: mode, MetaGroup: t.gkey, MetaValue: strconv.FormatFloat(res.value, 'f', -1, 64),
			MetaThreshold: strconv.FormatFloat(r.Threshold, 'f', -1, 64), MetaWindow: r.Window.String(),
		},
	}
	if t.dnode != ClusterNode {
		ev.NodeName = t.dnode
	}
	if t.sourceID != "" {
		ev.Metadata[MetaTrigger] = t.sourceID
	}
	if mode != ModeLive {
		ev.ProcessingStrategy = datamodels.ProcessingStrategy_STORE_ONLY
	}
	if healthy {
		ev.IsHealthy = true
		ev.RecommendedAction = datamodels.RecommendedAction_NONE
		ev.Message = render(r.recovery, vars)
		return ev
	}
	ev.IsFatal = r.Spec.Emit.IsFatal
	ev.RecommendedAction = r.Action
	ev.Message = render(r.message, vars)
	causes := append([]string(nil), res.causes...)
	if t.sourceID != "" && !contains(causes, t.sourceID) {
		causes = append(causes, t.sourceID)
	}
	sort.Strings(causes)
	ev.CauseIds = causes
	ev.ErrorCode = []string{r.Name}
	return ev
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// DerivedID is the deterministic id of a derived event (a UUIDv8 text):
// a hash of the rule, the group (cluster, node, entity key), the id of the
// group's previous derived event ("" for the first) and the polarity.
func DerivedID(rule, cluster, node, entity, prevID string, healthy bool) string {
	pol := "fault"
	if healthy {
		pol = "recovery"
	}
	sum := sha256.Sum256([]byte(strings.Join([]string{"faultline-correlate/v1", rule, cluster, node, entity, prevID, pol}, "\x00")))
	var u uuid.UUID
	copy(u[:], sum[:16])
	u[6] = (u[6] & 0x0f) | 0x80 // version 8: custom
	u[8] = (u[8] & 0x3f) | 0x80 // RFC 4122 variant
	return u.String()
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
