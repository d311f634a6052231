package quarantine

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
)

// Role is the processor role name written on actions.
const Role = events.RoleQuarantine

// RuleForce names the decision of an operator's quarantineOverrides.force
// when no rule set matched.
const RuleForce = "override-force"

// Handler is the quarantine role: for each event it decides with the
// Policy, acts on the event's cluster and records every decision as an
// Action.
//
// Records of one node are handled in offset order; different nodes of a
// batch are handled concurrently (Config.Workers). Clusters are isolated:
// a cluster whose API fails is retried inside the batch for at most
// Config.ClusterWait (one that cannot be reached at all, unless it answers
// a probe, not at all), then its remaining records (per node, in order) are
// deferred to the cluster's RetryTopic, produced with the batch's outputs before the
// offsets are committed, so nothing is lost and the other clusters' records
// of the same partition are not held up. For a grace period after a
// deferral (2×RetryWait) every new record of that cluster is deferred too,
// and so is every record of a node with an older record still waiting on
// a retry topic (retryWaiting, whichever replica deferred it), so a node's
// records stay in order behind the deferred ones. The retry
// consumer (HandleRetry) waits for the cluster and fails its batch while
// the cluster is still down, so the pipeline holds it and retries it with
// backoff, the other clusters' retry topics going on.
type Handler struct {
	cfg    Config
	policy *Policy
	reg    *clusters.Registry
	log    *slog.Logger
	now    func() time.Time
	m      *metrics
	optKey string
	optVal string

	nodes *clusters.NodeWatches
	// uncordons are nodes a person uncordoned, noticed by the node watch,
	// for this replica to acknowledge (RunUncordons).
	uncordons chan nodeRef
	// Ownership: the events partitions this replica consumes; it
	// acknowledges the uncordons of the nodes keyed to them.
	pipeline.Ownership

	mu            sync.Mutex
	breakers      map[string]*breaker
	deferUntil    map[string]time.Time
	ruleErrLogged map[string]time.Time
	// retried: the actions of retry records applied in a retry batch that
	// failed for another cluster, by record, for the batch's redo (which
	// finds them applied and would decide no action, a release's or the
	// breaker's opening, again).
	retried map[string]retriedActions

	// lastEvent: when each cluster/node/reason last got a node Event
	// (eventDue).
	events       *eventWriter
	eventsMu     sync.Mutex
	lastEvent    map[string]time.Time
	eventsPruned time.Time

	// retries: the records waiting on the retry topics, by key (Open sets it).
	retries *retryWaiting

	// dryRunLifts: the would-lifts the stabilization sweep reported for
	// dry-run clusters, by action id (reported once each; nothing is
	// written there, so every sweep finds them again), forgotten when a
	// sweep no longer finds them; sweeps numbers the sweeps. Under mu.
	dryRunLifts map[string]wouldLift
	sweeps      atomic.Uint64
	// saying: the unsaid actions this replica wrote, by id, in flight or
	// produced (unsaid.go). Under mu.
	saying map[string]saying
}

// Close stops the handler's node watches.
func (h *Handler) Close() {
	h.nodes.Close()
	h.events.stop()
}

// Options are a Handler's collaborators.
type Options struct {
	// Log defaults to slog.Default().
	Log *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Registerer gets the role's metrics; nil: not registered.
	Registerer prometheus.Registerer
}

// New compiles the rule file and returns the handler. An invalid rule is
// an error naming the rule set.
func New(cfg Config, reg *clusters.Registry, opts Options) (*Handler, error) {
	if err := cfg.Validate("quarantine."); err != nil {
		return nil, err
	}
	rs, err := LoadRules(cfg.Rules)
	if err != nil {
		return nil, fmt.Errorf("quarantine.rules: %w", err)
	}
	pol, err := CompileLimited(rs, cfg.RuleCostLimit)
	if err != nil {
		return nil, fmt.Errorf("quarantine.rules: %w", err)
	}
	return NewWithPolicy(cfg, pol, reg, opts)
}

// NewWithPolicy returns a handler for an already compiled policy.
func NewWithPolicy(cfg Config, pol *Policy, reg *clusters.Registry, opts Options) (*Handler, error) {
	k, v, err := cfg.optOut()
	if err != nil {
		return nil, fmt.Errorf("quarantine.opt_out_label: %w", err)
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	h := &Handler{
		cfg: cfg, policy: pol, reg: reg, log: opts.Log.With("role", Role), now: opts.Now,
		m: newMetrics(opts.Registerer), optKey: k, optVal: v,
		breakers: map[string]*breaker{}, deferUntil: map[string]time.Time{}, ruleErrLogged: map[string]time.Time{},
		retried: map[string]retriedActions{}, dryRunLifts: map[string]wouldLift{}, saying: map[string]saying{},
		lastEvent: map[string]time.Time{},
		uncordons: make(chan nodeRef, 1024), Ownership: pipeline.Ownership{Topic: events.TopicEvents},
	}
	for _, name := range pol.Names() {
		h.m.ruleErrors.WithLabelValues(name) // exported from the start (at 0), so an alert's increase sees the first error
	}
	h.nodes = newNodeWatches(h.log, h.noticeUncordon)
	h.events = newEventWriter(cfg.NodeEventQPS, h.log, func(cluster string) { h.m.eventsFailed.WithLabelValues(cluster).Inc() })
	return h, nil
}
