// Package loadtest holds the load generator and the benchmarks whose numbers
// are recorded in loadtest/README.md.
package loadtest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/gateway/gatewaytest"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/loadtest/machine"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

func benchEvent(i int) *datamodels.HealthEvent {
	return &datamodels.HealthEvent{
		Agent: "faultline-agent", ComponentClass: "NIC", CheckName: "InfiniBandStateCheck",
		IsFatal: true, NodeName: fmt.Sprintf("gpu-node-%05d", i%10000),
		Message:           "Port mlx5_3 port 1 state DOWN (phys LinkDown)",
		RecommendedAction: datamodels.RecommendedAction_REPLACE_VM,
		EntitiesImpacted: []*datamodels.Entity{
			{EntityType: "NIC", EntityValue: "mlx5_3"}, {EntityType: "NICPort", EntityValue: "mlx5_3/1"},
		},
		Metadata:           map[string]string{"state": "DOWN", "phys_state": "LinkDown"},
		GeneratedTimestamp: timestamppb.Now(),
	}
}

// BenchmarkIngest compares, against one real broker: the raw franz-go
// producer (the ceiling), the gateway over gRPC with batches of 100, and the
// gateway over REST with one event per call. Each reports events/s and the
// CPU time per event of this process (the callers and the gateway, or the
// raw producer) and of the broker.
//
//	make testenv && eval "$(scripts/testenv/env.sh)" && \
//	  go test ./loadtest -run '^$' -bench Ingest -benchtime 20000x
//
// BENCH_CONCURRENCY sets the number of concurrent callers (default 256: a
// fleet has thousands of agents; each caller waits for Kafka's
// acknowledgement, so the gateway's rate is callers × batch / ack latency).
func BenchmarkIngest(b *testing.B) {
	k := testenv.StartKafka(b)
	gw := gatewaytest.Start(b, k.Addr(), func(c *gateway.Config) {
		c.RatePerCaller = 0
		// All callers come from 127.0.0.1, and a round's closed
		// connections may not have left the gateway's count yet when
		// the next round dials its own.
		c.MaxConnsPerAddress = 0
		c.MaxBufferedRecords = 1 << 20
		if v, err := time.ParseDuration(os.Getenv("BENCH_LINGER")); err == nil {
			c.ProducerLinger = v
		}
	}, gateway.Options{})
	concurrency := 256
	if v, err := strconv.Atoi(os.Getenv("BENCH_CONCURRENCY")); err == nil && v > 0 {
		concurrency = v
	}

	b.Run("RawProducer", func(b *testing.B) {
		// The gateway's producer settings as it runs here
		// (gateway.NewProducer's; BENCH_LINGER sets both lingers).
		gcfg := gw.Config()
		b.Logf("raw producer: the gateway's linger %s, buffer %d records", gcfg.ProducerLinger, gcfg.MaxBufferedRecords)
		cl := k.Client(b, append(gateway.ProducerOpts(gcfg), kgo.DefaultProduceTopic(events.TopicEvents))...)
		payload := make([][]byte, 1000)
		for i := range payload {
			payload[i], _ = events.Marshal(benchEvent(i))
		}
		b.ResetTimer()
		start, cpu := time.Now(), markCPU(k)
		var failed atomic.Int64
		for i := 0; i < b.N; i++ {
			cl.Produce(context.Background(), &kgo.Record{Key: events.Key("alpha", fmt.Sprintf("gpu-node-%05d", i%10000)), Value: payload[i%1000]},
				func(_ *kgo.Record, err error) {
					if err != nil {
						failed.Add(1)
					}
				})
		}
		if err := cl.Flush(context.Background()); err != nil || failed.Load() > 0 {
			b.Fatalf("flush: %v, %d failed", err, failed.Load())
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
		cpu.report(b, b.N)
	})

	b.Run("GRPCBatch100", func(b *testing.B) {
		// The load generator encodes with the same generated code as the
		// gateway, so its own CPU (it shares the machine) stays small.
		// Agents connect on their own: the calls go round 16 connections,
		// as in the fleet tool (the gateway bounds what one connection
		// holds: 256 callers on one were refused
		// gateway.max_inflight_bytes_per_conn).
		var cls []faultlinev1.EventsClient
		for range 16 {
			conn, err := grpc.NewClient(gw.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.ForceCodec(gateway.Codec{})))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			cls = append(cls, faultlinev1.NewEventsClient(conn))
		}
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+gw.Token("alpha"))
		batches := (b.N + 99) / 100
		var next atomic.Int64
		b.ResetTimer()
		start, cpu := time.Now(), markCPU(k)
		runConcurrently(b, concurrency, func() bool {
			n := next.Add(1)
			if n > int64(batches) {
				return false
			}
			evs := make([]*datamodels.HealthEvent, 100)
			for j := range evs {
				evs[j] = benchEvent(int(n)*100 + j)
			}
			if _, err := cls[n%int64(len(cls))].SubmitEvents(ctx, &faultlinev1.SubmitEventsRequest{Events: evs}); err != nil {
				b.Error(err)
				return false
			}
			return true
		})
		b.ReportMetric(float64(batches*100)/time.Since(start).Seconds(), "events/s")
		cpu.report(b, batches*100)
	})

	b.Run("RESTSingle", func(b *testing.B) {
		body := `{"events":[{"agent":"faultline-agent","componentClass":"NIC","checkName":"InfiniBandStateCheck","isFatal":true,` +
			`"nodeName":"gpu-node-00042","message":"Port mlx5_3 port 1 state DOWN","recommendedAction":"REPLACE_VM",` +
			`"entitiesImpacted":[{"entityType":"NIC","entityValue":"mlx5_3"},{"entityType":"NICPort","entityValue":"mlx5_3/1"}]}]}`
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: concurrency}}
		// Each round (b.N) has its own client: close its connections when
		// it ends, or the rounds' idle connections add up past the
		// gateway's max_conns_per_address and it refuses the next ones.
		defer client.CloseIdleConnections()
		var next atomic.Int64
		b.ResetTimer()
		start, cpu := time.Now(), markCPU(k)
		runConcurrently(b, concurrency, func() bool {
			if next.Add(1) > int64(b.N) {
				return false
			}
			req, _ := http.NewRequest(http.MethodPost, gw.URL()+"/v1/events", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+gw.Token("alpha"))
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return false
			}
			// Read the answer to its end: a body closed unread closes the
			// connection, and every call would dial a new one.
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return false
			}
			return true
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
		cpu.report(b, b.N)
	})
}

// cpuMark is the CPU time this process and the broker had used at a moment.
type cpuMark struct {
	brokerPid    int
	self, broker float64
}

func markCPU(k *testenv.Kafka) cpuMark {
	pid := k.Pid()
	return cpuMark{brokerPid: pid, self: machine.CPUSeconds(os.Getpid()), broker: machine.CPUSeconds(pid)}
}

// report adds the CPU time per event since the mark, of this process and of
// the broker (the machine's other big user; left out when the broker is not
// this test's child), in microseconds.
func (m cpuMark) report(b *testing.B, events int) {
	b.ReportMetric((machine.CPUSeconds(os.Getpid())-m.self)*1e6/float64(events), "proc-cpu-us/event")
	if m.brokerPid != 0 {
		b.ReportMetric((machine.CPUSeconds(m.brokerPid)-m.broker)*1e6/float64(events), "broker-cpu-us/event")
	}
}

// runConcurrently calls step from n goroutines until it returns false.
func runConcurrently(b *testing.B, n int, step func() bool) {
	done := make(chan struct{})
	for range n {
		go func() {
			defer func() { done <- struct{}{} }()
			for step() {
			}
		}()
	}
	for range n {
		<-done
	}
}
