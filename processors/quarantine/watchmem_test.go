package quarantine

import (
	"encoding/json"
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
)

// BenchmarkNodeWatchMemory measures what a replica's node watch holds per
// node (the transform keeps name, UID, labels, annotations, taints,
// unschedulable and faultline's conditions): 5,000 GPU nodes as GPUNode
// writes them, then a node cache started and synced (testenv.HeldHeap),
// beside the node's size as the apiserver's JSON (metadata and spec: the
// test writes no status; a real node's status, its images and
// conditions, is several KB more that the transform drops).
//
//	go test -run '^$' -bench NodeWatchMemory -benchtime 1x ./processors/quarantine
func BenchmarkNodeWatchMemory(b *testing.B) {
	const n = 5000
	k := testenv.StartNodeFleet(b, n, testenv.GPUNode)
	j, _ := json.Marshal(testenv.GPUNode(0))
	size := len(j)
	reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	cl := reg.SetClient("c", k, false)
	b.ResetTimer()
	for range b.N {
		b.ReportMetric(testenv.HeldHeap(b, n, func() (func() bool, func()) {
			c := newNodeWatches(testLog, func(string, string) {})
			return func() bool { l, ok := c.List(cl, labels.Everything()); return ok && len(l) == n }, c.Close
		}), "heap-B/node")
	}
	b.ReportMetric(float64(size), "json-B/node")
}

// BenchmarkNodeWatchCopy is the CPU the node watch spends per node event
// on what it keeps (watchCopy: labels and annotations interned), beside
// the same copy with maps.Clone (no interning) and the decoding of the
// event's node from the apiserver's JSON, which the watch does first:
// a GPU node as testenv.GPUNode writes it, with a kubelet's status
// (testenv.WithKubeletStatus).
//
//	go test -run '^$' -bench NodeWatchCopy ./processors/quarantine
func BenchmarkNodeWatchCopy(b *testing.B) {
	nd := testenv.WithKubeletStatus(testenv.GPUNode(7), 7)
	raw, err := json.Marshal(nd)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("decode", func(b *testing.B) {
		b.ReportMetric(float64(len(raw)), "json-B")
		for range b.N {
			var n corev1.Node
			if err := json.Unmarshal(raw, &n); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("copy-interned", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			_, _ = watchCopy(nd)
		}
	})
	b.Run("copy-cloned", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			_ = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nd.Name, UID: nd.UID, ResourceVersion: nd.ResourceVersion,
				Labels: maps.Clone(nd.Labels), Annotations: maps.Clone(nd.Annotations)}}
		}
	})
}
