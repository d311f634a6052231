package quarantine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
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
// Config.ClusterWait, then its remaining records (per node, in order) are
// deferred to TopicRetry, produced with the batch's outputs before the
// offsets are committed, so nothing is lost and the other clusters' records
// of the same partition are not held up. For a grace period after a
// deferral (2×RetryWait) every new record of that cluster is deferred too,
// so a node's records stay in order behind the deferred ones. The retry
// consumer (HandleRetry) waits for the cluster and fails its batch while
// the cluster is still down, so the pipeline retries it with backoff.
type Handler struct {
	cfg    Config
	policy *Policy
	reg    *clusters.Registry
	log    *slog.Logger
	now    func() time.Time
	m      *metrics
	optKey string
	optVal string

	nodes *nodeCaches
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
}

// Close stops the handler's node watches.
func (h *Handler) Close() { h.nodes.close() }

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
		uncordons: make(chan nodeRef, 1024), Ownership: pipeline.Ownership{Topic: events.TopicEvents},
	}
	h.nodes = newNodeCaches(h.noticeUncordon)
	return h, nil
}

// nodeRef names a node of a cluster.
type nodeRef struct{ cluster, node string }

// noticeUncordon queues a node the watch saw a person uncordon, when it is
// this replica's. A full queue drops it: the node's next event notices the
// uncordon too.
func (h *Handler) noticeUncordon(cluster, node string) {
	if !h.Owns(events.Key(cluster, node)) {
		return
	}
	select {
	case h.uncordons <- nodeRef{cluster, node}:
	default:
		h.log.Warn("manual uncordon queue full; left to the node's next event", "cluster", cluster, "node", node)
	}
}

// WatchClusters starts the node watch of every configured cluster, so that
// manual uncordons are noticed before the cluster's first event.
func (h *Handler) WatchClusters(names []string) {
	for _, name := range names {
		if cl, err := h.reg.Get(name); err == nil && cl.Kube != nil {
			h.nodes.get(cl)
		}
	}
}

// RunUncordons acknowledges the queued manual uncordons until ctx ends,
// producing each one's action through p.
func (h *Handler) RunUncordons(ctx context.Context, p pipeline.Producer) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-h.uncordons:
			a, err := h.AcknowledgeUncordon(ctx, r.cluster, r.node)
			if err == nil && a != nil {
				var rec *kgo.Record
				if rec, err = pipeline.ActionRecord(a); err == nil {
					err = p.ProduceSync(ctx, rec).FirstErr()
				}
			}
			if err != nil && ctx.Err() == nil {
				h.log.Warn("manual uncordon not acknowledged; left to the node's next event", "cluster", r.cluster, "node", r.node, "err", err)
			}
		}
	}
}

// AcknowledgeUncordon does what the node's next event would do on finding
// that a person uncordoned it: its standing faults are acknowledged (they
// no longer cordon or taint; faultline's taints and label go) and it
// returns the manual_uncordon action — nil when there is nothing to
// acknowledge (already done, by this or another replica, or cordoned
// again).
func (h *Handler) AcknowledgeUncordon(ctx context.Context, cluster, node string) (*faultlinev1.Action, error) {
	cl, err := h.reg.Get(cluster)
	if err != nil || cl.Kube == nil || cl.DryRun {
		return nil, err
	}
	n, err := cl.Kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get node %s/%s: %w", cluster, node, err)
	}
	var at time.Time
	if _, err := h.updateNode(ctx, cl, n, func(n *corev1.Node, st *State) (bool, error) {
		at = time.Time{} // a conflict retries with the node as it is now
		if !st.DetectManualUncordon(n, h.now()) {
			return false, nil
		}
		at = st.ManualUncordonAt
		return true, nil
	}); err != nil || at.IsZero() {
		return nil, err
	}
	h.m.decisions.WithLabelValues(cluster, events.KindManualUncordon, events.OutcomeDecided).Inc()
	return &faultlinev1.Action{
		Id: pipeline.ActionID(cluster, node, at.UTC().Format(time.RFC3339Nano), events.KindManualUncordon), Cluster: cluster, Node: node,
		Role: Role, Kind: events.KindManualUncordon, Outcome: events.OutcomeDecided, Timestamp: timestamppb.New(at),
		Reason: "a person uncordoned the node; its standing faults no longer cordon it (noticed by the node watch)",
	}, nil
}

// item is one decoded record.
type item struct {
	rec     *kgo.Record
	ev      *datamodels.HealthEvent
	cluster string
	node    string
	// ignored says which overrides of the event were ignored and why
	// (its submitter is not an operator); every action of the event says so.
	ignored string
}

type seqResult struct {
	actions  []*faultlinev1.Action
	deferred []item
	failed   error
}

// Handle handles a batch of the events topic.
func (h *Handler) Handle(ctx context.Context, recs []*kgo.Record) (pipeline.Result, error) {
	return h.handle(ctx, recs, false)
}

// HandleRetry handles a batch of TopicRetry: it waits for each cluster up to
// Config.RetryWait and fails the batch (to be retried) while one is down.
func (h *Handler) HandleRetry(ctx context.Context, recs []*kgo.Record) (pipeline.Result, error) {
	return h.handle(ctx, recs, true)
}

// RetryHandler returns HandleRetry as a pipeline.Handler.
func (h *Handler) RetryHandler() pipeline.Handler { return pipeline.HandlerFunc(h.HandleRetry) }

func (h *Handler) handle(ctx context.Context, recs []*kgo.Record, retry bool) (pipeline.Result, error) {
	var res pipeline.Result
	seqs := map[string][]item{}
	var keys []string
	for _, r := range recs {
		// The key and the payload must name the same node (every role
		// checks, so that none acts for another cluster than the store
		// records).
		cluster, node, err := pipeline.EventKey(r)
		if err != nil {
			res.Dead = append(res.Dead, pipeline.Dead{Record: r, Reason: err})
			continue
		}
		ev, err := events.Unmarshal(r.Value)
		if err != nil {
			res.Dead = append(res.Dead, pipeline.Dead{Record: r, Reason: err})
			continue
		}
		ev.Cluster, ev.NodeName = cluster, node
		it := item{rec: r, ev: ev, cluster: cluster, node: node, ignored: gateOverrides(ev)}
		if it.ignored != "" {
			h.m.overridesIgnored.WithLabelValues(cluster).Inc()
			h.log.Warn("overrides ignored: not sent by an operator", "cluster", cluster, "node", node,
				"event", ev.GetId(), "submitter", ev.GetSubmitter().GetName(), "ignored", it.ignored)
		}
		k := string(r.Key)
		if _, ok := seqs[k]; !ok {
			keys = append(keys, k)
		}
		seqs[k] = append(seqs[k], it)
	}
	wait := h.cfg.ClusterWait
	if retry {
		wait = h.cfg.RetryWait
	}
	deadline := time.Now().Add(wait)
	results := make([]seqResult, len(keys))
	sem := make(chan struct{}, h.cfg.Workers)
	var wg sync.WaitGroup
	for i, k := range keys {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			results[i] = h.handleSeq(ctx, seqs[k], retry, deadline)
		}()
	}
	wg.Wait()
	var failed []error
	for _, r := range results {
		if r.failed != nil {
			failed = append(failed, r.failed)
		}
		for _, a := range r.actions {
			rec, err := pipeline.ActionRecord(a)
			if err != nil {
				return pipeline.Result{}, err
			}
			res.Out = append(res.Out, rec)
		}
		for _, it := range r.deferred {
			res.Out = append(res.Out, retryRecord(it.rec))
			h.m.deferred.WithLabelValues(it.cluster).Inc()
		}
	}
	if len(failed) > 0 {
		return pipeline.Result{}, fmt.Errorf("quarantine retry batch: %w", errors.Join(failed...))
	}
	return res, nil
}

// handleSeq handles one node's records in order.
func (h *Handler) handleSeq(ctx context.Context, items []item, retry bool, deadline time.Time) seqResult {
	var r seqResult
	cluster := items[0].cluster
	cl, err := h.reg.Get(cluster)
	switch {
	case errors.Is(err, clusters.ErrUnknownCluster):
		cl = nil // decided and recorded as dry-run
	case err != nil:
		// A kubeconfig that cannot be loaded: the cluster's trouble.
		h.log.Warn("cluster client unavailable", "cluster", cluster, "err", err)
		if retry {
			r.failed = err
			return r
		}
		h.markDeferring(cluster)
		r.deferred = items
		return r
	}
	live := cl != nil && cl.Kube != nil
	for i, it := range items {
		if live && !retry && h.deferring(cluster) {
			r.deferred = items[i:]
			return r
		}
		for {
			if live {
				if ready, next := cl.Gate.Ready(); !ready {
					if next.After(deadline) || ctx.Err() != nil {
						if retry {
							h.markDeferring(cluster)
							r.failed = fmt.Errorf("cluster %s: unreachable: %w", cluster, cl.Gate.LastError())
							return r
						}
						h.log.Warn("cluster unreachable; deferring records", "cluster", cluster, "node", it.node,
							"records", len(items)-i, "err", cl.Gate.LastError())
						h.markDeferring(cluster)
						r.deferred = items[i:]
						return r
					}
					select {
					case <-ctx.Done():
						continue
					case <-time.After(time.Until(next)):
					}
				}
			}
			acts, err := h.process(ctx, cl, it)
			if err == nil {
				if live {
					cl.Gate.OK()
				}
				r.actions = append(r.actions, acts...)
				break
			}
			if ctx.Err() != nil {
				// The batch ran out of time (or the processor is stopping):
				// not the cluster's fault; defer the rest without marking it.
				if retry {
					r.failed = fmt.Errorf("cluster %s: %w", cluster, ctx.Err())
					return r
				}
				h.markDeferring(cluster) // keep the node's later records behind these
				r.deferred = items[i:]
				return r
			}
			if !clusters.Retriable(err) || !live {
				h.log.Warn("quarantine failed", "cluster", cluster, "node", it.node, "event", it.ev.GetId(), "err", err)
				kind := events.KindQuarantine
				if it.ev.GetIsHealthy() {
					kind = events.KindUnquarantine
				}
				r.actions = append(r.actions, h.action(it, kind, events.OutcomeFailed, err.Error(), "", cl))
				break
			}
			h.m.apiErrors.WithLabelValues(cluster).Inc()
			next := cl.Gate.Fail(err)
			h.log.Warn("cluster API error; will retry", "cluster", cluster, "node", it.node, "retry_at", next, "err", err)
		}
	}
	return r
}

func (h *Handler) deferring(cluster string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return time.Now().Before(h.deferUntil[cluster])
}

func (h *Handler) markDeferring(cluster string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.deferUntil[cluster] = time.Now().Add(2 * h.cfg.RetryWait)
}

// process decides and acts on one event. A returned error is the cluster
// API's; decisions (including failures that retrying cannot fix) are
// actions.
func (h *Handler) process(ctx context.Context, cl *clusters.Client, it item) ([]*faultlinev1.Action, error) {
	if it.ev.GetIsHealthy() {
		return h.recover(ctx, cl, it)
	}
	return h.fault(ctx, cl, it)
}

func (h *Handler) getNode(ctx context.Context, cl *clusters.Client, name string) (*corev1.Node, error) {
	if cl == nil || cl.Kube == nil {
		return nil, nil
	}
	n, err := cl.Kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", name, err)
	}
	return n, nil
}

// gateOverrides enforces who may override the policy: only an operator
// credential's quarantineOverrides and drainOverrides take effect (and, for
// a credential bound to one node, only for that node: the gateway refuses
// other nodes already). From anyone else (an agent, the pipeline, an event
// without a submitter) they are removed from the event before anything
// reads it (the rules' CEL variables, the action details the drain reads),
// and the returned text says what was ignored and why ("" when nothing
// was).
func gateOverrides(ev *datamodels.HealthEvent) string {
	bound := ev.GetSubmitter().GetNode()
	if events.IsOperator(ev) && (bound == "" || bound == ev.GetNodeName()) {
		return ""
	}
	var set []string
	for _, o := range []struct {
		name string
		o    *datamodels.BehaviourOverrides
	}{{"quarantineOverrides", ev.GetQuarantineOverrides()}, {"drainOverrides", ev.GetDrainOverrides()}} {
		if o.o.GetForce() {
			set = append(set, o.name+".force")
		}
		if o.o.GetSkip() {
			set = append(set, o.name+".skip")
		}
	}
	ev.QuarantineOverrides, ev.DrainOverrides = nil, nil
	if len(set) == 0 {
		return ""
	}
	why := strings.Join(set, ", ") + " ignored: sent by " + events.DescribeSubmitter(ev)
	if events.IsOperator(ev) {
		why += " bound to node " + events.Truncate(bound, 253)
	}
	return why
}

func (h *Handler) fault(ctx context.Context, cl *clusters.Client, it item) ([]*faultlinev1.Action, error) {
	ev := it.ev
	// Overrides left on the event are an operator's (gateOverrides).
	force := ev.GetQuarantineOverrides().GetForce()
	if events.StoreOnly(ev) {
		return []*faultlinev1.Action{h.action(it, events.KindSkip, events.OutcomeSkipped, "processingStrategy STORE_ONLY: stored, never acted on", "", cl)}, nil
	}
	if ev.GetQuarantineOverrides().GetSkip() {
		return []*faultlinev1.Action{h.action(it, events.KindSkip, events.OutcomeSkipped, "quarantineOverrides.skip", "", cl)}, nil
	}
	node, err := h.getNode(ctx, cl, it.node)
	if apierrors.IsNotFound(err) {
		return []*faultlinev1.Action{h.action(it, events.KindQuarantine, events.OutcomeFailed, "node not found in cluster", "", cl)}, nil
	}
	if err != nil {
		return nil, err
	}
	if node != nil && h.optKey != "" && node.Labels[h.optKey] == h.optVal {
		// The opt-out label wins even over an operator's force: a node
		// someone exempted is never cordoned by an event; remove the
		// label to quarantine it.
		why := fmt.Sprintf("node opted out (label %s=%s)", h.optKey, h.optVal)
		if force {
			why += "; quarantineOverrides.force does not override the opt-out label"
		}
		return []*faultlinev1.Action{h.action(it, events.KindSkip, events.OutcomeSkipped, why, "", cl)}, nil
	}
	dec, errs := h.policy.Evaluate(ev, node)
	ruleErrs := h.ruleErrors(it, errs)
	if dec == nil && force {
		dec = &Decision{Rule: RuleForce, Cordon: true, Condition: true}
	}
	if dec == nil {
		var acts []*faultlinev1.Action
		if !ev.GetIsFatal() {
			var err error
			if acts, err = h.nodeEvent(ctx, cl, node, it); err != nil {
				return nil, err
			}
		} else {
			acts = []*faultlinev1.Action{h.action(it, events.KindSkip, events.OutcomeSkipped, "no rule set matched", "", cl)}
		}
		return withRuleErrors(acts, ruleErrs), nil
	}
	if cl == nil || cl.DryRun || cl.Kube == nil {
		a := h.action(it, events.KindQuarantine, events.OutcomeDryRun, "would quarantine: "+dryRunWhy(cl), dec.Rule, cl)
		a.Details[events.DetailCordon] = strconv.FormatBool(dec.Cordon)
		return withRuleErrors([]*faultlinev1.Action{a}, ruleErrs), nil
	}
	at := eventTime(ev, h.now())
	f := Fault{
		Check: ev.GetCheckName(), Class: ev.GetComponentClass(), Entity: events.EntityKey(ev), Agent: ev.GetAgent(),
		Rule: dec.Rule, Message: events.Truncate(ev.GetMessage(), 256), Derived: ev.GetDerivedBy(),
		Action: ev.GetRecommendedAction().String(), Since: at, LastSeen: at,
		Cordon: dec.Cordon, Taint: dec.Taint, Condition: dec.Condition,
	}
	key := FaultKey(f.Check, f.Entity)
	var (
		verdict         breakerVerdict
		reserved, held  bool
		manual, already bool
		preCordon       bool
		acked           bool
	)
	br := h.breaker(cl)
	_, err = h.updateNode(ctx, cl, node, func(n *corev1.Node, st *State) (bool, error) {
		now := h.now()
		manual = st.DetectManualUncordon(n, now)
		wasActive := st.Active()
		already = len(st.Faults) > 0
		changed := st.AddFault(key, f, ev.GetId())
		acked = st.Faults[key].Acked && !st.Active()
		preCordon = n.Spec.Unschedulable && !st.Cordoned
		// Every new quarantine takes a breaker slot, an operator's force
		// included: nothing bypasses the breaker.
		if !wasActive && st.Active() {
			v, err := br.reserve(ctx, n.Name, !n.Spec.Unschedulable)
			if err != nil {
				return false, err
			}
			verdict, reserved = v, true
			if !v.Allowed {
				held = true
				return false, nil
			}
		}
		return changed || manual, nil
	})
	if err != nil {
		return nil, err
	}
	var acts []*faultlinev1.Action
	if reserved {
		acts = append(acts, h.breakerActions(ctx, cl, it, verdict)...)
	}
	if manual {
		acts = append(acts, h.action(it, events.KindManualUncordon, events.OutcomeDecided, "a person uncordoned the node; its standing faults no longer cordon it", "", cl))
	}
	if held {
		a := h.action(it, events.KindQuarantine, events.OutcomeHeld, "would quarantine: circuit breaker open: "+verdict.Reason, dec.Rule, cl)
		if force {
			a.Details[events.DetailForce] = "true"
		}
		h.m.held.WithLabelValues(it.cluster).Inc()
		return withRuleErrors(append(acts, a), ruleErrs), nil
	}
	if acked {
		a := h.action(it, events.KindQuarantine, events.OutcomeSkipped, "fault acknowledged by a manual uncordon: recorded, node left schedulable", dec.Rule, cl)
		return withRuleErrors(append(acts, a), ruleErrs), nil
	}
	a := h.action(it, events.KindQuarantine, events.OutcomeApplied, fmt.Sprintf("rule %s matched %s", dec.Rule, ev.GetCheckName()), dec.Rule, cl)
	a.Details[events.DetailCordon] = strconv.FormatBool(dec.Cordon)
	a.Details[events.DetailAlreadyQuarantined] = strconv.FormatBool(already)
	a.Details[events.DetailPreexistingCordon] = strconv.FormatBool(preCordon)
	if dec.Taint != nil {
		a.Details[events.DetailTaint] = dec.Taint.Key + "=" + dec.Taint.Value + ":" + dec.Taint.Effect
	}
	if force {
		a.Details[events.DetailForce] = "true"
	}
	return withRuleErrors(append(acts, a), ruleErrs), nil
}

// ruleErrors counts and logs the rule expressions that failed on an event
// (at most one log line per rule set a minute: a rule that fails on every
// event must not flood the log) and returns them for the action's details.
func (h *Handler) ruleErrors(it item, errs []error) string {
	if len(errs) == 0 {
		return ""
	}
	var parts []string
	for _, err := range errs {
		rule := "?"
		if re, ok := errors.AsType[*RuleError](err); ok {
			rule = re.Rule
		}
		h.m.ruleErrors.WithLabelValues(rule).Inc()
		if h.logRuleError(rule) {
			h.log.Warn("rule evaluation failed; the rule set did not match", "cluster", it.cluster, "node", it.node,
				"event", it.ev.GetId(), "err", err)
		}
		parts = append(parts, err.Error())
	}
	return events.Truncate(strings.Join(parts, "; "), 1024)
}

func (h *Handler) logRuleError(rule string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	if now.Before(h.ruleErrLogged[rule]) {
		return false
	}
	h.ruleErrLogged[rule] = now.Add(time.Minute)
	return true
}

// withRuleErrors notes the rule errors of an event on its decision (the
// last action).
func withRuleErrors(acts []*faultlinev1.Action, errs string) []*faultlinev1.Action {
	if errs != "" && len(acts) > 0 {
		acts[len(acts)-1].Details[events.DetailRuleErrors] = errs
	}
	return acts
}

func dryRunWhy(cl *clusters.Client) string {
	if cl == nil {
		return "cluster not configured (dry-run)"
	}
	return "cluster is dry-run"
}

func (h *Handler) recover(ctx context.Context, cl *clusters.Client, it item) ([]*faultlinev1.Action, error) {
	ev := it.ev
	if events.StoreOnly(ev) || cl == nil || cl.Kube == nil {
		return nil, nil
	}
	if h.nodes.nothingStanding(cl, it.node, h.now()) {
		h.m.cacheHits.WithLabelValues(it.cluster).Inc()
		return nil, nil // the common case, decided without a request
	}
	node, err := h.getNode(ctx, cl, it.node)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	entity := events.EntityKey(ev)
	at := time.Time{}
	if ts := ev.GetGeneratedTimestamp(); ts != nil {
		at = ts.AsTime()
	}
	if st, _ := ReadState(node); len(st.Faults) == 0 {
		return nil, nil // the common case: nothing standing
	}
	if cl.DryRun {
		st, _ := ReadState(node)
		if removed, _ := st.Recover(ev.GetCheckName(), entity, at); len(removed) > 0 {
			return []*faultlinev1.Action{h.action(it, events.KindUnquarantine, events.OutcomeDryRun, "would lift: "+fmt.Sprint(removed), "", cl)}, nil
		}
		return nil, nil
	}
	var (
		removed, stale []string
		manual         bool
		remaining      int
		uncordon       bool
	)
	_, err = h.updateNode(ctx, cl, node, func(n *corev1.Node, st *State) (bool, error) {
		manual = st.DetectManualUncordon(n, h.now())
		removed, stale = st.Recover(ev.GetCheckName(), entity, at)
		remaining = len(st.Faults)
		uncordon = st.Cordoned && !st.Active()
		return len(removed) > 0 || manual, nil
	})
	if err != nil {
		return nil, err
	}
	var acts []*faultlinev1.Action
	if manual {
		acts = append(acts, h.action(it, events.KindManualUncordon, events.OutcomeDecided, "a person uncordoned the node; its standing faults no longer cordon it", "", cl))
	}
	if len(stale) > 0 && len(removed) == 0 {
		acts = append(acts, h.action(it, events.KindSkip, events.OutcomeSkipped, "recovery older than the fault's last occurrence", "", cl))
	}
	if len(removed) > 0 {
		outcome, reason := events.OutcomeApplied, "every fault recovered; lifted what faultline set"
		if remaining > 0 {
			outcome, reason = events.OutcomeInProgress, fmt.Sprintf("fault recovered; %d still standing", remaining)
		}
		a := h.action(it, events.KindUnquarantine, outcome, reason, "", cl)
		a.Details[events.DetailRecovered] = fmt.Sprint(removed)
		a.Details[events.DetailRemaining] = strconv.Itoa(remaining)
		a.Details[events.DetailUncordoned] = strconv.FormatBool(uncordon)
		acts = append(acts, a)
	}
	return acts, nil
}

// updateNode reads the node's state, lets mutate change it, and writes the
// result: the status (conditions) first, then metadata and spec, each with
// the resourceVersion read, so a concurrent writer makes it re-read and
// redo the whole decision (optimistic concurrency; nothing faultline does
// not own is overwritten). first may be a node already read. mutate returns
// false to write nothing.
func (h *Handler) updateNode(ctx context.Context, cl *clusters.Client, first *corev1.Node,
	mutate func(n *corev1.Node, st *State) (bool, error)) (*corev1.Node, error) {
	nodes := cl.Kube.CoreV1().Nodes()
	n := first.DeepCopy()
	name := first.Name
	for attempt := 1; ; attempt++ {
		if n == nil {
			var err error
			if n, err = nodes.Get(ctx, name, metav1.GetOptions{}); err != nil {
				return nil, fmt.Errorf("get node %s: %w", name, err)
			}
		}
		st, err := ReadState(n)
		if err != nil {
			h.log.Warn("corrupt quarantine state; starting afresh", "cluster", cl.Name, "node", name, "err", err)
		}
		write, err := mutate(n, st)
		if err != nil || !write {
			return n, err
		}
		if fit := st.Fit(MaxStateBytes); len(fit.Dropped) > 0 || fit.Compacted > 0 {
			h.m.stateTrimmed.WithLabelValues(cl.Name).Inc()
			h.log.Warn("quarantine state over its budget; oldest entries compacted or dropped", "cluster", cl.Name, "node", name,
				"budget_bytes", MaxStateBytes, "bytes", fit.Bytes, "compacted", fit.Compacted, "dropped", len(fit.Dropped))
		}
		now := h.now()
		h.nodes.wrote(cl.Name, name, now)
		status := n.DeepCopy()
		if RenderConditions(status, st, now) {
			out, err := nodes.UpdateStatus(ctx, status, metav1.UpdateOptions{FieldManager: "faultline-quarantine"})
			if apierrors.IsConflict(err) && attempt < 100 {
				h.m.conflicts.WithLabelValues(cl.Name).Inc()
				n = nil
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("update node %s status: %w", name, err)
			}
			n.ResourceVersion, n.Status = out.ResourceVersion, out.Status
		}
		if RenderObject(n, st, h.cfg.Identity, now) {
			out, err := nodes.Update(ctx, n, metav1.UpdateOptions{FieldManager: "faultline-quarantine"})
			if apierrors.IsConflict(err) && attempt < 100 {
				h.m.conflicts.WithLabelValues(cl.Name).Inc()
				n = nil
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("update node %s: %w", name, err)
			}
			n = out
		}
		return n, nil
	}
}

// nodeEvent records a non-fatal event as a Kubernetes Event on the node,
// with a name derived from the event id so a retry finds the first one.
func (h *Handler) nodeEvent(ctx context.Context, cl *clusters.Client, node *corev1.Node, it item) ([]*faultlinev1.Action, error) {
	if !h.cfg.NodeEvents {
		return nil, nil
	}
	ev := it.ev
	reason := eventReason(ev.GetComponentClass())
	if cl == nil || cl.DryRun || cl.Kube == nil {
		return []*faultlinev1.Action{h.action(it, events.KindEvent, events.OutcomeDryRun, "would record Event "+reason, "", cl)}, nil
	}
	now := metav1.NewTime(h.now())
	kev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      it.node + ".fl-" + shortHash(recordID(it)),
			Namespace: h.cfg.EventNamespace,
			Labels:    map[string]string{"app.kubernetes.io/managed-by": "faultline"},
		},
		InvolvedObject:      corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: it.node, UID: node.UID},
		Reason:              reason,
		Message:             events.Truncate(fmt.Sprintf("%s (%s): %s", ev.GetCheckName(), ev.GetAgent(), ev.GetMessage()), maxMessage),
		Type:                corev1.EventTypeWarning,
		Source:              corev1.EventSource{Component: "faultline-quarantine", Host: it.node},
		ReportingController: "faultline.io/quarantine",
		ReportingInstance:   events.Truncate(h.cfg.Identity, 128),
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
	}
	_, err := cl.Kube.CoreV1().Events(h.cfg.EventNamespace).Create(ctx, kev, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create event for node %s: %w", it.node, err)
	}
	return []*faultlinev1.Action{h.action(it, events.KindEvent, events.OutcomeApplied, "recorded Event "+reason, "", cl)}, nil
}

// eventReason is the Event reason of a component class: "GPUHealthIssue".
func eventReason(class string) string {
	t := ConditionType(class)
	return t[:len(t)-len("Healthy")] + "HealthIssue"
}

func (h *Handler) breaker(cl *clusters.Client) *breaker {
	h.mu.Lock()
	defer h.mu.Unlock()
	b, ok := h.breakers[cl.Name]
	if !ok {
		b = newBreaker(h.cfg.Breaker, cl.Kube, h.now)
		h.breakers[cl.Name] = b
	}
	return b
}

// breakerActions reports a breaker transition: an action, the metric, and
// a Kubernetes Event on the breaker's ConfigMap.
func (h *Handler) breakerActions(ctx context.Context, cl *clusters.Client, it item, v breakerVerdict) []*faultlinev1.Action {
	if v.Allowed {
		h.m.breakerOpen.WithLabelValues(cl.Name).Set(0)
	} else {
		h.m.breakerOpen.WithLabelValues(cl.Name).Set(1)
	}
	var acts []*faultlinev1.Action
	if v.Closed {
		a := h.action(it, events.KindBreakerClose, events.OutcomeApplied, "circuit breaker closed after its window", "", cl)
		a.Id = pipeline.ActionID(cl.Name, events.KindBreakerClose, recordID(it))
		acts = append(acts, a)
		h.breakerEvent(ctx, cl, "QuarantineBreakerClosed", "faultline closed the quarantine circuit breaker after its window", it)
	}
	if v.Opened {
		h.log.Warn("circuit breaker opened; no new quarantines", "cluster", cl.Name, "reason", v.Reason)
		a := h.action(it, events.KindBreakerOpen, events.OutcomeApplied, v.Reason, "", cl)
		a.Id = pipeline.ActionID(cl.Name, events.KindBreakerOpen, recordID(it))
		a.Details[events.DetailBreakerCount], a.Details[events.DetailBreakerLimit] = itoa(v.Count), itoa(v.Limit)
		a.Details[events.DetailBreakerTotal], a.Details[events.DetailBreakerSchedulable] = itoa(v.Total), itoa(v.Schedulable)
		acts = append(acts, a)
		h.m.breakerTrips.WithLabelValues(cl.Name).Inc()
		h.breakerEvent(ctx, cl, "QuarantineBreakerOpen", "faultline stopped quarantining new nodes: "+v.Reason, it)
	}
	return acts
}

func (h *Handler) breakerEvent(ctx context.Context, cl *clusters.Client, reason, msg string, it item) {
	now := metav1.NewTime(h.now())
	bc := h.cfg.Breaker
	kev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name: bc.Name + ".fl-" + shortHash(reason+recordID(it)), Namespace: bc.Namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "faultline"},
		},
		InvolvedObject:      corev1.ObjectReference{APIVersion: "v1", Kind: "ConfigMap", Namespace: bc.Namespace, Name: bc.Name},
		Reason:              reason,
		Message:             events.Truncate(msg, maxMessage),
		Type:                corev1.EventTypeWarning,
		Source:              corev1.EventSource{Component: "faultline-quarantine"},
		ReportingController: "faultline.io/quarantine",
		ReportingInstance:   events.Truncate(h.cfg.Identity, 128),
		FirstTimestamp:      now, LastTimestamp: now, Count: 1,
	}
	if _, err := cl.Kube.CoreV1().Events(bc.Namespace).Create(ctx, kev, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		h.log.Warn("breaker event not recorded", "cluster", cl.Name, "err", err)
	}
}

// action builds the audit record of a decision on one event; its id is
// deterministic (cluster, node, event, kind), so a retried decision writes
// the same id.
func (h *Handler) action(it item, kind, outcome, reason, rule string, cl *clusters.Client) *faultlinev1.Action {
	ev := it.ev
	h.m.decisions.WithLabelValues(it.cluster, kind, outcome).Inc()
	var ids []string
	if ev.GetId() != "" {
		ids = []string{ev.GetId()}
	}
	// What the drain and remediate roles need of the event travels in
	// the details (keys shared with processors/drain).
	details := map[string]string{}
	if e := events.EntityKey(ev); e != "" {
		details[events.DetailEntities] = e
	}
	switch o := ev.GetDrainOverrides(); {
	case o.GetSkip():
		details[events.DetailDrainOverrides] = "skip"
	case o.GetForce():
		details[events.DetailDrainOverrides] = "force"
	}
	if c := ev.GetCustomRecommendedAction(); c != "" {
		details[events.DetailCustomAction] = c
	}
	if pods, ok := ev.GetMetadata()[events.MetaGPUPods]; ok {
		details[events.MetaGPUPods], details[events.MetaGPUPodsAt] = pods, ev.GetMetadata()[events.MetaGPUPodsAt]
	}
	// Who sent the event: the drain honours drainOverrides only when the
	// quarantine says an operator did.
	details[events.DetailSubmitterRole] = events.RoleName(events.SubmitterRole(ev))
	if n := ev.GetSubmitter().GetName(); n != "" {
		details[events.DetailSubmitter] = events.Truncate(strings.ToValidUTF8(n, "?"), 128)
	}
	if it.ignored != "" {
		details[events.DetailOverridesIgnored] = it.ignored
		reason += " (" + it.ignored + ")"
	}
	return &faultlinev1.Action{
		Id:                pipeline.ActionID(it.cluster, it.node, recordID(it), kind),
		Cluster:           it.cluster,
		Node:              it.node,
		Role:              Role,
		Kind:              kind,
		Outcome:           outcome,
		Reason:            events.Truncate(reason, maxMessage),
		Rule:              rule,
		EventIds:          ids,
		DryRun:            cl == nil || cl.DryRun || cl.Kube == nil,
		Timestamp:         timestamppb.New(h.now()),
		Details:           details,
		CheckName:         ev.GetCheckName(),
		RecommendedAction: ev.GetRecommendedAction().String(),
	}
}

// recordID identifies the event of a record: its id, else its position.
func recordID(it item) string {
	if id := it.ev.GetId(); id != "" {
		return id
	}
	return fmt.Sprintf("%s/%d/%d", it.rec.Topic, it.rec.Partition, it.rec.Offset)
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:16]
}

func eventTime(ev *datamodels.HealthEvent, now time.Time) time.Time {
	if ts := ev.GetGeneratedTimestamp(); ts != nil && ts.IsValid() {
		return ts.AsTime()
	}
	if ts := ev.GetReceivedTimestamp(); ts != nil && ts.IsValid() {
		return ts.AsTime()
	}
	return now
}

// HeaderRetryAttempt counts how often a record was deferred.
const HeaderRetryAttempt = "faultline-retry-attempt"

func retryRecord(r *kgo.Record) *kgo.Record {
	attempt := 0
	var hdrs []kgo.RecordHeader
	for _, hd := range r.Headers {
		if hd.Key == HeaderRetryAttempt {
			attempt, _ = strconv.Atoi(string(hd.Value))
			continue
		}
		hdrs = append(hdrs, hd)
	}
	hdrs = append(hdrs, kgo.RecordHeader{Key: HeaderRetryAttempt, Value: []byte(strconv.Itoa(attempt + 1))})
	return &kgo.Record{Topic: TopicRetry, Key: r.Key, Value: r.Value, Headers: hdrs}
}

type metrics struct {
	decisions    *prometheus.CounterVec
	held         *prometheus.CounterVec
	deferred     *prometheus.CounterVec
	apiErrors    *prometheus.CounterVec
	conflicts    *prometheus.CounterVec
	breakerTrips *prometheus.CounterVec
	breakerOpen  *prometheus.GaugeVec
	cacheHits    *prometheus.CounterVec
	ruleErrors   *prometheus.CounterVec
	stateTrimmed *prometheus.CounterVec
	// overridesIgnored counts events whose overrides were ignored (not an
	// operator's).
	overridesIgnored *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		decisions:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_decisions_total", Help: "Quarantine decisions by kind and outcome."}, []string{"cluster", "kind", "outcome"}),
		held:             prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_held_total", Help: "Quarantines held back by the circuit breaker."}, []string{"cluster"}),
		deferred:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_deferred_total", Help: "Records deferred to the retry topic because their cluster was unreachable."}, []string{"cluster"}),
		apiErrors:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_api_errors_total", Help: "Retriable Kubernetes API errors."}, []string{"cluster"}),
		conflicts:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_conflicts_total", Help: "Node updates retried after a resourceVersion conflict."}, []string{"cluster"}),
		breakerTrips:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_breaker_trips_total", Help: "Times the circuit breaker opened."}, []string{"cluster"}),
		breakerOpen:      prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "faultline_quarantine_breaker_open", Help: "1 while the cluster's circuit breaker holds new quarantines."}, []string{"cluster"}),
		cacheHits:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_recoveries_from_cache_total", Help: "Healthy events decided from the node watch without an API request (nothing standing)."}, []string{"cluster"}),
		stateTrimmed:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_state_trimmed_total", Help: "Node state writes that compacted or dropped old faults to stay within the annotation budget."}, []string{"cluster"}),
		ruleErrors:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_rule_errors_total", Help: "Rule expressions that failed on an event (missing key, type error, cost limit); the rule set did not match."}, []string{"rule"}),
		overridesIgnored: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_quarantine_overrides_ignored_total", Help: "Events whose quarantineOverrides/drainOverrides were ignored because no operator credential sent them."}, []string{"cluster"}),
	}
	if reg != nil {
		reg.MustRegister(m.decisions, m.held, m.deferred, m.apiErrors, m.conflicts, m.breakerTrips, m.breakerOpen, m.cacheHits, m.ruleErrors, m.overridesIgnored, m.stateTrimmed)
	}
	return m
}
