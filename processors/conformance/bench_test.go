package conformance

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/clickhouse/chtest"
	ic "github.com/faultline/faultline/internal/conformance"
	"github.com/faultline/faultline/processors/clusters"
)

// BenchmarkFleet100k measures the role over a 100,000-node fleet (50
// clusters × 2,000 nodes, 2% drifted) in a real ClickHouse:
//
//   - ingest-reports/s: NodeConformance records decoded and written by
//     the role's handler, in batches of 5,000 (as the runner hands them);
//   - first-sweep-nodes/s: every cluster evaluated (latest fingerprint per
//     node, groups, majority) with the 2,000 drifted nodes explained
//     (components of both fingerprints) and recorded (dry-run: no
//     kubeconfig, so no Kubernetes calls are in the number);
//   - steady-sweep-nodes/s: the next sweep, nothing new to decide;
//   - ceiling-latest-nodes/s: one Latest query per cluster alone, the
//     floor of a sweep's cost.
//
// Run with -benchtime=1x (each phase is one pass over the fleet).
func BenchmarkFleet100k(b *testing.B) {
	if testing.Short() {
		b.Skip("needs ClickHouse")
	}
	const clusters, per = 50, 2000
	s := chtest.Start(b)
	now := time.Now().UTC().Truncate(time.Second)
	h := NewHandler(s.Conn, testLog, func() time.Time { return now })
	var batches [][]*kgo.Record
	var cur []*kgo.Record
	for c := 0; c < clusters; c++ {
		for n := 0; n < per; n++ {
			v := ""
			if n%50 == 7 {
				v = "28.41.1000"
			}
			cur = append(cur, record(b, fmt.Sprintf("fleet-%d", c), fmt.Sprintf("node-%05d", n), comps(v), now.Add(-time.Minute)))
			if len(cur) == 5000 {
				batches, cur = append(batches, cur), nil
			}
		}
	}
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		for _, batch := range batches {
			if res, err := h.Handle(ctx, batch); err != nil || len(res.Dead) > 0 {
				b.Fatal(err, res.Dead)
			}
		}
		ingest := time.Since(start)
		b.ReportMetric(float64(clusters*per)/ingest.Seconds(), "ingest-reports/s")

		start = time.Now()
		for c := 0; c < clusters; c++ {
			if _, err := ic.Latest(ctx, s.Conn, fmt.Sprintf("fleet-%d", c), now.Add(-13*time.Hour), nil); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(clusters*per)/time.Since(start).Seconds(), "ceiling-latest-nodes/s")

		sw := NewSweeper(testConfig(), s.Conn, clustersReg(), testLog, func() time.Time { return now }, nil)
		for _, phase := range []string{"first", "steady"} {
			start = time.Now()
			acts := 0
			for c := 0; c < clusters; c++ {
				out, err := sw.Sweep(ctx, fmt.Sprintf("fleet-%d", c))
				if err != nil {
					b.Fatal(err)
				}
				acts += len(out.Actions)
			}
			d := time.Since(start)
			b.ReportMetric(float64(clusters*per)/d.Seconds(), phase+"-sweep-nodes/s")
			if phase == "first" && acts != clusters*per/50 {
				b.Fatalf("first sweep: %d actions, want %d", acts, clusters*per/50)
			}
			if phase == "steady" && acts != 0 {
				b.Fatalf("steady sweep: %d actions", acts)
			}
		}
	}
}

func clustersReg() *clusters.Registry { return clusters.NewRegistry(clusters.DefaultConfig(), nil) }

// BenchmarkScoreDirect is the ceiling of BenchmarkScore1000: the same
// 1,000-node score without HTTP (Scorer on the connection).
func BenchmarkScoreDirect(b *testing.B) {
	if testing.Short() {
		b.Skip("needs ClickHouse")
	}
	conn := chtest.Start(b).Conn
	now := time.Now().UTC()
	fleet(b, conn, now, 50, 2000, "alpha")
	var nodes []string
	for i := 0; i < 1000; i++ {
		nodes = append(nodes, fmt.Sprintf("node-%05d", i*2))
	}
	sc := &ic.Scorer{Conn: func(context.Context) (clickhouse.Conn, error) { return conn, nil }, Staleness: 13 * time.Hour, Now: func() time.Time { return now }}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		s, err := sc.Score(context.Background(), "alpha", nodes)
		lat = append(lat, time.Since(start))
		if err != nil || s.Requested != 1000 {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[(len(lat)*99)/100].Microseconds())/1000, "p99-ms")
}
