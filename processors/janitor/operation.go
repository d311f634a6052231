package janitor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// operation is one reconcile of one resource.
type operation struct {
	j        *Janitor
	cr       *clusterRun
	kd       kind
	u        *unstructured.Unstructured
	key      string
	nodeName string
	node     *corev1.Node
	force    bool
	st       *opState
}

func (op *operation) res() dynamic.ResourceInterface { return op.cr.cl.Dynamic.Resource(op.kd.GVR) }

func (op *operation) ref() string { return op.kd.Name + "/" + op.u.GetName() }

// notDrained says why op.node may not be acted on under require_drained
// ("" when it may): faultline has not quarantined and drained it, or its
// drain is older than its quarantine, or (a reboot, a terminate) its drain
// took only some GPUs' pods. Not asked when spec.force is set.
func (op *operation) notDrained() string {
	if !op.j.cfg.RequireDrained || op.force {
		return ""
	}
	q, d := op.node.Labels[labelQuarantined], op.node.Labels[labelDrain]
	if q != "true" || (d != "succeeded" && d != "gave_up") {
		return fmt.Sprintf("node %s is not quarantined and drained by faultline (%s=%q, %s=%q) and spec.force is not set",
			op.nodeName, labelQuarantined, q, labelDrain, d)
	}
	if why := staleDrain(op.node); why != "" {
		return fmt.Sprintf("node %s is not drained for its current quarantine: %s; spec.force is not set", op.nodeName, why)
	}
	if op.kd != kindGPUReset {
		if why := partialDrain(op.node); why != "" {
			return fmt.Sprintf("node %s is not drained for a %s: %s; spec.force is not set", op.nodeName, op.kd.Name, why)
		}
	}
	return ""
}

// drainRunning reports whether faultline is draining the quarantined node
// now (what notDrained refuses may then be over soon).
func (op *operation) drainRunning() bool {
	return op.j.cfg.RequireDrained && !op.force && op.node.Labels[labelQuarantined] == "true" && op.node.Labels[labelDrain] == "running"
}

// queuedTooLong says why the resource, not started, may no longer be
// ("" when it may): it was created more than max_queue_age ago. It waited
// for a slot, the node's cooldown or a boot ID (none of which writes its
// status), or for a janitor at all; the remediate role counts it failed
// once its queue_timeout passes, and escalates the node: a signal sent
// after that would reboot a node handed to a human.
func (op *operation) queuedTooLong() string {
	created := op.u.GetCreationTimestamp().Time
	if op.j.cfg.MaxQueueAge <= 0 || created.IsZero() {
		return ""
	}
	if age := op.j.now().Sub(created); age > op.j.cfg.MaxQueueAge {
		return fmt.Sprintf("not started within max_queue_age (%v) of its creation (%v ago): nothing was sent to node %s",
			op.j.cfg.MaxQueueAge, age.Round(time.Second), op.nodeName)
	}
	return ""
}

// escalatedSince says why the resource, not started, may not be ("" when
// it may): its node was escalated to CONTACT_SUPPORT (the remediate
// role's annotationEscalated, "<RFC 3339> <why>") at or after the
// resource's creation. The remediate role gave up on the node — this
// resource counted failed past its queue_timeout, or another of the
// node's remediations failed — and a human has it now: nothing is sent.
// An escalation older than the resource was answered by creating it.
func (op *operation) escalatedSince() string {
	v := op.node.Annotations[annotationEscalated]
	if v == "" {
		return ""
	}
	ts, why, _ := strings.Cut(v, " ")
	at, err := time.Parse(time.RFC3339Nano, ts)
	// Both times by the remediate role's clock where it wrote its own
	// (annotationCreated).
	created, cerr := time.Parse(time.RFC3339Nano, op.u.GetAnnotations()[annotationCreated])
	if cerr != nil {
		created = op.u.GetCreationTimestamp().Time
	}
	if err != nil || created.IsZero() {
		return ""
	}
	// Compared exactly when both have sub-second precision (the remediate
	// role writes both with nanoseconds); else to the second, an
	// escalation of the resource's second counting as after it.
	if !subSecond(ts) || cerr != nil {
		at, created = at.Truncate(time.Second), created.Truncate(time.Second)
	}
	if at.Before(created) {
		return ""
	}
	return fmt.Sprintf("node %s was escalated to CONTACT_SUPPORT at %s, after %s was created (%s): nothing was sent",
		op.nodeName, ts, op.ref(), why)
}

// subSecond: the RFC 3339 time ts has a fraction of a second.
func subSecond(ts string) bool {
	_, frac, ok := strings.Cut(ts, ".")
	return ok && frac != ""
}

// awaitsBootID is a reboot of a node that reports no boot ID yet: its end
// could not be told.
func (op *operation) awaitsBootID() bool {
	return op.kd == kindReboot && op.node.Status.NodeInfo.BootID == ""
}

// dryRun is the whole reconcile of a resource in a dry-run cluster: its
// one dry_run action, and nothing sent, deleted or written — for an
// operation already in progress too (its signal recorded before the
// cluster was made dry-run: no forced reboot, power-on, GPU reset asked
// again, Node deleted or status written; it is followed again once the
// cluster is not dry-run, its timeouts counted from its record).
func (op *operation) dryRun(ctx context.Context) {
	if op.j.remember(op.u.GetUID(), func(m *memory) { m.dryRun = true }).dryRun {
		return
	}
	what := fmt.Sprintf("would carry out %s on node %s (cluster is dry-run)", op.ref(), op.nodeName)
	if op.st != nil {
		what = fmt.Sprintf("would follow %s on node %s, its signal recorded at %s by %s (cluster is dry-run: nothing is sent, deleted or written)",
			op.ref(), op.nodeName, op.st.At.Format(time.RFC3339), op.st.By)
	}
	a := op.action(events.OutcomeDryRun, what, "dry_run", nil)
	a.DryRun = true
	op.emit(ctx, a)
}

// start checks the safety rules and sends the signal.
func (op *operation) start(ctx context.Context) (time.Duration, error) {
	j := op.j
	var err error
	if op.node, err = op.cr.findNode(ctx, op.nodeName); err != nil {
		return 0, err
	}
	read := false // op.node is the API server's copy
	if op.node != nil && (op.notDrained() != "" || op.awaitsBootID()) {
		// The watch's copy may be behind a write made just before the
		// resource: the drain role's label, the kubelet's boot ID. A node
		// the checks below would refuse or wait for is read from the API
		// server first.
		if op.node, err = op.cr.readNode(ctx, op.nodeName); err != nil {
			return 0, err
		}
		read = true
	}
	if wait, stop, err := op.refused(ctx); stop {
		return wait, err
	}
	pname, nodeKey, err := j.cfg.providerName(op.node)
	if err != nil {
		return 0, op.fail(ctx, ReasonNoProvider, err.Error(), false)
	}
	prov := j.providers[pname]
	if prov == nil {
		why := "no provider for node " + op.nodeName + " (label " + LabelProvider + ", annotation/label " + AnnotationProvider +
			", providerID " + op.node.Spec.ProviderID + ", default_provider)"
		if pname != "" {
			why = fmt.Sprintf("provider %q of node %s is not configured", pname, op.nodeName)
		}
		return 0, op.fail(ctx, ReasonNoProvider, why, false)
	}
	if op.awaitsBootID() {
		return op.waitBootID(ctx)
	}
	if wait := op.claimNode(); wait > 0 {
		op.deferOnce(ctx, fmt.Sprintf("node %s is in its cooldown (%v) for %v more", op.nodeName, j.cfg.Cooldown, wait.Round(time.Second)))
		return wait, nil
	}
	if lim := j.lim.acquire(op.key, op.cr.name, j.rack(op.node, op.nodeName), pname, false); lim != "" {
		op.unclaimNode()
		op.deferOnce(ctx, "waiting for a slot: "+lim+" reached")
		return time.Second, nil
	}
	if !read {
		// The checks above passed on the watch's copy, which may lag
		// behind the API server's (a re-list after "too old resource
		// version", a slow apiserver): a node lifted since, or being
		// drained again, still read quarantined and drained, and was
		// rebooted with the pods scheduled since on it. The node is read
		// from the API server and checked again before the signal is
		// recorded: one GET per signal.
		wait, stop := time.Duration(0), false
		if op.node, err = op.cr.readNode(ctx, op.nodeName); err == nil {
			if wait, stop, err = op.refused(ctx); !stop && op.awaitsBootID() {
				wait, err = op.waitBootID(ctx)
				stop = true
			}
		}
		if err != nil || stop {
			j.lim.release(op.key)
			op.unclaimNode()
			return wait, err
		}
	}
	// Record the signal before sending it.
	st := opState{Step: "signal", At: j.now().UTC(), BootID: op.node.Status.NodeInfo.BootID, NodeUID: string(op.node.UID),
		Provider: pname, By: j.cfg.Identity}
	err = op.record(ctx, st)
	if apierrors.IsConflict(err) {
		j.lim.release(op.key)
		op.unclaimNode()
		return time.Second, nil // re-read; another janitor may have it
	}
	if err != nil {
		j.lim.release(op.key)
		op.unclaimNode()
		if op.kd != kindGPUReset {
			// The apiserver may have stored it all the same (the answer
			// timed out, the connection was cut): found, it is known here
			// to be unsent, and follow sends it (a GPU reset is asked
			// again there anyway).
			j.keepUnsent(op.u.GetUID(), unsentRecord{cluster: op.cr.name, state: st.encode(), nodeKey: nodeKey})
		}
		return 0, fmt.Errorf("record %s state: %w", op.ref(), err)
	}
	return op.signal(ctx, prov, pname, nodeKey)
}

// refused applies the safety rules to op.node before a signal: stop is
// true when the resource may not be started now — failed (no such node,
// not drained, escalated, queued too long; err says why a write failed)
// or waiting (wait) for its node's drain.
func (op *operation) refused(ctx context.Context) (wait time.Duration, stop bool, err error) {
	if op.node == nil {
		return 0, true, op.fail(ctx, ReasonNodeNotFound, fmt.Sprintf("node %s not found", op.nodeName), false)
	}
	notDrained := op.notDrained()
	if notDrained != "" && !op.drainRunning() {
		return 0, true, op.fail(ctx, ReasonNotDrained, notDrained, false)
	}
	if why := op.escalatedSince(); why != "" {
		return 0, true, op.fail(ctx, ReasonEscalated, why, false)
	}
	if why := op.queuedTooLong(); why != "" {
		return 0, true, op.fail(ctx, ReasonQueueTimeout, why, false)
	}
	if notDrained != "" {
		// A drain of the quarantined node under way (a fault that came
		// while the resource waited: a GPU's reset after the node's
		// whole-node drain): waited for, up to max_queue_age. Refused,
		// remediate took it for cancelled and nothing remediated the
		// node's standing fault.
		op.deferOnce(ctx, fmt.Sprintf("node %s is being drained (%s=running): waiting for its drain to end", op.nodeName, labelDrain))
		return op.j.cfg.PollInterval, true, nil
	}
	return 0, false, nil
}

// waitBootID waits for the boot ID of a reboot's node (awaitsBootID): a
// reboot is over at a boot ID other than the one recorded with its
// signal: recorded empty, the first one the kubelet reports (of the same
// boot) would read as the reboot done. Waited for up to reboot_timeout,
// then failed: not left to the remediate role's completion_timeout.
func (op *operation) waitBootID(ctx context.Context) (time.Duration, error) {
	j := op.j
	if created := op.u.GetCreationTimestamp().Time; !created.IsZero() && j.now().Sub(created) > j.cfg.RebootTimeout {
		return 0, op.fail(ctx, ReasonNoBootID, fmt.Sprintf("node %s reported no boot ID (status.nodeInfo.bootID) within %v: a reboot's end could not be told, so none was sent",
			op.nodeName, j.cfg.RebootTimeout), false)
	}
	op.deferOnce(ctx, fmt.Sprintf("node %s reports no boot ID (status.nodeInfo.bootID) yet: a reboot's end could not be told; waiting for its kubelet (up to %v)", op.nodeName, j.cfg.RebootTimeout))
	return j.cfg.PollInterval, nil
}

// signal sends the signal recorded as op.st through prov (pname), and
// writes its outcome; nodeKey is the node's own key that picked pname.
func (op *operation) signal(ctx context.Context, prov Provider, pname, nodeKey string) (time.Duration, error) {
	j := op.j
	var err error
	j.m.started.WithLabelValues(op.cr.name, op.kd.ActionKind, pname).Inc()
	named := op.nodeNamed(pname, nodeKey)
	t := Target{Cluster: op.cr.name, Node: op.node, Kube: op.cr.cl.Kube, RequestID: string(op.u.GetUID()) + "/signal"}
	switch op.kd {
	case kindGPUReset:
		return op.resetGPUs(ctx, prov, t)
	case kindTerminate:
		err = prov.Terminate(ctx, t)
	default:
		err = prov.Reboot(ctx, t, Graceful)
	}
	if err != nil && ctx.Err() != nil {
		// Stopping mid-signal: the state is recorded; whoever resumes it
		// does not send it again.
		return 0, ctx.Err()
	}
	if errors.Is(err, ErrMaybeSent) {
		// Written, never answered: the machine may be doing it. Followed
		// as a sent signal (a new boot ID, else reboot_timeout), never sent
		// again; not a failed signal, which the remediate role escalates.
		msg := fmt.Sprintf("%s signal may have been sent via %s, not sent again: %v", op.kd.ActionKind, pname, err)
		j.remember(op.u.GetUID(), func(m *memory) { m.maybeSentMsg = msg })
		op.emit(ctx, op.action(events.OutcomeApplied, msg+" (node "+op.nodeName+")", "signal", named))
		if err := op.writeStatus(ctx, false, cond{CondSignalSent, "True", ReasonMaybeSent, msg}, cond{op.kd.Result, "Unknown", ReasonInitializing, "waiting for the node"}); err != nil {
			return 0, err
		}
		return j.cfg.PollInterval, nil
	}
	if err != nil {
		reason, msg := reasonOf(err), fmt.Sprintf("%s via %s: %v", op.kd.ActionKind, pname, err)
		j.remember(op.u.GetUID(), func(m *memory) { m.failReason, m.failMsg = reason, msg })
		return 0, op.fail(ctx, reason, msg, true)
	}
	j.remember(op.u.GetUID(), func(m *memory) { m.signalSent = true })
	if created := op.u.GetCreationTimestamp().Time; !created.IsZero() {
		j.m.signalLatency.WithLabelValues(op.cr.name).Observe(j.now().Sub(created).Seconds())
	}
	msg := fmt.Sprintf("%s signal sent via %s", op.kd.ActionKind, pname)
	if keys := named[events.DetailNodeNamed]; keys != "" {
		msg += " following the node's own " + keys + " (its kubelet may write it)"
	}
	// The action before the status it reports, here and at every step: a
	// janitor that stops in between finds the step not written and does it
	// again, producing the same action (same id) again.
	op.emit(ctx, op.action(events.OutcomeApplied, msg+" to node "+op.nodeName, "signal", named))
	if err := op.writeStatus(ctx, false, cond{CondSignalSent, "True", ReasonSucceeded, msg}, cond{op.kd.Result, "Unknown", ReasonInitializing, "waiting for the node"}); err != nil {
		return 0, err
	}
	return j.cfg.PollInterval, nil
}

// nodeNamed accounts for the node's own keys (its kubelet may write them)
// that the signal about to be sent through pname follows: each counted
// in faultline_janitor_node_named_total and warned of (one signal, one
// warning: no set of nodes warned of to grow with the fleet), and
// returned as the signal action's details (nil when none). A compromised
// node can point them elsewhere: another node's BMC, another provider
// (SECURITY.md, "What a node may say about itself").
func (op *operation) nodeNamed(pname, nodeKey string) map[string]string {
	j := op.j
	keys := j.cfg.nodeNamed(op.node, pname, nodeKey)
	if len(keys) == 0 {
		return nil
	}
	for _, k := range keys {
		j.m.nodeNamed.WithLabelValues(op.cr.name, k).Inc()
		j.log.Warn("janitor: a signal follows the node's own "+k+" (its kubelet may write it); name it with a "+
			corev1.LabelNamespaceNodeRestriction+"/ label and set janitor.redfish.labels_only",
			"cluster", op.cr.name, "node", op.nodeName, "key", k, "value", op.node.Annotations[k]+op.node.Labels[k], "provider", pname)
	}
	return map[string]string{events.DetailNodeNamed: strings.Join(keys, ",")}
}

// resetGPUs asks for a GPU reset and completes the resource once the
// provider says it ran; while it runs (ErrInProgress) the resource says
// so and the janitor asks again each poll, within gpu_reset_timeout; a
// poll that says nothing of the accepted reset (pollError) too.
func (op *operation) resetGPUs(ctx context.Context, prov Provider, t Target) (time.Duration, error) {
	j := op.j
	var uuids []string
	if raw, ok, _ := unstructured.NestedStringSlice(op.u.Object, "spec", "selector", "uuids"); ok {
		uuids = raw
	}
	what := "every GPU"
	if len(uuids) > 0 {
		what = strings.Join(uuids, ",")
	}
	err := prov.ResetGPUs(ctx, t, uuids)
	// Sent unanswered (ErrMaybeSent): the agent may be resetting; asked
	// again at the next poll (the same request id gets the first answer).
	if errors.Is(err, ErrInProgress) || errors.Is(err, ErrMaybeSent) {
		if !condIs(op.u, CondResetJobCreated, "True") {
			msg := fmt.Sprintf("reset of %s sent via %s; the node is resetting", what, op.st.Provider)
			op.emit(ctx, op.action(events.OutcomeInProgress, msg+" (node "+op.nodeName+")", "signal", nil))
			if err := op.writeStatus(ctx, false, cond{CondReady, "True", ReasonSucceeded, "accepted"},
				cond{CondResetJobCreated, "True", ReasonSucceeded, msg}); err != nil {
				return 0, err
			}
		}
		return j.cfg.PollInterval, nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if condIs(op.u, CondResetJobCreated, "True") && pollError(err) {
			// The agent accepted the reset; this poll did not reach it or
			// could not read its answer (a restart, a blip, a proxy's
			// 502). Asked again at the next poll: follow ends it Timeout
			// past gpu_reset_timeout. Logged at the reset's first
			// failed poll, then at most once a minute: an agent that
			// is down fails every poll_interval.
			switch named, full := j.pollWarned.Allow(op.cr.name+"/"+string(op.u.GetUID()), j.now()); {
			case named:
				j.log.Warn("janitor: a running GPU reset could not be polled; asked again", "cluster", op.cr.name, "resource", op.ref(),
					"node", op.nodeName, "provider", op.st.Provider, "err", err)
			case full:
				j.log.Warn("janitor: more running GPU resets could not be polled; asked again, not named until the minute ends", "cluster", op.cr.name)
			}
			return j.cfg.PollInterval, nil
		}
		reason := reasonOf(err)
		if reason == ReasonFailed {
			reason = ReasonResetJobFailed
		}
		return 0, op.fail(ctx, reason, fmt.Sprintf("reset of %s via %s: %v", what, op.st.Provider, err), true)
	}
	msg := fmt.Sprintf("reset %s of node %s via %s", what, op.nodeName, op.st.Provider)
	op.emit(ctx, op.action(events.OutcomeSucceeded, msg, "complete", nil))
	if err := op.writeStatus(ctx, true, cond{CondReady, "True", ReasonSucceeded, "accepted"},
		cond{CondResetJobCreated, "True", ReasonSucceeded, "sent via " + op.st.Provider},
		cond{CondComplete, "True", ReasonGPUResetSucceeded, msg}); err != nil {
		return 0, err
	}
	j.lim.release(op.key)
	j.m.completed.WithLabelValues(op.cr.name, op.kd.ActionKind, events.OutcomeSucceeded).Inc()
	return 0, nil
}

// pollError is whether err, asking about a reset the provider accepted,
// says nothing of the reset: the agent unreachable, or no reason at all
// (an answer that is not the agent's). The agent's own answers
// (CommandFailed, Interrupted, GPUInUse, …), a refused signature and
// ErrUnsupported are final.
func pollError(err error) bool {
	var pe *ProviderError
	if errors.As(err, &pe) {
		return pe.Reason == ReasonAgentUnreachable
	}
	return !errors.Is(err, ErrUnsupported)
}

// cooldown is how long the node must still wait: another resource of the
// node recorded a signal within Config.Cooldown.
func (op *operation) cooldown() time.Duration {
	j := op.j
	if j.cfg.Cooldown <= 0 {
		return 0
	}
	var last time.Time
	for _, idx := range op.cr.res {
		objs, _ := idx.ByIndex(nodeIndex, op.nodeName)
		for _, o := range objs {
			u := o.(*unstructured.Unstructured)
			if u.GetUID() == op.u.GetUID() {
				continue
			}
			if st := stateOf(u); st != nil && st.At.After(last) {
				last = st.At
			}
		}
	}
	if last.IsZero() {
		return 0
	}
	return last.Add(j.cfg.Cooldown).Sub(j.now())
}

// claimNode is cooldown, and when it is over, claims the node for this
// resource until Config.Cooldown passes; a resource of the node that
// another worker claimed meanwhile waits for it. The watch's copy of the
// node's other resources shows their state records only some time after
// they were written: two resources of a node taken by two workers at once
// both passed the cooldown read from it, and the node got both signals.
// Nothing to claim without a cooldown.
func (op *operation) claimNode() time.Duration {
	j, cr := op.j, op.cr
	if j.cfg.Cooldown <= 0 {
		return 0
	}
	cr.claimMu.Lock()
	defer cr.claimMu.Unlock()
	now := j.now()
	for n, c := range cr.claims { // the expired go: the map follows the nodes signalled within a cooldown
		if now.Sub(c.at) >= j.cfg.Cooldown {
			delete(cr.claims, n)
		}
	}
	if c, ok := cr.claims[op.nodeName]; ok && c.uid != op.u.GetUID() {
		return c.at.Add(j.cfg.Cooldown).Sub(now)
	}
	if wait := op.cooldown(); wait > 0 {
		return wait
	}
	if cr.claims == nil {
		cr.claims = map[string]nodeClaim{}
	}
	cr.claims[op.nodeName] = nodeClaim{uid: op.u.GetUID(), at: now}
	return 0
}

// unclaimNode drops the resource's claim on its node: its signal was not
// recorded.
func (op *operation) unclaimNode() {
	cr := op.cr
	cr.claimMu.Lock()
	defer cr.claimMu.Unlock()
	if c, ok := cr.claims[op.nodeName]; ok && c.uid == op.u.GetUID() {
		delete(cr.claims, op.nodeName)
	}
}

// deferOnce writes a deferred action the first time a resource waits.
func (op *operation) deferOnce(ctx context.Context, why string) {
	j := op.j
	if !j.remember(op.u.GetUID(), func(m *memory) { m.deferred = true }).deferred {
		j.m.deferred.WithLabelValues(op.cr.name).Inc()
		op.emit(ctx, op.action(events.OutcomeDeferred, why, "deferred", nil))
	}
}

// follow observes an operation whose signal was recorded.
func (op *operation) follow(ctx context.Context) (time.Duration, error) {
	j := op.j
	var err error
	if op.node, err = op.cr.findNode(ctx, op.nodeName); err != nil {
		return 0, err
	}
	j.lim.acquire(op.key, op.cr.name, j.rack(op.node, op.nodeName), op.st.Provider, true)
	if !condIs(op.u, CondSignalSent, "True") && op.kd != kindGPUReset {
		// Read it fresh: the cache may be behind our own write.
		fresh, err := op.res().Get(ctx, op.u.GetName(), metav1.GetOptions{})
		if err != nil {
			return 0, fmt.Errorf("get %s: %w", op.ref(), err)
		}
		op.u = fresh
		if finished(fresh) {
			j.lim.release(op.key)
			return 0, nil
		}
		if m := j.recall(op.u.GetUID()); !condIs(fresh, CondSignalSent, "True") && m.failReason != "" {
			// This janitor's provider refused the signal; writing the
			// failure failed: write it now (not "recorded, may have gone out").
			if err := op.fail(ctx, m.failReason, m.failMsg, true); err != nil {
				return 0, op.writeRefused(ctx, err, m.failMsg, false)
			}
			return 0, nil
		}
		if m := j.recall(op.u.GetUID()); !condIs(fresh, CondSignalSent, "True") && m.maybeSentMsg != "" {
			// Sent unanswered by this janitor; writing it failed: now.
			op.emit(ctx, op.action(events.OutcomeApplied, m.maybeSentMsg+" (node "+op.nodeName+")", "signal", nil))
			if err := op.writeStatus(ctx, false, cond{CondSignalSent, "True", ReasonMaybeSent, m.maybeSentMsg},
				cond{op.kd.Result, "Unknown", ReasonInitializing, "waiting for the node"}); err != nil {
				return 0, op.writeRefused(ctx, err, m.maybeSentMsg, true)
			}
			return j.cfg.PollInterval, nil
		}
		if !condIs(fresh, CondSignalSent, "True") && j.recall(op.u.GetUID()).signalSent {
			// This janitor sent it; writing SignalSent failed: write it now
			// (else the resource waits here for ever, holding its slot).
			msg := fmt.Sprintf("%s signal sent via %s", op.kd.ActionKind, op.st.Provider)
			op.emit(ctx, op.action(events.OutcomeApplied, msg+" to node "+op.nodeName, "signal", nil))
			if err := op.writeStatus(ctx, false, cond{CondSignalSent, "True", ReasonSucceeded, msg},
				cond{op.kd.Result, "Unknown", ReasonInitializing, "waiting for the node"}); err != nil {
				return 0, op.writeRefused(ctx, err, msg, true)
			}
			return j.cfg.PollInterval, nil
		}
		if st := stateOf(fresh); !condIs(fresh, CondSignalSent, "True") && j.isUnsent(op.u.GetUID(), st) {
			// Recorded by this janitor, whose write answered an error
			// though it was stored; it sent nothing. Sent now, once.
			op.st = st
			return op.sendUnsent(ctx)
		}
		if !condIs(fresh, CondSignalSent, "True") {
			// Recorded by a janitor that stopped before it wrote
			// SignalSent (or by this one before it restarted): it may
			// have been sent. Never twice.
			msg := fmt.Sprintf("the signal was recorded at %s by %s, which stopped before confirming it; not sent again",
				op.st.At.Format(time.RFC3339), op.st.By)
			op.emit(ctx, op.action(events.OutcomeInProgress, "resumed "+op.ref()+": "+msg, "resumed", nil))
			if err := op.writeStatus(ctx, false, cond{CondSignalSent, "True", ReasonRecorded, msg},
				cond{op.kd.Result, "Unknown", ReasonInitializing, "waiting for the node"}); err != nil {
				return 0, err
			}
			return j.cfg.PollInterval, nil
		}
	}
	switch op.kd {
	case kindGPUReset:
		// The cache may be behind the Complete this janitor just wrote.
		fresh, err := op.res().Get(ctx, op.u.GetName(), metav1.GetOptions{})
		if err != nil {
			return 0, fmt.Errorf("get %s: %w", op.ref(), err)
		}
		if op.u = fresh; finished(fresh) {
			j.lim.release(op.key)
			return 0, nil
		}
		// Recorded but not completed: the reset is running, or was
		// interrupted. Only the node-local agent resets GPUs, and it
		// answers a repeated request id with the first answer (or
		// in_progress), so sending it again is safe.
		prov := j.providers[op.st.Provider]
		if prov == nil {
			return 0, op.fail(ctx, ReasonNoProvider, "provider "+op.st.Provider+" is not configured", true)
		}
		if j.now().Sub(op.st.At) > j.cfg.GPUResetTimeout {
			return 0, op.fail(ctx, ReasonTimeout, fmt.Sprintf("not completed within %v", j.cfg.GPUResetTimeout), true)
		}
		if op.node == nil {
			// Deleted while its GPUs reset: there is no agent to ask.
			return 0, op.fail(ctx, ReasonNodeNotFound, fmt.Sprintf("node %s is gone; its GPU reset cannot be followed", op.nodeName), true)
		}
		return op.resetGPUs(ctx, prov, Target{Cluster: op.cr.name, Node: op.node, Kube: op.cr.cl.Kube, RequestID: string(op.u.GetUID()) + "/signal"})
	case kindTerminate:
		return op.followTerminate(ctx)
	}
	return op.followReboot(ctx)
}

// writeRefused is what follow returns when the status write of a signal's
// outcome known to this janitor (what: refused by the provider, or sent —
// answered or not) failed with err: err, retried with backoff, unless the
// apiserver refused it as invalid (it refuses it every time) or the
// operation's timeout (reboot_timeout, terminate_timeout) passed. Then
// the resource ends failed with a reason the CRDs accept — the result
// condition False/Failed, and SignalSent=False/Failed too when the
// provider refused the signal (sent false) — and gives its slot back.
// Before, the write was retried for the life of the process, past the
// timeout, the resource holding its slots (taken again after a restart).
func (op *operation) writeRefused(ctx context.Context, err error, what string, sent bool) error {
	timeout := op.j.cfg.RebootTimeout
	if op.kd == kindTerminate {
		timeout = op.j.cfg.TerminateTimeout
	}
	if ctx.Err() != nil || (!apierrors.IsInvalid(err) && op.j.now().Sub(op.st.At) <= timeout) {
		return err
	}
	msg := fmt.Sprintf("writing the signal's outcome failed (%v): %s", err, what)
	if !sent {
		return op.fail(ctx, ReasonFailed, msg, false)
	}
	return op.failed(ctx, ReasonFailed, msg, cond{op.kd.Result, "False", ReasonFailed, msg})
}

// sendUnsent sends the signal of op.st, a record of this process's that
// it did not send (isUnsent): its node checked again as start checks it
// (it may have been lifted since), then taken from memory and sent.
func (op *operation) sendUnsent(ctx context.Context) (time.Duration, error) {
	j := op.j
	if op.node != nil && op.notDrained() != "" {
		var err error
		if op.node, err = op.cr.readNode(ctx, op.nodeName); err != nil {
			return 0, err
		}
	}
	r, ok := j.takeUnsent(op.u.GetUID(), op.st)
	if !ok {
		return j.cfg.PollInterval, nil
	}
	if op.node == nil {
		return 0, op.fail(ctx, ReasonNodeNotFound, fmt.Sprintf("node %s not found; its signal, recorded, was not sent", op.nodeName), false)
	}
	if why := op.notDrained(); why != "" {
		return 0, op.fail(ctx, ReasonNotDrained, why+"; the signal, recorded, was not sent", false)
	}
	prov := j.providers[op.st.Provider]
	if prov == nil {
		return 0, op.fail(ctx, ReasonNoProvider, fmt.Sprintf("provider %q of node %s is not configured", op.st.Provider, op.nodeName), false)
	}
	return op.signal(ctx, prov, op.st.Provider, r.nodeKey)
}

// record writes st as the resource's state annotation (optimistic
// concurrency: a second janitor, or a stale cache, gets a conflict).
func (op *operation) record(ctx context.Context, st opState) error {
	obj := op.u.DeepCopy()
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[AnnotationState] = st.encode()
	obj.SetAnnotations(ann)
	upd, err := op.res().Update(ctx, obj, metav1.UpdateOptions{FieldManager: "faultline-janitor"})
	if err != nil {
		return err
	}
	op.u, op.st = upd, &st
	return nil
}

// rebooted is whether op.node is Ready with another boot ID than the one
// recorded with the signal: the reboot is over.
func (op *operation) rebooted() bool {
	n := op.node
	return n != nil && nodeReady(n) && n.Status.NodeInfo.BootID != "" && n.Status.NodeInfo.BootID != op.st.BootID
}

func (op *operation) followReboot(ctx context.Context) (time.Duration, error) {
	j := op.j
	if _, unsent := j.providers[op.st.Provider].(forceless); !op.st.ForcedAt.IsZero() && !unsent && !j.isUnsent(op.u.GetUID(), op.st) &&
		!j.remember(op.u.GetUID(), func(m *memory) { m.forced = true }).forced {
		// A forced reboot recorded before this janitor started: its
		// recorder may have stopped before it produced the action. Not
		// sent again, but audited (the same id at each restart). A
		// provider without one (forceless) sent none: nothing to audit.
		op.emit(ctx, op.action(events.OutcomeInProgress, fmt.Sprintf("resumed %s: a forced reboot was recorded at %s; not sent again",
			op.ref(), op.st.ForcedAt.Format(time.RFC3339)), "force-resumed", nil))
	}
	elapsed := j.now().Sub(op.st.At)
	if op.node != nil && !op.rebooted() && (elapsed > j.cfg.RebootTimeout || (op.st.ForcedAt.IsZero() &&
		((j.cfg.ForceAfter > 0 && elapsed > j.cfg.ForceAfter) || (j.cfg.HungAfter > 0 && op.downFor() > j.cfg.HungAfter)))) {
		// Past the point where the watch's copy would have the reboot
		// forced or failed: a watch behind the kubelet's new boot ID would
		// start a machine that came back over, or fail a reboot that
		// worked. The node is read from the apiserver first (on this path
		// only: abnormal reboots, one GET a poll; a node the watch lacks
		// was read from it already).
		var err error
		if op.node, err = op.cr.readNode(ctx, op.nodeName); err != nil {
			return 0, err
		}
	}
	if op.rebooted() {
		n := op.node
		msg := fmt.Sprintf("node %s is Ready with a new boot ID %s (was %s) after %v", op.nodeName, n.Status.NodeInfo.BootID, op.st.BootID, elapsed.Round(time.Second))
		op.emit(ctx, op.action(events.OutcomeSucceeded, msg, "complete", nil))
		if err := op.writeStatus(ctx, true, cond{CondNodeReady, "True", ReasonSucceeded, msg}); err != nil {
			return 0, err
		}
		j.lim.release(op.key)
		j.m.completed.WithLabelValues(op.cr.name, op.kd.ActionKind, events.OutcomeSucceeded).Inc()
		return 0, nil
	}
	if elapsed > j.cfg.RebootTimeout {
		why := fmt.Sprintf("node %s did not come back Ready with a new boot ID within %v", op.nodeName, j.cfg.RebootTimeout)
		if op.node == nil {
			why = fmt.Sprintf("node %s is gone and did not come back within %v", op.nodeName, j.cfg.RebootTimeout)
		}
		return 0, op.fail(ctx, ReasonTimeout, why, true)
	}
	// A forced reboot this janitor recorded, whose write answered an error
	// though it was stored: it sent nothing. Sent now, once.
	// Its node is read from the apiserver first, as it is checked again
	// (liftedBeforeForce).
	if !op.st.ForcedAt.IsZero() && op.node != nil && j.isUnsent(op.u.GetUID(), op.st) {
		var err error
		if op.node, err = op.cr.readNode(ctx, op.nodeName); err != nil {
			return 0, err
		}
	}
	if !op.st.ForcedAt.IsZero() && op.node != nil {
		if r, ok := j.takeUnsent(op.u.GetUID(), op.st); ok {
			j.remember(op.u.GetUID(), func(m *memory) { m.forced = true })
			if next, done, err := op.liftedBeforeForce(ctx); done {
				return next, err
			}
			if prov := j.providers[op.st.Provider]; prov != nil {
				if next, done, err := op.sendForce(ctx, prov, r.why); done {
					return next, err
				}
			}
		}
	}
	// A graceful reboot that has not taken the node down: force it, once.
	if j.cfg.ForceAfter > 0 && op.st.ForcedAt.IsZero() && elapsed > j.cfg.ForceAfter && op.node != nil && nodeReady(op.node) &&
		op.node.Status.NodeInfo.BootID == op.st.BootID {
		if next, done, err := op.liftedBeforeForce(ctx); done {
			return next, err
		}
		if prov := j.providers[op.st.Provider]; prov != nil {
			if next, done, err := op.forceReboot(ctx, prov, fmt.Sprintf("the graceful one did not take node %s down within %v", op.nodeName, j.cfg.ForceAfter)); done {
				return next, err
			}
		}
	}
	if next, done, err := op.followDownMachine(ctx, elapsed); done {
		return next, err
	}
	return j.cfg.PollInterval, nil
}

// liftedBeforeForce ends a reboot whose forced reboot is due (force_after,
// hung_after, or one recorded and not sent) if its node, read from the
// apiserver by the caller, is no longer quarantined and drained
// (notDrained; not asked with spec.force): the fault recovered and the
// quarantine role lifted the node while the machine ignored the graceful
// reboot, or hung in its shutdown, and pods may be scheduled on it again.
// Nothing is forced: NodeReady=False/NotDrained, a refused action, which
// the remediate role reads as cancelled. A node down (NotReady) and
// lifted is refused too: faultline hard-resets only nodes it holds
// quarantined and drained; one that stays down is quarantined again and
// remediated anew. done: followReboot returns next and err.
func (op *operation) liftedBeforeForce(ctx context.Context) (next time.Duration, done bool, err error) {
	why := op.notDrained()
	if why == "" {
		return 0, false, nil
	}
	return 0, true, op.fail(ctx, ReasonNotDrained, fmt.Sprintf("%s; its reboot, signalled at %s, is not over, and it was not forced",
		why, op.st.At.Format(time.RFC3339)), true)
}

// forceReboot sends the forced reboot of a graceful one that did not do its
// work, once: ForcedAt is recorded first, like the signal. why says what
// it did not do. done: followReboot returns next and err.
func (op *operation) forceReboot(ctx context.Context, prov Provider, why string) (next time.Duration, done bool, err error) {
	j := op.j
	st := *op.st
	st.Step, st.ForcedAt = "force", j.now().UTC()
	err = op.record(ctx, st)
	if apierrors.IsConflict(err) {
		return time.Second, true, nil
	}
	if err != nil {
		// Stored all the same, perhaps: followReboot sends it then.
		j.keepUnsent(op.u.GetUID(), unsentRecord{cluster: op.cr.name, state: st.encode(), why: why})
		return 0, true, fmt.Errorf("record %s force: %w", op.ref(), err)
	}
	j.remember(op.u.GetUID(), func(m *memory) { m.forced = true })
	return op.sendForce(ctx, prov, why)
}

// sendForce sends the forced reboot recorded as op.st through prov; why
// says what the graceful one did not do. done: followReboot returns next
// and err.
func (op *operation) sendForce(ctx context.Context, prov Provider, why string) (next time.Duration, done bool, err error) {
	t := Target{Cluster: op.cr.name, Node: op.node, Kube: op.cr.cl.Kube, RequestID: string(op.u.GetUID()) + "/force"}
	switch err := prov.Reboot(ctx, t, Force); {
	case errors.Is(err, ErrUnsupported):
	case errors.Is(err, ErrMaybeSent):
		// Followed as sent: a new boot ID, else reboot_timeout.
		op.emit(ctx, op.action(events.OutcomeApplied, fmt.Sprintf("forced reboot may have been sent via %s (%s): %v",
			op.st.Provider, why, err), "force", nil))
	case err != nil:
		return 0, true, op.fail(ctx, reasonOf(err), fmt.Sprintf("forced reboot via %s (%s): %v", op.st.Provider, why, err), true)
	default:
		op.emit(ctx, op.action(events.OutcomeApplied, fmt.Sprintf("forced reboot via %s: %s", op.st.Provider, why), "force", nil))
	}
	return 0, false, nil
}

// offCheckEvery is how often the machine of a reboot whose node stays
// down is asked about (one BMC read while it is not off).
const offCheckEvery = time.Minute

// followDownMachine asks the provider, where it can tell (offPowerer),
// about the machine of a reboot whose node is down (NotReady) with its
// old boot ID, at most every offCheckEvery, once the reboot is older than
// force_after or the node has been down for hung_after:
//   - off (a graceful reset the machine took as a shutdown, a BMC that did
//     not power it back on): powered on; sending On only to a machine that
//     is off makes it safe to repeat;
//   - on, the node down for hung_after (a shutdown that hung: a driver
//     unload, an unmount that never returns): forced, once.
//
// Otherwise nothing is sent to a machine that is on: it is shutting down
// or in a long POST, and a forced reset would start that over. Before,
// both machines waited for reboot_timeout. done: followReboot returns
// next and err.
func (op *operation) followDownMachine(ctx context.Context, elapsed time.Duration) (next time.Duration, done bool, err error) {
	j := op.j
	prov := j.providers[op.st.Provider]
	p, ok := prov.(offPowerer)
	if !ok || op.node == nil || nodeReady(op.node) || op.node.Status.NodeInfo.BootID != op.st.BootID {
		return 0, false, nil
	}
	down := op.downFor()
	hung := j.cfg.HungAfter > 0 && down > j.cfg.HungAfter && op.st.ForcedAt.IsZero()
	if !hung && (j.cfg.ForceAfter == 0 || elapsed <= j.cfg.ForceAfter) {
		return 0, false, nil
	}
	now := j.now()
	if last := j.remember(op.u.GetUID(), func(m *memory) {
		if now.Sub(m.offChecked) >= offCheckEvery {
			m.offChecked = now
		}
	}).offChecked; now.Sub(last) < offCheckEvery {
		return 0, false, nil
	}
	t := Target{Cluster: op.cr.name, Node: op.node, Kube: op.cr.cl.Kube, RequestID: string(op.u.GetUID()) + "/power-on"}
	switch err := p.PowerOnIfOff(ctx, t); {
	case err == nil:
		op.emit(ctx, op.action(events.OutcomeApplied, fmt.Sprintf("powered on via %s: node %s was still down with its old boot ID after %v, and its machine was off",
			op.st.Provider, op.nodeName, elapsed.Round(time.Second)), "power-on", nil))
	case errors.Is(err, ErrNotOff) && hung:
		if next, done, err := op.liftedBeforeForce(ctx); done {
			return next, true, err
		}
		return op.forceReboot(ctx, prov, fmt.Sprintf("node %s has been down with its old boot ID for %v while its machine is on: its shutdown hung",
			op.nodeName, down.Round(time.Second)))
	case errors.Is(err, ErrNotOff), ctx.Err() != nil:
	default:
		j.log.Warn("janitor: could not tell whether a rebooting machine is off", "cluster", op.cr.name, "node", op.nodeName,
			"provider", op.st.Provider, "err", err)
	}
	return 0, false, nil
}

// downFor is how long the node of a reboot has been down: since its Ready
// condition last changed, or since the reboot was recorded if that is
// later (a node already NotReady when it was signalled).
func (op *operation) downFor() time.Duration {
	since := op.st.At
	for _, c := range op.node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.LastTransitionTime.After(since) {
			since = c.LastTransitionTime.Time
		}
	}
	return op.j.now().Sub(since)
}

func (op *operation) followTerminate(ctx context.Context) (time.Duration, error) {
	j := op.j
	gone := op.node == nil // read live where the watch's copy lacks it (follow)
	if !gone && op.st.NodeUID != "" && string(op.node.UID) != op.st.NodeUID {
		// A Node of the same name registered since the signal (a recycled
		// name: a private IP's ip-… name): the terminated machine's is gone,
		// and this one is not deleted.
		gone = true
	}
	// A signal this janitor's provider confirmed: the Node goes at once. A
	// resumed one (Recorded: the janitor that recorded it stopped before
	// it knew) may never have gone out: the Node goes only once the node
	// is down (NotReady), else a running machine would lose its Node and
	// the terminate be reported done; a node still Ready ends in Timeout.
	// So may one sent unanswered (MaybeSent).
	reason := condition(op.u, CondSignalSent)["reason"]
	confirmed := reason != ReasonRecorded && reason != ReasonMaybeSent
	if !gone && j.cfg.DeleteNodeOnTerminate && (confirmed || !nodeReady(op.node)) {
		var opts metav1.DeleteOptions
		if op.st.NodeUID != "" {
			// The watch's copy may be behind a new Node of the name: only
			// the signalled one is deleted; a conflict says it is gone.
			uid := types.UID(op.st.NodeUID)
			opts.Preconditions = &metav1.Preconditions{UID: &uid}
		}
		err := op.cr.cl.Kube.CoreV1().Nodes().Delete(ctx, op.nodeName, opts)
		if op.st.NodeUID != "" && apierrors.IsConflict(err) {
			err = nil
		}
		if err != nil && !apierrors.IsNotFound(err) {
			// Retried with backoff, within terminate_timeout: a delete
			// refused for good (RBAC, an admission webhook) ends the
			// terminate failed, its refusal named, not retried for ever.
			if j.now().Sub(op.st.At) > j.cfg.TerminateTimeout && ctx.Err() == nil {
				return 0, op.fail(ctx, ReasonTimeout, fmt.Sprintf("node %s still exists %v after the terminate signal: its Node could not be deleted: %v",
					op.nodeName, j.cfg.TerminateTimeout, err), true)
			}
			return 0, fmt.Errorf("delete node %s: %w", op.nodeName, err)
		}
		gone = true
	}
	if gone {
		msg := fmt.Sprintf("node %s terminated via %s and its Node object is gone", op.nodeName, op.st.Provider)
		op.emit(ctx, op.action(events.OutcomeSucceeded, msg, "complete", nil))
		if err := op.writeStatus(ctx, true, cond{CondNodeTerminated, "True", ReasonSucceeded, msg}); err != nil {
			return 0, err
		}
		j.lim.release(op.key)
		j.m.completed.WithLabelValues(op.cr.name, op.kd.ActionKind, events.OutcomeSucceeded).Inc()
		return 0, nil
	}
	if j.now().Sub(op.st.At) > j.cfg.TerminateTimeout {
		return 0, op.fail(ctx, ReasonTimeout, fmt.Sprintf("node %s still exists %v after the terminate signal", op.nodeName, j.cfg.TerminateTimeout), true)
	}
	return j.cfg.PollInterval, nil
}

// fail ends the resource failed: the result condition (or SignalSent when
// no signal went out) False with the reason, completionTime set. A reason
// the CRDs refuse is written Failed, quoted in the message (safeReason).
func (op *operation) fail(ctx context.Context, reason, msg string, signalled bool) error {
	reason, msg = safeReason(reason, msg)
	var cs []cond
	switch {
	case op.kd == kindGPUReset:
		cs = []cond{{CondComplete, "True", reason, msg}}
	case !signalled || !condIs(op.u, CondSignalSent, "True"):
		cs = []cond{{CondSignalSent, "False", reason, msg}, {op.kd.Result, "False", reason, msg}}
	default:
		cs = []cond{{op.kd.Result, "False", reason, msg}}
	}
	return op.failed(ctx, reason, msg, cs...)
}

// failed ends the resource failed with the conditions cs (fail's, whose
// reason and msg they carry).
func (op *operation) failed(ctx context.Context, reason, msg string, cs ...cond) error {
	j := op.j
	// Refused, not failed: the node was not drained, or remediate handed
	// it to a person meanwhile (remediate reads both as cancelled).
	outcome := events.OutcomeFailed
	if reason == ReasonNotDrained || reason == ReasonEscalated {
		outcome = events.OutcomeRefused
	}
	op.emit(ctx, op.action(outcome, reason+": "+msg, "failed", map[string]string{"reason": reason}))
	if err := op.writeStatus(ctx, true, cs...); err != nil {
		return err
	}
	j.lim.release(op.key)
	j.m.completed.WithLabelValues(op.cr.name, op.kd.ActionKind, outcome).Inc()
	j.log.Warn("janitor: operation "+outcome, "cluster", op.cr.name, "resource", op.ref(), "node", op.nodeName, "reason", reason, "msg", msg)
	return nil
}

// writeStatus merges conditions (and startTime, and completionTime when
// done) into the resource's status.
func (op *operation) writeStatus(ctx context.Context, done bool, cs ...cond) error {
	now := op.j.now()
	status := map[string]any{"conditions": setConditions(op.u, now, cs...)}
	if v, _, _ := unstructured.NestedString(op.u.Object, "status", "startTime"); v == "" {
		at := now
		if op.st != nil {
			at = op.st.At
		}
		status["startTime"] = at.UTC().Format(time.RFC3339)
	}
	if done {
		status["completionTime"] = now.UTC().Format(time.RFC3339)
	}
	patch, _ := json.Marshal(map[string]any{"status": status})
	out, err := op.res().Patch(ctx, op.u.GetName(), types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "faultline-janitor"}, "status")
	if err != nil {
		return fmt.Errorf("write %s status: %w", op.ref(), err)
	}
	op.u = out
	if done {
		op.j.remember(out.GetUID(), func(m *memory) { m.ended = true })
	}
	return nil
}

// action is one audit record of the operation.
func (op *operation) action(outcome, reason, step string, details map[string]string) *faultlinev1.Action {
	j := op.j
	j.m.actions.WithLabelValues(op.cr.name, op.kd.ActionKind, outcome).Inc()
	d := map[string]string{events.DetailResource: op.ref(), events.DetailStep: step}
	if op.st != nil {
		d[events.DetailProvider] = op.st.Provider
	}
	if op.force {
		d[events.DetailForce] = "true"
	}
	for k, v := range details {
		d[k] = v
	}
	// The id is the resource's, the step's, the outcome's and a failure's
	// reason: a step done again (by a janitor that restarted before it
	// wrote the step's status) produces the same id, and the store keeps
	// one; two different failures of one resource keep two.
	return &faultlinev1.Action{
		Id:      shortHash(strings.Join([]string{op.cr.name, string(op.u.GetUID()), op.u.GetName(), step, outcome, details["reason"]}, "\x00"), 32),
		Cluster: op.cr.name, Node: op.nodeName, Role: Role, Kind: op.kd.ActionKind, Outcome: outcome,
		Reason: events.Truncate(reason, 1024), Timestamp: timestamppb.New(j.now()), Details: d,
	}
}
