package drain

import (
	"context"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestNodeReadFromItsWatch: a step reads its node from the watch where the
// watch holds this replica's last write — a drain with nothing to evict
// and a repeated fault it covers read no node from the API; a copy that
// says the node is not quarantined is read again live; a copy another
// writer changed since is refused at the write and the step redone live.
func TestNodeReadFromItsWatch(t *testing.T) {
	if testing.Short() {
		t.Skip("real kube-apiserver test")
	}
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	k := kube.Client()
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	const node = "watched-1"
	quarantined(t, k, node)
	var gets atomic.Int64
	rc := kube.RESTConfig()
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes/"+node {
				gets.Add(1)
			}
			return rt.RoundTrip(r)
		})
	}
	h := newHandler(t, testConfig(), kubernetes.NewForConfigOrDie(rc), clk, false)
	t.Cleanup(h.Close)
	cl, err := h.reg.Get(cluster)
	if err != nil {
		t.Fatal(err)
	}
	live := func() *corev1.Node {
		n, err := k.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	inWatch := func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			n, ok := h.nodes.Cached(cl, node, clk.Now())
			if ok && n.ResourceVersion == live().ResourceVersion {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the node watch did not deliver the node as it is")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// stale puts a copy of the node in place of the watch's.
	stale := func(n *corev1.Node) {
		idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
		c, _ := drainCopy(n)
		if err := idx.Add(c); err != nil {
			t.Fatal(err)
		}
		h.nodes.Replace(cluster, corelisters.NewNodeLister(idx))
	}

	inWatch()
	acts, rq := handle(t, h, quarantineAction(node, "e-w1", "RESTART_VM", nil))
	if len(rq) != 0 || find(acts, events.OutcomeSucceeded) == nil {
		t.Fatalf("first drain: %s, %d requeued", outcomes(acts), len(rq))
	}
	finished := drainState(t, k, node).FinishedAt
	inWatch()
	clk.Add(time.Minute)
	acts, _ = handle(t, h, repeatAction(node, "e-w2", "RESTART_VM", clk.Now(), finished.Add(-time.Second)))
	if a := find(acts, events.OutcomeSkipped); len(acts) != 1 || a == nil {
		t.Fatalf("covered repeat: %s", outcomes(acts))
	}
	if g := gets.Load(); g != 0 {
		t.Fatalf("a drain and a covered repeat read the node %d times; want 0 (the watch's copy)", g)
	}

	// The watch's copy without the quarantine (its write not delivered).
	n := live()
	delete(n.Labels, events.LabelQuarantined)
	stale(n)
	acts, _ = handle(t, h, quarantineAction(node, "e-w3", "RESTART_VM", nil))
	if find(acts, events.OutcomeSucceeded) == nil || gets.Load() != 1 {
		t.Fatalf("fault on a copy without the quarantine: %s, %d node reads; want a drain, 1 read", outcomes(acts), gets.Load())
	}

	// A copy another writer changed since: the write is refused, the step
	// redone from the live node.
	stale(live())
	n = live()
	n.Labels["team/x"] = "y"
	if _, err := k.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	clk.Add(clusters.RecentWrite) // this replica's last write is no longer recent
	acts, _ = handle(t, h, quarantineAction(node, "e-w4", "RESTART_VM", nil))
	if find(acts, events.OutcomeSucceeded) == nil || find(acts, events.OutcomeFailed) != nil || gets.Load() != 2 {
		t.Fatalf("fault on a copy changed since: %s, %d node reads; want a drain, 2 reads", outcomes(acts), gets.Load())
	}
	if st := drainState(t, k, node); !slices.Contains(st.Seen, "e-w4") || live().Labels["team/x"] != "y" {
		t.Fatalf("after the redo: seen %v, labels %v", st.Seen, live().Labels)
	}
}

// TestStaleCopyEvictsNothingOnALiftedNode: a step that retries an
// eviction changes nothing in the state (the pod backing off after a PDB's
// refusal, its EvictAt kept), yet its intent write is sent: its
// resourceVersion check refuses the calls when the node changed since the
// copy the step decided on. Here the watch's copy holds the drain's last
// write while the quarantine was lifted (label removed, uncordoned) and
// the PDB no longer refuses; the retry's write conflicts, the redo reads
// the node live and cancels the drain, and the pod stays. Before, the
// unchanged state was not written, the pod was evicted from a node no
// longer quarantined, and only the write after it conflicted.
func TestStaleCopyEvictsNothingOnALiftedNode(t *testing.T) {
	if testing.Short() {
		t.Skip("real kube-apiserver test")
	}
	// No disruption controller: the PDB refuses every eviction (429, "still
	// being processed") until it is deleted.
	kube := testenv.StartKube(t, testenv.KubeOptions{KWOK: true})
	k := kube.Client()
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	const node = "lifted-1"
	quarantined(t, k, node)
	createPod(t, k, "guarded", "g0", node, withLabels("app", "g"))
	waitRunning(t, k, node, 1)
	pdb(t, k, "guarded", "guard", 1, "g")
	h := newHandler(t, testConfig(), k, clk, false)
	t.Cleanup(h.Close)

	acts, rq := handle(t, h, quarantineAction(node, "e-lift", "RESTART_VM", nil))
	if find(acts, events.OutcomeBlocked) == nil || len(rq) != 1 {
		t.Fatalf("first step: %s, %d requeues; want blocked by the PDB", outcomes(acts), len(rq))
	}
	// The node as the drain's last write left it: the watch's copy while
	// the lift has not reached it.
	written, err := k.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lifted := written.DeepCopy()
	delete(lifted.Labels, events.LabelQuarantined)
	lifted.Spec.Unschedulable = false
	if _, err := k.CoreV1().Nodes().Update(context.Background(), lifted, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := k.PolicyV1().PodDisruptionBudgets("guarded").Delete(context.Background(), "guard", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	c, _ := drainCopy(written)
	if err := idx.Add(c); err != nil {
		t.Fatal(err)
	}
	h.nodes.Replace(cluster, corelisters.NewNodeLister(idx))
	clk.Add(clusters.RecentWrite) // past the pod's backoff and this replica's last write

	acts, rq = handle(t, h, rq...)
	if pods := podsOn(t, k, node); len(pods) != 1 || pods[0].DeletionTimestamp != nil {
		t.Fatalf("pods %v: the pod was evicted from a node no longer quarantined", podNames(pods))
	}
	if find(acts, events.OutcomeCancelled) == nil || len(rq) != 0 {
		t.Fatalf("retry on the lifted node: %s, %d requeues; want the drain cancelled", outcomes(acts), len(rq))
	}
}

// TestDrainCopyKeepsTheQuarantineStart: the watch's copy of a node keeps
// when its quarantine began beside the drain state (a step read from the
// watch judges a finished drain by it: drainedNode), and drops the rest.
func TestDrainCopyKeepsTheQuarantineStart(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{
		AnnotationState: `{"id":"d1"}`, annotationQuarantinedAt: "2026-12-03T12:00:00Z", "faultline.io/quarantine-reason": "x", "other": "y"}}}
	c, _ := drainCopy(n)
	got := c.(*corev1.Node).Annotations
	if len(got) != 2 || got[AnnotationState] != `{"id":"d1"}` || got[annotationQuarantinedAt] != "2026-12-03T12:00:00Z" {
		t.Fatalf("copy's annotations %v", got)
	}
	if at := quarantinedAt(c.(*corev1.Node)); !at.Equal(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)) {
		t.Fatalf("quarantinedAt %v", at)
	}
}
