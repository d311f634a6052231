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
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
)

// Topics are what the role consumes.
var Topics = []string{events.TopicActions, TopicRequeue}

// Start creates TopicRequeue if missing and returns the handler for the
// clusters of kube.
func Start(ctx context.Context, cfg Config, kube clusters.Config, kcfg kafka.Config, log *slog.Logger, reg prometheus.Registerer) (*Handler, error) {
	if log == nil {
		log = slog.Default()
	}
	h, err := New(cfg, clusters.NewRegistry(kube, nil), Options{Log: log, Registerer: reg})
	if err != nil {
		return nil, err
	}
	if err := kafka.CreateTopics(ctx, kcfg, log, TopicRequeue); err != nil {
		return nil, fmt.Errorf("drain: %w", err)
	}
	return h, nil
}
