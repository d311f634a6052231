// Package history serves the read side of the API from ClickHouse: the
// events (GET /v1/events) and the audit trail of actions (GET /v1/actions)
// of one cluster, newest first, paged with an opaque token (a page holds
// at most limit rows and MaxPageBytes), each event or action once however
// many times the store processor wrote it. Parameters
// that cannot match anything (a time outside DateTime's 1970-2106 range, a
// node name longer than Kubernetes allows, a page token it did not issue)
// are refused as InvalidArgument before any query; a query runs at most
// until its context's deadline, on the server too (max_execution_time).
package history

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	ch "github.com/ClickHouse/clickhouse-go/v2"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
	"github.com/faultline/faultline/schemas/validate"
)

const (
	// DefaultLimit is the page size when a request gives none.
	DefaultLimit = 100
	// MaxLimit is the largest page size.
	MaxLimit = 1000
	// MaxPageBytes bounds a page's encoded (protobuf) size: a page ends
	// before the event or action that would take it past this, whatever
	// the limit (its nextPageToken goes on from there), and holds at least
	// one. 1000 of the largest events the gateway accepts are ~200 MB.
	MaxPageBytes = 4 << 20
)

// pageBudget is what a page's events (or actions) may take of
// MaxPageBytes, each counted as framed in the response (framed); the
// nextPageToken takes the rest. MaxPageBytes is grpc-go's default receive
// limit, so a page over it is refused by a default client on every retry.
const pageBudget = MaxPageBytes - 256

// framed is the encoded size of an n-byte message in a repeated field:
// its tag, its length and itself.
func framed(n int) int { return 1 + protowire.SizeVarint(uint64(n)) + n }

// ClickHouse implements the gateway's History over the events and actions
// tables.
type ClickHouse struct {
	conn clickhouse.Conn
	log  *slog.Logger
}

// New returns a History reading through conn (a connection to faultline's
// database, e.g. from clickhouse.Setup or clickhouse.Open).
func New(conn clickhouse.Conn, log *slog.Logger) *ClickHouse {
	return &ClickHouse{conn: conn, log: log.With("component", "history")}
}

// cursor is the position after the last row of a page: its time in
// milliseconds and its id. Pages are ordered by (time, id) descending.
type cursor struct {
	ms int64
	id string
}

func (c cursor) token() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.ms, 10) + "|" + c.id))
}

// maxTokenLen bounds a page token: a cursor is at most 20 digits, a
// separator and a 128-byte id, about 200 bytes of base64.
const maxTokenLen = 256

// The range of ClickHouse's DateTime (UInt32 seconds): a time outside it
// cannot match any row, so a bound outside it is a mistake (400).
var (
	minTime = time.Unix(0, 0).UTC()
	maxTime = time.Unix(math.MaxUint32, 0).UTC()
)

func parseToken(tok string) (*cursor, error) {
	if tok == "" {
		return nil, nil
	}
	if len(tok) <= maxTokenLen {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err == nil {
			ms, id, ok := strings.Cut(string(b), "|")
			n, perr := strconv.ParseInt(ms, 10, 64)
			if ok && perr == nil && n >= 0 && n <= maxTime.UnixMilli() && id != "" && len(id) <= 128 && plain(id) {
				return &cursor{ms: n, id: id}, nil
			}
		}
	}
	return nil, status.Errorf(codes.InvalidArgument, "pageToken: not a token this server issued")
}

// nodeName is a Kubernetes node name (an RFC 1123 subdomain).
var nodeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// plain reports whether s has no control characters.
func plain(s string) bool { return strings.IndexFunc(s, unicode.IsControl) < 0 }

// checkFilters refuses filters that cannot match anything the gateway
// accepts, with the parameter named (InvalidArgument, 400), instead of
// sending them to ClickHouse.
func checkFilters(node, check, entity string, since, until *timestamppb.Timestamp) error {
	switch {
	case len(node) > 253:
		return status.Errorf(codes.InvalidArgument, "node: longer than 253 bytes, the Kubernetes limit")
	case node != "" && !nodeName.MatchString(node):
		return status.Errorf(codes.InvalidArgument, "node: not a Kubernetes node name (a lowercase RFC 1123 subdomain)")
	case len(check) > 256 || !plain(check):
		return status.Errorf(codes.InvalidArgument, "check: must be at most 256 bytes with no control characters")
	case len(entity) > 512 || !plain(entity):
		return status.Errorf(codes.InvalidArgument, "entity: must be at most 512 bytes with no control characters")
	}
	for _, b := range []struct {
		name string
		ts   *timestamppb.Timestamp
	}{{"since", since}, {"until", until}} {
		if b.ts == nil {
			continue
		}
		if err := b.ts.CheckValid(); err != nil {
			return status.Errorf(codes.InvalidArgument, "%s: not a valid timestamp", b.name)
		}
		if t := b.ts.AsTime(); t.Before(minTime) || t.After(maxTime) {
			return status.Errorf(codes.InvalidArgument, "%s: %s is outside the stored range %s to %s",
				b.name, t.Format(time.RFC3339), minTime.Format(time.RFC3339), maxTime.Format(time.RFC3339))
		}
	}
	if since != nil && until != nil && until.AsTime().Before(since.AsTime()) {
		return status.Errorf(codes.InvalidArgument, "until: before since")
	}
	return nil
}

// queryContext makes ClickHouse itself stop a query at ctx's deadline
// (max_execution_time), not only the client waiting for it.
func queryContext(ctx context.Context) context.Context {
	d, ok := ctx.Deadline()
	if !ok {
		return ctx
	}
	secs := int(math.Ceil(time.Until(d).Seconds()))
	return ch.Context(ctx, ch.WithSettings(ch.Settings{"max_execution_time": max(secs, 1)}))
}

func pageLimit(n int32) (int, error) {
	switch {
	case n == 0:
		return DefaultLimit, nil
	case n < 0 || n > MaxLimit:
		return 0, status.Errorf(codes.InvalidArgument, "limit: must be between 1 and %d, got %d", MaxLimit, n)
	}
	return int(n), nil
}

// newestFirst returns the first n distinct ids of sel's rows, newest
// first. The deduplication (LIMIT 1 BY id) is a subquery of its own: on a
// ClickHouse cluster (Distributed tables) 18.16 sends ORDER BY … LIMIT 1 BY
// id LIMIT n to each shard as ORDER BY … LIMIT n before LIMIT BY, so a
// shard's duplicates use up the limit and rows go missing. Each shard holds
// every copy of its ids, so it can deduplicate on its own; the order and
// limit apply to the merged rows.
//
// The copy kept of an id is its earliest of those sel matches (ORDER BY
// id, ts, ts_ms: copies of an event differ in ts when a monitor resent it
// under one idempotency key without a generatedTimestamp, each try stamped
// when received, and ts is in the sorting key, so ReplacingMergeTree never
// merges them). Whichever copy was read first was kept before: a page
// listed the newer copy and the next page, whose cursor had dropped it, the
// older. A page's cursor and until only drop copies no older than the
// copy a page listed, and a page read in a window (inWindows) leaves out
// the ids with a copy before it (firstCopies), so a listing shows each id
// once.
func newestFirst(sel string, n int) string {
	return "SELECT * FROM (" + sel + " ORDER BY id, ts, ts_ms LIMIT 1 BY id) ORDER BY ts DESC, ts_ms DESC, id DESC LIMIT " + strconv.Itoa(n)
}

// where accumulates conditions with positional arguments.
type where struct {
	conds []string
	args  []any
}

func (w *where) add(cond string, args ...any) {
	w.conds = append(w.conds, cond)
	w.args = append(w.args, args...)
}

func (w *where) sql() string { return strings.Join(w.conds, " AND ") }

// clone returns a copy of w to add to.
func (w where) clone() where {
	return where{conds: slices.Clone(w.conds), args: slices.Clone(w.args)}
}

// notBefore adds ts >= t, in seconds, and received >= t less
// validate.MaxFutureSkewLimit: no accepted event was generated later than
// that after it was received, and received is what the tables are
// partitioned by (each part knows its range), so ClickHouse skips every
// month, and every part, received too early instead of reading the ts of
// all the cluster's rows.
func (w *where) notBefore(t time.Time) {
	r := t.Add(-validate.MaxFutureSkewLimit)
	if r.Before(minTime) {
		r = minTime
	}
	w.add("ts >= ? AND received >= ?", t.UTC().Truncate(time.Second), r.UTC().Truncate(time.Second))
}

// timeBounds adds since (inclusive), until (exclusive) and the page cursor
// on a (ts DateTime, ts_ms UInt16) pair: a coarse condition on ts that the
// index uses, and the exact one in milliseconds.
func (w *where) timeBounds(since, until *timestamppb.Timestamp, cur *cursor) {
	const ms = "(toUInt64(ts) * 1000 + ts_ms)"
	if since != nil {
		t := since.AsTime()
		w.notBefore(t)
		w.add(ms+" >= ?", uint64(t.UnixMilli()))
	}
	if until != nil {
		t := until.AsTime()
		w.add("ts <= ? AND "+ms+" < ?", t.UTC().Truncate(time.Second), uint64(t.UnixMilli()))
	}
	if cur != nil {
		t := time.UnixMilli(cur.ms).UTC()
		w.add("ts <= ? AND ("+ms+" < ? OR ("+ms+" = ? AND id < ?))", t.Truncate(time.Second), uint64(cur.ms), uint64(cur.ms), cur.id)
	}
}

const eventSelect = `SELECT id, cluster, node, check, ts, ts_ms, received, received_ms, ts_missing, version,
	agent, component_class, is_fatal, is_healthy, message, recommended_action, custom_recommended_action,
	error_codes, entities.type, entities.value, metadata.key, metadata.value, quarantine_set,
	quarantine_force, quarantine_skip, drain_set, drain_force, drain_skip, processing_strategy,
	derived_by, cause_ids, submitter_name, submitter_role, submitter_node
FROM events`

// ListEvents returns the cluster's events matching req, newest first.
func (h *ClickHouse) ListEvents(ctx context.Context, cluster string, req *faultlinev1.ListEventsRequest) (*faultlinev1.ListEventsResponse, error) {
	limit, err := pageLimit(req.GetLimit())
	if err != nil {
		return nil, err
	}
	cur, err := parseToken(req.GetPageToken())
	if err != nil {
		return nil, err
	}
	if err := checkFilters(req.GetNode(), req.GetCheck(), req.GetEntity(), req.GetSince(), req.GetUntil()); err != nil {
		return nil, err
	}
	var filters where
	filters.add("cluster = ?", cluster)
	if req.GetNode() != "" {
		filters.add("node = ?", req.GetNode())
	}
	if req.GetCheck() != "" {
		filters.add("check = ?", req.GetCheck())
	}
	if req.GetEntity() != "" {
		filters.add("has(entities.value, ?)", req.GetEntity())
	}
	if req.GetFatalOnly() {
		filters.add("is_fatal = 1")
	}
	spans := windowSpans
	if req.GetNode() != "" {
		spans = nodeWindowSpans
	}
	// A page whose every event is listed later, at its earliest copy
	// (firstCopies), goes on from its token: a page holds at least one
	// event unless none are left. The cursor only moves down, so this ends.
	for {
		w := filters.clone()
		w.timeBounds(req.GetSince(), req.GetUntil(), cur)
		lows := windows(newest(req.GetUntil(), cur), req.GetSince(), spans)
		resp, err := inWindows(w, lows, func(ww where, lo time.Time) (*faultlinev1.ListEventsResponse, bool, error) {
			resp, full, err := h.eventPage(ctx, ww, limit)
			if err != nil || !full || lo.IsZero() {
				return resp, full, err
			}
			resp.Events, err = firstCopies(ctx, h, "events", w, lo, resp.Events, (*datamodels.HealthEvent).GetId,
				copyKey[*datamodels.HealthEvent]{"node", (*datamodels.HealthEvent).GetNodeName},
				copyKey[*datamodels.HealthEvent]{"check", (*datamodels.HealthEvent).GetCheckName})
			return resp, full, err
		})
		if err != nil || len(resp.Events) > 0 || resp.NextPageToken == "" {
			return resp, err
		}
		if cur, err = parseToken(resp.NextPageToken); err != nil {
			return nil, err
		}
	}
}

// firstCopies drops from rows, a page of table read in the window from
// lo, the rows (events or actions) with a copy matching w before the
// window: the page's deduplication only saw the copies inside it, so it
// listed a later copy of those, and a later page (whose window reaches
// further back) would list the earliest again. Dropped, each is listed
// once, at its earliest copy, on a later page (the page's token stays
// after the last row read, and the earliest copy is older than every row
// of this page).
//
// The copies are looked for among the page's values of keys (columns the
// copies of a row share, the table's sorting key first), in the
// resendHorizon before the window: the parts received before that are
// skipped, as the window skips them.
func firstCopies[T any](ctx context.Context, h *ClickHouse, table string, w where, lo time.Time, rows []T, id func(T) string, keys ...copyKey[T]) ([]T, error) {
	if len(rows) == 0 {
		return rows, nil
	}
	ww := w.clone()
	ww.notBefore(lo.Add(-resendHorizon))
	for _, k := range keys {
		var vals []any
		seen := map[string]bool{}
		for _, r := range rows {
			if v := k.of(r); !seen[v] {
				seen[v] = true
				vals = append(vals, v)
			}
		}
		ww.add(k.col+" IN ?", ch.GroupSet{Value: vals})
	}
	ids := make([]any, len(rows))
	for i, r := range rows {
		ids[i] = id(r)
	}
	// The window is ts >= lo in whole seconds (notBefore).
	ww.add("id IN ? AND ts < ?", ch.GroupSet{Value: ids}, lo.UTC().Truncate(time.Second))
	what := "list " + table
	q, err := h.conn.Query(queryContext(ctx), "SELECT DISTINCT id FROM "+table+" WHERE "+ww.sql(), ww.args...)
	if err != nil {
		return nil, h.unavailable(ctx, what, err)
	}
	defer q.Close()
	older := map[string]bool{}
	for q.Next() {
		var id string
		if err := q.Scan(&id); err != nil {
			return nil, h.unavailable(ctx, what, fmt.Errorf("scan id: %w", err))
		}
		older[id] = true
	}
	if err := q.Err(); err != nil {
		return nil, h.unavailable(ctx, what, err)
	}
	if len(older) == 0 {
		return rows, nil
	}
	return slices.DeleteFunc(rows, func(r T) bool { return older[id(r)] }), nil
}

// copyKey is a column the copies of a row share (col), and its value in
// a row (of).
type copyKey[T any] struct {
	col string
	of  func(T) string
}

// windowSpans: a listing without a node (events or actions) would read
// every row of the cluster (the tables are ordered by node first) and
// deduplicate them all before it can sort — seconds and gigabytes of
// ClickHouse's memory over a large history for a page of the newest 100
// (2.8 s for 5M rows). It looks in the last hour first,
// then the last day, week and month, and in the whole range only when
// those hold less than a page: the newest rows of a window that holds a
// full page are the newest of all. A window is only a lower bound on ts
// (until and the page cursor still apply), received-pruned (notBefore).
var windowSpans = []time.Duration{time.Hour, 24 * time.Hour, 7 * 24 * time.Hour, 31 * 24 * time.Hour}

// nodeWindowSpans: a node's newest page read every row of the node (the
// table is ordered by (cluster, node, check, entity, ts), and ClickHouse
// 18.16 cannot read it in ts order), so its cost grew with the node's whole
// history: p99 30 ms over 100M events (25,000 a node). It looks in the
// last day first, where the parts received since hold a small share of the
// node's rows (p99 15 ms), and else in the whole range: a node with fewer
// than a page that day pays one query more, bounded (≈ 4 ms here) where
// more windows would each add one (loadtest/RESULTS.md §5, 2026-12-04).
var nodeWindowSpans = []time.Duration{24 * time.Hour}

// inWindows returns the first full page that page reads with each lower
// bound of lows added to w, else the page of the whole range. page is
// given the lower bound (zero for the whole range).
func inWindows[R any](w where, lows []time.Time, page func(w where, lo time.Time) (R, bool, error)) (R, error) {
	for _, lo := range lows {
		ww := w.clone()
		ww.notBefore(lo)
		if r, full, err := page(ww, lo); err != nil || full {
			return r, err
		}
	}
	r, _, err := page(w, time.Time{})
	return r, err
}

// newest is the latest time a page can hold: now, until or the cursor.
func newest(until *timestamppb.Timestamp, cur *cursor) time.Time {
	t := time.Now()
	if until != nil && until.AsTime().Before(t) {
		t = until.AsTime()
	}
	if cur != nil && time.UnixMilli(cur.ms).Before(t) {
		t = time.UnixMilli(cur.ms)
	}
	return t
}

// windows are the lower bounds to try (top less each of spans), newest
// first, before the whole range; none starts at or before since.
func windows(top time.Time, since *timestamppb.Timestamp, spans []time.Duration) []time.Time {
	var out []time.Time
	for _, d := range spans {
		lo := top.Add(-d)
		if since != nil && !lo.After(since.AsTime()) {
			break
		}
		out = append(out, lo)
	}
	return out
}

// resendHorizon is how far before a window firstCopies looks for an
// earlier copy of the page's rows. Copies of an event that differ in ts
// come from NVSentinel resending a call (under one idempotency key, each
// copy stamped when received) within its retry window, minutes; copies of
// an action from a role's trigger redelivered after a crash or a
// rebalance (each copy stamped when written), seconds to minutes; a copy resent
// more than this after the first can still be listed twice, at each copy,
// when a window's edge falls between them. Looking further back reads
// more of the history that the windows are there to skip.
const resendHorizon = 24 * time.Hour

// firstRows is the most rows the first query of a page asks for (the
// default page's).
const firstRows = DefaultLimit

// eventPage reads one page of the events matching w. It asks ClickHouse in
// rounds: at most firstRows rows first, then as many as the page's bytes
// still hold at the size of the rows so far (from the last row on) — the
// client receives and decodes every row a query returns, and a page of
// limit=1000 over the largest events (~200 KB each, 29 to a page) decoded
// all 1,000: 783 MB allocated and 2.3 s for one request (98 MB and 0.74 s
// now). The default page is one query; a page of 1,000 small events two.
// full: the rows went on past the page.
func (h *ClickHouse) eventPage(ctx context.Context, w where, limit int) (*faultlinev1.ListEventsResponse, bool, error) {
	resp := &faultlinev1.ListEventsResponse{}
	var last cursor
	size := 0
	for {
		k := len(resp.Events)
		n, ww := min(limit-k, firstRows), w
		if k > 0 {
			n = min(limit-k, (pageBudget-size)/(size/k+1)+1)
			ww = w.clone()
			ww.timeBounds(nil, nil, &last)
		}
		evs, cs, err := h.events(ctx, ww, n+1)
		if err != nil {
			return nil, false, err
		}
		for i, ev := range evs {
			sz := framed(ev.SizeVT())
			if len(resp.Events) == limit || (len(resp.Events) > 0 && size+sz > pageBudget) {
				resp.NextPageToken = last.token()
				return resp, true, nil
			}
			size += sz
			resp.Events = append(resp.Events, ev)
			last = cs[i]
		}
		if len(evs) <= n { // the rows ended
			return resp, false, nil
		}
	}
}

// events reads the newest n events matching w.
func (h *ClickHouse) events(ctx context.Context, w where, n int) ([]*datamodels.HealthEvent, []cursor, error) {
	rows, err := h.conn.Query(queryContext(ctx), newestFirst(eventSelect+" WHERE "+w.sql(), n), w.args...)
	if err != nil {
		return nil, nil, h.unavailable(ctx, "list events", err)
	}
	defer rows.Close()
	var (
		evs []*datamodels.HealthEvent
		cs  []cursor
	)
	for rows.Next() {
		ev, c, err := scanEvent(rows)
		if err != nil {
			return nil, nil, h.unavailable(ctx, "list events", err)
		}
		evs, cs = append(evs, ev), append(cs, c)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, h.unavailable(ctx, "list events", err)
	}
	return evs, cs, nil
}

// unavailable turns a ClickHouse failure into the gRPC status the client
// sees: the request's own cancellation or deadline as such, anything else
// as Unavailable (the details go to the log, not to the client).
func (h *ClickHouse) unavailable(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	h.log.Warn("history query failed", "query", what, "err", err)
	return status.Errorf(codes.Unavailable, "%s: history store unavailable", what)
}

type scanner interface{ Scan(dest ...any) error }

func scanEvent(r scanner) (*datamodels.HealthEvent, cursor, error) {
	var (
		id, cluster, node, check, agent, class, msg, rec, custom, strategy, derived string
		ts, received                                                                time.Time
		tsMS, rMS                                                                   uint16
		missing, fatal, healthy, qSet, qForce, qSkip, dSet, dForce, dSkip           uint8
		version                                                                     uint32
		codesArr, et, evv, mk, mv, causes                                           []string
		subName, subRole, subNode                                                   string
	)
	if err := r.Scan(&id, &cluster, &node, &check, &ts, &tsMS, &received, &rMS, &missing, &version,
		&agent, &class, &fatal, &healthy, &msg, &rec, &custom,
		&codesArr, &et, &evv, &mk, &mv, &qSet,
		&qForce, &qSkip, &dSet, &dForce, &dSkip, &strategy,
		&derived, &causes, &subName, &subRole, &subNode); err != nil {
		return nil, cursor{}, fmt.Errorf("scan event: %w", err)
	}
	ev := &datamodels.HealthEvent{
		Version:                 version,
		Agent:                   agent,
		ComponentClass:          class,
		CheckName:               check,
		IsFatal:                 fatal == 1,
		IsHealthy:               healthy == 1,
		Message:                 msg,
		RecommendedAction:       datamodels.RecommendedAction(enumValue(datamodels.RecommendedAction_value, rec)),
		ErrorCode:               nilIfEmpty(codesArr),
		NodeName:                node,
		ProcessingStrategy:      datamodels.ProcessingStrategy(enumValue(datamodels.ProcessingStrategy_value, strategy)),
		Id:                      id,
		CustomRecommendedAction: custom,
		Cluster:                 cluster,
		ReceivedTimestamp:       toTimestamp(received, rMS),
		DerivedBy:               derived,
		CauseIds:                nilIfEmpty(causes),
	}
	if missing == 0 {
		ev.GeneratedTimestamp = toTimestamp(ts, tsMS)
	}
	for i := range et {
		ev.EntitiesImpacted = append(ev.EntitiesImpacted, &datamodels.Entity{EntityType: et[i], EntityValue: evv[i]})
	}
	if len(mk) > 0 {
		ev.Metadata = make(map[string]string, len(mk))
		for i := range mk {
			ev.Metadata[mk[i]] = mv[i]
		}
	}
	if qSet == 1 {
		ev.QuarantineOverrides = &datamodels.BehaviourOverrides{Force: qForce == 1, Skip: qSkip == 1}
	}
	if dSet == 1 {
		ev.DrainOverrides = &datamodels.BehaviourOverrides{Force: dForce == 1, Skip: dSkip == 1}
	}
	// '' in all three: the event had no submitter (or was stored before
	// the columns existed).
	if subName != "" || subRole != "" || subNode != "" {
		ev.Submitter = &datamodels.Submitter{Name: subName, Node: subNode,
			Role: datamodels.SubmitterRole(enumValue(datamodels.SubmitterRole_value, subRole))}
	}
	return ev, cursor{ms: ts.Unix()*1000 + int64(tsMS), id: id}, nil
}

const actionSelect = `SELECT id, cluster, node, role, kind, outcome, reason, rule, event_ids, dry_run,
	ts, ts_ms, details.key, details.value, check, recommended_action
FROM actions`

// ListActions returns the cluster's actions matching req, newest first.
func (h *ClickHouse) ListActions(ctx context.Context, cluster string, req *faultlinev1.ListActionsRequest) (*faultlinev1.ListActionsResponse, error) {
	limit, err := pageLimit(req.GetLimit())
	if err != nil {
		return nil, err
	}
	cur, err := parseToken(req.GetPageToken())
	if err != nil {
		return nil, err
	}
	if err := checkFilters(req.GetNode(), "", "", req.GetSince(), nil); err != nil {
		return nil, err
	}
	var filters where
	filters.add("cluster = ?", cluster)
	if req.GetNode() != "" {
		filters.add("node = ?", req.GetNode())
	}
	// As ListEvents: a role writes an action under a deterministic id,
	// stamped when written, so a redelivered trigger writes a later copy;
	// a page read in a window leaves out the actions with a copy before
	// it (firstCopies), and a page whose every action is listed later
	// goes on from its token.
	for {
		w := filters.clone()
		w.timeBounds(req.GetSince(), nil, cur)
		var lows []time.Time
		if req.GetNode() == "" {
			lows = windows(newest(nil, cur), req.GetSince(), windowSpans)
		}
		resp, err := inWindows(w, lows, func(ww where, lo time.Time) (*faultlinev1.ListActionsResponse, bool, error) {
			resp, full, err := h.actionPage(ctx, ww, limit)
			if err != nil || !full || lo.IsZero() {
				return resp, full, err
			}
			resp.Actions, err = firstCopies(ctx, h, "actions", w, lo, resp.Actions, (*faultlinev1.Action).GetId,
				copyKey[*faultlinev1.Action]{"node", (*faultlinev1.Action).GetNode})
			return resp, full, err
		})
		if err != nil || len(resp.Actions) > 0 || resp.NextPageToken == "" {
			return resp, err
		}
		if cur, err = parseToken(resp.NextPageToken); err != nil {
			return nil, err
		}
	}
}

// actionPage reads one page of the actions matching w; full: the rows
// went on past it (it has a nextPageToken).
func (h *ClickHouse) actionPage(ctx context.Context, w where, limit int) (*faultlinev1.ListActionsResponse, bool, error) {
	q := newestFirst(actionSelect+" WHERE "+w.sql(), limit+1)
	rows, err := h.conn.Query(queryContext(ctx), q, w.args...)
	if err != nil {
		return nil, false, h.unavailable(ctx, "list actions", err)
	}
	defer rows.Close()
	resp := &faultlinev1.ListActionsResponse{}
	var last cursor
	size := 0
	for rows.Next() {
		var (
			a           faultlinev1.Action
			ts          time.Time
			ms          uint16
			dry         uint8
			ids, dk, dv []string
		)
		if err := rows.Scan(&a.Id, &a.Cluster, &a.Node, &a.Role, &a.Kind, &a.Outcome, &a.Reason, &a.Rule, &ids, &dry,
			&ts, &ms, &dk, &dv, &a.CheckName, &a.RecommendedAction); err != nil {
			return nil, false, h.unavailable(ctx, "list actions", fmt.Errorf("scan action: %w", err))
		}
		a.EventIds = nilIfEmpty(ids)
		a.DryRun = dry == 1
		a.Timestamp = toTimestamp(ts, ms)
		if len(dk) > 0 {
			a.Details = make(map[string]string, len(dk))
			for i := range dk {
				a.Details[dk[i]] = dv[i]
			}
		}
		n := framed(a.SizeVT())
		if len(resp.Actions) == limit || (len(resp.Actions) > 0 && size+n > pageBudget) {
			resp.NextPageToken = last.token()
			break
		}
		size += n
		resp.Actions = append(resp.Actions, &a)
		last = cursor{ms: ts.Unix()*1000 + int64(ms), id: a.Id}
	}
	if err := rows.Err(); err != nil {
		return nil, false, h.unavailable(ctx, "list actions", err)
	}
	return resp, resp.NextPageToken != "", nil
}

func toTimestamp(sec time.Time, ms uint16) *timestamppb.Timestamp {
	return timestamppb.New(sec.Add(time.Duration(ms) * time.Millisecond))
}

// enumValue maps an enum name back to its number; a stored number (an
// enum value this build does not know) is parsed as such.
func enumValue(names map[string]int32, s string) int32 {
	if v, ok := names[s]; ok {
		return v
	}
	n, _ := strconv.ParseInt(s, 10, 32)
	return int32(n)
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}
