package quarantine

import (
	"log/slog"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/processors/clusters"
)

// recentWrite is how long after this replica wrote a node's state the
// watch's copy is used only once it holds that write.
const recentWrite = clusters.RecentWrite

// newNodeWatches returns quarantine's node watches: each live cluster's
// nodes, so that a healthy event for a node with no standing fault — by far
// the most common event — is decided without an API request, so that a
// person uncordoning a node faultline cordoned is noticed as it happens
// (uncordoned), and so that a fault is written as a patch of the watch's
// copy, without a GET first. Only what quarantine reads and writes is kept
// (watchCopy).
//
// Another replica writes a node whose records this replica decides only
// before a partition rebalance or through the retry topic (its records
// wait for the retry group's commit), both slower than a working watch;
// while the watch is behind (a list or watch failed) cachedNode reads
// live. Anything the copy says is standing is written with its
// resourceVersion (a conflict re-reads live).
func newNodeWatches(log *slog.Logger, uncordoned func(cluster, node string)) *clusters.NodeWatches {
	return clusters.NewNodeWatches(log, watchCopy, func(cluster string, o, n *corev1.Node) {
		if !o.Spec.Unschedulable || n.Spec.Unschedulable {
			return
		}
		if st, err := ReadState(n); err == nil && st.Cordoned {
			uncordoned(cluster, n.Name)
		}
	})
}

// watchCopy is what the node watch keeps of a node: name, UID,
// resourceVersion, creationTimestamp, labels and annotations (interned), unschedulable,
// taints, faultline's conditions and the machine's system UUID (a fault of
// another machine is not acted on: otherMachine).
func watchCopy(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	var conds []corev1.NodeCondition
	for _, c := range n.Status.Conditions {
		if strings.HasPrefix(c.Message, conditionPrefix) {
			conds = append(conds, c)
		}
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, CreationTimestamp: n.CreationTimestamp, Labels: clusters.Interned(n.Labels), Annotations: clusters.Interned(n.Annotations),
	}, Spec: corev1.NodeSpec{Unschedulable: n.Spec.Unschedulable, Taints: n.Spec.Taints},
		Status: corev1.NodeStatus{Conditions: conds, NodeInfo: corev1.NodeSystemInfo{SystemUUID: n.Status.NodeInfo.SystemUUID}}}, nil
}
