package drain

import (
	"context"
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
)

// BenchmarkNodeWatchMemory measures what a drain replica's node watch
// holds per node (drainCopy: name, UID, resourceVersion, creation time,
// faultline's two labels, the drain state, the quarantine's start): 5,000 GPU nodes with a
// kubelet's status (testenv.GPUNode, WithKubeletStatus), the watch started
// and synced (testenv.HeldHeap), beside the node's size as the
// apiserver's JSON. Every replica watches every node of every cluster it
// drains in, so this times the fleet's node count is its floor.
//
//	go test -run '^$' -bench NodeWatchMemory -benchtime 1x ./processors/drain
func BenchmarkNodeWatchMemory(b *testing.B) {
	const n = 5000
	k := testenv.StartNodeFleet(b, n, func(i int) *corev1.Node { return testenv.WithKubeletStatus(testenv.GPUNode(i), i) })
	one, err := k.CoreV1().Nodes().Get(context.Background(), testenv.GPUNode(0).Name, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	j, _ := json.Marshal(one)
	reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	cl := reg.SetClient("c", k, false)
	b.ResetTimer()
	for range b.N {
		b.ReportMetric(testenv.HeldHeap(b, n, func() (func() bool, func()) {
			w := newNodeWatches(testLog)
			return func() bool { l, ok := w.List(cl, labels.Everything()); return ok && len(l) == n }, w.Close
		}), "heap-B/node")
	}
	b.ReportMetric(float64(len(j)), "json-B/node")
}
