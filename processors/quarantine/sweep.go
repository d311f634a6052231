package quarantine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// RunStabilization lifts flapping faults whose stabilization window passed
// and sets True the conditions no standing fault holds (SweepStabilized)
// every sweep interval until ctx ends, producing each lift's action
// through p. An agent may send nothing after the recovery that started
// the window, so the lift cannot wait for an event.
func (h *Handler) RunStabilization(ctx context.Context, p pipeline.Producer, clusterNames []string) {
	t := time.NewTicker(h.cfg.sweepInterval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		acts, err := h.SweepStabilized(ctx, clusterNames)
		h.sayLoop(ctx, p, "stabilization sweep", acts, err)
	}
}

// SweepStabilized lifts, on the nodes of the named clusters that this
// replica owns (their events land on its partitions), the flapping faults
// whose entity stayed healthy for the stabilization window, and drops
// onsets older than the flap window from nodes where nothing stands, and
// recoveries remembered past recovery_memory (recovered.go), and sets True
// the conditions faultline set False that no standing fault holds
// (State.orphanConditions: an apply whose object patch never landed), and
// acknowledges the manual uncordons the node watch's notice missed (the
// node was no replica's then, or the write failed). It picks nodes from the node watch's copy and writes each with
// updateNode, which re-reads and re-decides on a conflict (a new
// occurrence that cancelled the lift in the meantime wins). It returns
// an unquarantine action per lifted fault; a dry-run cluster writes
// nothing and reports each would-lift once.
func (h *Handler) SweepStabilized(ctx context.Context, clusterNames []string) ([]*faultlinev1.Action, error) {
	flap := h.cfg.Flap()
	var (
		acts []*faultlinev1.Action
		errs []error
	)
	for _, name := range clusterNames {
		cl, err := h.reg.Get(name)
		if err != nil || cl.Kube == nil {
			continue
		}
		nodes, ok := h.nodes.List(cl, labels.Everything())
		if !ok {
			continue // the watch has not listed the nodes yet: next sweep
		}
		now := h.now()
		sweep := h.sweeps.Add(1)
		for _, n := range nodes {
			if ctx.Err() != nil {
				return acts, errors.Join(append(errs, ctx.Err())...)
			}
			_, standing := n.Annotations[AnnotationState]
			_, onsets := n.Annotations[AnnotationOnsets]
			_, recovered := n.Annotations[AnnotationRecovered]
			if !(standing || onsets || recovered || falseCondition(n)) || !h.Owns(events.Key(name, n.Name)) {
				continue
			}
			st, err := ReadState(n)
			if err != nil {
				continue // the node's next event starts it afresh
			}
			// Forgetting is due only when flapping or the recovery memory
			// is on; a stabilizing fault's lift whose deadline passed
			// always (flapping turned off since, it would stand for good),
			// and so are orphaned conditions.
			next := st.NextSweep(flap)
			due := (flap.Enabled() || h.cfg.RecoveryMemory > 0 || st.liftDue(now)) && !next.IsZero() && !now.Before(next)
			// A person's uncordon not acknowledged (the watch's notice
			// went to no replica, or its write failed): acknowledged here,
			// or the node keeps faultline's taints and label for good.
			manual := st.Cordoned && !n.Spec.Unschedulable
			if cl.DryRun {
				if due {
					acts = append(acts, h.wouldLift(cl, n.Name, st, now, sweep)...)
				}
				continue
			}
			if !due && !manual && len(st.orphanConditions(n, now, h.cfg.BatchTimeout)) == 0 {
				continue
			}
			a, err := h.liftStabilized(ctx, cl, n, flap)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			acts = append(acts, a...)
		}
		if cl.DryRun {
			h.forgetWouldLifts(name, sweep)
		}
	}
	return acts, errors.Join(errs...)
}

// liftDue reports whether a stabilizing fault's deadline passed by now.
func (s *State) liftDue(now time.Time) bool {
	for _, f := range s.Faults {
		if f.Stabilizing() && !now.Before(f.LiftAt) {
			return true
		}
	}
	return false
}

// falseCondition reports whether n shows a condition faultline set False.
func falseCondition(n *corev1.Node) bool {
	return slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool {
		return c.Status == corev1.ConditionFalse && strings.HasPrefix(c.Message, conditionPrefix)
	})
}

// liftStabilized writes one node's due lifts, with their actions as
// unsaid (unsaid.go), and its orphaned conditions set True
// (State.orphanConditions), and returns the actions: a manual_uncordon
// first when a person uncordoned the node and it was not acknowledged yet.
func (h *Handler) liftStabilized(ctx context.Context, cl *clusters.Client, node *corev1.Node, flap FlapPolicy) ([]*faultlinev1.Action, error) {
	var (
		acts     []*faultlinev1.Action
		orphaned []string
	)
	_, err := h.updateNode(ctx, cl, node, func(n *corev1.Node, st *State) (bool, error) {
		now := h.now()
		acts = acts[:0] // a conflict re-decides on the node as it is now
		// A person's uncordon not acknowledged yet is acknowledged with
		// the lift, or the write would cordon the node again for a fault
		// still standing.
		manual := h.acknowledgeUncordon(cl.Name, n, st, "the stabilization sweep")
		if manual != nil {
			acts = append(acts, manual)
		}
		// Before the lifts: a lifted fault's condition is the lift's (True,
		// FaultsRecovered), not an orphan.
		orphaned = st.orphanConditions(n, now, h.cfg.BatchTimeout)
		st.orphaned = orphaned
		due := map[string]Fault{}
		for k, f := range st.Faults {
			if f.Stabilizing() && !now.Before(f.LiftAt) {
				due[k] = *f
			}
		}
		keys, changed := st.LiftStabilized(now, flap)
		for _, k := range keys {
			st.rememberRecovery(k, due[k].RecoveredAt, now, h.cfg.RecoveryMemory)
		}
		changed = st.pruneRecovered(now) || changed
		remaining := len(st.Faults)
		uncordon := st.Cordoned && !st.Active()
		for _, k := range keys {
			outcome, reason := events.OutcomeApplied, "flapping fault stayed healthy for its stabilization window; lifted what faultline set"
			if remaining > 0 || st.Overflow != nil {
				outcome = events.OutcomeInProgress
				reason = fmt.Sprintf("flapping fault stayed healthy for its stabilization window; lifted, %d still standing", remaining)
			}
			a := sweepAction(cl, node.Name, k, due[k], outcome, reason, now)
			a.Details[events.DetailRemaining] = strconv.Itoa(remaining)
			a.Details[events.DetailUncordoned] = strconv.FormatBool(uncordon)
			acts = append(acts, a)
		}
		st.addUnsaid(acts[len(acts)-len(keys):]...) // the acknowledgement's is in already
		return changed || manual != nil || len(orphaned) > 0, nil
	})
	if err != nil {
		return nil, fmt.Errorf("cluster %s: lift stabilized faults of node %s: %w", cl.Name, node.Name, err)
	}
	if len(orphaned) > 0 {
		h.log.Info("conditions no standing fault holds set True (an apply whose quarantine was not written)",
			"cluster", cl.Name, "node", node.Name, "conditions", orphaned)
	}
	for _, a := range acts {
		h.m.decisions.WithLabelValues(cl.Name, a.GetKind(), a.GetOutcome()).Inc()
	}
	h.track(unsaidIDs(acts), false) // in flight until the loop says them
	return acts, nil
}

// wouldLift reports, once each, the lifts a dry-run cluster's sweep would
// make; sweep is the sweep's number (forgetWouldLifts).
func (h *Handler) wouldLift(cl *clusters.Client, node string, st *State, now time.Time, sweep uint64) []*faultlinev1.Action {
	var acts []*faultlinev1.Action
	for _, k := range st.keys() {
		f := st.Faults[k]
		if !f.Stabilizing() || now.Before(f.LiftAt) {
			continue
		}
		id := pipeline.ActionID(cl.Name, node, k, f.LiftAt.UTC().Format(time.RFC3339Nano), events.KindUnquarantine)
		h.mu.Lock()
		_, seen := h.dryRunLifts[id]
		h.dryRunLifts[id] = wouldLift{cluster: cl.Name, sweep: sweep}
		h.mu.Unlock()
		if seen {
			continue
		}
		h.m.decisions.WithLabelValues(cl.Name, events.KindUnquarantine, events.OutcomeDryRun).Inc()
		acts = append(acts, sweepAction(cl, node, k, *f, events.OutcomeDryRun,
			"would lift: flapping fault stayed healthy for its stabilization window (cluster is dry-run)", now))
	}
	return acts
}

// wouldLift is a would-lift reported: its cluster and the last sweep that
// found it.
type wouldLift struct {
	cluster string
	sweep   uint64
}

// forgetWouldLifts forgets the would-lifts of cluster its sweep (number
// sweep, run to its end) no longer found: the fault recurred, or the
// node's events moved to another replica.
func (h *Handler) forgetWouldLifts(cluster string, sweep uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, w := range h.dryRunLifts {
		if w.cluster == cluster && w.sweep != sweep {
			delete(h.dryRunLifts, id)
		}
	}
}

// sweepAction is the unquarantine action of a fault the sweep lifted; its
// id is the cluster, node, fault and deadline, so a retried lift writes
// the same id.
func sweepAction(cl *clusters.Client, node, key string, f Fault, outcome, reason string, now time.Time) *faultlinev1.Action {
	details := map[string]string{
		events.DetailRecovered: fmt.Sprint([]string{key}),
		events.DetailLiftAt:    f.LiftAt.UTC().Format(time.RFC3339),
	}
	if f.Entity != "" {
		details[events.DetailEntities] = f.Entity
	}
	return &faultlinev1.Action{
		Id:      pipeline.ActionID(cl.Name, node, key, f.LiftAt.UTC().Format(time.RFC3339Nano), events.KindUnquarantine),
		Cluster: cl.Name, Node: node, Role: Role,
		Kind: events.KindUnquarantine, Outcome: outcome,
		Reason:    events.Truncate(reason, maxMessage),
		DryRun:    cl.DryRun,
		Timestamp: timestamppb.New(now),
		Details:   details,
		CheckName: f.Check,
	}
}
