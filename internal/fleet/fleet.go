// Package fleet answers the fleet page's questions from ClickHouse, always
// for one cluster (the caller's): how many nodes are in each state and
// what the circuit breaker holds back (Summary), which nodes those are,
// paged (Nodes), what faultline holds one node quarantined for and how to
// release it (Node), and the analytics queries of sql/analytics over a time
// range (Analytics). Every count, state and page is computed in ClickHouse
// SQL (sql/fleet/*.sql, in the analytics header format), so the answer's
// size is bounded by the page, not by the fleet or its history.
//
// A node's state is derived from the actions history (each action once):
//
//	escalated    quarantined, and escalated to support since
//	remediating  quarantined, its remediation created or in progress
//	draining     quarantined, its drain in progress or blocked
//	quarantined  a quarantine applied (or decided, dry-run) after the last release
//	held         a quarantine held back by the circuit breaker, nothing applied
//	healthy      reported events in the range and none of the above
//
// The quarantined states date from the first quarantine after the last
// release: a repeat of a standing fault writes another applied quarantine
// and starts no drain or remediation. Held and dry-run quarantines applied
// nothing, so no release follows them: they end once every fault they
// decided on has recovered (its latest event healthy).
//
// drifted (the conformance role's latest action on the node is a
// conformance_drift) is counted beside them: a drifted node may also be in
// any of the states.
package fleet

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"

	"github.com/faultline/faultline/internal/analytics"
	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/sql"
)

// Node states.
const (
	StateHealthy     = "healthy"
	StateQuarantined = "quarantined"
	StateDraining    = "draining"
	StateRemediating = "remediating"
	StateEscalated   = "escalated"
	StateHeld        = "held"
	StateDrifted     = "drifted"
)

// States lists every state a summary counts, in the page's order.
var States = []string{StateHealthy, StateQuarantined, StateDraining, StateRemediating, StateEscalated, StateHeld, StateDrifted}

const (
	// DefaultLimit is a node page's size when a request gives none.
	DefaultLimit = 100
	// MaxLimit is the largest node page.
	MaxLimit = 1000
	// DefaultRange is how far back "reporting nodes" look when the
	// request gives no since.
	DefaultRange = 24 * time.Hour
)

// BadRequest is an error in the request's parameters (HTTP 400): its
// message names the parameter.
type BadRequest struct{ msg string }

func (e *BadRequest) Error() string { return e.msg }

func badf(format string, args ...any) error { return &BadRequest{msg: fmt.Sprintf(format, args...)} }

// Store runs the fleet queries on faultline's database.
type Store struct {
	conn      clickhouse.Conn
	log       *slog.Logger
	queries   map[string]analytics.Query
	analytics map[string]analytics.Query
	now       func() time.Time
}

// Options are a Store's optional settings.
type Options struct {
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// New returns a Store reading through conn (a connection to faultline's
// database).
func New(conn clickhouse.Conn, log *slog.Logger, opts Options) (*Store, error) {
	qs, err := Queries()
	if err != nil {
		return nil, err
	}
	an, err := clusterAnalytics()
	if err != nil {
		return nil, err
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Store{conn: conn, log: log.With("component", "fleet"), queries: qs, analytics: an, now: opts.Now}, nil
}

// Queries returns the fleet queries as the Store runs them: the files of
// sql/fleet, and the summary and page queries composed over node_states.
// sql/compat_test.go runs each on ClickHouse 18.16 and a current engine.
func Queries() (map[string]analytics.Query, error) {
	qs, err := analytics.Load(sql.Fleet, "fleet")
	if err != nil {
		return nil, err
	}
	states, ok := qs["node_states"]
	if !ok {
		return nil, fmt.Errorf("sql/fleet: no node_states.sql")
	}
	compose := func(name, desc, sqlText string, extra ...analytics.Param) {
		q := analytics.Query{Name: name, Description: desc, SQL: sqlText, Params: append(slices.Clone(states.Params), extra...)}
		qs[name] = q
	}
	// reporting: the nodes of the state that reported in [since, until),
	// which the healthy count (the reporting nodes in no state) subtracts:
	// a state counts every node out of service now, reporting or not.
	compose("state_counts", "Nodes per state (node_states counted), and how many of them reported events received in [since, until).",
		"SELECT state, count() AS nodes, toUInt64(sum(dry_run)) AS dry_run,\n"+
			"    toUInt64(sum(node IN (SELECT node FROM recent_events WHERE received >= @since AND received < @until AND cluster = @cluster))) AS reporting\n"+
			"FROM\n(\n"+states.SQL+"\n)\nGROUP BY state\nORDER BY state",
		analytics.Param{Name: "since", Type: "DateTime", Default: "now-1d"},
		analytics.Param{Name: "until", Type: "DateTime", Default: "now"})
	// Keyset paging: a page goes on after the previous page's last row
	// (after_ms, after_node) in the page's order, which is unique (one row
	// per node of the cluster), so a node whose row did not change is never
	// shown twice or skipped when others change state between pages.
	compose("node_page", "One page of node_states, newest state first (state_since_ms descending, then node), after the row (after_ms, after_node) when after_node is given.",
		"SELECT *\nFROM\n(\n"+states.SQL+"\n)\nWHERE (@state = '' OR state = @state)\n"+
			"    AND (@after_node = '' OR state_since_ms < @after_ms OR (state_since_ms = @after_ms AND node > @after_node))\n"+
			"ORDER BY state_since_ms DESC, node\nLIMIT @limit",
		analytics.Param{Name: "state", Type: "String", Default: ""},
		analytics.Param{Name: "after_ms", Type: "UInt64", Default: "0"},
		analytics.Param{Name: "after_node", Type: "String", Default: ""},
		analytics.Param{Name: "limit", Type: "UInt64", Default: strconv.Itoa(DefaultLimit)})
	return qs, nil
}

// run runs a fleet query with its parameters (text form) bound.
func (s *Store) run(ctx context.Context, name string, params map[string]string) (*analytics.Result, error) {
	q, ok := s.queries[name]
	if !ok {
		return nil, fmt.Errorf("fleet: no query %s", name)
	}
	res, err := analytics.Run(queryContext(ctx), s.conn, q, params, s.now())
	if err != nil {
		return nil, fmt.Errorf("fleet %s: %w", name, err)
	}
	return res, nil
}

// parallel runs fs at once (each a query on its own pooled connection)
// and returns their errors; a panic is its function's error (net/http
// recovers the request's own goroutine, not these: it ended the gateway).
func parallel(fs ...func() error) error {
	errs := make([]error, len(fs))
	var wg sync.WaitGroup
	for i, f := range fs {
		wg.Go(func() {
			defer func() {
				if p := recover(); p != nil {
					errs[i] = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
				}
			}()
			errs[i] = f()
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// queryContext makes ClickHouse itself stop a query at ctx's deadline.
func queryContext(ctx context.Context) context.Context {
	d, ok := ctx.Deadline()
	if !ok {
		return ctx
	}
	secs := int(math.Ceil(time.Until(d).Seconds()))
	return ch.Context(ctx, ch.WithSettings(ch.Settings{"max_execution_time": max(secs, 1)}))
}

// Breaker is a cluster's quarantine circuit breaker as the actions tell it.
type Breaker struct {
	// State is "open", "closed" or "never tripped".
	State string `json:"state"`
	// Since is when it last changed state.
	Since *time.Time `json:"since,omitempty"`
	// Reason is why it last opened or closed.
	Reason string `json:"reason,omitempty"`
	// Held counts the nodes whose quarantine it held back (state held).
	Held uint64 `json:"held"`
}

// Summary is one cluster's fleet at a glance.
type Summary struct {
	Cluster string    `json:"cluster"`
	AsOf    time.Time `json:"asOf"`
	// Since and Until bound "reporting nodes".
	Since time.Time `json:"since"`
	Until time.Time `json:"until"`
	// ReportingNodes reported at least one event in [Since, Until).
	ReportingNodes uint64 `json:"reportingNodes"`
	// Nodes counts nodes per state (States); healthy is the reporting
	// nodes in no other state but drifted.
	Nodes map[string]uint64 `json:"nodes"`
	// DryRun: the cluster's latest quarantine decision was a dry run
	// (nothing is applied to its nodes).
	DryRun bool `json:"dryRun"`
	// DryRunNodes counts the quarantined nodes whose quarantine was only
	// decided (dry-run).
	DryRunNodes uint64  `json:"dryRunNodes"`
	Breaker     Breaker `json:"breaker"`
	// Page is the first page of nodes asked for with the summary (the
	// fleet view's first render in one request), or nil.
	Page *NodesPage `json:"page,omitempty"`
}

// Range is a time range [Since, Until); zero values take the defaults
// (Until now, Since Until minus DefaultRange). Since may be at most
// clickhouse.RecentRetention before now (the reporting nodes' table keeps
// no more).
type Range struct {
	Since, Until time.Time
}

func (r Range) resolve(now time.Time) (Range, error) {
	if r.Until.IsZero() {
		r.Until = now
	}
	if r.Since.IsZero() {
		r.Since = r.Until.Add(-DefaultRange)
	}
	switch {
	case r.Since.Before(time.Unix(0, 0)) || r.Until.After(time.Unix(math.MaxUint32, 0)):
		return r, badf("since, until: outside the stored range 1970 to 2106")
	case !r.Until.After(r.Since):
		return r, badf("until: must be after since")
	case r.Since.Before(now.Add(-clickhouse.RecentRetention)):
		// Reporting nodes are read from recent_events: a range reaching
		// past its retention would silently leave out the nodes that
		// reported only before it.
		return r, badf("since: at most %s before now (reporting nodes are read from recent_events, which keeps %s): from %s",
			days(clickhouse.RecentRetention), days(clickhouse.RecentRetention), now.Add(-clickhouse.RecentRetention).UTC().Format(time.RFC3339))
	}
	r.Since, r.Until = r.Since.UTC().Truncate(time.Second), r.Until.UTC().Truncate(time.Second)
	return r, nil
}

// days writes d in whole days, as "8 days".
func days(d time.Duration) string { return fmt.Sprintf("%d days", d/(24*time.Hour)) }

func msTime(ms uint64) time.Time { return time.UnixMilli(int64(ms)).UTC() }

func optTime(ms uint64) *time.Time {
	if ms == 0 {
		return nil
	}
	t := msTime(ms)
	return &t
}

func sqlTime(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05") }

// Summary counts cluster's nodes per state, its breaker and dry-run, all
// as of now, and the nodes reporting in r (r bounds nothing else); with
// page, also that page of nodes (as Nodes), the drift query shared.
func (s *Store) Summary(ctx context.Context, cluster string, r Range, page *NodesQuery) (*Summary, error) {
	now := s.now().UTC().Truncate(time.Second)
	r, err := r.resolve(now)
	if err != nil {
		return nil, err
	}
	var limit int
	var after *cursor
	if page != nil {
		if limit, after, err = checkNodesQuery(*page); err != nil {
			return nil, err
		}
	}
	asOf := sqlTime(now)
	var cs, counts, drift, pageRes *analytics.Result
	err = parallel(
		func() (err error) {
			if page != nil {
				pageRes, err = s.pageQuery(ctx, cluster, asOf, page.State, limit, after)
			}
			return err
		},
		func() (err error) {
			cs, err = s.run(ctx, "cluster_state", map[string]string{"cluster": cluster, "now": asOf, "since": sqlTime(r.Since), "until": sqlTime(r.Until)})
			return err
		},
		func() (err error) {
			counts, err = s.run(ctx, "state_counts", map[string]string{"cluster": cluster, "now": asOf, "since": sqlTime(r.Since), "until": sqlTime(r.Until)})
			return err
		},
		func() (err error) {
			drift, err = s.run(ctx, "drifted", map[string]string{"cluster": cluster, "now": asOf})
			return err
		})
	if err != nil {
		return nil, err
	}
	out := &Summary{Cluster: cluster, AsOf: now, Since: r.Since, Until: r.Until, Nodes: map[string]uint64{}, Breaker: Breaker{State: "never tripped"}}
	for _, st := range States {
		out.Nodes[st] = 0
	}
	if len(cs.Rows) == 1 {
		row := cs.Rows[0]
		kind, at, reason := row[0].(string), row[1].(uint64), row[2].(string)
		out.DryRun = row[3].(uint8) == 1 && row[4].(uint64) > 0
		out.ReportingNodes = row[5].(uint64)
		switch kind {
		case "breaker_open":
			out.Breaker = Breaker{State: "open", Since: optTime(at), Reason: reason}
		case "breaker_close":
			out.Breaker = Breaker{State: "closed", Since: optTime(at), Reason: reason}
		}
	}
	var unhealthy uint64 // of the reporting nodes
	for _, row := range counts.Rows {
		st, n, dry, reporting := row[0].(string), row[1].(uint64), row[2].(uint64), row[3].(uint64)
		out.Nodes[st] = n
		unhealthy += reporting
		out.DryRunNodes += dry
	}
	out.Breaker.Held = out.Nodes[StateHeld]
	if page != nil {
		if out.Page, err = s.assemblePage(ctx, cluster, asOf, page.State, limit, after, drift, pageRes); err != nil {
			return nil, err
		}
	}
	out.Nodes[StateDrifted] = uint64(len(drift.Rows))
	if out.ReportingNodes > unhealthy {
		out.Nodes[StateHealthy] = out.ReportingNodes - unhealthy
	}
	return out, nil
}

// NodeRow is one node of a page.
type NodeRow struct {
	Node  string `json:"node"`
	State string `json:"state"`
	// StateSince is when the node entered State.
	StateSince time.Time `json:"stateSince"`
	// QuarantinedSince is the first quarantine after the node's last
	// release (or the latest hold).
	QuarantinedSince time.Time `json:"quarantinedSince"`
	Check            string    `json:"check"`
	Rule             string    `json:"rule"`
	Reason           string    `json:"reason"`
	DryRun           bool      `json:"dryRun"`
	// Drain and Remediation are the outcomes of the node's latest drain
	// and remediation actions ('' when none).
	Drain       string `json:"drain,omitempty"`
	Remediation string `json:"remediation,omitempty"`
	// Drifted: the conformance role's latest action on the node is a
	// conformance_drift; DriftDetail says what differs.
	Drifted     bool   `json:"drifted"`
	DriftDetail string `json:"driftDetail,omitempty"`
}

// NodesQuery selects a page of nodes.
type NodesQuery struct {
	// State is one of States but healthy, or '' for every node in a state.
	State string
	// Limit is the page size (default DefaultLimit, at most MaxLimit).
	Limit int
	// PageToken continues from a previous page's NextPageToken.
	PageToken string
}

// NodesPage is a page of nodes, newest state first.
type NodesPage struct {
	Nodes         []NodeRow `json:"nodes"`
	NextPageToken string    `json:"nextPageToken,omitempty"`
}

// nodeName is a Kubernetes node name (an RFC 1123 subdomain).
var nodeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// CheckNode refuses a node name that cannot be a Kubernetes node's.
func CheckNode(node string) error {
	if node == "" || len(node) > 253 || !nodeName.MatchString(node) {
		return badf("node: not a Kubernetes node name (a lowercase RFC 1123 subdomain of at most 253 bytes)")
	}
	return nil
}

// cursor is the position after the last row of a page: the page's state
// filter, and the row's sort key (its state_since_ms and node; the drifted
// page is ordered by node alone). A page goes on after it (keyset paging),
// so a node whose row did not change between two pages is neither shown
// twice nor skipped, and a deep page costs no scan to an offset.
type cursor struct {
	state string
	ms    uint64
	node  string
}

// token encodes c as an opaque page token.
func (c cursor) token() string {
	return base64.RawURLEncoding.EncodeToString([]byte(c.state + "|" + strconv.FormatUint(c.ms, 10) + "|" + c.node))
}

// maxTokenLen bounds a page token: a state, at most 20 digits, a
// 253-byte node name and two separators, about 390 bytes of base64.
const maxTokenLen = 512

// parsePageToken decodes a page token of the state's pages (nil for none).
func parsePageToken(tok, state string) (*cursor, error) {
	if tok == "" {
		return nil, nil
	}
	if len(tok) <= maxTokenLen {
		if b, err := base64.RawURLEncoding.DecodeString(tok); err == nil {
			if _, ok := strings.CutPrefix(string(b), "o"); ok && !strings.Contains(string(b), "|") {
				// An earlier version's tokens held an offset.
				return nil, badf("pageToken: an offset token of an earlier version, no longer taken; start again from the first page (no pageToken)")
			}
			if parts := strings.Split(string(b), "|"); len(parts) == 3 {
				ms, err := strconv.ParseUint(parts[1], 10, 64)
				if err == nil && ms <= math.MaxUint32*1000+999 && CheckNode(parts[2]) == nil {
					if parts[0] != state {
						return nil, badf("pageToken: issued for the state=%s page, not state=%s", parts[0], state)
					}
					return &cursor{state: parts[0], ms: ms, node: parts[2]}, nil
				}
			}
		}
	}
	return nil, badf("pageToken: not a token this server issued")
}

// Nodes returns a page of cluster's nodes in q.State (every state but
// healthy when empty), newest state first; drifted pages the drifted nodes.
func (s *Store) Nodes(ctx context.Context, cluster string, q NodesQuery) (*NodesPage, error) {
	limit, after, err := checkNodesQuery(q)
	if err != nil {
		return nil, err
	}
	asOf := sqlTime(s.now())
	var drift, res *analytics.Result
	err = parallel(
		func() (err error) {
			drift, err = s.run(ctx, "drifted", map[string]string{"cluster": cluster, "now": asOf})
			return err
		},
		func() (err error) {
			res, err = s.pageQuery(ctx, cluster, asOf, q.State, limit, after)
			return err
		})
	if err != nil {
		return nil, err
	}
	return s.assemblePage(ctx, cluster, asOf, q.State, limit, after, drift, res)
}

// checkNodesQuery validates q and returns its page size and the position
// its page goes on from (nil: the first page).
func checkNodesQuery(q NodesQuery) (limit int, after *cursor, err error) {
	limit = q.Limit
	switch {
	case limit == 0:
		limit = DefaultLimit
	case limit < 0 || limit > MaxLimit:
		return 0, nil, badf("limit: must be between 1 and %d, got %d", MaxLimit, limit)
	}
	switch q.State {
	case "", StateQuarantined, StateDraining, StateRemediating, StateEscalated, StateHeld, StateDrifted:
	case StateHealthy:
		return 0, nil, badf("state: healthy nodes are not listed (only counted); pick one of quarantined, draining, remediating, escalated, held, drifted")
	default:
		return 0, nil, badf("state: %q is not one of quarantined, draining, remediating, escalated, held, drifted", q.State)
	}
	if after, err = parsePageToken(q.PageToken, q.State); err != nil {
		return 0, nil, err
	}
	return limit, after, nil
}

// pageQuery runs node_page for a state's page (nothing for drifted: that
// page comes from the drifted query).
func (s *Store) pageQuery(ctx context.Context, cluster, asOf, state string, limit int, after *cursor) (*analytics.Result, error) {
	if state == StateDrifted {
		return nil, nil
	}
	params := map[string]string{"cluster": cluster, "now": asOf, "state": state, "limit": strconv.Itoa(limit + 1)}
	if after != nil {
		params["after_ms"], params["after_node"] = strconv.FormatUint(after.ms, 10), after.node
	}
	return s.run(ctx, "node_page", params)
}

// assemblePage cuts a page from node_page's rows (or, for drifted, the
// drifted query's), marking drifted nodes.
func (s *Store) assemblePage(ctx context.Context, cluster, asOf, state string, limit int, after *cursor, drift, res *analytics.Result) (*NodesPage, error) {
	drifted := map[string]string{}
	for _, row := range drift.Rows {
		drifted[row[0].(string)] = row[2].(string)
	}
	out := &NodesPage{Nodes: []NodeRow{}}
	if state != StateDrifted {
		for _, row := range res.Rows {
			if len(out.Nodes) == limit {
				last := out.Nodes[limit-1]
				out.NextPageToken = cursor{state: state, ms: uint64(last.StateSince.UnixMilli()), node: last.Node}.token()
				break
			}
			n := nodeRow(res.Columns, row)
			n.DriftDetail, n.Drifted = drifted[n.Node]
			out.Nodes = append(out.Nodes, n)
		}
		return out, nil
	}
	// The drifted query is bounded by the cluster's drifted nodes; the
	// page is cut here, in its node order, and the nodes that are also out
	// of service get that state (one query for all of them).
	states, err := s.run(ctx, "node_states", map[string]string{"cluster": cluster, "now": asOf})
	if err != nil {
		return nil, err
	}
	byNode := map[string]NodeRow{}
	for _, row := range states.Rows {
		n := nodeRow(states.Columns, row)
		byNode[n.Node] = n
	}
	for _, row := range drift.Rows {
		if after != nil && row[0].(string) <= after.node {
			continue // the drifted query is in node order
		}
		if len(out.Nodes) == limit {
			out.NextPageToken = cursor{state: state, node: out.Nodes[limit-1].Node}.token()
			break
		}
		n, ok := byNode[row[0].(string)]
		if !ok {
			n = NodeRow{Node: row[0].(string), State: StateDrifted, StateSince: msTime(row[1].(uint64))}
		}
		n.Drifted, n.DriftDetail = true, row[2].(string)
		out.Nodes = append(out.Nodes, n)
	}
	return out, nil
}

// nodeRow reads a node_states row.
func nodeRow(cols []string, row []any) NodeRow {
	get := func(name string) any {
		if i := slices.Index(cols, name); i >= 0 {
			return row[i]
		}
		return nil
	}
	str := func(name string) string { v, _ := get(name).(string); return v }
	u64 := func(name string) uint64 { v, _ := get(name).(uint64); return v }
	u8 := func(name string) uint8 { v, _ := get(name).(uint8); return v }
	return NodeRow{
		Node: str("node"), State: str("state"),
		StateSince: msTime(u64("state_since_ms")), QuarantinedSince: msTime(u64("quarantined_since_ms")),
		Check: str("check"), Rule: str("rule"), Reason: str("reason"), DryRun: u8("dry_run") == 1,
		Drain: str("drain"), Remediation: str("remediation"),
	}
}

// Fault is one fault faultline holds a node quarantined for.
type Fault struct {
	Check    string    `json:"check"`
	Entities string    `json:"entities"`
	Since    time.Time `json:"since"`
	Rule     string    `json:"rule"`
	Reason   string    `json:"reason"`
	// Taint is the taint it set ("key=value:Effect"), '' for none.
	Taint string `json:"taint,omitempty"`
	// Cordon: it cordoned the node for this fault.
	Cordon bool `json:"cordon"`
	// Condition is the node condition set False for it
	// ("<ComponentClass>Healthy"), '' when the class is unknown.
	Condition      string   `json:"condition,omitempty"`
	ComponentClass string   `json:"componentClass,omitempty"`
	Message        string   `json:"message,omitempty"`
	DryRun         bool     `json:"dryRun"`
	EventIDs       []string `json:"eventIds"`
}

// NodeDetail is what the node page shows above the node's timeline.
type NodeDetail struct {
	Cluster string `json:"cluster"`
	Node    string `json:"node"`
	// State is one of States (healthy when no action holds it).
	State      string     `json:"state"`
	StateSince *time.Time `json:"stateSince,omitempty"`
	Row        *NodeRow   `json:"row,omitempty"`
	Faults     []Fault    `json:"faults"`
	// Release says how the node's quarantine (or hold) is lifted.
	Release []string `json:"release"`
}

// Node returns node's state, the faults faultline holds it for, and how
// to release it.
func (s *Store) Node(ctx context.Context, cluster, node string) (*NodeDetail, error) {
	if err := CheckNode(node); err != nil {
		return nil, err
	}
	asOf := sqlTime(s.now())
	out := &NodeDetail{Cluster: cluster, Node: node, State: StateHealthy, Faults: []Fault{}, Release: []string{}}
	var st, drift, fr *analytics.Result
	err := parallel(
		func() (err error) {
			st, err = s.run(ctx, "node_states", map[string]string{"cluster": cluster, "now": asOf, "node": node})
			return err
		},
		func() (err error) {
			drift, err = s.run(ctx, "drifted", map[string]string{"cluster": cluster, "now": asOf})
			return err
		},
		func() (err error) {
			fr, err = s.run(ctx, "node_faults", map[string]string{"cluster": cluster, "node": node, "now": asOf})
			return err
		})
	if err != nil {
		return nil, err
	}
	if len(st.Rows) > 0 {
		r := nodeRow(st.Columns, st.Rows[0])
		out.Row, out.State, out.StateSince = &r, r.State, &r.StateSince
	}
	for _, row := range drift.Rows {
		if row[0].(string) == node {
			if out.Row != nil {
				out.Row.Drifted, out.Row.DriftDetail = true, row[2].(string)
			} else {
				out.State = StateDrifted
				out.StateSince = optTime(row[1].(uint64))
			}
		}
	}
	var ids []string
	for _, row := range fr.Rows {
		f := Fault{
			Check: row[0].(string), Entities: row[1].(string), Since: msTime(row[2].(uint64)), Rule: row[3].(string),
			Reason: row[4].(string), Taint: row[5].(string), Cordon: row[6].(string) == "true", DryRun: row[7].(uint8) == 1,
			EventIDs: row[8].([]string),
		}
		if f.EventIDs == nil {
			f.EventIDs = []string{}
		}
		ids = append(ids, f.EventIDs...)
		out.Faults = append(out.Faults, f)
	}
	if len(ids) > 0 {
		if err := s.describeCauses(ctx, cluster, node, ids, out.Faults); err != nil {
			return nil, err
		}
	}
	out.Release = release(out)
	return out, nil
}

// describeCauses fills each fault's component class, condition and
// message from the events that caused it.
func (s *Store) describeCauses(ctx context.Context, cluster, node string, ids []string, faults []Fault) error {
	rows, err := s.conn.Query(queryContext(ctx),
		`SELECT id, component_class, message FROM events WHERE cluster = ? AND node = ? AND has(?, id) LIMIT 1 BY id`,
		cluster, node, ids)
	if err != nil {
		return fmt.Errorf("fleet causes: %w", err)
	}
	defer rows.Close()
	type cause struct{ class, msg string }
	byID := map[string]cause{}
	for rows.Next() {
		var id, class, msg string
		if err := rows.Scan(&id, &class, &msg); err != nil {
			return fmt.Errorf("fleet causes: %w", err)
		}
		byID[id] = cause{class, msg}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("fleet causes: %w", err)
	}
	for i := range faults {
		for _, id := range faults[i].EventIDs {
			if c, ok := byID[id]; ok {
				faults[i].ComponentClass, faults[i].Message = c.class, c.msg
				if c.class != "" {
					faults[i].Condition = c.class + "Healthy"
				}
				break
			}
		}
	}
	return nil
}

// release says how a node's quarantine is lifted, from what faultline set.
func release(d *NodeDetail) []string {
	var out []string
	switch d.State {
	case StateHealthy, StateDrifted:
		if d.State == StateDrifted {
			out = append(out, "Drifted from its conformance group: faultline's conformance role set a PreferNoSchedule taint (faultline.io/conformance-drift) and the faultline.io/conformance-group label; bring the node's configuration back to its group's (firmware, driver, kernel) and its next conforming report lifts them.")
		}
		return append(out, "Nothing to release: faultline holds no quarantine on this node.")
	case StateHeld:
		return append(out,
			"Nothing was applied: the circuit breaker held this quarantine back (held events are recorded, not replayed).",
			"To let faultline quarantine again, close the breaker once the cause is understood: "+
				"kubectl -n default patch configmap faultline-quarantine-breaker --type merge -p '{\"data\":{\"state\":\"closed\"}}' "+
				"(or wait for quarantine.breaker.auto_close).")
	}
	dry := d.Row != nil && d.Row.DryRun
	if dry {
		return append(out, "Dry-run: faultline decided to quarantine this node but applied nothing (the cluster is dry-run or not configured); there is nothing to release on the node.")
	}
	for _, f := range d.Faults {
		what := []string{}
		if f.Cordon {
			what = append(what, "cordon")
		}
		if f.Taint != "" {
			what = append(what, "taint "+f.Taint)
		}
		if f.Condition != "" {
			what = append(what, "condition "+f.Condition+"=False")
		}
		set := "label faultline.io/quarantined=true"
		if len(what) > 0 {
			set = strings.Join(what, ", ") + ", " + set
		}
		ent := f.Entities
		if ent == "" {
			ent = "(no entities)"
		}
		out = append(out, fmt.Sprintf("%s on %s: faultline set %s. It lifts this fault by itself when the node reports %s healthy for the same entities "+
			"(the agent does on recovery; by hand: POST /v1/events with checkName %q, isHealthy true and the same entitiesImpacted).",
			f.Check, ent, set, f.Check, f.Check))
	}
	out = append(out,
		"When its last fault is lifted faultline uncordons the node (if it cordoned it) and removes only its own taints, label and annotations; the condition turns True (FaultsRecovered).",
		"Or release it by hand now: kubectl uncordon "+d.Node+" — faultline notices the manual uncordon, acknowledges the standing faults (a repeat of one is recorded, not re-cordoned) and removes its taints and label.")
	switch d.State {
	case StateDraining:
		out = append(out, "A drain is in progress: it stops by itself once the node is no longer quarantined.")
	case StateRemediating:
		out = append(out, "A remediation is in progress (a RebootNode resource): let it finish, or delete the resource to stop it.")
	case StateEscalated:
		out = append(out, "Escalated to support (CONTACT_SUPPORT): automatic remediation has given up on this node.")
	}
	return out
}

// AnalyticsQuery describes an analytics query the page may run.
type AnalyticsQuery struct {
	Name        string            `json:"name"`
	Description string            `json:"description"`
	Params      []analytics.Param `json:"params"`
}

// AnalyticsQueries lists the analytics queries that take a cluster, by
// name.
func (s *Store) AnalyticsQueries() []AnalyticsQuery { return listAnalytics(s.analytics) }

// AnalyticsList lists the analytics queries of sql/analytics that take a
// cluster (the ones Analytics runs), by name.
func AnalyticsList() ([]AnalyticsQuery, error) {
	an, err := clusterAnalytics()
	if err != nil {
		return nil, err
	}
	return listAnalytics(an), nil
}

func clusterAnalytics() (map[string]analytics.Query, error) {
	an, err := analytics.Builtin()
	if err != nil {
		return nil, err
	}
	// Only queries the cluster can be bound on are offered: a caller sees
	// its own cluster only.
	for name, q := range an {
		if !slices.ContainsFunc(q.Params, func(p analytics.Param) bool { return p.Name == "cluster" }) {
			delete(an, name)
		}
	}
	return an, nil
}

func listAnalytics(an map[string]analytics.Query) []AnalyticsQuery {
	out := []AnalyticsQuery{}
	for _, q := range an {
		ps := []analytics.Param{}
		for _, p := range q.Params {
			if p.Name != "cluster" {
				ps = append(ps, p)
			}
		}
		out = append(out, AnalyticsQuery{Name: q.Name, Description: q.Description, Params: ps})
	}
	slices.SortFunc(out, func(a, b AnalyticsQuery) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Table is an analytics result as JSON.
type Table struct {
	Query   string   `json:"query"`
	Columns []string `json:"columns"`
	Types   []string `json:"types"`
	Rows    [][]any  `json:"rows"`
	// Truncated: the query has more rows than maxAnalyticsRows; Rows are
	// its first ones.
	Truncated bool `json:"truncated"`
}

// maxAnalyticsRows bounds an analytics answer, and what is read of it.
const maxAnalyticsRows = 10000

// Analytics runs the named analytics query on cluster with params (text
// values; cluster cannot be given: it is always the caller's).
func (s *Store) Analytics(ctx context.Context, cluster, name string, params map[string]string) (*Table, error) {
	q, ok := s.analytics[name]
	if !ok {
		names := make([]string, 0, len(s.analytics))
		for n := range s.analytics {
			names = append(names, n)
		}
		slices.Sort(names)
		return nil, badf("query: no analytics query %q (queries: %s)", name, strings.Join(names, ", "))
	}
	if _, ok := params["cluster"]; ok {
		return nil, badf("cluster: not a parameter here: the cluster is the caller's")
	}
	vals := map[string]string{"cluster": cluster}
	for k, v := range params {
		vals[k] = v
	}
	if _, err := q.Args(vals, s.now()); err != nil {
		return nil, &BadRequest{msg: err.Error()}
	}
	res, err := analytics.RunMax(queryContext(ctx), s.conn, q, vals, s.now(), maxAnalyticsRows)
	if err != nil {
		return nil, err
	}
	t := &Table{Query: name, Columns: res.Columns, Types: res.Types, Rows: res.Rows, Truncated: res.Truncated}
	if t.Rows == nil {
		t.Rows = [][]any{}
	}
	for _, row := range t.Rows {
		for i, v := range row {
			if tm, ok := v.(time.Time); ok {
				row[i] = tm.UTC().Format(time.RFC3339)
			}
		}
	}
	return t, nil
}
