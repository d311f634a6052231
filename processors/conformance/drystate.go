package conformance

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/schemas/events"
)

// restoreDry reads a dry-run cluster's node states back from its audit
// trail — the role's dry-run actions of the cluster in ClickHouse — once
// per process, before its first sweep decides anything. Without it a
// restart decided every drift again from the restart (drift_remediation_timeout
// counted from then: a role restarted more often than the timeout never
// escalated in dry-run where live would, and each restart recorded a
// sensitive node's drain again). A decision whose action never reached
// ClickHouse is decided again, as it should be.
func (s *Sweeper) restoreDry(ctx context.Context, cluster string) error {
	s.mu.Lock()
	done := s.restored[cluster]
	s.mu.Unlock()
	if done {
		return nil
	}
	rows, err := dryActions(ctx, s.conn, cluster)
	if err != nil {
		return err
	}
	states := foldDry(cluster, rows)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dry[cluster] = states
	s.restored[cluster] = true
	return nil
}

// dryAction is one dry-run action of the role as stored.
type dryAction struct {
	node, kind, outcome     string
	at                      time.Time
	since, expected, actual string
	group                   string // DetailConformanceGroup: cluster or cluster/pool
}

// dryActions reads the role's dry-run actions of cluster that make up a
// node's state, oldest first, each id once.
func dryActions(ctx context.Context, conn clickhouse.Conn, cluster string) ([]dryAction, error) {
	const q = `SELECT node, kind, outcome, toUInt64(ts) * 1000 + ts_ms AS at_ms,
  details.value[indexOf(details.key, ?)], details.value[indexOf(details.key, ?)],
  details.value[indexOf(details.key, ?)], details.value[indexOf(details.key, ?)]
FROM actions
WHERE cluster = ? AND role = ? AND dry_run = 1 AND kind IN (?, ?, ?, ?, ?)
ORDER BY node, at_ms
LIMIT 1 BY id`
	rows, err := conn.Query(ctx, q, events.DetailDriftSince, events.DetailExpected, events.DetailActual, events.DetailConformanceGroup,
		cluster, Role, events.KindConformanceDrift, events.KindConformanceDrain, events.KindEscalate, events.KindConformanceUndrain, events.KindConformanceRestored)
	if err != nil {
		return nil, fmt.Errorf("conformance: dry-run actions of %s: %w", cluster, err)
	}
	defer rows.Close()
	var out []dryAction
	for rows.Next() {
		var (
			a  dryAction
			ms uint64
		)
		if err := rows.Scan(&a.node, &a.kind, &a.outcome, &ms, &a.since, &a.expected, &a.actual, &a.group); err != nil {
			return nil, fmt.Errorf("conformance: dry-run actions of %s: %w", cluster, err)
		}
		a.at = time.UnixMilli(int64(ms))
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("conformance: dry-run actions of %s: %w", cluster, err)
	}
	return out, nil
}

// dryOrder puts the actions one sweep records together in the order it
// decides them (they share a timestamp).
var dryOrder = map[string]int{events.KindConformanceDrift: 0, events.KindConformanceDrain: 1, events.KindEscalate: 2,
	events.KindConformanceUndrain: 3, events.KindConformanceRestored: 4}

// foldDry replays a cluster's dry-run actions into each node's state, as
// reconcile left it: a drift starts a state (or, with the same start,
// changes its fingerprints), a drain and an escalation of that drift set
// Drained and Escalated, an undrain in progress Awaiting, and a return to
// conformance ends it. An action of another drift than the node's current
// one is stale and ignored.
func foldDry(cluster string, acts []dryAction) map[string]State {
	sort.SliceStable(acts, func(i, j int) bool {
		a, b := acts[i], acts[j]
		if a.node != b.node {
			return a.node < b.node
		}
		if !a.at.Equal(b.at) {
			return a.at.Before(b.at)
		}
		return dryOrder[a.kind] < dryOrder[b.kind]
	})
	out := map[string]State{}
	for _, a := range acts {
		since, err := time.Parse(time.RFC3339, a.since)
		if err != nil {
			continue // not written by reconcile
		}
		st, has := out[a.node]
		ours := has && st.Since.Equal(since)
		switch a.kind {
		case events.KindConformanceDrift:
			if !ours {
				st = State{Since: since}
			}
			if ours && st.Awaiting {
				st.Resumed++ // drifted again while it awaited approval
			}
			st.Expected, st.Actual, st.Awaiting = a.expected, a.actual, false
			pool, _, _ := strings.Cut(a.group, "{") // without the hardware identity
			st.Group = GroupValue(strings.TrimPrefix(strings.TrimPrefix(pool, cluster), "/"))
		case events.KindConformanceDrain:
			st.Drained, st.Sensitive = true, true
		case events.KindEscalate:
			st.Escalated = true
		case events.KindConformanceUndrain:
			st.Awaiting = a.outcome == events.OutcomeInProgress
		case events.KindConformanceRestored:
			if ours {
				delete(out, a.node)
			}
			continue
		}
		if ours || a.kind == events.KindConformanceDrift {
			out[a.node] = st
		}
	}
	return out
}
