package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/gateway/gatewaytest"
	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/clickhouse/chtest"
	ic "github.com/faultline/faultline/internal/conformance"
	"github.com/faultline/faultline/internal/kafka"
)

// scoreGateway is a real gateway (REST) whose score endpoint reads a real
// ClickHouse; its Kafka is franz-go's in-process kfake (the score endpoint
// does not produce).
func scoreGateway(t testing.TB, conn clickhouse.Conn, now func() time.Time) *gatewaytest.Server {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, kafka.PipelineTopics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	scorer := &ic.Scorer{Conn: func(context.Context) (clickhouse.Conn, error) { return conn, nil }, Staleness: DefaultConfig().Staleness, Now: now}
	return gatewaytest.Start(t, strings.Join(kc.ListenAddrs(), ","), func(c *gateway.Config) {
		c.ReadRatePerCaller = 0 // the benchmark measures the endpoint, not the limiter
	}, gateway.Options{Conformance: scorer})
}

func get(t testing.TB, url, token string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, []byte(b.String())
}

// TestScoreThroughGateway: GET /v1/conformance/score through a real
// gateway over reports in a real ClickHouse: f₉ and groups of the caller's
// cluster only; stale and unknown nodes are groups of one; bad input 400,
// no credential 401.
func TestScoreThroughGateway(t *testing.T) {
	s := server(t)
	clk := &clock{t: time.Now().UTC().Truncate(time.Second)}
	h := NewHandler(s.Conn, testLog, clk.Now)
	// gatewaytest's clusters are alpha and beta; alpha has 3 nodes on one
	// fingerprint, 1 on another, 1 stale; beta reports a node of the same name.
	store(t, h, record(t, "alpha", "g1", comps(""), clk.Now()), record(t, "alpha", "g2", comps(""), clk.Now()),
		record(t, "alpha", "g3", comps(""), clk.Now()), record(t, "alpha", "g4", comps("other"), clk.Now()),
		record(t, "alpha", "g5", comps(""), clk.Now().Add(-14*time.Hour)), record(t, "beta", "g1", comps("beta"), clk.Now()))
	gw := scoreGateway(t, s.Conn, clk.Now)
	code, body := get(t, gw.URL()+"/v1/conformance/score?nodes=g1,g2,g3,g4,g5,g6", gw.Token("alpha"))
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	var sc ic.Score
	if err := json.Unmarshal(body, &sc); err != nil {
		t.Fatal(err)
	}
	if sc.F9 != 0.5 || sc.Requested != 6 || len(sc.Groups) != 4 || strings.Join(sc.Groups[0].Nodes, ",") != "g1,g2,g3" ||
		sc.Groups[1].Nodes[0] != "g4" || sc.Groups[2].Fingerprint != ic.Unknown || sc.Groups[3].Fingerprint != ic.Unknown {
		t.Fatalf("score %s", body)
	}
	// beta sees only its own g1.
	_, body = get(t, gw.URL()+"/v1/conformance/score?nodes=g1,g2", gw.Token("beta"))
	if err := json.Unmarshal(body, &sc); err != nil || sc.F9 != 0.5 || sc.Groups[0].Nodes[0] != "g1" || sc.Groups[1].Fingerprint != ic.Unknown {
		t.Fatalf("beta %s", body)
	}
	for _, tc := range []struct {
		q, token string
		code     int
		msg      string
	}{
		{"nodes=Bad_Node", gw.Token("alpha"), 400, "nodes[0]"},
		{"nodes=", gw.Token("alpha"), 400, "nodes: required"},
		{"nodes=a&limit=3", gw.Token("alpha"), 400, "unknown parameter"},
		{"nodes=a", "", 401, ""},
		{"nodes=a", "wrong", 401, ""},
	} {
		code, body := get(t, gw.URL()+"/v1/conformance/score?"+tc.q, tc.token)
		if code != tc.code || !strings.Contains(string(body), tc.msg) {
			t.Errorf("%s: %d %s, want %d %q", tc.q, code, body, tc.code, tc.msg)
		}
	}
}

// BenchmarkScore1000: the score endpoint's latency for 1,000 requested
// nodes of a 2,000-node cluster in a ClickHouse holding the reports of a
// 100,000-node fleet (50 clusters), through the gateway's REST listener;
// reports p50/p99 (ms) measured from the request being sent to the
// response read. Setup (100k rows) is outside the timer.
func BenchmarkScore1000(b *testing.B) {
	if testing.Short() {
		b.Skip("needs ClickHouse")
	}
	s := chtest.Start(b).Conn
	now := time.Now().UTC()
	fleet(b, s, now, 50, 2000, "alpha")
	gw := scoreGateway(b, s, func() time.Time { return now })
	var nodes []string
	for i := 0; i < 1000; i++ {
		nodes = append(nodes, fmt.Sprintf("node-%05d", i*2))
	}
	url := gw.URL() + "/v1/conformance/score?nodes=" + strings.Join(nodes, ",")
	tok := gw.Token("alpha")
	get(b, url, tok) // warm
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		code, _ := get(b, url, tok)
		lat = append(lat, time.Since(start))
		if code != 200 {
			b.Fatalf("status %d", code)
		}
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[(len(lat)*99)/100].Microseconds())/1000, "p99-ms")
}

// fleet writes one report per node of clusters×perCluster nodes (cluster
// names "fleet-<i>", the first named first), 2% of nodes on other NIC
// firmware, through the role's handler in batches of 5,000.
func fleet(b testing.TB, conn clickhouse.Conn, now time.Time, clusters, perCluster int, first string) {
	h := NewHandler(conn, testLog, func() time.Time { return now })
	var recs []*kgo.Record
	for c := 0; c < clusters; c++ {
		name := fmt.Sprintf("fleet-%d", c)
		if c == 0 {
			name = first
		}
		for n := 0; n < perCluster; n++ {
			v := ""
			if n%50 == 7 {
				v = "28.41.1000"
			}
			recs = append(recs, record(b, name, fmt.Sprintf("node-%05d", n), comps(v), now.Add(-time.Minute)))
			if len(recs) == 5000 {
				store(b, h, recs...)
				recs = recs[:0]
			}
		}
	}
	if len(recs) > 0 {
		store(b, h, recs...)
	}
}
