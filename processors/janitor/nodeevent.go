package janitor

import (
	"context"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// nodeEventTry bounds the create of one node Event: it is informational,
// and the operation's next step waits on it.
const nodeEventTry = 5 * time.Second

// nodeEvent records a on its node as a Kubernetes Event (node_events), so
// that `kubectl describe node` shows what the janitor did to it: a signal
// sent and an operation's end. Warning for a failure or refusal, and for a
// signal that followed the node's own keys (its kubelet may write them:
// SECURITY.md); Normal otherwise. Named after the action's id, so a step
// done again (a janitor restarted) records no second Event. Best effort:
// an Event not created is logged and stops nothing.
func (op *operation) nodeEvent(ctx context.Context, a *faultlinev1.Action) {
	j := op.j
	if !j.cfg.NodeEvents || op.cr.cl.DryRun || op.cr.cl.Kube == nil {
		return
	}
	typ := corev1.EventTypeNormal
	switch a.Outcome {
	case events.OutcomeApplied, events.OutcomeSucceeded:
		if a.Details[events.DetailNodeNamed] != "" {
			typ = corev1.EventTypeWarning
		}
	case events.OutcomeFailed, events.OutcomeRefused:
		typ = corev1.EventTypeWarning
	default:
		return // deferred, in progress: the resource's status says it
	}
	ref := corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: op.nodeName}
	if op.node != nil {
		ref.UID = op.node.UID
	}
	now := metav1.NewTime(j.now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: op.nodeName + ".fl-" + shortHash(a.Id, 16), Namespace: j.cfg.EventNamespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "faultline"}},
		InvolvedObject:      ref,
		Reason:              op.kd.Name + strings.ToUpper(a.Outcome[:1]) + a.Outcome[1:],
		Message:             events.Truncate(op.ref()+": "+a.Reason, 1024),
		Type:                typ,
		Source:              corev1.EventSource{Component: "faultline-janitor", Host: op.nodeName},
		ReportingController: "faultline.io/janitor",
		ReportingInstance:   events.Truncate(j.cfg.Identity, 128),
		FirstTimestamp:      now, LastTimestamp: now, Count: 1,
	}
	cctx, cancel := context.WithTimeout(ctx, nodeEventTry)
	defer cancel()
	_, err := op.cr.cl.Kube.CoreV1().Events(ev.Namespace).Create(cctx, ev, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) && ctx.Err() == nil {
		j.log.Warn("janitor: node Event not recorded", "cluster", op.cr.name, "node", op.nodeName, "reason", ev.Reason, "err", err)
	}
}
