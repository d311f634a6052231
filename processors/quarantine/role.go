// Package quarantine is the Fault Quarantine processor (`faultline process
// --role=quarantine`) together with the Kubernetes side of the seed's
// Platform Connector: for every HealthEvent it decides with a CEL policy
// whether the node must be quarantined, and acts on the event's own cluster:
// cordon, taint, labels and annotations of why / by whom / when, a node
// condition per component class for fatal events, a Kubernetes Event for
// non-fatal ones, and un-quarantine when every fault recovered, restoring
// only what faultline set.
//
// The node object is the only state: AnnotationState records the standing
// faults and exactly what faultline changed, updated with optimistic
// concurrency so any replica can handle any node. A circuit breaker per
// cluster (a ConfigMap in that cluster, see breaker.go) caps how many nodes
// faultline newly quarantines within a window. Every decision is an Action
// on the actions topic. README.md has the configuration, the design
// choices and the measurements.
package quarantine

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
)

// Deps are what Start needs from the processor binary.
type Deps struct {
	Log      *slog.Logger
	Registry prometheus.Registerer
	Kafka    kafka.Config
	Metrics  *pipeline.Metrics
}

// Start builds the role: it compiles the rules (an invalid rule stops
// start-up, naming the rule set), creates TopicRetry if missing, and starts
// the retry consumer (group "faultline-quarantine-retry"), which runs until
// ctx ends or the returned closer is closed. The returned handler consumes
// the events topic.
func Start(ctx context.Context, cfg Config, kube clusters.Config, deps Deps) (*Handler, io.Closer, error) {
	if deps.Log == nil {
		deps.Log = slog.Default()
	}
	h, err := New(cfg, clusters.NewRegistry(kube, nil), Options{Log: deps.Log, Registerer: deps.Registry})
	if err != nil {
		return nil, nil, err
	}
	deps.Log.Info("quarantine policy compiled", "rule_sets", h.policy.Names(), "clusters", kube.Names())
	if err := kafka.CreateTopics(ctx, deps.Kafka, deps.Log, TopicRetry); err != nil {
		return nil, nil, fmt.Errorf("quarantine: %w", err)
	}
	prod, err := kafka.NewClient(deps.Kafka, deps.Log, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0))
	if err != nil {
		return nil, nil, fmt.Errorf("quarantine: %w", err)
	}
	h.WatchClusters(kube.Names())
	rctx, rcancel := context.WithCancel(ctx)
	pc := cfg.Pipeline()
	pc.Role, pc.Topics = "quarantine-retry", []string{TopicRetry}
	runner := pipeline.NewRunner(pc,
		deps.Kafka, h.RetryHandler(), deps.Log, deps.Metrics)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := runner.Run(rctx); err != nil {
			deps.Log.Error("quarantine retry consumer stopped", "err", err)
		}
	}()
	go func() {
		defer wg.Done()
		h.RunUncordons(rctx, prod)
	}()
	return h, closerFunc(func() error { rcancel(); wg.Wait(); prod.Close(); h.Close(); return nil }), nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }
