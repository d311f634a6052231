package quarantine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
	"github.com/faultline/faultline/schemas/validate"
)

// process decides and acts on one event. A returned error is the cluster
// API's; decisions (including failures that retrying cannot fix) are
// actions.
func (h *Handler) process(ctx context.Context, cl *clusters.Client, it item) ([]*faultlinev1.Action, error) {
	if it.ev.GetIsHealthy() {
		return h.recover(ctx, cl, it)
	}
	return h.fault(ctx, cl, it)
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
	if events.NeverActs(ev) {
		return []*faultlinev1.Action{h.action(it, events.KindSkip, events.OutcomeSkipped, "processingStrategy "+ev.GetProcessingStrategy().String()+": stored, never acted on", "", cl)}, nil
	}
	if ev.GetQuarantineOverrides().GetSkip() {
		return []*faultlinev1.Action{h.action(it, events.KindSkip, events.OutcomeSkipped, "quarantineOverrides.skip", "", cl)}, nil
	}
	// The watch's copy when it has one: the write below carries its
	// resourceVersion, so a stale copy costs a conflict and a live read,
	// never a wrong write; a fresh one saves a GET per fault (a fleet-wide
	// failure is bounded by the client's QPS).
	node, cached := h.cachedNode(cl, it.node)
	if cached {
		if acts, ok, err := h.nonFatalFromCache(ctx, cl, it, force, node); ok || err != nil {
			return acts, err
		}
	}
	if _, other := otherMachine(ev, node); !cached || other {
		// No copy, or one that names another machine than the event: the
		// watch may not have the swapped-in machine's status yet, and a
		// fault is skipped as an earlier machine's only on a live read.
		var err error
		node, err = h.getNode(ctx, cl, it.node)
		if apierrors.IsNotFound(err) {
			return []*faultlinev1.Action{h.action(it, events.KindQuarantine, events.OutcomeFailed, "node not found in cluster", "", cl)}, nil
		}
		if err != nil {
			return nil, err
		}
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
		stands          Fault // the fault as the node keeps it, after this occurrence
		closing         *faultlinev1.Action
		uncordoned      *faultlinev1.Action // the manual_uncordon action, when manual
		superseded      time.Time
		before          time.Time // the node's creation, when the event was received before it
		created         time.Time // the node's creation
		machine         string    // the node's system UUID, when the event is of another machine
	)
	br := h.breaker(cl)
	_, err := h.updateNode(ctx, cl, node, func(n *corev1.Node, st *State) (bool, error) {
		// A conflict re-decides on the node as it is now: what a run found
		// is found again (a held run writes too now: a manual uncordon's
		// acknowledgement). verdict and reserved stay: a slot reserved is
		// taken, and its actions are said.
		closing, uncordoned, superseded, before, machine = nil, nil, time.Time{}, time.Time{}, ""
		held, acked, already, preCordon = false, false, false, false
		now := h.now()
		manual = st.DetectManualUncordon(n, now)
		if manual {
			// Written into the node with the acknowledgement (unsaid.go),
			// as recover's: a redelivery of this event finds nothing to
			// acknowledge (this write may cordon the node again), so a
			// batch whose produce failed would lose the action for ever.
			uncordoned = h.newAction(it, events.KindManualUncordon, events.OutcomeDecided, "a person uncordoned the node; its standing faults no longer cordon it", "", cl)
			st.addUnsaid(uncordoned)
		}
		created = n.CreationTimestamp.Time
		if c, ok := predates(ev, n); ok {
			// Received before this Node object existed: of the machine an
			// earlier Node of this name was (replaced, its name reused).
			before = c
			return manual, nil
		}
		if m, ok := otherMachine(ev, n); ok {
			// Of the machine this Node object was before (kept across a
			// machine swap, registered again without being deleted).
			machine = m
			return manual, nil
		}
		if ev.GetGeneratedTimestamp().IsValid() {
			if rec, ok := st.Superseded(key, f.LastSeen, now, h.cfg.RecoveryMemory); ok {
				// Generated before the recovery that lifted its fault: a
				// late or repeated copy (recovered.go).
				superseded = rec
				return manual, nil
			}
		}
		wasActive := st.Active()
		already = len(st.Faults) > 0
		preCordon = n.Spec.Unschedulable && !st.Cordoned
		if !manual && h.cfg.RepeatWriteInterval > 0 && st.Repeats(key, f, h.cfg.RepeatWriteInterval) {
			acked = st.Faults[key].Acked && !st.Active()
			stands = *st.Faults[key]
			return false, nil // it stands as this occurrence would make it: nothing to write
		}
		changed := st.AddFault(key, f, ev.GetId())
		acked = st.Faults[key].Acked && !st.Active()
		stands = *st.Faults[key]
		// Every new quarantine takes a breaker slot, an operator's force
		// included: nothing bypasses the breaker.
		if !wasActive && st.Active() {
			v, err := br.reserve(ctx, n.Name, recordID(it), !n.Spec.Unschedulable)
			if err != nil {
				return false, err
			}
			verdict, reserved = v, true
			if !v.Allowed {
				held = true
				if !manual {
					return false, nil
				}
				// The fault is not written, the acknowledgement is:
				// the node stays as the person left it (no taint,
				// label or cordon of faultline's), and the watch's
				// notice later finds nothing to acknowledge again.
				ack, err := ReadState(n) // as read: this mutate has not touched n
				if err != nil {
					return false, err
				}
				ack.DetectManualUncordon(n, now)
				ack.addUnsaid(uncordoned)
				*st = *ack
				return true, nil
			}
			if v.Closed {
				// This write cordons the node: the breaker's closing goes
				// into it too (unsaid.go), as a redelivery of this fault
				// finds the node quarantined and reserves nothing. (A
				// held record is asked again: breaker.go's closedBy.)
				closing = h.breakerClose(it, cl)
				st.addUnsaid(closing)
			}
		}
		return changed || manual, nil
	})
	if err != nil {
		return nil, err
	}
	var acts []*faultlinev1.Action
	if reserved {
		if closing != nil {
			h.track([]string{closing.Id}, false) // in flight until the batch's output is produced
		}
		acts = append(acts, h.breakerActions(ctx, cl, it, verdict, closing)...)
	}
	if manual {
		h.m.decisions.WithLabelValues(it.cluster, events.KindManualUncordon, events.OutcomeDecided).Inc()
		h.track([]string{uncordoned.Id}, false) // in flight until the batch's output is produced
		acts = append(acts, uncordoned)
	}
	if !before.IsZero() {
		a := h.action(it, events.KindQuarantine, events.OutcomeSkipped, fmt.Sprintf(
			"event received at %s, before this node object was created at %s: it is of the machine an earlier node of this name was, not acted on",
			ev.GetReceivedTimestamp().AsTime().UTC().Format(time.RFC3339Nano), before.UTC().Format(time.RFC3339)), dec.Rule, cl)
		return withRuleErrors(append(acts, a), ruleErrs), nil
	}
	if machine != "" {
		a := h.action(it, events.KindQuarantine, events.OutcomeSkipped, fmt.Sprintf(
			"event of machine %s (its system UUID), while node %s reports machine %s: of the machine this node was before, not acted on",
			validate.Short(ev.GetMetadata()[events.MetaSystemUUID]), node.Name, machine), dec.Rule, cl)
		return withRuleErrors(append(acts, a), ruleErrs), nil
	}
	if !superseded.IsZero() {
		a := h.action(it, events.KindQuarantine, events.OutcomeSkipped, fmt.Sprintf(
			"occurrence generated at %s, not after the recovery generated at %s that lifted this fault: a late or repeated copy, not acted on",
			f.LastSeen.UTC().Format(time.RFC3339Nano), superseded.UTC().Format(time.RFC3339Nano)), dec.Rule, cl)
		return withRuleErrors(append(acts, a), ruleErrs), nil
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
	// What holds the node for this fault: a weaker occurrence of a
	// standing fault leaves its rule, cordon and taint (Fault.strengthen),
	// and the fleet's node page reads the latest applied action.
	reason := fmt.Sprintf("rule %s matched %s", dec.Rule, ev.GetCheckName())
	if stands.Rule != dec.Rule {
		reason += fmt.Sprintf("; the fault stands as rule %s decided it", stands.Rule)
	}
	a := h.action(it, events.KindQuarantine, events.OutcomeApplied, reason, stands.Rule, cl)
	a.Details[events.DetailCordon] = strconv.FormatBool(stands.Cordon)
	a.Details[events.DetailAlreadyQuarantined] = strconv.FormatBool(already)
	a.Details[events.DetailPreexistingCordon] = strconv.FormatBool(preCordon)
	if !created.IsZero() {
		a.Details[events.DetailNodeCreated] = created.UTC().Format(time.RFC3339)
	}
	if stands.Taint != nil {
		a.Details[events.DetailTaint] = stands.Taint.Key + "=" + stands.Taint.Value + ":" + stands.Taint.Effect
	}
	if force {
		a.Details[events.DetailForce] = "true"
	}
	return withRuleErrors(append(acts, a), ruleErrs), nil
}

// nonFatalFromCache decides a non-fatal event that no rule set matches from
// node, the node watch's copy, without an API request: under a fleet's
// background of warnings a request each would spend the client's QPS and
// queue the fatal events behind it. ok false: fault decides it (a fatal or
// forced event, an opted-out node, or a rule set that matches — whatever
// could change the node goes through updateNode, whose patches carry the
// copy's resourceVersion).
func (h *Handler) nonFatalFromCache(ctx context.Context, cl *clusters.Client, it item, force bool, node *corev1.Node) (acts []*faultlinev1.Action, ok bool, err error) {
	if it.ev.GetIsFatal() || force || (h.optKey != "" && node.Labels[h.optKey] == h.optVal) {
		return nil, false, nil
	}
	dec, errs := h.policy.Evaluate(it.ev, node)
	if dec != nil {
		return nil, false, nil
	}
	h.m.warnCache.WithLabelValues(it.cluster).Inc()
	ruleErrs := h.ruleErrors(it, errs)
	if acts, err = h.nodeEvent(ctx, cl, node, it); err != nil {
		return nil, true, err
	}
	return withRuleErrors(acts, ruleErrs), true, nil
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

// cachedNode returns the node watch's copy of node when a decision may
// be made on it without a request (clusters.NodeWatches.Cached: not
// while this replica's own write of it is missing), and not while the
// watch is behind (a list or watch failed, nothing received since): a
// decision that writes nothing — a healthy event finding nothing
// standing, an occurrence deciding what stands already (State.Repeats) —
// meets no resourceVersion conflict, so a copy missing another replica's
// write (a fault or a lift its retry consumer applied) would decide for
// good: the recovery dropped, the node cordoned for ever. Read live then.
// The watch's failures are rare; a GET for every healthy event (about
// half of a fleet's events) is what the copy saves.
func (h *Handler) cachedNode(cl *clusters.Client, node string) (*corev1.Node, bool) {
	n, ok := h.nodes.Cached(cl, node, h.now())
	if !ok || h.nodes.Behind(cl) {
		return nil, false
	}
	return n, true
}

func (h *Handler) recover(ctx context.Context, cl *clusters.Client, it item) ([]*faultlinev1.Action, error) {
	ev := it.ev
	if events.NeverActs(ev) || cl == nil || cl.Kube == nil {
		return nil, nil
	}
	// The watch's copy when it has one, as for a fault: the write below
	// carries its resourceVersion, so a stale copy costs a conflict and a
	// live read; a fresh one saves a GET per recovery (a fleet-wide
	// recovery is bounded by the client's QPS). Nothing standing on it
	// writes nothing, so no conflict would correct a copy that lags:
	// cachedNode.
	node, cached := h.cachedNode(cl, it.node)
	if cached {
		if st, err := ReadState(node); err == nil && len(st.Faults) == 0 {
			h.m.cacheHits.WithLabelValues(it.cluster).Inc()
			return nil, nil // the common case, decided without a request
		}
	} else {
		var err error
		node, err = h.getNode(ctx, cl, it.node)
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
	}
	entities := events.EntityParts(ev)
	at := time.Time{}
	if ts := ev.GetGeneratedTimestamp(); ts != nil {
		at = ts.AsTime()
	}
	if st, _ := ReadState(node); len(st.Faults) == 0 {
		return nil, nil // the common case: nothing standing
	}
	flap := h.cfg.Flap()
	if cl.DryRun {
		st, _ := ReadState(node)
		removed, held, _ := st.RecoverFlapping(ev.GetCheckName(), entities, at, h.now(), flap)
		var acts []*faultlinev1.Action
		if len(held) > 0 {
			acts = append(acts, h.action(it, events.KindUnquarantine, events.OutcomeDryRun, "would hold (flapping, stabilizing): "+fmt.Sprint(held), "", cl))
		}
		if len(removed) > 0 {
			acts = append(acts, h.action(it, events.KindUnquarantine, events.OutcomeDryRun, "would lift: "+fmt.Sprint(removed), "", cl))
		}
		return acts, nil
	}
	// The actions of a write go into the node with it (State.Unsaid): a
	// redelivered recovery finds its faults gone and decides nothing, so a
	// process killed between the write and the produce (or a retry batch
	// failed for another cluster, then restarted) would lose them; the
	// owning replica produces them again (unsaid.go).
	var acts []*faultlinev1.Action
	_, err := h.updateNode(ctx, cl, node, func(n *corev1.Node, st *State) (bool, error) {
		acts = acts[:0] // a conflict re-decides on the node as it is now
		now := h.now()
		manual := st.DetectManualUncordon(n, now)
		removed, held, stale := st.RecoverFlapping(ev.GetCheckName(), entities, at, now, flap)
		for _, k := range removed {
			st.rememberRecovery(k, at, now, h.cfg.RecoveryMemory)
		}
		if manual {
			acts = append(acts, h.newAction(it, events.KindManualUncordon, events.OutcomeDecided, "a person uncordoned the node; its standing faults no longer cordon it", "", cl))
		}
		if len(stale) > 0 && len(removed) == 0 && len(held) == 0 {
			acts = append(acts, h.newAction(it, events.KindSkip, events.OutcomeSkipped, "recovery older than the fault's last occurrence", "", cl))
		}
		if len(removed) > 0 || len(held) > 0 {
			acts = append(acts, h.recoveryAction(it, cl, st, removed, held, flap))
		}
		st.addUnsaid(acts...) // the lift's and the manual uncordon's, not the skip
		return len(removed) > 0 || len(held) > 0 || manual, nil
	})
	if err != nil {
		return nil, err
	}
	h.track(unsaidIDs(acts), false) // in flight until the batch's output is produced
	for _, a := range acts {
		h.m.decisions.WithLabelValues(it.cluster, a.GetKind(), a.GetOutcome()).Inc()
	}
	return acts, nil
}

// recoveryAction is the unquarantine action of a recovery that removed
// or held faults (st: the state after it).
func (h *Handler) recoveryAction(it item, cl *clusters.Client, st *State, removed, held []string, flap FlapPolicy) *faultlinev1.Action {
	remaining := len(st.Faults)
	var liftAt time.Time
	if len(held) > 0 {
		liftAt = st.Faults[held[0]].LiftAt
	}
	if len(removed) == 0 {
		// A flapping fault recovered: it stands until its entity has been
		// healthy for stabilization_window (the sweep lifts it then).
		a := h.newAction(it, events.KindUnquarantine, events.OutcomeDeferred, fmt.Sprintf(
			"flapping fault (%d+ occurrences within %v) recovered: stands, stabilizing, until %s unless it recurs",
			flap.Threshold, flap.Window, liftAt.UTC().Format(time.RFC3339)), "", cl)
		a.Details[events.DetailStabilizing] = fmt.Sprint(held)
		a.Details[events.DetailLiftAt] = liftAt.UTC().Format(time.RFC3339)
		a.Details[events.DetailRemaining] = strconv.Itoa(remaining)
		return a
	}
	outcome, reason := events.OutcomeApplied, "every fault recovered; lifted what faultline set"
	switch {
	case remaining == 0 && st.Overflow != nil:
		outcome, reason = events.OutcomeInProgress, fmt.Sprintf(
			"every fault kept recovered; held quarantined until a manual uncordon: %d cordoning faults were dropped (more than %d standing)", st.Overflow.Dropped, maxFaults)
	case remaining > 0:
		outcome, reason = events.OutcomeInProgress, fmt.Sprintf("fault recovered; %d still standing", remaining)
	}
	a := h.newAction(it, events.KindUnquarantine, outcome, reason, "", cl)
	a.Details[events.DetailRecovered] = fmt.Sprint(removed)
	a.Details[events.DetailRemaining] = strconv.Itoa(remaining)
	a.Details[events.DetailUncordoned] = strconv.FormatBool(st.Cordoned && !st.Active())
	if len(held) > 0 {
		a.Details[events.DetailStabilizing] = fmt.Sprint(held)
		a.Details[events.DetailLiftAt] = liftAt.UTC().Format(time.RFC3339)
	}
	return a
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

// predates reports whether ev was received (the gateway's time) before the
// Node object n was created, and its creation time. Node names are reused
// — on AWS the private DNS name of an IP handed to a replacement instance,
// on premises a replaced server's hostname — and a new machine registers a
// new Node object; an event received before that is of the machine the
// name belonged to before (a Kafka backlog, a retry topic, a requeue), not
// of this one. Both clocks are the control plane's (the gateway's and the
// apiserver's), never an agent's. An event without a received time (an
// older record) is not compared.
func predates(ev *datamodels.HealthEvent, n *corev1.Node) (time.Time, bool) {
	rt := ev.GetReceivedTimestamp()
	created := n.CreationTimestamp.Time
	if rt == nil || !rt.IsValid() || created.IsZero() {
		return time.Time{}, false
	}
	return created, rt.AsTime().Before(created)
}

// otherMachine returns the system UUID node n reports when ev names
// another machine (events.MetaSystemUUID, stamped by the node's agent):
// a Node object kept across a machine swap (the new machine's kubelet
// registered under the same name, the object not deleted) and a late
// event of the machine before. An event or a node that names none is of
// the node's machine, as before (another sender, an agent not root).
func otherMachine(ev *datamodels.HealthEvent, n *corev1.Node) (string, bool) {
	if n == nil {
		return "", false
	}
	m, now := ev.GetMetadata()[events.MetaSystemUUID], n.Status.NodeInfo.SystemUUID
	return now, m != "" && now != "" && !strings.EqualFold(m, now)
}
