package correlate

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/ext"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/processors/rows"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// MaxStanding bounds how far back the sweep looks for standing verdicts
// (every window is bounded): a verdict older than this is not swept.
const MaxStanding = 30 * 24 * time.Hour

// batchTables are a batch's records as the external tables batch and
// batch_actions (processors/rows: the events and actions tables' own rows,
// under their column names), built once per batch (before the rule queries
// run concurrently) and sent with every query that reads them: sending
// only reads a table, so the concurrent queries share them.
type batchTables struct {
	events, actions *ext.Table
}

// Columns of the events and actions tables the rule queries read from the
// batch (sql/rules/README.md).
var (
	batchColumns = []string{"cluster", "node", "check", "entity", "ts", "ts_ms", "id", "is_fatal", "is_healthy",
		"error_codes", "entities.type", "entities.value", "metadata.key", "metadata.value", "derived_by", "processing_strategy"}
	batchActionColumns = []string{"cluster", "node", "ts", "ts_ms", "id", "kind", "outcome", "role", "rule", "dry_run",
		"details.key", "details.value"}
)

// newBatchTables maps the batch's records to rows (batchRows).
func newBatchTables(recs []*kgo.Record) (*batchTables, error) {
	var b batchRows
	b.add(recs)
	return b.tables()
}

// batchRows are the rows of the batch tables, added in parts. A record
// that can never be a row (rows.ErrPoison) is left out: the store
// dead-letters it, so it is in no window of the history either.
type batchRows struct {
	evs rows.Events
	acs rows.Actions
}

func (b *batchRows) add(recs []*kgo.Record) {
	b.evs.Grow(len(recs))
	for _, r := range recs {
		if r.Topic == events.TopicActions {
			_ = b.acs.Add(r)
		} else {
			_ = b.evs.Add(r)
		}
	}
}

func (b *batchRows) tables() (*batchTables, error) {
	bt := &batchTables{}
	var err error
	if bt.events, err = b.evs.Table("batch", batchColumns...); err != nil {
		return nil, err
	}
	if bt.actions, err = b.acs.Table("batch_actions", batchActionColumns...); err != nil {
		return nil, err
	}
	return bt, nil
}

type col struct{ name, typ string }

var (
	triggerCols = []col{{"tid", "String"}, {"cluster", "String"}, {"node", "String"}, {"gkey", "String"}, {"at", "DateTime"}, {"at_ms", "UInt64"},
		{"machine", "String"}}
	lookupCols = []col{{"cluster", "String"}, {"node", "String"}, {"entity", "String"}, {"pci", "String"}}
	nodeCols   = []col{{"cluster", "String"}, {"node", "String"}}
)

func newTable(name string, cols []col, rows [][]any) (*ext.Table, error) {
	opts := make([]func(*ext.Table) error, len(cols))
	for i, c := range cols {
		opts[i] = ext.Column(c.name, column.Type(c.typ))
	}
	t, err := ext.NewTable(name, opts...)
	if err != nil {
		return nil, fmt.Errorf("external table %s: %w", name, err)
	}
	for _, r := range rows {
		if err := t.Append(r...); err != nil {
			return nil, fmt.Errorf("external table %s: %w", name, err)
		}
	}
	return t, nil
}

// runRule runs the rule's query for the triggers: one query for all of
// them, with the batch sent along. A query ClickHouse refuses for its
// memory limit is run again for each half of the triggers, down to one:
// each trigger's value depends on its own window only, and the halves see
// the same batch, so the results are the same (a large batch, taken
// whole under a backlog, can need more than one query may use).
func (h *Handler) runRule(ctx context.Context, r *Rule, trigs []trigger, bt *batchTables, pass string) (map[string]result, error) {
	res, err := h.runRuleOnce(ctx, r, trigs, bt, pass)
	if err == nil || len(trigs) < 2 || !memoryLimited(err) {
		return res, err
	}
	h.metrics.splits.WithLabelValues(r.Name).Inc()
	h.log.Info("rule query over its memory limit, split in two", "rule", r.Name, "triggers", len(trigs), "err", err)
	half := len(trigs) / 2
	res, err = h.runRule(ctx, r, trigs[:half], bt, pass)
	if err != nil {
		return nil, err
	}
	rest, err := h.runRule(ctx, r, trigs[half:], bt, pass)
	if err != nil {
		return nil, err
	}
	maps.Copy(res, rest)
	return res, nil
}

// memoryLimited reports whether err is ClickHouse's MEMORY_LIMIT_EXCEEDED
// (code 241; a shard's, in a cluster, comes back with its code).
func memoryLimited(err error) bool {
	var ex *ch.Exception
	return errors.As(err, &ex) && ex.Code == 241
}

// The passes of a rule query: value reads every trigger's window value
// (and its cause ids, unless the rule reads them apart); causes reads
// the cause ids of the triggers that start a verdict (Rule.CausesApart).
const (
	passValue  = "value"
	passCauses = "causes"
)

// runRuleOnce runs the rule's query for the triggers. The value pass of a
// rule that reads its cause ids apart is wrapped in a SELECT that does not
// read them, so ClickHouse neither computes them nor carries the ids
// through the query's JOIN; another rule's value pass sends back the ids
// of the values at the threshold only.
func (h *Handler) runRuleOnce(ctx context.Context, r *Rule, trigs []trigger, bt *batchTables, pass string) (map[string]result, error) {
	minAt, maxAt := trigs[0].atMS, trigs[0].atMS
	rows := make([][]any, len(trigs))
	for i, t := range trigs {
		minAt, maxAt = min(minAt, t.atMS), max(maxAt, t.atMS)
		rows[i] = []any{t.tid, t.cluster, t.node, t.gkey, time.UnixMilli(t.atMS).UTC().Truncate(time.Second), uint64(t.atMS), t.machine}
	}
	tables := make([]*ext.Table, 0, 3)
	tt, err := newTable("triggers", triggerCols, rows)
	if err != nil {
		return nil, err
	}
	tables = append(tables, tt)
	q := r.query
	switch {
	case pass == passValue && r.CausesApart:
		q = "SELECT tid, value, emptyArrayString() AS cause_ids, last_ms FROM (" + q + "\n)"
	case pass == passValue:
		// only a value at the threshold can start a verdict: the other
		// triggers' ids are not sent back
		q = "SELECT tid, value, if(value >= @threshold, cause_ids, emptyArrayString()) AS cause_ids, last_ms FROM (" + q + "\n)"
	}
	if r.readsBatch {
		tables = append(tables, bt.events)
	}
	if r.readsBatchActions {
		tables = append(tables, bt.actions)
	}
	since := time.UnixMilli(minAt - r.Window.Milliseconds()).UTC().Truncate(time.Second)
	until := time.UnixMilli(maxAt).UTC().Truncate(time.Second).Add(time.Second)
	args := h.args(r, since, until)
	start := time.Now()
	res, err := h.query(ctx, r, q, tables, args)
	h.metrics.query.WithLabelValues(r.Name, pass).Observe(time.Since(start).Seconds())
	return res, err
}

func (h *Handler) args(r *Rule, since, until time.Time) []any {
	args := []any{
		ch.Named("window_ms", uint64(r.Window.Milliseconds())),
		ch.Named("since", since),
		ch.Named("until", until),
		ch.Named("threshold", r.Threshold),
	}
	for k, v := range r.args {
		args = append(args, ch.Named(k, v))
	}
	return args
}

func (h *Handler) query(ctx context.Context, r *Rule, q string, tables []*ext.Table, args []any) (map[string]result, error) {
	rows, err := h.conn.Query(ch.Context(ctx, ch.WithExternalTable(tables...)), q, args...)
	if err != nil {
		return nil, fmt.Errorf("rule %s: query: %w", r.Name, err)
	}
	defer rows.Close()
	out := map[string]result{}
	for rows.Next() {
		var (
			tid    string
			res    result
			lastMS uint64
		)
		if err := rows.Scan(&tid, &res.value, &res.causes, &lastMS); err != nil {
			return nil, fmt.Errorf("rule %s: scan (a rule query returns tid String, value Float64, cause_ids Array(String), last_ms UInt64): %w", r.Name, err)
		}
		res.lastMS = int64(lastMS)
		out[tid] = res
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("rule %s: query: %w", r.Name, err)
	}
	return out, nil
}

// modes are the derived-event modes that stand for the rule: a shadow
// rule's own records, or the live (and suppressed) verdicts.
func modes(r *Rule) []string {
	if r.Shadow {
		return []string{ModeShadow}
	}
	return []string{ModeLive, ModeSuppressed}
}

const priorsSQL = `
SELECT cluster, node, entity, argMax(id, t), argMax(is_healthy, t), max(t), argMax(mode, t), argMax(recv, t)
FROM
(
    SELECT cluster, node, entity, id, is_healthy, toUInt64(ts) * 1000 + ts_ms AS t, toUInt64(received) * 1000 AS recv,
        metadata.value[indexOf(metadata.key, 'mode')] AS mode
    FROM derived_events
    PREWHERE check = @check AND derived_by = @rule
    WHERE (cluster, node) IN (SELECT cluster, node FROM lookups)
        AND ((cluster, node, entity) IN (SELECT cluster, node, entity FROM lookups)
            OR (cluster, node, extract(entity, '^PCI=([^,]+)')) IN (SELECT cluster, node, pci FROM lookups WHERE pci != ''))
        AND has(@modes, mode)
)
GROUP BY cluster, node, entity`

// priors returns, per derived group of the triggers, the last derived event
// of the rule: from the events table, overlaid with what this replica
// emitted that may not be stored yet. For an entity-scope trigger on a GPU
// (gpuOf) it also returns the groups of the node's other spellings of the
// GPU's PCI address ("PCI=…" alone and "PCI=…,GPU=…"), which sameGPU
// matches the trigger to.
func (h *Handler) priors(ctx context.Context, r *Rule, trigs []trigger) (map[string]prior, error) {
	seen := map[string]bool{}
	pcis := map[string]bool{} // gpuGroup's ids of the GPU triggers
	var rows [][]any
	for _, t := range trigs {
		k := t.groupKey()
		if !seen[k] {
			seen[k] = true
			pci := ""
			if r.Scope == ScopeEntity {
				if id, _, ok := gpuGroup(k); ok {
					pci, _, _ = gpuOf(t.dentity)
					pcis[id] = true
				}
			}
			rows = append(rows, []any{t.cluster, t.dnode, t.dentity, pci})
		}
	}
	tbl, err := newTable("lookups", lookupCols, rows)
	if err != nil {
		return nil, err
	}
	res, err := h.conn.Query(ch.Context(ctx, ch.WithExternalTable(tbl)), priorsSQL,
		ch.Named("check", r.CheckName), ch.Named("rule", r.Name), ch.Named("modes", modes(r)))
	if err != nil {
		return nil, fmt.Errorf("rule %s: read standing verdicts: %w", r.Name, err)
	}
	defer res.Close()
	out := map[string]prior{}
	for res.Next() {
		var (
			cluster, node, entity, id, mode string
			healthy                         uint8
			t, recv                         uint64
		)
		if err := res.Scan(&cluster, &node, &entity, &id, &healthy, &t, &mode, &recv); err != nil {
			return nil, fmt.Errorf("rule %s: read standing verdicts: %w", r.Name, err)
		}
		out[cluster+"\x00"+node+"\x00"+entity] = prior{id: id, healthy: healthy == 1, tMS: int64(t), recvMS: int64(recv), mode: mode}
	}
	if err := res.Err(); err != nil {
		return nil, fmt.Errorf("rule %s: read standing verdicts: %w", r.Name, err)
	}
	overlay := func(k string, c prior) {
		if c.mode != "" && slices.Contains(modes(r), c.mode) {
			if p, ok := out[k]; !ok || c.tMS >= p.tMS {
				out[k] = c
			}
		}
	}
	if len(pcis) == 0 {
		for k := range seen {
			if c, ok := h.cached(r, k); ok {
				overlay(k, c)
			}
		}
		return out, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for key, c := range h.cache {
		rule, k, _ := strings.Cut(key, "\x00")
		if rule != r.Name {
			continue
		}
		if !seen[k] {
			if id, _, ok := gpuGroup(k); !ok || !pcis[id] {
				continue
			}
		}
		overlay(k, c)
	}
	return out, nil
}

const suppressSQL = `
SELECT cluster, entity, argMax(is_healthy, t)
FROM
(
    SELECT cluster, entity, is_healthy, toUInt64(ts) * 1000 + ts_ms AS t
    FROM derived_events
    PREWHERE node = @node AND check = @check AND derived_by = @rule
    WHERE has(@clusters, cluster) AND ts >= @since AND metadata.value[indexOf(metadata.key, 'mode')] = 'live'
)
GROUP BY cluster, entity`

// suppressions returns the clusters of the triggers where a rule named in
// r's suppressed_by has a standing live verdict, and which rule: its
// verdicts are read as far back as the sweep reads standing ones
// (MaxStanding). They were read from the last 24 h alone: a day into a
// fabric outage whose incident still stood, the per-node verdicts went out
// live, REPLACE_VM on every node.
func (h *Handler) suppressions(ctx context.Context, r *Rule, trigs []trigger) (map[string]string, error) {
	set := map[string]bool{}
	var clusters []string
	for _, t := range trigs {
		if !set[t.cluster] {
			set[t.cluster] = true
			clusters = append(clusters, t.cluster)
		}
	}
	out := map[string]string{}
	for _, name := range r.Spec.SuppressedBy {
		by := h.byName[name]
		if by == nil || by.Shadow {
			continue
		}
		standing := map[string]bool{} // cluster\0entity -> standing
		rows, err := h.conn.Query(ctx, suppressSQL, ch.Named("clusters", clusters), ch.Named("node", ClusterNode),
			ch.Named("check", by.CheckName), ch.Named("rule", by.Name), ch.Named("since", h.now().Add(-MaxStanding).UTC()))
		if err != nil {
			return nil, fmt.Errorf("rule %s: read %s verdicts: %w", r.Name, name, err)
		}
		for rows.Next() {
			var cluster, entity string
			var healthy uint8
			if err := rows.Scan(&cluster, &entity, &healthy); err != nil {
				rows.Close()
				return nil, fmt.Errorf("rule %s: read %s verdicts: %w", r.Name, name, err)
			}
			standing[cluster+"\x00"+entity] = healthy == 0
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("rule %s: read %s verdicts: %w", r.Name, name, err)
		}
		h.mu.Lock()
		for k, p := range h.cache {
			parts := strings.SplitN(k, "\x00", 4) // rule, cluster, node, entity
			if len(parts) == 4 && parts[0] == by.Name && set[parts[1]] && p.mode == ModeLive {
				standing[parts[1]+"\x00"+parts[3]] = !p.healthy
			}
		}
		h.mu.Unlock()
		for k, s := range standing {
			if s && r.suppressedBy(k) {
				c, _, _ := strings.Cut(k, "\x00")
				if _, ok := out[c]; !ok {
					out[c] = name
				}
			}
		}
	}
	return out, nil
}

// suppressedBy reports whether a suppressor's standing verdict (key
// cluster\x00entity, the entity FABRIC=<check>|<code>) is about r's checks:
// an incident suppresses only the rules over its own check (a NIC state
// incident the NIC rules, an NVSwitch SXid one not). Before, a standing
// incident of any signature suppressed the whole cluster's NIC rules: a
// node's port DOWN for good stood STORE_ONLY while four nodes' SXids did.
// Where the rule reads only some codes of the check (counter_codes), the
// signature's code must be one of them: a NIC counter the rule does not
// read (four nodes' rnr_nak_retry_err) no more suppresses it than an SXid
// does. A rule that names no checks is suppressed by any.
func (r *Rule) suppressedBy(key string) bool {
	if len(r.reads) == 0 {
		return true
	}
	_, entity, _ := strings.Cut(key, "\x00")
	sig := strings.TrimPrefix(entity, EntityFabric+"=")
	check, code, _ := strings.Cut(sig, "|")
	codes, ok := r.reads[check]
	return ok && (codes == nil || slices.Contains(codes, code))
}

// heldSQL reads the standing suppressed verdicts of @rules (with their
// @checks) in @clusters: the groups whose last live or suppressed derived
// event is a suppressed verdict.
const heldSQL = `
SELECT derived_by, cluster, node, entity, argMax(grp, t), argMax(etypes, t), argMax(evalues, t),
    argMax(is_healthy, t) AS healthy, argMax(mode, t) AS last_mode
FROM
(
    SELECT derived_by, cluster, node, entity, is_healthy, toUInt64(ts) * 1000 + ts_ms AS t,
        metadata.value[indexOf(metadata.key, 'mode')] AS mode,
        metadata.value[indexOf(metadata.key, 'group')] AS grp,
        entities.type AS etypes, entities.value AS evalues
    FROM derived_events
    PREWHERE has(@rules, derived_by) AND has(@checks, check) AND has(@clusters, cluster)
    WHERE received >= @since AND ts >= @since AND has(['live', 'suppressed'], mode)
)
GROUP BY derived_by, cluster, node, entity
HAVING healthy = 0 AND last_mode = 'suppressed'`

// holdingSuppressed returns, per cluster of the plan's sweep triggers
// whose suppressed verdict still holds (that may go live), the nodes of
// the cluster whose standing suppressed verdicts still hold, of every
// rule suppressed by one of r's suppressors (r among them): its own
// groups in the plan by their results; the others, whoever sweeps them,
// read from derived_events (overlaid with this replica's memory) and
// evaluated at the sweep's time with their rule's query. Before, only the
// plan's triggers counted: with several replicas (the sweep shared by
// partition) a cluster's nodes spread over them each stayed under the
// threshold, and a cluster's suppressed NICPortDrops and
// RepeatedNICLinkFlaps were counted apart: all of them went live at once.
func (h *Handler) holdingSuppressed(ctx context.Context, pl *plan) (map[string]map[string]bool, error) {
	r := pl.r
	held := map[string]map[string]bool{}
	add := func(cluster, node string) {
		if held[cluster] == nil {
			held[cluster] = map[string]bool{}
		}
		held[cluster][node] = true
	}
	own := map[string]bool{} // r's groups the plan evaluates
	var (
		clusters []string
		atMS     int64
	)
	for _, t := range pl.trigs {
		own[t.groupKey()] = true
		p, has := priorFor(pl.priors, t)
		if !t.fromSweep || t.recoverOnly || !has || p.healthy || p.mode != ModeSuppressed ||
			pl.results[t.tid].value < r.Threshold {
			continue
		}
		if held[t.cluster] == nil {
			clusters = append(clusters, t.cluster)
		}
		add(t.cluster, t.dnode)
		atMS = max(atMS, t.atMS)
	}
	if len(clusters) == 0 {
		return held, nil
	}
	var rules []*Rule // those suppressed by one of r's suppressors
	var names, checks []string
	for _, o := range h.rules {
		if slices.ContainsFunc(o.Spec.SuppressedBy, func(by string) bool { return slices.Contains(r.Spec.SuppressedBy, by) }) {
			rules = append(rules, o)
			names, checks = append(names, o.Name), append(checks, o.CheckName)
		}
	}
	now := time.UnixMilli(atMS)
	rows, err := h.conn.Query(ctx, heldSQL, ch.Named("since", now.Add(-MaxStanding).UTC()),
		ch.Named("rules", names), ch.Named("checks", checks), ch.Named("clusters", clusters))
	if err != nil {
		return nil, fmt.Errorf("rule %s: read suppressed verdicts: %w", r.Name, err)
	}
	groups := map[string]trigger{} // rule\x00cluster\x00node\x00entity
	for rows.Next() {
		var (
			rule, cluster, node, entity, grp, mode string
			et, ev                                 []string
			healthy                                uint8
		)
		if err := rows.Scan(&rule, &cluster, &node, &entity, &grp, &et, &ev, &healthy, &mode); err != nil {
			rows.Close()
			return nil, fmt.Errorf("rule %s: read suppressed verdicts: %w", r.Name, err)
		}
		t := trigger{cluster: cluster, node: node, gkey: grp, dnode: node, dentity: entity, entities: entities(et, ev), fromSweep: true}
		groups[rule+"\x00"+t.groupKey()] = t
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("rule %s: read suppressed verdicts: %w", r.Name, err)
	}
	// what this replica emitted that may not be stored: a verdict that
	// stands suppressed, or one no longer does
	set := map[string]bool{}
	for _, c := range clusters {
		set[c] = true
	}
	h.mu.Lock()
	for k, p := range h.cache {
		parts := strings.SplitN(k, "\x00", 4) // rule, cluster, node, entity
		if len(parts) != 4 || !set[parts[1]] || !slices.Contains(names, parts[0]) {
			continue
		}
		switch {
		case !p.healthy && p.mode == ModeSuppressed:
			if _, ok := groups[k]; !ok {
				groups[k] = trigger{cluster: parts[1], node: parts[2], dnode: parts[2], dentity: parts[3], fromSweep: true}
			}
		case p.mode == ModeLive || p.mode == ModeSuppressed:
			delete(groups, k)
		}
	}
	h.mu.Unlock()
	for _, o := range rules {
		var trigs []trigger
		for k, t := range groups {
			rule, gk, _ := strings.Cut(k, "\x00")
			if rule != o.Name || o == r && own[gk] || held[t.cluster][t.dnode] {
				continue
			}
			if t.gkey == "" && o.Scope == ScopeEntity {
				t.gkey = t.dentity // a verdict only remembered: its group is its entity key
			}
			t.tid, t.atMS, t.recvMS = fmt.Sprint(len(trigs)), atMS, atMS
			trigs = append(trigs, t)
		}
		if len(trigs) == 0 {
			continue
		}
		if o.readsMachine {
			machines, err := h.machines(ctx, trigs, now, o.Window)
			if err != nil {
				return nil, fmt.Errorf("rule %s: %w", r.Name, err)
			}
			for j := range trigs {
				trigs[j].machine = machines[nodeKey{trigs[j].cluster, trigs[j].node}]
			}
		}
		empty, err := newBatchTables(nil)
		if err != nil {
			return nil, err
		}
		res, err := h.runRule(ctx, o, trigs, empty, passValue)
		if err != nil {
			return nil, fmt.Errorf("rule %s: the cluster's suppressed verdicts: %w", r.Name, err)
		}
		for _, t := range trigs {
			if res[t.tid].value >= o.Threshold {
				add(t.cluster, t.dnode)
			}
		}
	}
	return held, nil
}

const standingSQL = `
SELECT derived_by, cluster, node, entity, shadow, argMax(is_healthy, t) AS healthy, argMax(grp, t),
    argMax(etypes, t), argMax(evalues, t)
FROM
(
    SELECT derived_by, cluster, node, entity, is_healthy, toUInt64(ts) * 1000 + ts_ms AS t,
        metadata.value[indexOf(metadata.key, 'mode')] = 'shadow' AS shadow,
        metadata.value[indexOf(metadata.key, 'group')] AS grp,
        entities.type AS etypes, entities.value AS evalues
    FROM derived_events
    PREWHERE has(@rules, derived_by) AND has(@checks, check)
    WHERE received >= @since AND ts >= @since
)
GROUP BY derived_by, cluster, node, entity, shadow
HAVING healthy = 0`

// Sweep evaluates what time alone changes, at the clock's now: for every
// rule, its standing verdicts (which recover once the window no longer
// holds and the stabilization window has passed) and the groups of its
// candidates query (verdicts that start to hold with nothing arriving, such
// as a port that stays DOWN). It returns the derived events to produce.
// A replica sweeps the groups keyed to the events partitions it consumes
// (all of them until it knows); replicas that overlap, as during a
// rebalance, emit the same ids.
func (h *Handler) Sweep(ctx context.Context) ([]*kgo.Record, error) {
	now := h.now()
	h.expireCache()
	names, checks := make([]string, 0, len(h.rules)), make([]string, 0, len(h.rules))
	for _, r := range h.rules {
		names, checks = append(names, r.Name), append(checks, r.CheckName)
	}
	// standing: per rule, its groups' standing verdicts of the mode the
	// rule runs in; unshadowed: the live or suppressed ones of a rule now
	// shadowed (correlate.shadow, the way to stop a noisy rule), which are
	// still recovered, in their own mode: skipped, they stood for good and
	// their nodes stayed cordoned.
	standing, unshadowed := map[string][]trigger{}, map[string][]trigger{}
	rows, err := h.conn.Query(ctx, standingSQL, ch.Named("since", now.Add(-MaxStanding).UTC()),
		ch.Named("rules", names), ch.Named("checks", checks))
	if err != nil {
		return nil, fmt.Errorf("sweep: read standing verdicts: %w", err)
	}
	for rows.Next() {
		var (
			rule, cluster, node, entity, grp string
			shadow, healthy                  uint8
			et, ev                           []string
		)
		if err := rows.Scan(&rule, &cluster, &node, &entity, &shadow, &healthy, &grp, &et, &ev); err != nil {
			rows.Close()
			return nil, fmt.Errorf("sweep: read standing verdicts: %w", err)
		}
		r := h.byName[rule]
		if r == nil || shadow == 1 && !r.Shadow {
			continue
		}
		t := trigger{cluster: cluster, node: node, gkey: grp, dnode: node, dentity: entity, entities: entities(et, ev), fromSweep: true}
		if r.Scope == ScopeCluster {
			t.node = ""
		}
		if shadow == 0 && r.Shadow {
			t.recoverOnly = true
			unshadowed[rule] = append(unshadowed[rule], t)
			continue
		}
		standing[rule] = append(standing[rule], t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sweep: read standing verdicts: %w", err)
	}
	if err := h.orphans(ctx, names, checks, now); err != nil {
		return nil, err
	}
	swept, sweptLive := make([][]trigger, len(h.rules)), make([][]trigger, len(h.rules))
	failed := make([]bool, len(h.rules))
	var lookback time.Duration // the longest window that counts by machine
	var named []trigger        // the triggers of the rules that count by machine
	for i, r := range h.rules {
		trigs := standing[r.Name]
		if r.Candidates != "" {
			cands, err := h.candidates(ctx, r, now)
			if err != nil {
				if ctx.Err() != nil {
					return nil, err
				}
				h.sweepFailed(r, err)
				failed[i] = true
				continue
			}
			trigs = append(trigs, cands...)
		}
		swept[i], sweptLive[i] = h.owned(trigs, now), h.owned(unshadowed[r.Name], now)
		if r.readsMachine && len(swept[i])+len(sweptLive[i]) > 0 {
			lookback = max(lookback, r.Window)
			named = append(append(named, swept[i]...), sweptLive[i]...)
		}
	}
	var machines map[nodeKey]string
	if lookback > 0 {
		var err error
		if machines, err = h.machines(ctx, named, now, lookback); err != nil {
			return nil, fmt.Errorf("sweep: %w", err)
		}
	}
	bt, err := h.sweptUnstored(swept, sweptLive)
	if err != nil {
		return nil, err
	}
	// down: the rules whose sweep failed or was skipped. A rule suppressed
	// by one of them (suppressed_by; swept after it, suppressorsFirst) is
	// skipped too: without its suppressor's standing incident (its
	// candidates failed, or evaluate forgot the incident it had decided)
	// it would derive live verdicts — REPLACE_VM on every node behind a
	// dead switch. It sweeps again when its suppressor does.
	down := map[string]bool{}
	var out []*kgo.Record
	for i, r := range h.rules {
		if !failed[i] {
			if j := slices.IndexFunc(r.Spec.SuppressedBy, func(by string) bool { return down[by] }); j >= 0 {
				h.sweepSkipped(r, r.Spec.SuppressedBy[j])
				failed[i] = true
			}
		}
		if failed[i] {
			down[r.Name] = true
			continue
		}
		for pass, trigs := range [][]trigger{swept[i], sweptLive[i]} {
			if len(trigs) == 0 {
				continue
			}
			if r.readsMachine {
				for j := range trigs {
					trigs[j].machine = machines[nodeKey{trigs[j].cluster, trigs[j].node}]
				}
			}
			er := r
			if pass == 1 {
				// the live verdicts of a rule now shadowed: read, decided
				// and recovered as the live rule's (recoverOnly: none starts)
				live := *r
				live.Shadow = false
				er = &live
			}
			recs, err := h.evaluate(ctx, er, trigs, bt)
			if err != nil {
				if ctx.Err() != nil {
					return nil, fmt.Errorf("sweep: %w", err)
				}
				h.sweepFailed(r, err)
				down[r.Name] = true
				break
			}
			out = append(out, recs...)
		}
	}
	return out, nil
}

// sweptUnstored returns the batch tables of a sweep: the records of this
// replica's earlier batches that the store may not have written yet
// (unstored), of the swept groups' nodes and, for a cluster-scope rule,
// clusters — as a batch's tables carry them. The sweep's windows then see
// what the batches saw: a trigger a batch skipped, its group's verdict
// standing and recovered in the sweep only (recovery = "sweep"), is in
// neither ClickHouse nor any later batch until the store writes it; a
// sweep without it took the window for empty and recovered the verdict
// (a GPU with a fifth Xid burst in 24h cleared), and nothing evaluated
// the skipped trigger again. The memory is only read: what the store has
// written is forgotten as the batches go on (refresh), and a record both
// remembered and stored counts once (LIMIT 1 BY id).
func (h *Handler) sweptUnstored(swept ...[][]trigger) (*batchTables, error) {
	keys, clusters := map[string]bool{}, map[string]bool{}
	for _, byRule := range swept {
		for i, trigs := range byRule {
			for _, t := range trigs {
				if h.rules[i].Scope == ScopeCluster {
					clusters[t.cluster] = true
				} else {
					keys[string(events.Key(t.cluster, t.dnode))] = true
				}
			}
		}
	}
	return newBatchTables(h.unstored.ofKeys(keys, clusters))
}

// sweepFailed counts and logs a rule whose sweep failed: the sweep goes
// on with the other rules (evaluate left none of the failed rule's
// verdicts remembered as emitted), and the next sweep tries the rule
// again. Before, one rule's failure threw away every rule's records while
// this replica remembered the verdicts decided before it as emitted: no
// rule's verdict or recovery came out of the sweep until the failing rule
// was fixed (and correlate.cache_ttl had passed).
func (h *Handler) sweepFailed(r *Rule, err error) {
	h.metrics.sweepErrors.WithLabelValues(r.Name).Inc()
	h.log.Warn("rule's sweep failed; the other rules' went on, this one is tried again at the next sweep", "rule", r.Name, "err", err)
}

// sweepSkipped logs that a rule was not swept because the sweep of a rule
// it is suppressed by failed (or was skipped). It is not counted in
// faultline_correlate_sweep_errors_total: its own queries did not fail,
// and FaultlineCorrelateRuleSweepFailing names the suppressor.
func (h *Handler) sweepSkipped(r *Rule, suppressor string) {
	h.log.Warn("rule's sweep skipped: the sweep of a rule it is suppressed by failed; tried again at the next sweep", "rule", r.Name, "suppressed_by", suppressor)
}

// owned returns the triggers of the groups this replica sweeps, one per
// group, evaluated at now.
func (h *Handler) owned(trigs []trigger, now time.Time) []trigger {
	seen := map[string]bool{}
	uniq := trigs[:0]
	for _, t := range trigs {
		k := t.groupKey()
		if seen[k] || !h.Owns(events.Key(t.cluster, t.dnode)) {
			continue
		}
		seen[k] = true
		t.tid, t.atMS, t.recvMS = fmt.Sprint(len(uniq)), now.UnixMilli(), now.UnixMilli()
		uniq = append(uniq, t)
	}
	return uniq
}

// orphansSQL reads the standing live or suppressed verdicts of rules not
// in @rules with their @checks (a rule dropped from the file, or whose
// emit.check_name changed), per group.
const orphansSQL = `
SELECT derived_by, check, cluster, node
FROM
(
    SELECT derived_by, check, cluster, node, entity, argMax(is_healthy, t) AS healthy
    FROM
    (
        SELECT derived_by, check, cluster, node, entity, is_healthy, toUInt64(ts) * 1000 + ts_ms AS t
        FROM derived_events
        WHERE received >= @since AND ts >= @since
            AND NOT arrayExists((r, c) -> r = derived_by AND c = check, @rules, @checks)
            AND has(['live', 'suppressed'], metadata.value[indexOf(metadata.key, 'mode')])
    )
    GROUP BY derived_by, check, cluster, node, entity
    HAVING healthy = 0
)`

// orphans counts the standing live or suppressed verdicts, of the groups
// this replica sweeps, whose rule the file no longer has under that check
// name (orphansSQL): nothing evaluates them, so nothing recovers them and
// what acts on them (quarantine) holds on. The count is the metric
// faultline_correlate_orphan_verdicts, and each sweep that finds any logs
// a warning naming the rules: the operator recovers them by restoring the
// rule (in shadow mode: it recovers its live verdicts) until they clear.
func (h *Handler) orphans(ctx context.Context, rules, checks []string, now time.Time) error {
	rows, err := h.conn.Query(ctx, orphansSQL, ch.Named("since", now.Add(-MaxStanding).UTC()),
		ch.Named("rules", rules), ch.Named("checks", checks))
	if err != nil {
		return fmt.Errorf("sweep: read orphan verdicts: %w", err)
	}
	defer rows.Close()
	n, by := 0, map[string]int{}
	for rows.Next() {
		var rule, check, cluster, node string
		if err := rows.Scan(&rule, &check, &cluster, &node); err != nil {
			return fmt.Errorf("sweep: read orphan verdicts: %w", err)
		}
		if h.Owns(events.Key(cluster, node)) {
			n++
			by[rule+" (check "+check+")"]++
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("sweep: read orphan verdicts: %w", err)
	}
	h.metrics.orphans.Set(float64(n))
	if n > 0 {
		h.log.Warn("standing verdicts of rules no longer in the rules file (or of another check name) never recover; restore the rule, in shadow mode if need be, until they do",
			"verdicts", n, "rules", slices.Sorted(maps.Keys(by)))
	}
	return nil
}

// machinesSQL reads, per node, the machine (events.MetaSystemUUID) of its
// newest event in recent_events (those the windows count) that names one,
// in [@since, @until]. recent_events is ordered by (check, ts): a short
// range of ts is read directly, the node filter on its rows only (events,
// ordered by node, cannot prune where the nodes are a good part of the
// fleet: it read every granule's metadata, 10x the time).
const machinesSQL = `
SELECT cluster, node, argMax(m, t)
FROM
(
    SELECT cluster, node, toUInt64(ts) * 1000 + ts_ms AS t,
        metadata.value[indexOf(metadata.key, 'faultline.io/system-uuid')] AS m
    FROM recent_events
    PREWHERE ts >= @since AND ts <= @until
        AND cityHash64(cluster, node) IN (SELECT cityHash64(cluster, node) FROM lookups)
    WHERE m != ''
)
GROUP BY cluster, node`

// machinesRecent is how far back machines looks first: most nodes have
// reported within it, and only the others' rows of the whole lookback are
// read.
const machinesRecent = time.Hour

// nodeKey names a node of a cluster.
type nodeKey struct{ cluster, node string }

// machines returns the machine each node of the sweep's triggers reports
// now: that of its newest event naming one (machinesSQL) within lookback
// of now, the last machinesRecent read first. A sweep evaluates a node's
// windows for that machine, as a batch does for its trigger's: a machine
// swapped in under a kept Node object is not judged on its predecessor's
// events once it has reported (its first event stamped), and a verdict the
// sweep derives from the predecessor's events alone names the
// predecessor, which the quarantine role does not act on
// (processors/quarantine: an event of another machine). A node none of
// whose events names a machine is missing: its windows count every event.
func (h *Handler) machines(ctx context.Context, trigs []trigger, now time.Time, lookback time.Duration) (map[nodeKey]string, error) {
	out := map[nodeKey]string{}
	nodes := map[nodeKey]bool{}
	for _, t := range trigs {
		nodes[nodeKey{t.cluster, t.node}] = true
	}
	backs := []time.Duration{lookback}
	if lookback > machinesRecent {
		backs = []time.Duration{machinesRecent, lookback}
	}
	until := now.UTC().Truncate(time.Second).Add(time.Second)
	for _, back := range backs {
		var rows [][]any
		for n := range nodes {
			if out[n] == "" {
				rows = append(rows, []any{n.cluster, n.node})
			}
		}
		if len(rows) == 0 {
			break
		}
		if err := h.readMachines(ctx, rows, now.Add(-back).UTC().Truncate(time.Second), until, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// readMachines runs machinesSQL for the lookups rows (cluster, node) and
// adds what it finds to out.
func (h *Handler) readMachines(ctx context.Context, rows [][]any, since, until time.Time, out map[nodeKey]string) error {
	tbl, err := newTable("lookups", nodeCols, rows)
	if err != nil {
		return err
	}
	res, err := h.conn.Query(ch.Context(ctx, ch.WithExternalTable(tbl)), machinesSQL, ch.Named("since", since), ch.Named("until", until))
	if err != nil {
		return fmt.Errorf("read the nodes' machines: %w", err)
	}
	defer res.Close()
	for res.Next() {
		var n nodeKey
		var machine string
		if err := res.Scan(&n.cluster, &n.node, &machine); err != nil {
			return fmt.Errorf("read the nodes' machines: %w", err)
		}
		out[n] = machine
	}
	if err := res.Err(); err != nil {
		return fmt.Errorf("read the nodes' machines: %w", err)
	}
	return nil
}

// candidates runs the rule's candidates query over (now - window, now].
func (h *Handler) candidates(ctx context.Context, r *Rule, now time.Time) ([]trigger, error) {
	since := now.Add(-r.Window).UTC().Truncate(time.Second)
	until := now.UTC().Truncate(time.Second).Add(time.Second)
	rows, err := h.conn.Query(ctx, r.Candidates, h.args(r, since, until)...)
	if err != nil {
		return nil, fmt.Errorf("rule %s: candidates: %w", r.Name, err)
	}
	defer rows.Close()
	var out []trigger
	for rows.Next() {
		var (
			cluster, node, gkey string
			et, ev              []string
		)
		if err := rows.Scan(&cluster, &node, &gkey, &et, &ev); err != nil {
			return nil, fmt.Errorf("rule %s: candidates (returns cluster, node, gkey String, entity_types, entity_values Array(String)): %w", r.Name, err)
		}
		t := trigger{cluster: cluster, node: node, gkey: gkey, entities: entities(et, ev), fromSweep: true}
		switch r.Scope {
		case ScopeEntity:
			t.dnode, t.dentity = node, events.EntityKey(&datamodels.HealthEvent{EntitiesImpacted: t.entities})
		case ScopeNode:
			t.dnode, t.dentity = node, events.EntityNode+"="+node
			t.entities = []*datamodels.Entity{{EntityType: events.EntityNode, EntityValue: node}}
		case ScopeCluster:
			t.dnode, t.dentity = ClusterNode, EntityFabric+"="+gkey
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("rule %s: candidates: %w", r.Name, err)
	}
	return out, nil
}

func entities(types, values []string) []*datamodels.Entity {
	out := make([]*datamodels.Entity, 0, len(types))
	for i := range types {
		v := ""
		if i < len(values) {
			v = values[i]
		}
		out = append(out, &datamodels.Entity{EntityType: types[i], EntityValue: v})
	}
	return out
}
