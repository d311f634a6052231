package quarantine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

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
// result: the status (faultline's conditions) first, then the metadata and
// spec faultline owns, each as a patch of only what changed that carries
// the resourceVersion read, so a concurrent writer makes it re-read the
// node live and redo the whole decision (optimistic concurrency; nothing
// faultline does not own is written). first is a node already read: a live
// one, or the watch cache's copy, which holds everything faultline reads
// and writes (so a node the cache knows costs no GET). mutate returns false
// to write nothing.
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
		if len(st.dropped) > 0 {
			h.m.faultsDropped.WithLabelValues(cl.Name).Add(float64(len(st.dropped)))
			h.log.Warn("standing faults dropped to keep the quarantine state bounded; cordoning or tainting ones hold the node until a manual uncordon",
				"cluster", cl.Name, "node", name, "faults", st.dropped, "held", st.Overflow != nil)
		}
		now := h.now()
		h.nodes.Wrote(cl.Name, name, now, "")
		before := n.DeepCopy()
		if RenderConditions(n, st, now) {
			out, err := patchNode(ctx, nodes, name, statusPatch(before, n), "status")
			if apierrors.IsConflict(err) && attempt < 100 {
				h.m.conflicts.WithLabelValues(cl.Name).Inc()
				n = nil
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("patch node %s status: %w", name, err)
			}
			n.ResourceVersion = out.ResourceVersion
			before.ResourceVersion = out.ResourceVersion
		}
		if RenderObject(n, st, h.cfg.Identity, now) {
			out, err := patchNode(ctx, nodes, name, objectPatch(before, n))
			if apierrors.IsConflict(err) && attempt < 100 {
				h.m.conflicts.WithLabelValues(cl.Name).Inc()
				n = nil
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("patch node %s: %w", name, err)
			}
			n = out
		}
		h.nodes.Wrote(cl.Name, name, now, n.ResourceVersion)
		return n, nil
	}
}

// patchNode sends a strategic merge patch of the node (or of its status):
// conditions merge by type and labels and annotations by key, so only what
// the patch names is written; taints, which have no merge key, are replaced
// whole, which the resourceVersion the patch carries makes safe.
func patchNode(ctx context.Context, nodes corev1client.NodeInterface, name string, patch map[string]any, subresources ...string) (*corev1.Node, error) {
	b, err := json.Marshal(patch)
	if err != nil {
		return nil, fmt.Errorf("encode patch: %w", err)
	}
	return nodes.Patch(ctx, name, types.StrategicMergePatchType, b, metav1.PatchOptions{FieldManager: "faultline-quarantine"}, subresources...)
}

// statusPatch names the conditions that differ between before and after,
// with before's resourceVersion as the precondition.
func statusPatch(before, after *corev1.Node) map[string]any {
	var changed []corev1.NodeCondition
	for _, c := range after.Status.Conditions {
		i := slices.IndexFunc(before.Status.Conditions, func(b corev1.NodeCondition) bool { return b.Type == c.Type })
		if i < 0 || !sameCondition(before.Status.Conditions[i], c) {
			changed = append(changed, c)
		}
	}
	return map[string]any{
		"metadata": map[string]any{"resourceVersion": before.ResourceVersion},
		"status":   map[string]any{"conditions": changed},
	}
}

// objectPatch names the labels, annotations, cordon and taints that differ
// between before and after, with before's resourceVersion as the
// precondition.
func objectPatch(before, after *corev1.Node) map[string]any {
	meta := map[string]any{"resourceVersion": before.ResourceVersion}
	if d := mapDiff(before.Labels, after.Labels); len(d) > 0 {
		meta["labels"] = d
	}
	if d := mapDiff(before.Annotations, after.Annotations); len(d) > 0 {
		meta["annotations"] = d
	}
	spec := map[string]any{}
	if before.Spec.Unschedulable != after.Spec.Unschedulable {
		spec["unschedulable"] = after.Spec.Unschedulable
	}
	if !slices.EqualFunc(before.Spec.Taints, after.Spec.Taints, sameTaint) {
		spec["taints"] = after.Spec.Taints // nil removes the list
	}
	patch := map[string]any{"metadata": meta}
	if len(spec) > 0 {
		patch["spec"] = spec
	}
	return patch
}

func sameCondition(a, b corev1.NodeCondition) bool {
	return a.Type == b.Type && a.Status == b.Status && a.Reason == b.Reason && a.Message == b.Message &&
		a.LastTransitionTime.Equal(&b.LastTransitionTime) && a.LastHeartbeatTime.Equal(&b.LastHeartbeatTime)
}

func sameTaint(a, b corev1.Taint) bool {
	return a.Key == b.Key && a.Value == b.Value && a.Effect == b.Effect
}

// mapDiff is the merge patch from a to b: changed and new keys with their
// value, removed keys with null.
func mapDiff(a, b map[string]string) map[string]any {
	d := map[string]any{}
	for k, v := range b {
		if w, ok := a[k]; !ok || w != v {
			d[k] = v
		}
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			d[k] = nil
		}
	}
	return d
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
