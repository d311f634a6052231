package drain

import (
	"log/slog"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
)

// newNodeWatches returns the drain's node watches: each cluster's nodes,
// keeping what a step reads (drainCopy), so that a step reads its node
// without a request: a drain's next look after its own write, a repeated
// fault its finished drain already covers.
//
// Beside the watch's cover of this replica's own writes
// (clusters.NodeWatches), a write the step makes from a copy another
// writer has changed since is refused (every write carries the
// resourceVersion read) and the redo reads the node live; and a copy that
// says the node is not quarantined (the quarantine role's write may not
// have arrived) is read again live (stepOnce).
func newNodeWatches(log *slog.Logger) *clusters.NodeWatches {
	return clusters.NewNodeWatches(log, drainCopy, nil)
}

// drainCopy is what the watch keeps of a node: name, UID,
// resourceVersion, creation time, faultline's quarantine and drain labels,
// the drain state annotation and when the quarantine began.
func drainCopy(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	keep := func(m map[string]string, keys ...string) map[string]string {
		var out map[string]string
		for _, k := range keys {
			if v, ok := m[k]; ok {
				if out == nil {
					out = map[string]string{}
				}
				out[k] = v
			}
		}
		return out
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, CreationTimestamp: n.CreationTimestamp,
		Labels:      clusters.Interned(keep(n.Labels, events.LabelQuarantined, LabelDrain)),
		Annotations: keep(n.Annotations, AnnotationState, annotationQuarantinedAt),
	}}, nil
}
