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
// were created, and counting them is the budget. README.md (in
// processors/drain) has the configuration and the measurements.
package remediate

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
	h, err := New(cfg, clusters.NewRegistry(kube, nil), Options{Log: log, Registerer: reg, Clusters: kube})
	if err != nil {
		return nil, err
	}
	if err := kafka.CreateTopics(ctx, kcfg, log, TopicRequeue); err != nil {
		return nil, fmt.Errorf("remediate: %w", err)
	}
	return h, nil
}
