package loadtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/gateway/gatewaytest"
	"github.com/faultline/faultline/internal/analytics"
	"github.com/faultline/faultline/internal/clickhouse/chtest"
	"github.com/faultline/faultline/internal/fleet"
	"github.com/faultline/faultline/internal/history"
	"github.com/faultline/faultline/internal/kafka"
)

// fleetHistory writes the benchmark's history into ClickHouse with
// INSERT … SELECT FROM numbers (the store role's path is measured
// elsewhere): events events of cluster bench over 10,000 nodes and 30
// days up to now (4 checks, 2% fatal), and the actions of 1,000
// quarantined nodes (of which 100 draining, 50 remediating, 20 escalated),
// 3,000 nodes quarantined and released twice, 30 held by a breaker that
// opened, 20 drifted.
func fleetHistory(b *testing.B, srv *chtest.Server, events int) {
	b.Helper()
	ctx := context.Background()
	now := time.Now().Unix()
	span := int64(30 * 86400)
	start := time.Now()
	exec := func(sql string) {
		b.Helper()
		if err := srv.Conn.Exec(ctx, sql); err != nil {
			b.Fatalf("%v\n%s", err, sql)
		}
	}
	const chunk = 500_000 // each INSERT well within the server's 60 s max_execution_time under load
	for off := 0; off < events; off += chunk {
		n := min(chunk, events-off)
		exec(fmt.Sprintf(`INSERT INTO events (cluster, node, check, entity, ts, ts_ms, id, received, received_ms, ts_missing, version,
	agent, component_class, is_fatal, is_healthy, message, recommended_action, error_codes, entities.type, entities.value,
	processing_strategy)
SELECT 'bench', concat('node-', toString(k %% 10000)),
	if(k %% 100 = 0, 'ConformanceDrift', ['GpuHealthCheck', 'SysLogsXIDError', 'InfiniBandStateCheck'][k %% 3 + 1]),
	concat('GPU=GPU-', toString(k %% 8)),
	toDateTime(%d + intDiv(k * %d, %d)), k %% 1000, toString(generateUUIDv4()),
	toDateTime(%d + intDiv(k * %d, %d)), 0, 0, 1, 'faultline-agent', 'GPU',
	toUInt8(k %% 50 = 1), toUInt8(k %% 50 != 1 AND k %% 500 != 0), 'bench event', 'NONE',
	if(k %% 50 = 1, ['XID-79'], emptyArrayString()), ['GPU'], [concat('GPU-', toString(k %% 8))], 'EXECUTE_REMEDIATION'
FROM (SELECT number + %d AS k FROM numbers(%d))`, now-span, span, events, now-span, span, events, off, n))
	}
	b.Logf("fleet history: %d events written in %s", events, time.Since(start).Round(time.Second))
	act := func(sel string) {
		exec(`INSERT INTO actions (cluster, node, ts, ts_ms, id, role, kind, outcome, reason, rule, event_ids, dry_run,
	details.key, details.value, check, recommended_action, received) ` + sel)
	}
	cols := func(node, at, role, kind, outcome, reason string) string {
		return fmt.Sprintf(`SELECT 'bench', %s, toDateTime(%s), 0, toString(generateUUIDv4()), '%s', '%s', '%s', %s, 'faultline-agent-fatal',
	[toString(generateUUIDv4())], 0, ['entities', 'taint', 'cordon'], ['GPU=GPU-0', 'faultline.io/unhealthy=true:NoSchedule', 'true'],
	'SysLogsXIDError', 'REPLACE_VM', toDateTime(%s)`, node, at, role, kind, outcome, reason, at)
	}
	// 3,000 nodes quarantined and released, twice, over the month.
	for cycle := 0; cycle < 2; cycle++ {
		base := fmt.Sprintf("%d + number * 300 + %d", now-span, cycle*86400*10)
		act(cols("concat('node-', toString(5000 + number))", base, "quarantine", "quarantine", "applied", "'rule faultline-agent-fatal matched SysLogsXIDError'") + " FROM numbers(3000)")
		act(cols("concat('node-', toString(5000 + number))", base+" + 3600", "quarantine", "unquarantine", "applied", "'recovered'") + " FROM numbers(3000)")
	}
	// 1,000 nodes quarantined now.
	act(cols("concat('node-', toString(number))", fmt.Sprintf("%d - number * 60", now-60), "quarantine", "quarantine", "applied",
		"concat('rule faultline-agent-fatal matched SysLogsXIDError: XID 79 on GPU-', toString(number % 8))") + " FROM numbers(1000)")
	act(cols("concat('node-', toString(number))", fmt.Sprintf("%d", now-30), "drain", "drain", "in_progress", "'drain started (node)'") + " FROM numbers(100)")
	act(cols("concat('node-', toString(100 + number))", fmt.Sprintf("%d", now-30), "remediate", "remediate", "in_progress", "'RebootNode created'") + " FROM numbers(50)")
	act(cols("concat('node-', toString(200 + number))", fmt.Sprintf("%d", now-30), "remediate", "escalate", "applied", "'CONTACT_SUPPORT'") + " FROM numbers(20)")
	act(cols("'node-9000'", fmt.Sprintf("%d", now-600), "quarantine", "breaker_open", "applied", "'1000 of 10000 nodes quarantined within 10m'") + " FROM numbers(1)")
	act(cols("concat('node-', toString(9000 + number))", fmt.Sprintf("%d", now-500), "quarantine", "quarantine", "held_by_breaker", "'would quarantine: circuit breaker open'") + " FROM numbers(30)")
	act(cols("concat('node-', toString(9500 + number))", fmt.Sprintf("%d", now-100), "conformance", "conformance_drift", "applied", "'drifted from its conformance group'") + " FROM numbers(20)")
	exec("OPTIMIZE TABLE actions FINAL")
	b.Logf("fleet history ready in %s", time.Since(start).Round(time.Second))
}

// BenchmarkFleetPage measures the fleet page's server responses on a
// history of BENCH_FLEET_EVENTS events (default 10,000,000) with 1,000
// quarantined nodes, through a real gateway over the real ClickHouse
// 18.16 (the embedded kfake broker stands in for Kafka: the page reads
// nothing from it). One user, requests sent one render after another:
//
//   - FirstRender: what the fleet view fetches (GET
//     /v1/fleet/summary?limit=50: the counts, the breaker and the first
//     page of nodes out of service in one request).
//   - NodeTimeline: the node view (GET /v1/fleet/nodes/{node},
//     /v1/events?node=…&limit=200, /v1/actions?node=…&limit=200, in
//     parallel) for quarantined nodes in turn.
//   - StoreFirstRender: the same two reads as Go calls on internal/fleet's
//     Store, no HTTP: the ceiling the gateway adds to.
//
// Each reports p50 and p99 in ms (the clock starts before the requests
// are sent).
//
//	eval "$(scripts/testenv/env.sh)" && go test ./loadtest -run '^$' -bench FleetPage -benchtime 200x
func BenchmarkFleetPage(b *testing.B) {
	events := 10_000_000
	if s := os.Getenv("BENCH_FLEET_EVENTS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatalf("BENCH_FLEET_EVENTS: %v", err)
		}
		events = n
	}
	srv := chtest.Start(b)
	fleetHistory(b, srv, events)

	broker, err := kfake.NewCluster(kfake.SeedTopics(1, kafka.PipelineTopics...))
	if err != nil {
		b.Fatal(err)
	}
	defer broker.Close()
	st, err := fleet.New(srv.Conn, slog.New(slog.NewTextHandler(io.Discard, nil)), fleet.Options{})
	if err != nil {
		b.Fatal(err)
	}
	const token = "bench-fleet-page-token-0001"
	gw := gatewaytest.Start(b, strings.Join(broker.ListenAddrs(), ","), func(c *gateway.Config) {
		path := filepath.Join(b.TempDir(), "tokens")
		if err := os.WriteFile(path, []byte(token+",bench,operator\n"), 0o600); err != nil {
			b.Fatal(err)
		}
		c.TokensFile = path
		c.ReadRatePerCaller = 0 // one user's page loads back to back
	}, gateway.Options{History: history.New(srv.Conn, slog.New(slog.NewTextHandler(io.Discard, nil))), Fleet: st})
	base := "http://" + gw.HTTPAddr()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	get := func(path string) error {
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, body)
		}
		return nil
	}
	parallel := func(paths ...string) error {
		var wg sync.WaitGroup
		errs := make([]error, len(paths))
		for i, p := range paths {
			wg.Go(func() { errs[i] = get(p) })
		}
		wg.Wait()
		for _, e := range errs {
			if e != nil {
				return e
			}
		}
		return nil
	}
	// Check the seed once: 1,000 out of service, 10,000 reporting.
	sum, err := st.Summary(context.Background(), "bench", fleet.Range{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	out := sum.Nodes[fleet.StateQuarantined] + sum.Nodes[fleet.StateDraining] + sum.Nodes[fleet.StateRemediating] + sum.Nodes[fleet.StateEscalated]
	b.Logf("summary: %d reporting, out of service %d, states %v, breaker %s", sum.ReportingNodes, out, sum.Nodes, sum.Breaker.State)
	if out != 1000 {
		b.Fatalf("want 1000 nodes out of service, got %d", out)
	}

	// Each fleet query alone, server and driver (b.N runs each, p50 in
	// the log): where a render's time goes.
	if qs, err := fleet.Queries(); err == nil {
		now := time.Now()
		params := map[string]map[string]string{
			"cluster_state": {"cluster": "bench"},
			"state_counts":  {"cluster": "bench"},
			"drifted":       {"cluster": "bench"},
			"node_page":     {"cluster": "bench", "limit": "51"},
			"node_states":   {"cluster": "bench", "node": "node-7"},
			"node_faults":   {"cluster": "bench", "node": "node-7"},
		}
		var parts []string
		for _, name := range []string{"cluster_state", "state_counts", "drifted", "node_page", "node_states", "node_faults"} {
			var lat []time.Duration
			for range 10 {
				t0 := time.Now()
				if _, err := analytics.Run(context.Background(), srv.Conn, qs[name], params[name], now); err != nil {
					b.Fatalf("%s: %v", name, err)
				}
				lat = append(lat, time.Since(t0))
			}
			slices.Sort(lat)
			parts = append(parts, fmt.Sprintf("%s %s", name, lat[len(lat)/2].Round(100*time.Microsecond)))
		}
		b.Logf("query p50 (10 runs each): %s", strings.Join(parts, ", "))
	}

	loadavg := func() string {
		l, _ := os.ReadFile("/proc/loadavg")
		return strings.Join(strings.Fields(string(l))[:min(3, len(strings.Fields(string(l))))], " ")
	}
	run := func(b *testing.B, render func(i int) error) {
		b.Logf("load average before: %s", loadavg())
		defer func() { b.Logf("load average after: %s", loadavg()) }()
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			if err := render(i); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
		}
		b.StopTimer()
		slices.Sort(lat)
		q := func(p float64) float64 {
			return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
		}
		b.ReportMetric(q(0.5), "p50-ms")
		b.ReportMetric(q(0.99), "p99-ms")
		b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
	}
	b.Run("FirstRender", func(b *testing.B) {
		run(b, func(int) error { return get("/v1/fleet/summary?limit=50") })
	})
	b.Run("NodeTimeline", func(b *testing.B) {
		run(b, func(i int) error {
			n := "node-" + strconv.Itoa(i%1000)
			return parallel("/v1/fleet/nodes/"+n, "/v1/events?node="+n+"&limit=200", "/v1/actions?node="+n+"&limit=200")
		})
	})
	b.Run("StoreFirstRender", func(b *testing.B) {
		ctx := context.Background()
		run(b, func(int) error {
			_, err := st.Summary(ctx, "bench", fleet.Range{}, &fleet.NodesQuery{Limit: 50})
			return err
		})
	})
}
