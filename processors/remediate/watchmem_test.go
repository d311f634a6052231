package remediate

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/faultline/faultline/internal/testenv"
)

// BenchmarkWatchMemory measures what a replica's watch holds per
// RebootNode: 5,000 RebootNodes created by the role (one per node,
// as drain results ask), finished by the test as the janitor finishes
// them (conditions, startTime, completionTime), then a new handler's
// watches started and synced (testenv.HeldHeap), beside the objects' size
// as the apiserver's JSON.
//
//	go test -run '^$' -bench WatchMemory -benchtime 1x ./processors/remediate
func BenchmarkWatchMemory(b *testing.B) {
	const n = 5000
	kube := testenv.StartKube(b, testenv.KubeOptions{})
	k := kube.Client()
	rc := kube.RESTConfig()
	rc.QPS, rc.Burst = -1, 0 // the test's own writes: no client limit
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}
	kube.ApplyCRDs(b, "../../deploy/crds/*.yaml")
	clk := &clock{t: time.Now()}
	h := newHandler(b, testConfig(), k, dyn, clk)
	recs := make([]*kgo.Record, 0, n)
	for i := range n {
		recs = append(recs, drained(fmt.Sprintf("gpu-node-%05d", i), fmt.Sprintf("m-%d", i), "REPLACE_VM", nil))
	}
	for i := 0; i < n; i += 500 {
		if acts, _ := handle(b, h, recs[i:min(i+500, n)]...); len(acts) != min(500, n-i) {
			b.Fatalf("created %s", outcomes(acts))
		}
	}
	l, err := dyn.Resource(rebootGVR).List(context.Background(), metav1.ListOptions{})
	if err != nil || len(l.Items) != n {
		b.Fatalf("%v RebootNodes listed, want %d: %v", len(l.Items), n, err)
	}
	var g errgroup.Group
	g.SetLimit(32)
	for _, o := range l.Items {
		g.Go(func() error {
			return writeStatus(dyn, rebootGVR, o.GetName(), true, cond{"SignalSent", "True", "Succeeded"}, cond{"NodeReady", "True", "Succeeded"})
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	l, err = dyn.Resource(rebootGVR).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	size := 0
	for _, o := range l.Items {
		j, err := json.Marshal(o.Object)
		if err != nil {
			b.Fatal(err)
		}
		size += len(j)
	}
	h.Close()
	b.ResetTimer()
	for range b.N {
		b.ReportMetric(testenv.HeldHeap(b, n, func() (func() bool, func()) {
			w := newHandler(b, testConfig(), k, dyn, clk)
			w.WatchClusters([]string{cluster})
			rc := w.caches.get(nil, w.watchKey(cluster, w.cfg.template("REPLACE_VM")))
			return func() bool { return rc.inf.HasSynced() && len(rc.inf.GetStore().ListKeys()) == n }, w.Close
		}), "heap-B/RebootNode")
	}
	b.ReportMetric(float64(size)/n, "json-B/RebootNode")
}
