// Package conformance is the read side of node conformance shared by the
// conformance processor role and the gateway's score endpoint: the latest
// fingerprint of each node from ClickHouse's conformance table, the
// conformance groups (nodes with the same fingerprint), drift against a
// baseline or the majority, and f₉, the homogeneity score of a node set
// (../../shared/seeds/node-conformance-drift.txt).
//
// A node whose latest report is older than the staleness window, or that
// never reported, has unknown conformance: a group of its own (Unknown).
package conformance

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"

	"github.com/faultline/faultline/internal/clickhouse"
)

// Unknown is the fingerprint shown for a node without a fresh report; each
// such node is a group of one.
const Unknown = "unknown"

// Report is a node's latest conformance report.
type Report struct {
	Node        string
	Fingerprint string
	// At is when the agent took it (the event's generatedTimestamp).
	At time.Time
	// Components: name → value; filled by Latest for a partial report
	// only (Evaluate reads them when a group has no complete report).
	Components map[string]string
	// Partial: the agent could not read some component (its value starts
	// with agents/conformance.Unreadable) — a driver not loaded yet after
	// a reboot, a BMC tool that timed out. Such a report votes for no
	// fingerprint while the group has a complete one, though its node
	// counts among the members (filled by Latest).
	Partial bool
}

// unreadablePrefix starts a component value the agent could not read
// (agents/conformance.Unreadable; a test keeps them equal), and
// unreadablePattern matches one in SQL.
const (
	unreadablePrefix  = "unreadable: "
	unreadablePattern = unreadablePrefix + "%"
)

// Latest returns the latest report of each node of cluster taken at or
// after since (older ones are stale), restricted to nodes when nodes is
// not nil. A node without such a report is absent from the map. A partial
// report comes with its components.
func Latest(ctx context.Context, conn clickhouse.Conn, cluster string, since time.Time, nodes []string) (map[string]Report, error) {
	q := `SELECT node, argMax(fingerprint, toUInt64(ts) * 1000 + ts_ms) AS fp, max(toUInt64(ts) * 1000 + ts_ms) AS at_ms,
	argMax(arrayExists(v -> v LIKE ?, components.version), toUInt64(ts) * 1000 + ts_ms) AS partial,
	argMax(components.name, toUInt64(ts) * 1000 + ts_ms) AS names, argMax(components.version, toUInt64(ts) * 1000 + ts_ms) AS versions
FROM conformance
WHERE cluster = ? AND ts >= ?`
	args := []any{unreadablePattern, cluster, clampTime(since)}
	if nodes != nil {
		if len(nodes) == 0 {
			return map[string]Report{}, nil
		}
		set := make([]any, len(nodes))
		for i, n := range nodes {
			set[i] = n
		}
		q += ` AND node IN ?`
		args = append(args, ch.GroupSet{Value: set})
	}
	q += `
GROUP BY node`
	rows, err := conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("conformance: latest reports of %s: %w", cluster, err)
	}
	defer rows.Close()
	out := map[string]Report{}
	for rows.Next() {
		var (
			r               Report
			ms              uint64
			partial         uint8
			names, versions []string
		)
		if err := rows.Scan(&r.Node, &r.Fingerprint, &ms, &partial, &names, &versions); err != nil {
			return nil, fmt.Errorf("conformance: latest reports of %s: %w", cluster, err)
		}
		r.At, r.Partial = time.UnixMilli(int64(ms)).UTC(), partial == 1
		if r.Partial {
			r.Components = make(map[string]string, len(names))
			for i, n := range names {
				if i < len(versions) {
					r.Components[n] = versions[i]
				}
			}
		}
		out[r.Node] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("conformance: latest reports of %s: %w", cluster, err)
	}
	return out, nil
}

// Components returns the components of one report of a node of cluster
// with that fingerprint (the latest such), for explaining drift.
func Components(ctx context.Context, conn clickhouse.Conn, cluster, node, fingerprint string) (map[string]string, error) {
	var names, versions []string
	err := conn.QueryRow(ctx, `SELECT argMax(components.name, toUInt64(ts) * 1000 + ts_ms), argMax(components.version, toUInt64(ts) * 1000 + ts_ms)
FROM conformance WHERE cluster = ? AND node = ? AND fingerprint = ?`, cluster, node, fingerprint).Scan(&names, &versions)
	if err != nil {
		return nil, fmt.Errorf("conformance: components of %s/%s: %w", cluster, node, err)
	}
	out := make(map[string]string, len(names))
	for i, n := range names {
		if i < len(versions) {
			out[n] = versions[i]
		}
	}
	return out, nil
}

// ComponentsOf returns the components of any node's latest report with
// that fingerprint in cluster (a group's representative).
func ComponentsOf(ctx context.Context, conn clickhouse.Conn, cluster, fingerprint string) (map[string]string, error) {
	var names, versions []string
	err := conn.QueryRow(ctx, `SELECT argMax(components.name, toUInt64(ts) * 1000 + ts_ms), argMax(components.version, toUInt64(ts) * 1000 + ts_ms)
FROM conformance WHERE cluster = ? AND fingerprint = ?`, cluster, fingerprint).Scan(&names, &versions)
	if err != nil {
		return nil, fmt.Errorf("conformance: components of fingerprint %s: %w", fingerprint, err)
	}
	out := make(map[string]string, len(names))
	for i, n := range names {
		if i < len(versions) {
			out[n] = versions[i]
		}
	}
	return out, nil
}

func clampTime(t time.Time) time.Time {
	if t.Before(time.Unix(0, 0)) {
		return time.Unix(0, 0).UTC()
	}
	if t.After(time.Unix(math.MaxUint32, 0)) {
		return time.Unix(math.MaxUint32, 0).UTC()
	}
	return t.UTC()
}

// Group is a conformance group: the nodes with one fingerprint.
type Group struct {
	Fingerprint string   `json:"fingerprint"`
	Nodes       []string `json:"nodes"`
}

// Score is f₉ of a requested node set and its groups.
type Score struct {
	// F9 is the largest group's size ÷ the nodes requested (1 for one
	// node or none).
	F9 float64 `json:"f9"`
	// Requested is the number of distinct nodes requested.
	Requested int `json:"requested"`
	// Groups, largest first (then by fingerprint); each node without a
	// fresh report, or with a partial one that ComputeScore cannot group,
	// is a group of one with fingerprint Unknown.
	Groups []Group `json:"groups"`
}

// ComputeScore groups the requested nodes by their fresh report (latest;
// a node missing from it is unknown: a group of one) and computes f₉.
// As in Evaluate, a partial report is unknown while a requested node has
// a complete one (the processor takes no vote from it then: 8 nodes
// rebooting, their GPU driver unreadable, are not one homogeneous group);
// when every fresh report is partial (a component unreadable on every
// node: /dev/ipmi0 not passed through), the nodes are grouped as
// majorityOfPartial compares them, on their components but those
// unreadable on every report, and a report with another unreadable
// component, without its components or with nothing readable, is unknown.
// Such a group's fingerprint is its most common one.
func ComputeScore(nodes []string, latest map[string]Report) Score {
	var (
		requested []string
		partial   []*Report
		complete  bool
	)
	seen := map[string]bool{}
	for _, node := range nodes {
		if seen[node] {
			continue
		}
		seen[node] = true
		requested = append(requested, node)
		if r, ok := latest[node]; ok {
			complete = complete || !r.Partial
			if r.Partial {
				partial = append(partial, &r)
			}
		}
	}
	var groups []Group
	placed := map[string]bool{}
	if !complete {
		readable, _ := byReadable(partial)
		for k, rs := range readable {
			if k == "" { // nothing readable on any node
				continue
			}
			g := Group{Fingerprint: commonFingerprint(rs)}
			for _, r := range rs {
				g.Nodes = append(g.Nodes, r.Node)
				placed[r.Node] = true
			}
			sort.Strings(g.Nodes)
			groups = append(groups, g)
		}
	}
	byFP := map[string][]string{}
	for _, node := range requested {
		r, ok := latest[node]
		switch {
		case placed[node]:
		case ok && !r.Partial:
			byFP[r.Fingerprint] = append(byFP[r.Fingerprint], node)
		default:
			groups = append(groups, Group{Fingerprint: Unknown, Nodes: []string{node}})
		}
	}
	for fp, ns := range byFP {
		sort.Strings(ns)
		groups = append(groups, Group{Fingerprint: fp, Nodes: ns})
	}
	sort.Slice(groups, func(i, j int) bool {
		if len(groups[i].Nodes) != len(groups[j].Nodes) {
			return len(groups[i].Nodes) > len(groups[j].Nodes)
		}
		if groups[i].Fingerprint != groups[j].Fingerprint {
			return groups[i].Fingerprint < groups[j].Fingerprint
		}
		return groups[i].Nodes[0] < groups[j].Nodes[0]
	})
	n := len(requested)
	s := Score{F9: 1, Requested: n, Groups: groups}
	if n > 0 && len(groups) > 0 {
		s.F9 = float64(len(groups[0].Nodes)) / float64(n)
	}
	if s.Groups == nil {
		s.Groups = []Group{}
	}
	return s
}

// State is a node's conformance state within its group.
type State string

// States.
const (
	// Conforming: the node's fingerprint is the group's expected one.
	Conforming State = "conforming"
	// Drifted: the node's fresh fingerprint differs from the expected one.
	Drifted State = "drifted"
	// StateUnknown: no fresh report.
	StateUnknown State = "unknown"
	// Undecided: the group has neither a baseline nor a strict majority,
	// so nothing can be said of its nodes.
	Undecided State = "undecided"
)

// Basis says where a group's expected fingerprint comes from.
const (
	BasisBaseline = "baseline"
	BasisMajority = "majority"
)

// Member is a node of a group to evaluate.
type Member struct {
	Node string
	// Report is the node's fresh report; nil: unknown.
	Report *Report
}

// Verdict is one node's state.
type Verdict struct {
	Node  string
	State State
	// Expected is the group's expected fingerprint ("" when Undecided).
	Expected string
	// Actual is the node's fingerprint (Unknown without a fresh report).
	Actual string
	// Basis is BasisBaseline or BasisMajority.
	Basis string
}

// Evaluate decides each member's state: the expected fingerprint is
// baseline when set, else the one of the fresh, complete reports of more
// than half of all the members (none: Undecided). Members without a fresh
// report are StateUnknown; they and partial reports vote for no
// fingerprint (an unreadable one is never the expected one) but count
// among the members: the few that report complete do not decide the group
// (a straggler on the old image, 1 of 10, its 9 peers rebooted into the
// new one and partial, their driver not loaded yet, drifted all 9 and
// drained them when sensitive; 2 of 10 agreeing, 7 agents silent, drifted
// the third). The same majority is firm enough to lift a quarantine
// (processors/conformance).
//
// A group whose fresh reports are all partial (a component unreadable on
// every node: ipmitool configured, /dev/ipmi0 not passed through) is
// decided on the components readable somewhere (majorityOfPartial).
func Evaluate(members []Member, baseline string) []Verdict {
	expected, basis := baseline, BasisBaseline
	var (
		key     func(*Report) string // nil: nodes are compared by fingerprint
		wantKey string
	)
	if expected == "" {
		basis = BasisMajority
		counts := map[string]int{}
		fresh, complete := 0, 0
		for _, m := range members {
			if m.Report != nil {
				fresh++
			}
			if m.Report != nil && !m.Report.Partial {
				counts[m.Report.Fingerprint]++
				complete++
			}
		}
		for fp, c := range counts {
			if 2*c > len(members) {
				expected = fp
			}
		}
		if complete == 0 && fresh > 0 {
			expected, wantKey, key = majorityOfPartial(members)
		}
	}
	out := make([]Verdict, 0, len(members))
	for _, m := range members {
		v := Verdict{Node: m.Node, Expected: expected, Basis: basis, Actual: Unknown}
		switch {
		case m.Report == nil:
			v.State = StateUnknown
		case expected == "":
			v.State, v.Actual = Undecided, m.Report.Fingerprint
		case m.Report.Fingerprint == expected, key != nil && key(m.Report) == wantKey:
			v.State, v.Actual = Conforming, m.Report.Fingerprint
		default:
			v.State, v.Actual = Drifted, m.Report.Fingerprint
		}
		out = append(out, v)
	}
	return out
}

// majorityOfPartial decides a group whose fresh reports are all partial:
// the reports are compared as byReadable groups them, and the components
// of more than half of all the members are expected (none: ""; members
// without a fresh report, or with another unreadable component, agree
// with nobody, as in Evaluate). It
// returns the fingerprint of one such report (the most common among
// them), and the key a node's report must have to conform: its components
// but those unreadable on every report (so an unreadable value's reason,
// which may differ from node to node, does not count). A report without
// its components (Latest fills them) leaves the group undecided.
func majorityOfPartial(members []Member) (expected, wantKey string, key func(*Report) string) {
	var reports []*Report
	for _, m := range members {
		if m.Report != nil {
			reports = append(reports, m.Report)
		}
	}
	groups, key := byReadable(reports)
	if key == nil {
		return "", "", nil
	}
	for k, rs := range groups {
		if 2*len(rs) > len(members) {
			wantKey = k
		}
	}
	if wantKey == "" { // no majority, or nothing readable on any node
		return "", "", nil
	}
	return commonFingerprint(groups[wantKey]), wantKey, key
}

// byReadable groups partial reports by their components but those
// unreadable on every one of them (the key; "" when nothing is readable
// on any); a report with another unreadable component is in no group. It
// returns nil groups and key when a report lacks its components.
func byReadable(reports []*Report) (groups map[string][]*Report, key func(*Report) string) {
	var common map[string]bool // unreadable on every report
	for _, r := range reports {
		if r.Components == nil {
			return nil, nil
		}
		unreadable := map[string]bool{}
		for n, v := range r.Components {
			if strings.HasPrefix(v, unreadablePrefix) && (common == nil || common[n]) {
				unreadable[n] = true
			}
		}
		common = unreadable
	}
	key = func(r *Report) string {
		names := make([]string, 0, len(r.Components))
		for n := range r.Components {
			if !common[n] {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		var b strings.Builder
		for _, n := range names {
			fmt.Fprintf(&b, "%s=%s\n", n, r.Components[n])
		}
		return b.String()
	}
	groups = map[string][]*Report{}
	for _, r := range reports {
		if !otherUnreadable(r, common) {
			groups[key(r)] = append(groups[key(r)], r)
		}
	}
	return groups, key
}

// commonFingerprint is the most common fingerprint of reports (the
// smallest of a tie).
func commonFingerprint(reports []*Report) string {
	counts := map[string]int{}
	for _, r := range reports {
		counts[r.Fingerprint]++
	}
	fp := ""
	for f, c := range counts {
		if fp == "" || c > counts[fp] || c == counts[fp] && f < fp {
			fp = f
		}
	}
	return fp
}

// otherUnreadable: r has an unreadable component not in common.
func otherUnreadable(r *Report, common map[string]bool) bool {
	for n, v := range r.Components {
		if !common[n] && strings.HasPrefix(v, unreadablePrefix) {
			return true
		}
	}
	return false
}

// Diff lists the components that differ between expected and actual, as
// "name: expected → actual" (a missing one shows "(none)"), sorted.
func Diff(expected, actual map[string]string) []string {
	names := map[string]bool{}
	for n := range expected {
		names[n] = true
	}
	for n := range actual {
		names[n] = true
	}
	var out []string
	for n := range names {
		e, eok := expected[n]
		a, aok := actual[n]
		if eok && aok && e == a {
			continue
		}
		if !eok {
			e = "(none)"
		}
		if !aok {
			a = "(none)"
		}
		out = append(out, fmt.Sprintf("%s: expected %q, actual %q", n, e, a))
	}
	sort.Strings(out)
	return out
}

// QueryContext makes ClickHouse stop a query at ctx's deadline.
func QueryContext(ctx context.Context) context.Context {
	d, ok := ctx.Deadline()
	if !ok {
		return ctx
	}
	secs := int(math.Ceil(time.Until(d).Seconds()))
	return ch.Context(ctx, ch.WithSettings(ch.Settings{"max_execution_time": max(secs, 1)}))
}

// Scorer serves f₉ over a ClickHouse connection.
type Scorer struct {
	// Conn reaches faultline's database; a func so a caller can connect
	// lazily (the gateway accepts events while ClickHouse is down).
	Conn func(ctx context.Context) (clickhouse.Conn, error)
	// Staleness: a report older is unknown (the conformance role's
	// conformance.staleness).
	Staleness time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Score returns f₉ and the groups of nodes (of cluster only).
func (s *Scorer) Score(ctx context.Context, cluster string, nodes []string) (Score, error) {
	conn, err := s.Conn(ctx)
	if err != nil {
		return Score{}, err
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	latest, err := Latest(QueryContext(ctx), conn, cluster, now().Add(-s.Staleness), nodes)
	if err != nil {
		return Score{}, err
	}
	return ComputeScore(nodes, latest), nil
}
