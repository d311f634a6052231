// Package remediate is the Fault Remediation processor (`faultline process
// --role=remediate`): when a drain ends (drain/succeeded, or drain/gave_up
// when its policy stopped waiting) it turns the event's recommendedAction
// into a custom resource rendered from a Go text/template over the event —
// REPLACE_VM, RESTART_VM and RESTART_BM into the RebootNode of NVIDIA
// NVSentinel's janitor, COMPONENT_RESET into the janitor's GPUReset, CUSTOM
// through customRecommendedAction — with a deterministic name, so a retry
// or a second replica finds the first. A node gets at most one resource
// per equivalence group in progress; its completion is read from the
// resource's status as the janitor writes it (KindCompletion); a node
// whose remediation failed, or that spent its budget within the window,
// is escalated to CONTACT_SUPPORT instead.
//
// The resources themselves are the state: their labels select a node's
// group, their annotations say which triggers they serve and when they
// were created, and counting them is the budget. README.md has the
// configuration, the contract with the drain role and the tests.
package remediate

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
	// Every cluster's series exist from the start (at 0), so alerts on
	// them (deploy/monitoring) see a cluster before its first escalation.
	for _, c := range deps.Kube.Names() {
		h.m.escalations.WithLabelValues(c)
		h.m.apiErrors.WithLabelValues(c)
		h.m.slowLane.WithLabelValues(c)
	}
	h.WatchClusters(deps.Kube.Names())
	if err := kafka.CreateTopics(ctx, deps.Kafka, deps.Log, TopicRequeue, TopicSlow); err != nil {
		h.Close()
		return nil, fmt.Errorf("remediate: %w", err)
	}
	return &role.Role{Name: Role, Consumers: []role.Consumer{{Pipeline: cfg.Pipeline(), Handler: h},
		{Pipeline: requeue.LanePipeline(cfg.Pipeline(), TopicSlow), Handler: h.SlowHandler()}},
		Close: func() error { h.Close(); return nil }}, nil
}
