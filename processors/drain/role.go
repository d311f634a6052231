// Package drain is the Node Drainer processor (`faultline process
// --role=drain`): when the quarantine role applies a quarantine (an action
// quarantine/applied on the actions topic) it drains the node's pods
// through the Eviction API, in the mode its rules pick per namespace
// pattern and pod label (Immediate, AllowCompletion, DeleteAfterTimeout),
// never touching system namespaces, DaemonSet or mirror pods, respecting
// PodDisruptionBudgets (a 429 is retried with backoff and reported as
// "blocked by PDB <name>"), and for a GPU-scoped COMPONENT_RESET only the
// pods using that GPU. Progress and the result (succeeded, gave_up,
// cancelled) are actions; the remediate role starts from the result.
//
// The node is the only state (AnnotationState, written with the
// resourceVersion read). A drain in progress comes back through
// TopicRequeue every PollInterval, so no batch is held open and a
// restarted or different replica resumes from the node. README.md has the
// configuration, the annotation contract and the measurements.
package drain

import (
	"context"
	"fmt"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/requeue"
	"github.com/faultline/faultline/processors/role"
	"github.com/faultline/faultline/schemas/events"
)

// Topics are what the role's main consumer reads; its slow lane reads
// TopicSlow.
var Topics = []string{events.TopicActions, TopicRequeue}

// Open creates TopicRequeue and TopicSlow if missing and returns the role
// for the clusters of deps.Kube: one consumer of Topics and one of
// TopicSlow, the slow lane (requeue.Lane; no side loops: work in progress
// comes back through TopicRequeue).
func Open(ctx context.Context, cfg Config, deps role.Deps) (*role.Role, error) {
	deps = deps.WithDefaults()
	h, err := New(cfg, clusters.NewRegistry(deps.Kube, nil).WithLog(deps.Log), Options{Log: deps.Log, Registerer: deps.Registry})
	if err != nil {
		return nil, err
	}
	if err := kafka.CreateTopics(ctx, deps.Kafka, deps.Log, TopicRequeue, TopicSlow); err != nil {
		return nil, fmt.Errorf("drain: %w", err)
	}
	for _, c := range deps.Kube.Names() {
		h.m.slowLane.WithLabelValues(c)
	}
	return &role.Role{Name: Role, Consumers: []role.Consumer{{Pipeline: cfg.Pipeline(), Handler: h},
		{Pipeline: requeue.LanePipeline(cfg.Pipeline(), TopicSlow), Handler: h.SlowHandler()}},
		Close: func() error { h.Close(); return nil }}, nil
}
