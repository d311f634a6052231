package loadtest

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/faultline/faultline/loadtest/fleet"
	"github.com/faultline/faultline/loadtest/machine"
)

// BenchmarkEventToCordon measures fault to cordon end to end: a fatal
// event's clock starts when its SubmitEvents request is sent and stops
// when the node's cordon arrives on a watch of the real kube-apiserver,
// through the gateway, a real Kafka broker and the quarantine role at its
// shipped defaults (client QPS 200, the default breaker: the cluster has
// 1,000 nodes, so the measured faults stay inside its 10% share), while a
// mixed background (healthy and unhealthy events of several checks, a few
// fatal) flows through the same gateway, topic and role at a delivered
// rate that is counted and verified (fleet.Load). It is the
// fault-to-cordon scenario of loadtest/cmd/fleetload; b.N faults (at most 90, inside the breaker's share).
//
//	eval "$(scripts/testenv/env.sh)" && \
//	  go test ./loadtest -run '^$' -bench EventToCordon -benchtime 80x
//
// BENCH_BACKGROUND sets the background events/s (default 1000).
func BenchmarkEventToCordon(b *testing.B) {
	if b.N == 1 {
		// testing runs a benchmark once with N=1 first, then with the
		// N of -benchtime Nx: the servers start once, for that run (a
		// Skip here would end the benchmark).
		return
	}
	background := 1000.0
	if v, err := fmt.Sscan(os.Getenv("BENCH_BACKGROUND"), &background); err != nil || v != 1 {
		background = 1000
	}
	p := fleet.Params{Clusters: 1, Nodes: 1000, Rate: background, Faults: min(b.N, 90)}
	e := fleet.Start(b, fleet.Options{Clusters: 1, Nodes: p.Nodes, Roles: "quarantine"})
	if err := e.WarmUp(e.Context()); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	res, err := fleet.FaultToCordon(e.Context(), e, p)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	bg := res.Background
	if bg.Window < time.Second {
		// Too few faults (the smoke run's -benchtime 2x) for a window a
		// batch period's stall does not decide: the whole run is checked,
		// the window's figure logged.
		b.Log(bg.Verdict(0.95))
		bg.Window = 0
	}
	if err := bg.Verified(0.95); err != nil {
		b.Fatal(err)
	}
	if len(res.Latencies) < res.Faults {
		b.Fatalf("only %d of %d nodes cordoned within 60s", len(res.Latencies), res.Faults)
	}
	p50, p99, mx := fleet.Percentiles(res.Latencies)
	b.ReportMetric(float64(p50.Milliseconds()), "p50-ms")
	b.ReportMetric(float64(p99.Milliseconds()), "p99-ms")
	b.ReportMetric(float64(mx.Milliseconds()), "max-ms")
	b.ReportMetric(res.Background.Delivered, "background-events/s")
	b.Log(machine.Stamp("background %s; %d cordons: p50 %s p99 %s max %s", res.Background, len(res.Latencies),
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), mx.Round(time.Millisecond)))
}
