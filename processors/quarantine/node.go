package quarantine

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

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
// with a name derived from the event id so a retry finds the first one. The
// Event is created in the background (eventWriter): informational, best
// effort, never in the way of a cordon.
func (h *Handler) nodeEvent(ctx context.Context, cl *clusters.Client, node *corev1.Node, it item) ([]*faultlinev1.Action, error) {
	if !h.cfg.NodeEvents {
		return nil, nil
	}
	ev := it.ev
	reason := eventReason(ev.GetComponentClass())
	if cl == nil || cl.DryRun || cl.Kube == nil {
		return []*faultlinev1.Action{h.action(it, events.KindEvent, events.OutcomeDryRun, "would record Event "+reason, "", cl)}, nil
	}
	if !h.eventDue(cl.Name, it.node, reason) {
		h.m.eventsMerged.WithLabelValues(cl.Name).Inc()
		return []*faultlinev1.Action{h.action(it, events.KindEvent, events.OutcomeSkipped,
			fmt.Sprintf("Event %s recorded on this node less than %v ago: merged", reason, h.cfg.NodeEventInterval), "", cl)}, nil
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
	if !h.events.enqueue(cl, kev) {
		h.m.eventsDropped.WithLabelValues(cl.Name).Inc()
		return []*faultlinev1.Action{h.action(it, events.KindEvent, events.OutcomeSkipped, "Event "+reason+" dropped: the cluster's Event queue is full", "", cl)}, nil
	}
	return []*faultlinev1.Action{h.action(it, events.KindEvent, events.OutcomeApplied, "recorded Event "+reason+" (created in the background, best effort)", "", cl)}, nil
}

// eventDue reports whether the node may get an Event of reason now (none
// in the last node_event_interval), and if so counts this one. A redelivered
// record whose Event was created inside the interval is merged too: the Event
// it would make already stands.
func (h *Handler) eventDue(cluster, node, reason string) bool {
	if h.cfg.NodeEventInterval <= 0 {
		return true
	}
	now := h.now()
	key := cluster + "/" + node + "/" + reason
	h.eventsMu.Lock()
	defer h.eventsMu.Unlock()
	if last, ok := h.lastEvent[key]; ok && now.Sub(last) < h.cfg.NodeEventInterval {
		return false
	}
	if now.Sub(h.eventsPruned) > h.cfg.NodeEventInterval {
		for k, t := range h.lastEvent {
			if now.Sub(t) >= h.cfg.NodeEventInterval {
				delete(h.lastEvent, k)
			}
		}
		h.eventsPruned = now
	}
	h.lastEvent[key] = now
	return true
}

// eventReason is the Event reason of a component class: "GPUHealthIssue".
func eventReason(class string) string {
	t := ConditionType(class)
	return t[:len(t)-len("Healthy")] + "HealthIssue"
}
