package quarantine

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

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
			h.nodes.Get(cl)
		}
	}
}

// RunUncordons acknowledges the queued manual uncordons until ctx ends,
// producing each one's action through p, and every resayInterval produces
// the actions left unsaid on this replica's nodes (unsaid.go).
func (h *Handler) RunUncordons(ctx context.Context, p pipeline.Producer) {
	resay := time.NewTicker(resayInterval)
	defer resay.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-resay.C:
			if err := h.resay(ctx, p); err != nil && ctx.Err() == nil {
				h.log.Warn("unsaid actions not produced; tried again within "+resayInterval.String(), "err", err)
			}
		case r := <-h.uncordons:
			a, err := h.AcknowledgeUncordon(ctx, r.cluster, r.node)
			if err != nil {
				if ctx.Err() == nil {
					h.log.Warn("manual uncordon not acknowledged; left to the node's next event", "cluster", r.cluster, "node", r.node, "err", err)
				}
				continue
			}
			if a != nil {
				h.sayLoop(ctx, p, "manual uncordon", []*faultlinev1.Action{a}, nil)
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
	var a *faultlinev1.Action
	if _, err := h.updateNode(ctx, cl, n, func(n *corev1.Node, st *State) (bool, error) {
		a = h.acknowledgeUncordon(cluster, n, st, "the node watch") // a conflict retries with the node as it is now
		return a != nil, nil
	}); err != nil || a == nil {
		return nil, err
	}
	h.m.decisions.WithLabelValues(cluster, events.KindManualUncordon, events.OutcomeDecided).Inc()
	h.track([]string{a.Id}, false) // in flight until the loop says it
	return a, nil
}

// acknowledgeUncordon acknowledges, in st, a person's uncordon of n
// (State.DetectManualUncordon) and returns its manual_uncordon action,
// written into st as unsaid (unsaid.go); nil when there is none. Every
// write of a node a loop makes (AcknowledgeUncordon, forgetUnsaid,
// liftStabilized) asks it first, as a decision of an event does: with a
// cordoning fault standing, RenderObject would otherwise take the
// schedulable node for one to cordon and undo the uncordon, and the
// watch's notice, handled later, would find nothing to acknowledge. by
// says what noticed it.
func (h *Handler) acknowledgeUncordon(cluster string, n *corev1.Node, st *State, by string) *faultlinev1.Action {
	if !st.DetectManualUncordon(n, h.now()) {
		return nil
	}
	at := st.ManualUncordonAt
	a := &faultlinev1.Action{
		Id: pipeline.ActionID(cluster, n.Name, at.UTC().Format(time.RFC3339Nano), events.KindManualUncordon), Cluster: cluster, Node: n.Name,
		Role: Role, Kind: events.KindManualUncordon, Outcome: events.OutcomeDecided, Timestamp: timestamppb.New(at),
		Reason: "a person uncordoned the node; its standing faults no longer cordon it (noticed by " + by + ")",
	}
	st.addUnsaid(a)
	return a
}
