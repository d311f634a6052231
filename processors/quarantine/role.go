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

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/role"
	"github.com/faultline/faultline/schemas/events"
)

// Topics are what the role's own consumer reads; its retry consumer reads
// TopicRetry.
var Topics = []string{events.TopicEvents}

// Open builds the role: it compiles the rules (an invalid rule stops
// start-up, naming the rule set), creates TopicRetry if missing and
// starts the node watch of every configured cluster. The role is its
// consumer of Topics, its retry consumer of TopicRetry (group
// "faultline-quarantine-retry"), the loop that acknowledges manual
// uncordons (RunUncordons) and, unless flapping faults are off, the sweep
// that lifts them after their stabilization window (RunStabilization).
func Open(ctx context.Context, cfg Config, deps role.Deps) (*role.Role, error) {
	deps = deps.WithDefaults()
	h, err := New(cfg, clusters.NewRegistry(deps.Kube, nil), Options{Log: deps.Log, Registerer: deps.Registry})
	if err != nil {
		return nil, err
	}
	h.log.Info("quarantine policy compiled", "rule_sets", h.policy.Names(), "clusters", deps.Kube.Names())
	if err := kafka.CreateTopics(ctx, deps.Kafka, deps.Log, TopicRetry); err != nil {
		return nil, fmt.Errorf("quarantine: %w", err)
	}
	if err := h.deferBehindRetries(ctx, deps.Kafka, deps.Kube.Names()); err != nil {
		return nil, fmt.Errorf("quarantine: %w", err)
	}
	h.WatchClusters(deps.Kube.Names())
	// Every cluster's health series exist from the start (at 0), so
	// alerts on them (deploy/monitoring) see a cluster before its first
	// failure.
	for _, c := range deps.Kube.Names() {
		h.m.apiErrors.WithLabelValues(c)
		h.m.deferred.WithLabelValues(c)
		h.m.held.WithLabelValues(c)
		h.m.breakerTrips.WithLabelValues(c)
		h.m.breakerOpen.WithLabelValues(c)
	}
	loops := []role.Loop{{Name: "manual uncordons", Run: func(ctx context.Context) error {
		prod, err := kafka.NewClient(deps.Kafka, deps.Log, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0))
		if err != nil {
			return err
		}
		defer prod.Close()
		h.RunUncordons(ctx, prod)
		return nil
	}}}
	if cfg.Flap().Enabled() {
		// Flapping faults held after their recovery are lifted by this
		// sweep once their stabilization window passed (flap.go).
		names := deps.Kube.Names()
		loops = append(loops, role.Loop{Name: "stabilization sweep", Run: func(ctx context.Context) error {
			prod, err := kafka.NewClient(deps.Kafka, deps.Log, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0))
			if err != nil {
				return err
			}
			defer prod.Close()
			h.RunStabilization(ctx, prod, names)
			return nil
		}})
	}
	retry := cfg.Pipeline()
	retry.Role, retry.Topics, retry.Group = Role+"-retry", []string{TopicRetry}, retryGroup
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

// retryGroup is the retry consumer's group.
var retryGroup = pipeline.DefaultGroup(Role + "-retry")

// deferBehindRetries defers the clusters' records for 2×retry_wait when
// TopicRetry holds records its group has not consumed: records deferred
// before this process started (a cluster's API was down) whose order the
// replica that deferred them kept in memory. Decided now, a later record
// of the same node (a recovery) would be applied before the fault it
// ends, and the retried fault would then cordon a healthy node.
func (h *Handler) deferBehindRetries(ctx context.Context, kcfg kafka.Config, names []string) error {
	cl, err := kafka.NewClient(kcfg, h.log)
	if err != nil {
		return err
	}
	defer cl.Close()
	switch n, err := pendingRetries(ctx, kadm.NewClient(cl), retryGroup); {
	case err != nil:
		h.log.Warn("records waiting on the retry topic not counted; deferring every cluster's records behind any", "err", err)
	case n == 0:
		return nil
	default:
		h.log.Info("records deferred before this start wait on the retry topic; deferring every cluster's records behind them",
			"records", n, "for", 2*h.cfg.RetryWait)
	}
	for _, c := range names {
		h.markDeferring(c)
	}
	return nil
}

// pendingRetries counts TopicRetry's records after group's committed
// offsets (from the log start on a partition it never committed).
func pendingRetries(ctx context.Context, adm *kadm.Client, group string) (int64, error) {
	ends, err := adm.ListEndOffsets(ctx, TopicRetry)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("end offsets of %s: %w", TopicRetry, err)
	}
	starts, err := adm.ListStartOffsets(ctx, TopicRetry)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("start offsets of %s: %w", TopicRetry, err)
	}
	var held int64
	ends.Each(func(e kadm.ListedOffset) {
		if s, ok := starts.Lookup(e.Topic, e.Partition); ok {
			held += e.Offset - s.Offset
		}
	})
	if held == 0 {
		return 0, nil
	}
	committed, err := adm.FetchOffsets(ctx, group)
	for try := 1; kerr.IsRetriable(err) && try < 10; try++ { // a coordinator still loading
		time.Sleep(200 * time.Millisecond)
		committed, err = adm.FetchOffsets(ctx, group)
	}
	if err != nil {
		return 0, fmt.Errorf("offsets of group %s: %w", group, err)
	}
	var n int64
	ends.Each(func(e kadm.ListedOffset) {
		from := int64(0)
		if s, ok := starts.Lookup(e.Topic, e.Partition); ok {
			from = s.Offset
		}
		if c, ok := committed.Lookup(e.Topic, e.Partition); ok && c.Err == nil && c.At >= 0 {
			from = c.At
		}
		n += max(0, e.Offset-from)
	})
	return n, nil
}
