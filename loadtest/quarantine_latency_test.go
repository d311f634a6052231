package loadtest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/gateway/gatewaytest"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// BenchmarkEventToCordon measures the latency from SubmitEvents returning
// (the event is in Kafka) to the node being cordoned on a real
// kube-apiserver, through the gateway, a real Kafka broker and the
// quarantine role, while a background load of non-fatal events flows
// through the same pipeline.
//
//	make testenv && eval "$(scripts/testenv/env.sh)" && \
//	  go test ./loadtest -run '^$' -bench EventToCordon -benchtime 200x
//
// BENCH_BACKGROUND sets the background events/s (default 1000).
func BenchmarkEventToCordon(b *testing.B) {
	background := 1000.0
	if v, err := fmt.Sscan(os.Getenv("BENCH_BACKGROUND"), &background); err != nil || v != 1 {
		background = 1000
	}
	kube := testenv.StartKube(b, testenv.KubeOptions{})
	k := testenv.StartKafka(b)
	gw := gatewaytest.Start(b, k.Addr(), func(c *gateway.Config) { c.RatePerCaller = 0 }, gateway.Options{})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pcfg := processors.DefaultConfig()
	pcfg.Roles = "quarantine"
	pcfg.Kube.Clusters = []clusters.Cluster{{Name: "alpha", Kubeconfig: kube.Kubeconfig()}}
	pcfg.Kube.QPS, pcfg.Kube.Burst = 500, 1000
	// The default breaker would (rightly) stop cordoning a large share of
	// this small cluster: open it wide for the measurement.
	pcfg.Quarantine.Breaker.Enabled = false
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers = k.Addr()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	reg := prometheus.NewRegistry()
	go func() {
		if err := processors.Run(ctx, pcfg, processors.Deps{Log: log, Registry: reg, Kafka: kcfg, Metrics: pipeline.NewMetrics(reg)}); err != nil {
			b.Error(err)
		}
	}()

	// Nodes: the measured ones and the background's.
	kc := kube.Client()
	mkNode := func(name string) {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"nvidia.com/gpu.present": "true"}}}
		if _, err := kc.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range b.N {
		mkNode(fmt.Sprintf("measured-%04d", i))
	}
	for i := range 100 {
		mkNode(fmt.Sprintf("busy-%03d", i))
	}

	conn, err := grpc.NewClient(gw.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	cl := faultlinev1.NewEventsClient(conn)
	actx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+gw.Token("alpha"))

	// Background: non-fatal, healthy GPU telemetry on busy nodes, in
	// batches of 50 every 50 ms per 1000 events/s.
	go func() {
		per := max(1, int(background/20))
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			batch := make([]*datamodels.HealthEvent, per)
			for j := range batch {
				ev := benchEvent(i*per + j)
				ev.NodeName = fmt.Sprintf("busy-%03d", (i*per+j)%100)
				ev.CheckName, ev.IsFatal, ev.IsHealthy = "GpuThermalWatch", false, true
				ev.RecommendedAction = datamodels.RecommendedAction_NONE
				batch[j] = ev
			}
			if _, err := cl.SubmitEvents(actx, &faultlinev1.SubmitEventsRequest{Events: batch}); err != nil && ctx.Err() == nil {
				b.Logf("background: %v", err)
			}
		}
	}()

	// Watch cordons.
	w, err := kc.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	var mu sync.Mutex
	cordoned := map[string]time.Time{}
	go func() {
		for e := range w.ResultChan() {
			if e.Type != watch.Modified {
				continue
			}
			if n, ok := e.Object.(*corev1.Node); ok && n.Spec.Unschedulable {
				mu.Lock()
				if _, seen := cordoned[n.Name]; !seen {
					cordoned[n.Name] = time.Now()
				}
				mu.Unlock()
			}
		}
	}()
	time.Sleep(3 * time.Second) // let the consumer group settle and the background flow

	sent := map[string]time.Time{}
	b.ResetTimer()
	for i := range b.N {
		name := fmt.Sprintf("measured-%04d", i)
		ev := benchEvent(i)
		ev.NodeName = name
		if _, err := cl.SubmitEvents(actx, &faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{ev}}); err != nil {
			b.Fatal(err)
		}
		sent[name] = time.Now()
		time.Sleep(20 * time.Millisecond)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		n := 0
		for name := range sent {
			if _, ok := cordoned[name]; ok {
				n++
			}
		}
		mu.Unlock()
		if n == len(sent) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	var lat []time.Duration
	for name, t0 := range sent {
		if t1, ok := cordoned[name]; ok {
			lat = append(lat, t1.Sub(t0))
		}
	}
	if len(lat) < len(sent) {
		b.Fatalf("only %d of %d nodes cordoned within 60s", len(lat), len(sent))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	b.ReportMetric(float64(pct(0.50).Milliseconds()), "p50-ms")
	b.ReportMetric(float64(pct(0.99).Milliseconds()), "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Milliseconds()), "max-ms")
	b.Logf("background %.0f events/s; %d cordons: p50 %s p99 %s max %s", background, len(lat), pct(0.5), pct(0.99), lat[len(lat)-1])
}
