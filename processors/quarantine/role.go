// Package quarantine is the Fault Quarantine processor (`faultline process
// --role=quarantine`) together with the Kubernetes side of NVSentinel's
// Platform Connector (node conditions and Events): for every HealthEvent it decides with a CEL policy
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
	"time"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/role"
	"github.com/faultline/faultline/schemas/events"
)

// breakerGaugeInterval is how often a breaker shown open is looked at
// again (RefreshBreakerGauges).
const breakerGaugeInterval = 15 * time.Second

// Topics are what the role's own consumer reads; its retry consumer reads
// RetryTopics.
var Topics = []string{events.TopicEvents}

// Open builds the role: it compiles the rules (an invalid rule stops
// start-up, naming the rule set), creates the retry topics if missing and
// starts the node watch of every configured cluster. The role is its
// consumer of Topics, its retry consumer of RetryTopics (group
// "faultline-quarantine-retry"), the loop that acknowledges manual
// uncordons (RunUncordons) and the sweep that lifts flapping faults after
// their stabilization window and the conditions no fault holds
// (RunStabilization).
func Open(ctx context.Context, cfg Config, deps role.Deps) (*role.Role, error) {
	deps = deps.WithDefaults()
	h, err := New(cfg, clusters.NewRegistry(deps.Kube, nil).WithLog(deps.Log), Options{Log: deps.Log, Registerer: deps.Registry})
	if err != nil {
		return nil, err
	}
	h.log.Info("quarantine policy compiled", "rule_sets", h.policy.Names(), "clusters", deps.Kube.Names())
	retryTopics, err := openRetryTopics(ctx, deps.Kafka, deps.Log, deps.Kube.Names())
	if err != nil {
		return nil, fmt.Errorf("quarantine: %w", err)
	}
	h.WatchClusters(deps.Kube.Names())
	h.exportClusters(deps.Kube.Names())
	loops := []role.Loop{{Name: "manual uncordons", Run: func(ctx context.Context) error {
		prod, err := kafka.NewBoundedProducer(deps.Kafka, deps.Log)
		if err != nil {
			return err
		}
		defer prod.Close()
		h.RunUncordons(ctx, prod)
		return nil
	}}}
	loops = append(loops, role.Loop{Name: "breaker gauges", Run: func(ctx context.Context) error {
		unread := h.ReadBreakers(ctx, deps.Kube.Names())
		t := time.NewTicker(breakerGaugeInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				if len(unread) > 0 {
					unread = h.ReadBreakers(ctx, unread)
				}
				h.RefreshBreakerGauges(ctx)
			}
		}
	}})
	// Flapping faults held after their recovery are lifted by this sweep
	// once their stabilization window passed (flap.go), remembered
	// recoveries forgotten (recovered.go), and conditions left False by
	// an apply whose quarantine was not written set True
	// (State.orphanConditions).
	names := deps.Kube.Names()
	loops = append(loops, role.Loop{Name: "stabilization sweep", Run: func(ctx context.Context) error {
		prod, err := kafka.NewBoundedProducer(deps.Kafka, deps.Log)
		if err != nil {
			return err
		}
		defer prod.Close()
		h.RunStabilization(ctx, prod, names)
		return nil
	}})
	// The records already waiting on the retry topic are read before the
	// consumers start: a node's newer records go behind them. The retry
	// group, like the main one, starts a partition it has no commit for
	// MaxEventAge back (a renamed group, its offsets expired): a week of
	// deferrals applied long ago is not replayed. So what it reads was
	// held, never replayed, and acts whatever its age (handleSeq).
	retry := cfg.Pipeline()
	retry.Role, retry.Topics, retry.Group = Role+"-retry", retryTopics, retryGroup
	retry.MaxPollRecords = cfg.RetryMaxPollRecords
	w, caughtUp, err := openRetryWaiting(ctx, deps.Kafka, h.log, retryGroup, retryTopics, retry.StartWithin)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("quarantine: %w", err)
	}
	if !caughtUp {
		h.log.Warn("the records waiting on the retry topic were not all read in time; deferring every cluster's records for 2×retry_wait",
			"within", catchUpTimeout)
		for _, c := range deps.Kube.Names() {
			h.markDeferring(c)
		}
	}
	h.retries = w
	loops = append(loops, role.Loop{Name: "retry topic follower", Run: func(ctx context.Context) error {
		w.run(ctx)
		return nil
	}})
	// A held retry batch comes back within a second: each try asks a
	// cluster that was unreachable whether it answers again (its gate's
	// probe), so its deferred faults are applied about a second after its
	// API server is back, not at the end of a backoff of up to 30 s. The
	// records behind it (its partitions paused meanwhile) come with the
	// next fetch after it succeeds: an idle fetch waits 250 ms, not 5 s.
	retry.MaxBackoff = time.Second
	retry.FetchMaxWait = 250 * time.Millisecond
	return &role.Role{
		Name: Role,
		Consumers: []role.Consumer{
			{Pipeline: cfg.Pipeline(), Handler: h},
			{Pipeline: retry, Handler: h.RetryHandler()},
		},
		Loops: loops,
		Close: func() error { h.Close(); return nil },
	}, nil
}

// exportClusters creates every cluster's health series at 0, so alerts on
// them (deploy/monitoring) see a cluster before its first failure, and its
// retry topic's series (faultline_quarantine_retry_topic), by which they
// name the cluster of the retry consumer's lag on a topic.
func (h *Handler) exportClusters(names []string) {
	for _, c := range names {
		h.m.apiErrors.WithLabelValues(c)
		h.m.deferred.WithLabelValues(c)
		h.m.held.WithLabelValues(c)
		h.m.breakerTrips.WithLabelValues(c)
		h.m.breakerOpen.WithLabelValues(c)
		h.m.selectorUnmatched.WithLabelValues(c)
		h.m.clusterSlow.WithLabelValues(c)
		h.m.stale.WithLabelValues(c)
		h.m.faultsDropped.WithLabelValues(c)
		h.m.retryTopic.WithLabelValues(c, RetryTopic(c)).Set(1)
	}
}
