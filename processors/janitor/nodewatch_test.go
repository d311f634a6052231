package janitor

import (
	"context"
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/faultline/faultline/internal/testenv"
)

// TestNodeWatchKeepsWhatTheJanitorReads: the janitor's node watch (one
// replica, every node of every cluster) keeps what the janitor reads of
// a node, read from a real apiserver, and drops the kubelet's images,
// capacity and the managedFields (before: the whole Node, ≈ 3× the heap
// per node; BenchmarkNodeWatchMemory).
func TestNodeWatchKeepsWhatTheJanitorReads(t *testing.T) {
	t.Parallel()
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	k := kube.Client()
	ctx := context.Background()
	nd := testenv.WithKubeletStatus(testenv.GPUNode(3), 3)
	nd.Labels[LabelBMCHost] = "10.1.0.3"
	nd.Annotations[AnnotationProvider] = ProviderRedfish
	nd.Spec.ProviderID = "aws:///us-east-1a/i-03"
	nd.Spec.Unschedulable = true
	if _, err := k.CoreV1().Nodes().Create(ctx, nd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nf, inf := nodeWatch(k)
	stop := make(chan struct{})
	defer close(stop)
	nf.Start(stop)
	if !cache.WaitForCacheSync(stop, inf.HasSynced) {
		t.Fatal("node watch did not sync")
	}
	o, ok, err := inf.GetIndexer().GetByKey(nd.Name)
	if err != nil || !ok {
		t.Fatalf("node %s not in the watch: %v", nd.Name, err)
	}
	got := o.(*corev1.Node)
	for _, c := range []struct {
		what string
		ok   bool
	}{
		{"images dropped", len(got.Status.Images) == 0},
		{"capacity dropped", got.Status.Capacity == nil && got.Status.Allocatable == nil},
		{"managedFields dropped", got.ManagedFields == nil},
		{"labels kept", got.Labels[LabelBMCHost] == "10.1.0.3" && got.Labels["nvidia.com/gpu.count"] == "8"},
		{"annotations kept", got.Annotations[AnnotationProvider] == ProviderRedfish},
		{"creation time and resourceVersion kept", !got.CreationTimestamp.IsZero() && got.ResourceVersion != ""},
		{"spec kept", got.Spec.ProviderID == nd.Spec.ProviderID && got.Spec.Unschedulable},
		{"boot ID and system UUID kept", got.Status.NodeInfo.BootID == nd.Status.NodeInfo.BootID && got.Status.NodeInfo.SystemUUID == nd.Status.NodeInfo.SystemUUID},
		{"addresses kept", len(got.Status.Addresses) == 3 && got.Status.Addresses[0].Address == "10.0.0.3"},
		{"Ready kept", nodeReady(got)},
	} {
		if !c.ok {
			t.Errorf("%s: not so in the watch's copy", c.what)
		}
	}
}

// BenchmarkNodeWatchMemory measures what the janitor's node watch holds
// per node: 5,000 GPU nodes with a kubelet's status (testenv.GPUNode,
// WithKubeletStatus), the watch started and synced (testenv.HeldHeap),
// beside the same watch keeping whole Nodes and the node's size as the
// apiserver's JSON (managedFields included).
//
//	go test -run '^$' -bench NodeWatchMemory -benchtime 1x ./processors/janitor
func BenchmarkNodeWatchMemory(b *testing.B) {
	const n = 5000
	k := testenv.StartNodeFleet(b, n, func(i int) *corev1.Node { return testenv.WithKubeletStatus(testenv.GPUNode(i), i) })
	one, err := k.CoreV1().Nodes().Get(context.Background(), testenv.GPUNode(0).Name, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	j, _ := json.Marshal(one)
	for _, w := range []struct {
		name  string
		watch func() (informers.SharedInformerFactory, cache.SharedIndexInformer)
	}{
		{"nodeCopy", func() (informers.SharedInformerFactory, cache.SharedIndexInformer) { return nodeWatch(k) }},
		{"whole", func() (informers.SharedInformerFactory, cache.SharedIndexInformer) {
			nf := informers.NewSharedInformerFactory(k, 0)
			return nf, nf.Core().V1().Nodes().Informer()
		}},
	} {
		b.Run(w.name, func(b *testing.B) {
			for range b.N {
				b.ReportMetric(testenv.HeldHeap(b, n, func() (func() bool, func()) {
					nf, inf := w.watch()
					stop := make(chan struct{})
					nf.Start(stop)
					return func() bool { return inf.HasSynced() && len(inf.GetStore().ListKeys()) == n }, func() { close(stop); nf.Shutdown() }
				}), "heap-B/node")
			}
			b.ReportMetric(float64(len(j)), "json-B/node")
		})
	}
}
