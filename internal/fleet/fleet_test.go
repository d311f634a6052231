package fleet_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/internal/clickhouse/chtest"
	"github.com/faultline/faultline/internal/fleet"
	"github.com/faultline/faultline/internal/fleet/fleettest"
	"github.com/faultline/faultline/schemas/events"
)

func newStore(t *testing.T, srv *chtest.Server) *fleet.Store {
	t.Helper()
	st, err := fleet.New(srv.Conn, slog.Default(), fleet.Options{Now: func() time.Time { return fleettest.Base.Add(time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse")
	}
	srv := chtest.Start(t)
	fleettest.Seed(t, srv.Conn)
	st := newStore(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("Summary", func(t *testing.T) {
		sum, err := st.Summary(ctx, "alpha", fleet.Range{Since: fleettest.Base.Add(-time.Hour), Until: fleettest.Base.Add(time.Hour)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]uint64{
			fleet.StateHealthy:     6, // n00, n05, n07, n08, n10, n11 (of 12 reporting)
			fleet.StateQuarantined: 2, fleet.StateDraining: 1, fleet.StateRemediating: 1, fleet.StateEscalated: 1,
			fleet.StateHeld: 1, fleet.StateDrifted: 2,
		}
		for k, v := range want {
			if sum.Nodes[k] != v {
				t.Errorf("%s: got %d, want %d (all: %v)", k, sum.Nodes[k], v, sum.Nodes)
			}
		}
		if sum.ReportingNodes != 12 {
			t.Errorf("reporting nodes: got %d, want 12", sum.ReportingNodes)
		}
		if sum.Breaker.State != "open" || sum.Breaker.Held != 1 || !strings.Contains(sum.Breaker.Reason, "3 of 12") {
			t.Errorf("breaker: %+v", sum.Breaker)
		}
		if sum.DryRun {
			t.Errorf("alpha marked dry-run")
		}
		if sum.Page != nil {
			t.Errorf("a page that was not asked for: %+v", sum.Page)
		}
		withPage, err := st.Summary(ctx, "alpha", fleet.Range{}, &fleet.NodesQuery{State: fleet.StateDrifted, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		if p := withPage.Page; p == nil || len(p.Nodes) != 1 || p.Nodes[0].Node != "n07" || p.NextPageToken == "" {
			t.Errorf("summary's drifted page: %+v", p)
		}
		if _, err := st.Summary(ctx, "alpha", fleet.Range{}, &fleet.NodesQuery{State: "bogus"}); err == nil {
			t.Error("summary accepted a bad page state")
		}
		beta, err := st.Summary(ctx, "beta", fleet.Range{Since: fleettest.Base.Add(-time.Hour), Until: fleettest.Base.Add(time.Hour)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !beta.DryRun || beta.Nodes[fleet.StateQuarantined] != 1 || beta.DryRunNodes != 1 || beta.Breaker.State != "never tripped" {
			t.Errorf("beta: %+v", beta)
		}
		// A quarantined node that reports nothing is not taken off the
		// reporting nodes' healthy count.
		gamma, err := st.Summary(ctx, "gamma", fleet.Range{Since: fleettest.Base.Add(-time.Hour), Until: fleettest.Base.Add(time.Hour)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if gamma.ReportingNodes != 1 || gamma.Nodes[fleet.StateQuarantined] != 1 || gamma.Nodes[fleet.StateHealthy] != 1 {
			t.Errorf("gamma: reporting %d, nodes %v", gamma.ReportingNodes, gamma.Nodes)
		}
	})

	// until bounds the reporting nodes only: the breaker, dry-run and the
	// node counts are all as of now, so one page never contradicts itself.
	t.Run("Summary until before the breaker opened", func(t *testing.T) {
		sum, err := st.Summary(ctx, "alpha", fleet.Range{Since: fleettest.Base.Add(-time.Hour), Until: fleettest.Base.Add(5 * time.Minute)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if sum.Breaker.State != "open" || sum.Breaker.Held != 1 || sum.Breaker.Since == nil || !sum.Breaker.Since.Equal(fleettest.Base.Add(7*time.Minute)) {
			t.Errorf("breaker as of now: %+v", sum.Breaker)
		}
		if sum.ReportingNodes != 12 || !sum.AsOf.Equal(fleettest.Base.Add(time.Hour)) {
			t.Errorf("reporting nodes %d, asOf %s", sum.ReportingNodes, sum.AsOf)
		}
		// beta's only quarantine (dry-run) is at Base+1m.
		beta, err := st.Summary(ctx, "beta", fleet.Range{Since: fleettest.Base.Add(-time.Hour), Until: fleettest.Base.Add(30 * time.Second)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !beta.DryRun || beta.DryRunNodes != 1 {
			t.Errorf("beta dry-run as of now: %+v", beta)
		}
	})

	t.Run("Nodes", func(t *testing.T) {
		tests := []struct {
			state string
			want  []string
		}{
			{"", []string{"n09", "n06", "n04", "n03", "n02", "n01"}},
			{fleet.StateQuarantined, []string{"n09", "n01"}},
			{fleet.StateDraining, []string{"n02"}},
			{fleet.StateRemediating, []string{"n03"}},
			{fleet.StateEscalated, []string{"n04"}},
			{fleet.StateHeld, []string{"n06"}},
			{fleet.StateDrifted, []string{"n07", "n09"}},
		}
		for _, tt := range tests {
			t.Run("state="+tt.state, func(t *testing.T) {
				var got []string
				tok := ""
				for range 10 {
					p, err := st.Nodes(ctx, "alpha", fleet.NodesQuery{State: tt.state, Limit: 4, PageToken: tok})
					if err != nil {
						t.Fatal(err)
					}
					for _, n := range p.Nodes {
						got = append(got, n.Node)
					}
					if tok = p.NextPageToken; tok == "" {
						break
					}
				}
				if !slices.Equal(got, tt.want) {
					t.Fatalf("got %v, want %v", got, tt.want)
				}
			})
		}
		p, err := st.Nodes(ctx, "alpha", fleet.NodesQuery{State: fleet.StateQuarantined, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		rem, err := st.Nodes(ctx, "alpha", fleet.NodesQuery{State: fleet.StateRemediating})
		if err != nil {
			t.Fatal(err)
		}
		// n03's last drain action is a fault its finished drain covered;
		// the repeat quarantine after its remediation started changes
		// neither its state nor since when (the remediation's start), and
		// it is quarantined since the first quarantine.
		if len(rem.Nodes) != 1 || rem.Nodes[0].Drain != events.OutcomeSucceeded ||
			!rem.Nodes[0].StateSince.Equal(fleettest.Base.Add(5*time.Minute)) ||
			!rem.Nodes[0].QuarantinedSince.Equal(fleettest.Base.Add(3*time.Minute+time.Second)) {
			t.Errorf("remediating: %+v", rem.Nodes)
		}
		n := p.Nodes[0]
		if n.Node != "n09" || !n.Drifted || n.Reason != "rule nic matched" || p.NextPageToken == "" {
			t.Errorf("first quarantined: %+v, token %q", n, p.NextPageToken)
		}
		beta, err := st.Nodes(ctx, "beta", fleet.NodesQuery{})
		if err != nil {
			t.Fatal(err)
		}
		if len(beta.Nodes) != 1 || beta.Nodes[0].Node != "b01" || !beta.Nodes[0].DryRun {
			t.Errorf("beta sees %+v", beta.Nodes)
		}
	})

	// Keyset paging: nodes change state while the pages are read; a node
	// whose row stayed is shown exactly once, and no node twice (with an
	// offset, the released nodes shifted the rest up, skipping some, and
	// the new ones shifted them down, repeating some).
	t.Run("PagingOverChanges", func(t *testing.T) {
		const cluster = "paging"
		var nodes []string
		for g := range 8 { // 8 groups of 3 nodes quarantined at the same time: ties
			group := []string{}
			for i := range 3 {
				group = append(group, fmt.Sprintf("p%02d", 3*g+i))
			}
			fleettest.Change(t, srv.Conn, cluster, events.KindQuarantine, fmt.Sprintf("g%d-", g), 20*time.Minute-time.Duration(g)*time.Minute, group...)
			nodes = append(nodes, group...)
		}
		changed := map[string]bool{}
		changes := map[int]func(){
			// Two shown nodes released.
			1: func() {
				fleettest.Change(t, srv.Conn, cluster, events.KindUnquarantine, "c1-", 40*time.Minute, "p00", "p01")
				changed["p00"], changed["p01"] = true, true
			},
			// Three new nodes, newest first.
			2: func() {
				fleettest.Change(t, srv.Conn, cluster, events.KindQuarantine, "c2-", 41*time.Minute, "q00", "q01", "q02")
			},
			// A shown node starts draining (newest state now), one not shown
			// yet is released.
			3: func() {
				fleettest.Change(t, srv.Conn, cluster, events.KindDrain, "c3-", 42*time.Minute, "p02")
				fleettest.Change(t, srv.Conn, cluster, events.KindUnquarantine, "c4-", 42*time.Minute, "p20")
				changed["p02"], changed["p20"] = true, true
			},
		}
		seen := map[string]int{}
		var order []string
		tok := ""
		for page := 1; page <= 20; page++ {
			p, err := st.Nodes(ctx, cluster, fleet.NodesQuery{Limit: 4, PageToken: tok})
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range p.Nodes {
				seen[n.Node]++
				order = append(order, n.Node)
			}
			if tok = p.NextPageToken; tok == "" {
				break
			}
			if f := changes[page]; f != nil {
				f()
			}
		}
		for n, c := range seen {
			if c > 1 {
				t.Errorf("%s shown %d times (pages: %v)", n, c, order)
			}
		}
		for _, n := range nodes {
			if !changed[n] && seen[n] != 1 {
				t.Errorf("%s stayed quarantined but was shown %d times (pages: %v)", n, seen[n], order)
			}
		}
	})

	// Held and dry-run quarantines applied nothing, so nothing releases
	// them: they end when every fault they decided on has recovered.
	t.Run("Unapplied", func(t *testing.T) {
		p, err := st.Nodes(ctx, "delta", fleet.NodesQuery{})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, n := range p.Nodes {
			got[n.Node] = n.State
		}
		want := map[string]string{"d02": fleet.StateHeld, "d03": fleet.StateHeld, "d05": fleet.StateQuarantined, "d06": fleet.StateHeld, "d07": fleet.StateQuarantined}
		if !maps.Equal(got, want) {
			t.Errorf("delta's nodes: got %v, want %v", got, want)
		}
		sum, err := st.Summary(ctx, "delta", fleet.Range{Since: fleettest.Base.Add(-time.Hour), Until: fleettest.Base.Add(time.Hour)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if sum.Nodes[fleet.StateHeld] != 3 || sum.Nodes[fleet.StateQuarantined] != 2 || sum.DryRunNodes != 2 || sum.Nodes[fleet.StateHealthy] != 2 {
			t.Errorf("delta's summary: %v, dry-run %d", sum.Nodes, sum.DryRunNodes)
		}
		for node, faults := range map[string][]string{"d04": nil, "d05": {"GPU=GPU-0"}, "d07": {"GPU=GPU-1"}} {
			d, err := st.Node(ctx, "delta", node)
			if err != nil {
				t.Fatal(err)
			}
			var ents []string
			for _, f := range d.Faults {
				ents = append(ents, f.Entities)
			}
			if !slices.Equal(ents, faults) {
				t.Errorf("%s (%s): faults %v, want %v", node, d.State, ents, faults)
			}
		}
	})

	t.Run("BadRequests", func(t *testing.T) {
		for _, q := range []fleet.NodesQuery{{State: "healthy"}, {State: "bogus"}, {Limit: 1001}, {Limit: -1}, {PageToken: "zzz"}} {
			_, err := st.Nodes(ctx, "alpha", q)
			if _, ok := errors.AsType[*fleet.BadRequest](err); !ok {
				t.Errorf("%+v: got %v, want a BadRequest", q, err)
			}
		}
		first, err := st.Nodes(ctx, "alpha", fleet.NodesQuery{State: fleet.StateQuarantined, Limit: 1})
		if err != nil || first.NextPageToken == "" {
			t.Fatalf("first quarantined page: %+v, %v", first, err)
		}
		b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
		for _, tt := range []struct{ name, state, token, want string }{
			{"not base64", "", "zzz!", "pageToken: not a token this server issued"},
			{"garbage", "", b64("garbage"), "pageToken: not a token this server issued"},
			{"bad time", "", b64("|x|n01"), "pageToken: not a token this server issued"},
			{"bad node", "", b64("|1|N 01"), "pageToken: not a token this server issued"},
			{"too long", "", strings.Repeat("A", 600), "pageToken: not a token this server issued"},
			{"an earlier version's offset", "", b64("o100"), "pageToken: an offset token of an earlier version"},
			{"another state's", fleet.StateDraining, first.NextPageToken, "pageToken: issued for the state=quarantined page, not state=draining"},
		} {
			_, err := st.Nodes(ctx, "alpha", fleet.NodesQuery{State: tt.state, PageToken: tt.token})
			if _, ok := errors.AsType[*fleet.BadRequest](err); !ok || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%s: got %v, want a BadRequest saying %q", tt.name, err, tt.want)
			}
		}
		for _, node := range []string{"", "UPPER", strings.Repeat("a", 254), "a b"} {
			if _, err := st.Node(ctx, "alpha", node); err == nil {
				t.Errorf("node %q accepted", node)
			}
		}
		if _, err := st.Analytics(ctx, "alpha", "remediation_outcomes", map[string]string{"cluster": "beta"}); err == nil {
			t.Error("analytics accepted a cluster parameter")
		}
		if _, err := st.Analytics(ctx, "alpha", "nope", nil); err == nil {
			t.Error("unknown analytics query accepted")
		}
		if _, err := st.Summary(ctx, "alpha", fleet.Range{Since: fleettest.Base, Until: fleettest.Base.Add(-time.Hour)}, nil); err == nil {
			t.Error("until before since accepted")
		}
	})

	t.Run("Node", func(t *testing.T) {
		d, err := st.Node(ctx, "alpha", "n09")
		if err != nil {
			t.Fatal(err)
		}
		if d.State != fleet.StateQuarantined || d.Row == nil || !d.Row.Drifted {
			t.Fatalf("n09: %+v", d)
		}
		if len(d.Faults) != 1 {
			t.Fatalf("n09 faults: %+v (the NIC fault recovered)", d.Faults)
		}
		f := d.Faults[0]
		if f.Check != "SysLogsXIDError" || f.Entities != "GPU=GPU-n09" || f.Taint != "faultline.io/unhealthy=true:NoSchedule" ||
			!f.Cordon || f.Condition != "GPUHealthy" || f.Message != "XID 79 on n09" || len(f.EventIDs) != 1 {
			t.Errorf("fault: %+v", f)
		}
		rel := strings.Join(d.Release, "\n")
		for _, want := range []string{"kubectl uncordon n09", "taint faultline.io/unhealthy=true:NoSchedule", "condition GPUHealthy=False"} {
			if !strings.Contains(rel, want) {
				t.Errorf("release does not say %q:\n%s", want, rel)
			}
		}
		for node, state := range map[string]string{"n00": fleet.StateHealthy, "n05": fleet.StateHealthy, "n08": fleet.StateHealthy,
			"n07": fleet.StateDrifted, "n06": fleet.StateHeld, "n04": fleet.StateEscalated, "b01": fleet.StateHealthy} {
			d, err := st.Node(ctx, "alpha", node)
			if err != nil {
				t.Fatal(err)
			}
			if d.State != state {
				t.Errorf("%s: state %s, want %s", node, d.State, state)
			}
			if holds := state == fleet.StateEscalated; holds != (len(d.Faults) > 0) {
				t.Errorf("%s: faults %+v", node, d.Faults)
			}
		}
		held, _ := st.Node(ctx, "alpha", "n06")
		if !strings.Contains(strings.Join(held.Release, " "), "faultline-quarantine-breaker") {
			t.Errorf("held node's release does not name the breaker: %v", held.Release)
		}
	})

	t.Run("Analytics", func(t *testing.T) {
		names := []string{}
		for _, q := range st.AnalyticsQueries() {
			names = append(names, q.Name)
			for _, p := range q.Params {
				if p.Name == "cluster" {
					t.Errorf("%s offers the cluster parameter", q.Name)
				}
			}
		}
		if !slices.Contains(names, "remediation_outcomes") || !slices.Contains(names, "xid_bursts") {
			t.Errorf("queries: %v", names)
		}
		tab, err := st.Analytics(ctx, "alpha", "remediation_outcomes", map[string]string{"since": "2026-03-01", "until": "2026-03-03"})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]uint64{}
		for _, r := range tab.Rows {
			got[fmt.Sprint(r[0], "/", r[1], "/", r[2])] = r[3].(uint64)
		}
		if got["quarantine/quarantine/applied"] != 9 || got["remediate/escalate/applied"] != 1 || got["quarantine/quarantine/dry_run"] != 0 {
			t.Errorf("alpha's remediation outcomes: %v", got)
		}
	})
}
