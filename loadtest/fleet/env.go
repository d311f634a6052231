// Package fleet runs faultline end to end against real servers for load
// scenarios: a real Kafka broker (or a KRaft cluster of several),
// ClickHouse, one real kube-apiserver per simulated cluster (its nodes
// created as Node objects, optionally kept Ready by KWOK), the gateway
// (gRPC and REST) and the processor roles —
// all started through internal/testenv and gateway/gatewaytest, so the
// scenarios (cmd/fleetload) and their smoke tests (make test) run the same
// code. It also holds the load generator (Load: a verified delivered
// rate, not ticks that drop silently) and the watchers that see cordons on
// the apiservers and actions on the actions topic.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/gateway/gatewaytest"
	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/fleetsim"
	"github.com/faultline/faultline/internal/history"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// Options shape the simulated fleet and the pipeline under it.
type Options struct {
	// Clusters simulated, each with its own kube-apiserver. Default 1.
	Clusters int
	// Nodes per cluster. Default 100.
	Nodes int
	// Roles run by one processors.Run (the production entry point).
	// Default "quarantine"; "" runs none.
	Roles string
	// BreakerOff disables quarantine's circuit breaker (default: on, with
	// its shipped policy).
	BreakerOff bool
	// Kube starts the apiservers even when no in-process role needs them
	// (roles "none": the replicas run in their own processes).
	Kube bool
	// ClickHouse starts a ClickHouse server (for store, correlate and the
	// history API). Default false.
	ClickHouse bool
	// KWOK keeps the nodes Ready with kwok. Default false.
	KWOK bool
	// Brokers above 1 starts a KRaft cluster of that many brokers
	// (testenv.KafkaClusterDefaults) instead of one broker, and creates
	// the pipeline's topics replicated 3 times (at most Brokers), with
	// min.insync.replicas 2, as a production fleet runs them. Default 1.
	Brokers int
	// Gateway, if not nil, adjusts the gateway's config (every other
	// setting is the shipped default).
	Gateway func(*gateway.Config)
	// SlowFirst, if above 0, puts the first cluster's API server behind
	// a LatencyProxy holding each of the roles' requests this long (the
	// tool's own watches and clients reach it directly).
	SlowFirst time.Duration
	// Modify, if not nil, adjusts the processors' config (every other
	// setting is the shipped default).
	Modify func(*processors.Config)
	// Log receives the servers' and roles' warnings. Default: stderr, warn.
	Log *slog.Logger
}

// Env is a running fleet and pipeline.
type Env struct {
	TB       testing.TB
	Opts     Options
	Kafka    *testenv.Kafka        // nil with Options.Brokers > 1
	Cluster  *testenv.KafkaCluster // nil unless Options.Brokers > 1
	CH       clickhouse.Conn       // nil without ClickHouse
	CHServer *testenv.ClickHouse
	GW       *gatewaytest.Server
	Clusters []string
	Kubes    map[string]*testenv.Kube
	Cordons  *CordonWatch
	Actions  *ActionWatch
	Registry *prometheus.Registry

	pcfg          processors.Config // the roles' config, as run
	conns         []*grpc.ClientConn
	next          atomic.Uint64
	firstPushback sync.Once
	ctx           context.Context
	cancel        context.CancelFunc
	done          chan error
}

// Database is the ClickHouse database of the fleet's history.
const Database = "fleet"

// NodeName is the name of node i of a cluster.
func NodeName(i int) string { return fmt.Sprintf("gpu-%05d", i) }

// nodeNames are the names of nodes from..from+n.
func nodeNames(from, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = NodeName(from + i)
	}
	return names
}

// ClusterName is the name of simulated cluster i.
func ClusterName(i int) string { return fmt.Sprintf("sim-%02d", i) }

// Start starts the servers, creates the nodes, the gateway and the roles,
// and waits until the roles consume. Everything stops when tb ends.
func Start(tb testing.TB, o Options) *Env {
	tb.Helper()
	if o.Clusters <= 0 {
		o.Clusters = 1
	}
	if o.Nodes <= 0 {
		o.Nodes = 100
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	e := &Env{TB: tb, Opts: o, Kubes: map[string]*testenv.Kube{}, Registry: prometheus.NewRegistry()}
	for i := range o.Clusters {
		e.Clusters = append(e.Clusters, ClusterName(i))
	}
	// The servers start concurrently: on 2 busy cores each takes seconds.
	var mu sync.Mutex
	var g errgroup.Group
	g.Go(func() error {
		if o.Brokers > 1 {
			e.Cluster = testenv.StartKafkaCluster(tb, o.Brokers, testenv.KafkaPartitions(12))
		} else {
			e.Kafka = testenv.StartKafka(tb, testenv.KafkaPartitions(12))
		}
		return nil
	})
	if o.ClickHouse {
		g.Go(func() error { e.CHServer = testenv.StartClickHouse(tb); return nil })
	}
	if o.Roles == "" {
		o.Roles = "quarantine"
	}
	needKube := strings.Contains(o.Roles, "quarantine") || strings.Contains(o.Roles, "drain") || strings.Contains(o.Roles, "remediate") || o.Roles == "all" || o.Kube
	for _, c := range e.Clusters {
		if !needKube {
			break
		}
		g.Go(func() error {
			k := testenv.StartKube(tb, testenv.KubeOptions{KWOK: o.KWOK})
			mu.Lock()
			e.Kubes[c] = k
			mu.Unlock()
			return createNodes(k, o.Nodes)
		})
	}
	if err := g.Wait(); err != nil {
		tb.Fatalf("fleet: %v", err)
	}
	// A server that failed to start (tb.Fatal) or is not run here (tb.Skip,
	// as under -short) ended its goroutine only, leaving its field nil.
	if tb.Failed() {
		tb.FailNow()
	}
	if tb.Skipped() {
		tb.SkipNow()
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	tb.Cleanup(e.stop)

	var hist gateway.History
	pcfg := processors.DefaultConfig()
	if o.ClickHouse {
		cfg := clickhouse.DefaultConfig()
		cfg.Addr, cfg.Database = e.CHServer.Addr(), Database
		conn, err := clickhouse.Setup(e.ctx, cfg, o.Log)
		if err != nil {
			tb.Fatalf("fleet: clickhouse: %v", err)
		}
		e.CH = conn
		hist = history.New(conn, o.Log)
		pcfg.ClickHouse.Addr, pcfg.ClickHouse.Database = cfg.Addr, cfg.Database
	}
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers = e.brokers()
	if e.Cluster != nil {
		// Created before the gateway's (replication factor 1) would be.
		kcfg.ReplicationFactor = min(3, o.Brokers)
		if err := kafka.CreatePipelineTopics(e.ctx, kcfg, o.Log); err != nil {
			tb.Fatalf("fleet: %v", err)
		}
	}
	// gatewaytest gives every cluster it lists an agent token.
	gatewaytest.Clusters = e.Clusters
	e.GW = gatewaytest.Start(tb, kcfg.Brokers, func(c *gateway.Config) {
		// Every simulated agent connects from 127.0.0.1: the per-address
		// connection bound (256), meant for one client host, is lifted.
		c.MaxConnsPerAddress = 0
		if o.Gateway != nil {
			o.Gateway(c)
		}
	}, gateway.Options{History: hist})

	e.Cordons = WatchCordons(e.ctx, tb, e.Kubes)
	e.Actions = WatchActions(e.ctx, e.KafkaClient(kgo.ConsumeTopics(events.TopicActions), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())))
	// Agents connect on their own: 16 connections stand for them (the
	// gateway bounds the bytes held per connection).
	for range 16 {
		conn, err := grpc.NewClient(e.GW.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(gateway.Codec{})))
		if err != nil {
			tb.Fatal(err)
		}
		e.conns = append(e.conns, conn)
	}

	if o.Roles != "none" {
		pcfg.Roles = o.Roles
		for i, c := range e.Clusters {
			k := e.Kubes[c]
			if k == nil {
				continue
			}
			kc := k.Kubeconfig()
			if i == 0 && o.SlowFirst > 0 {
				proxy, err := StartLatencyProxy(e.ctx, k, o.SlowFirst)
				if err == nil {
					kc, err = proxy.Kubeconfig(tb.TempDir(), k)
				}
				if err != nil {
					tb.Fatalf("fleet: latency proxy of %s: %v", c, err)
				}
			}
			pcfg.Kube.Clusters = append(pcfg.Kube.Clusters, clusters.Cluster{Name: c, Kubeconfig: kc})
		}
		pcfg.Quarantine.Breaker.Enabled = !o.BreakerOff
		if o.Modify != nil {
			o.Modify(&pcfg)
		}
		e.pcfg = pcfg
		if err := pcfg.Validate(); err != nil {
			tb.Fatalf("fleet: processors config: %v", err)
		}
		e.done = make(chan error, 1)
		go func() {
			e.done <- processors.Run(e.ctx, pcfg, processors.Deps{Log: o.Log, Registry: e.Registry, Kafka: kcfg, Metrics: pipeline.NewMetrics(e.Registry)})
		}()
	}
	e.Opts = o
	return e
}

// slowClusterSetting is the roles' slow_cluster (quarantine.slow_cluster; the fleet sets drain's and remediate's alike), for reports.
func (e *Env) slowClusterSetting() string {
	if d := e.pcfg.Quarantine.SlowCluster; d > 0 {
		return d.String()
	}
	return "0 (never deferred for being slow)"
}

// brokers are the fleet's Kafka bootstrap addresses.
func (e *Env) brokers() string {
	if e.Cluster != nil {
		return e.Cluster.Addrs()
	}
	return e.Kafka.Addr()
}

// KafkaClient is a client of the fleet's broker or brokers, closed when
// the fleet's test ends.
func (e *Env) KafkaClient(opts ...kgo.Opt) *kgo.Client {
	if e.Cluster != nil {
		return e.Cluster.Client(e.TB, opts...)
	}
	return e.Kafka.Client(e.TB, opts...)
}

func (e *Env) stop() {
	e.cancel()
	for _, c := range e.conns {
		c.Close()
	}
	if e.done != nil {
		select {
		case err := <-e.done:
			if err != nil && !errors.Is(err, context.Canceled) {
				e.TB.Logf("fleet: processors: %v", err)
			}
		case <-time.After(30 * time.Second):
			e.TB.Logf("fleet: processors did not stop within 30s")
		}
	}
	if e.CH != nil {
		e.CH.Close()
	}
}

// storing reports whether the store role runs in-process with ClickHouse.
func (e *Env) storing() bool {
	return e.CH != nil && (strings.Contains(e.Opts.Roles, "store") || e.Opts.Roles == "all")
}

// Context ends when the fleet stops.
func (e *Env) Context() context.Context { return e.ctx }

// Events is a gRPC Events client of the gateway (vtprotobuf codec, as an
// agent relay would use) on the next of its connections; authenticate each
// call with AuthContext.
func (e *Env) Events() faultlinev1.EventsClient {
	return faultlinev1.NewEventsClient(e.conns[e.next.Add(1)%uint64(len(e.conns))])
}

// ProcessorsErr reports the processors' exit, if they stopped early.
func (e *Env) ProcessorsErr() error {
	if e.done == nil {
		return nil
	}
	select {
	case err := <-e.done:
		e.done <- err
		if err == nil {
			err = errors.New("processors stopped")
		}
		return err
	default:
		return nil
	}
}

func createNodes(k *testenv.Kube, n int) error {
	return createNodesNamed(k, nodeNames(0, n))
}

func createNodesNamed(k *testenv.Kube, names []string) error {
	ctx := context.Background()
	var g errgroup.Group
	g.SetLimit(16)
	for _, name := range names {
		g.Go(func() error {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"nvidia.com/gpu.present": "true"}}}
			if _, err := k.Client().CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create node %s: %w", node.Name, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// Describe is one line naming the fleet, for reports.
func (e *Env) Describe() string {
	d := fmt.Sprintf("%d cluster(s) x %d nodes, roles %s, kafka %s", len(e.Clusters), e.Opts.Nodes, e.Opts.Roles, testenv.KafkaVersion)
	if e.Cluster != nil {
		d += fmt.Sprintf(" (%d brokers, topics replicated %d times, min.insync.replicas 2)", len(e.Cluster.Brokers), min(3, len(e.Cluster.Brokers)))
	}
	if len(e.Kubes) > 0 {
		d += fmt.Sprintf(", kube-apiserver %s per cluster, breaker %s", testenv.KubeVersion, map[bool]string{true: "off", false: "default"}[e.Opts.BreakerOff])
	}
	return d
}

// WarmUp sends one healthy event per cluster through the gateway until it
// is acknowledged (a cold broker or topic takes seconds on a busy machine)
// and, with the store role running, until ClickHouse holds them, so a
// scenario's clock never includes the pipeline's start.
func (e *Env) WarmUp(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for _, c := range e.Clusters {
		for {
			err := e.Send(ctx, GRPC, c, []*datamodels.HealthEvent{fleetsim.Healthy("warm-up", 0)})
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("fleet: warm-up: the gateway never acknowledged: %w", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if e.CH != nil && strings.Contains(e.Opts.Roles, "store") {
		for {
			var n uint64
			_ = e.CH.QueryRow(ctx, "SELECT count() FROM events").Scan(&n)
			if n >= uint64(len(e.Clusters)) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("fleet: warm-up: the store wrote %d of %d events", n, len(e.Clusters))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}
