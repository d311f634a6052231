package quarantine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	clienttesting "k8s.io/client-go/testing"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// behindHandler returns a handler of cluster c1 whose requests go to k and
// whose node watch holds seed as it listed it, then fails (its lists and
// watches refused, the reflector in backoff), while other writers change
// the node in k: replica A of the scenarios below.
func behindHandler(t *testing.T, cfg Config, k kubernetes.Interface, seed *corev1.Node) *Handler {
	t.Helper()
	wk := fakeKube()
	seed = seed.DeepCopy()
	seed.ResourceVersion = ""
	if err := wk.Tracker().Add(seed); err != nil {
		t.Fatal(err)
	}
	var (
		down    atomic.Bool
		refused atomic.Int32
		mu      sync.Mutex
		open    []*watch.RaceFreeFakeWatcher
	)
	wk.PrependReactor("list", "nodes", func(clienttesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			refused.Add(1)
			return true, nil, errors.New("apiserver unreachable")
		}
		return false, nil, nil
	})
	wk.PrependWatchReactor("nodes", func(clienttesting.Action) (bool, watch.Interface, error) {
		if down.Load() {
			refused.Add(1)
			return true, nil, errors.New("apiserver unreachable")
		}
		w := watch.NewRaceFreeFake() // delivers nothing: the copy stays as listed
		mu.Lock()
		open = append(open, w)
		mu.Unlock()
		return true, w, nil
	})
	reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	reg.SetClient("c1", k, false).WatchKube = wk
	h, err := New(cfg, reg, Options{Log: testLog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	cl, _ := reg.Get("c1")
	waitUntil(t, 10*time.Second, func() bool { _, ok := h.nodes.Cached(cl, seed.Name, h.now()); return ok }, "the node watch synced")
	down.Store(true)
	mu.Lock()
	for _, w := range open {
		w.Stop()
	}
	mu.Unlock()
	// Twice: the first refusal's failure is reported before the second.
	waitUntil(t, 20*time.Second, func() bool { return refused.Load() >= 2 }, "the node watch refused twice")
	return h
}

// Another replica applies a fault (from the retry topic) while this
// replica's node watch is failing, so its copy shows nothing standing;
// the fault's recovery reaches this replica: it reads the node live and
// lifts the fault. Before, it decided from the copy that nothing stood,
// wrote nothing (so no conflict corrected it) and the node stayed
// cordoned for good.
func TestRecoveryOverAWatchBehind(t *testing.T) {
	cfg := testConfig("behindrec")
	b, k, _ := fakeHandler(t, cfg, "behindrec", "behindrec-1")
	a := behindHandler(t, cfg, k, getNode(t, k, "behindrec-1"))
	if acts, _ := handle(t, b, record("c1", fatal("behindrec-1", "XID_ERROR_48", "GPU-1"))); kinds(acts) != "quarantine/applied" {
		t.Fatalf("fault on the other replica: %s", kinds(acts))
	}
	acts, _ := handle(t, a, record("c1", healthy("behindrec-1", "XID_ERROR_48", "GPU-1")))
	if n := getNode(t, k, "behindrec-1"); kinds(acts) != "unquarantine/applied" || n.Spec.Unschedulable || n.Annotations[AnnotationState] != "" {
		t.Fatalf("recovery over a watch behind: actions %s; node unschedulable %v, state %s", kinds(acts), n.Spec.Unschedulable, n.Annotations[AnnotationState])
	}
}

// The same with a repeat: another replica lifted a fault while this
// replica's watch is failing, so its copy shows the fault standing; a new
// occurrence of it within repeat_write_interval is not taken for a repeat
// that changes nothing: it is decided on the node read live and cordons
// it again.
func TestRepeatOverAWatchBehind(t *testing.T) {
	cfg := testConfig("behindrep")
	b, k, _ := fakeHandler(t, cfg, "behindrep", "behindrep-1")
	if acts, _ := handle(t, b, record("c1", fatal("behindrep-1", "XID_ERROR_48", "GPU-1"))); kinds(acts) != "quarantine/applied" {
		t.Fatalf("fault: %s", kinds(acts))
	}
	a := behindHandler(t, cfg, k, getNode(t, k, "behindrep-1")) // its copy: the fault standing
	if acts, _ := handle(t, b, record("c1", healthy("behindrep-1", "XID_ERROR_48", "GPU-1"))); kinds(acts) != "unquarantine/applied" {
		t.Fatalf("recovery on the other replica: %s", kinds(acts))
	}
	acts, _ := handle(t, a, record("c1", fatal("behindrep-1", "XID_ERROR_48", "GPU-1")))
	if n := getNode(t, k, "behindrep-1"); kinds(acts) != "quarantine/applied" || !n.Spec.Unschedulable || n.Labels[LabelQuarantined] != "true" {
		t.Fatalf("occurrence over a watch behind: actions %s; node unschedulable %v, labels %v", kinds(acts), n.Spec.Unschedulable, n.Labels)
	}
}

// TestThrottledIsNotTheClusters: the client's own rate limiter refusing
// to wait past the batch's deadline (more of the batch's writes for the
// cluster than its QPS lets through in time) defers the rest as an ended
// batch does; it is not counted or logged as the cluster's API error.
func TestThrottledIsNotTheClusters(t *testing.T) {
	h, k, _ := fakeHandler(t, testConfig("throttle"), "throttle", "throttle-1")
	k.PrependReactor("patch", "nodes", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("client rate limiter Wait returned an error: rate: Wait(n=1) would exceed context deadline")
	})
	acts, deferred := handle(t, h, record("c1", fatal("throttle-1", "XID_ERROR_48", "GPU-1")))
	if len(deferred) != 1 || len(acts) != 0 {
		t.Fatalf("throttled write: actions %s, %d records deferred; want none and the record", kinds(acts), len(deferred))
	}
	if n := testutil.ToFloat64(h.m.apiErrors.WithLabelValues("c1")); n != 0 {
		t.Errorf("throttled write counted %v cluster API errors, want none", n)
	}
}

// manualUncordonIDs returns the ids of the manual_uncordon actions among
// acts.
func manualUncordonIDs(acts []*faultlinev1.Action) []string {
	var ids []string
	for _, a := range acts {
		if a.GetKind() == events.KindManualUncordon {
			ids = append(ids, a.GetId())
		}
	}
	return ids
}

// faultline cordons a node for one fault, a person uncordons it, and a
// new fault of it is decided before the node watch's notice is handled:
// one write acknowledges the uncordon and cordons the node again. The
// batch's produce fails and the pipeline redoes it: the redo finds
// nothing to acknowledge (the node is cordoned), yet the manual_uncordon
// action is not lost: the write kept it on the node, and resay produces
// it, the same id. Before, fault() built it after the write and never
// stored it: it was lost for ever.
func TestManualUncordonOfARedoneFault(t *testing.T) {
	h, k, advance := fakeHandler(t, testConfig("redoack"), "redoack", "redoack-1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if acts, _ := handle(t, h, record("c1", fatal("redoack-1", "XID_ERROR_48", "GPU-1"))); kinds(acts) != "quarantine/applied" {
		t.Fatalf("fault: %s", kinds(acts))
	}
	uncordonSeen(t, h, k, getNode(t, k, "redoack-1"))
	rec := record("c1", fatal("redoack-1", "XID_ERROR_48", "GPU-2"))
	res, err := h.Handle(ctx, []*kgo.Record{rec}) // its produce fails: res.Produced never called
	if err != nil {
		t.Fatal(err)
	}
	first, _ := splitOut(t, res.Out)
	if kinds(first) != "manual_uncordon/decided,quarantine/applied" || !getNode(t, k, "redoack-1").Spec.Unschedulable {
		t.Fatalf("new fault after the uncordon: %s", kinds(first))
	}
	again, _ := handle(t, h, rec) // the pipeline redoes the batch
	// Past sayingFor the first try's action is no longer in flight.
	advance(sayingFor + time.Second)
	waitWatchedUnsaid(t, h, "redoack-1", func(u string) bool { return strings.Contains(u, events.KindManualUncordon) }, "the manual uncordon kept on the node")
	var said actionSink
	if err := h.resay(ctx, &said); err != nil {
		t.Fatal(err)
	}
	want := manualUncordonIDs(first)
	redone := manualUncordonIDs(append(again, said.snapshot()...))
	if len(redone) != 1 || redone[0] != want[0] {
		t.Fatalf("manual_uncordon after the redo %v (redo %s, resaid %s); want once, %v", redone, kinds(again), kinds(said.snapshot()), want)
	}
}

// The breaker is open; a person uncordons a node faultline cordoned, and
// a new fault of it is held by the breaker: the fault is not written, the
// acknowledgement is (faultline's taint and label go, the uncordon's time
// is recorded, its action kept on the node), so the node watch's notice
// finds nothing to acknowledge again. Before, the held fault wrote
// nothing: the node stayed schedulable with faultline's taint and label,
// and the notice acknowledged it later with a second manual_uncordon
// action.
func TestManualUncordonWhileTheBreakerHolds(t *testing.T) {
	cfg := testConfig("heldack")
	cfg.Breaker.MaxPercent = 10 // of 4 nodes: 1
	h, k, _ := fakeHandler(t, cfg, "heldack", "heldack-1", "heldack-2", "heldack-3", "heldack-4")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a1, _ := handle(t, h, record("c1", fatal("heldack-1", "XID_ERROR_48", "GPU-1")))
	a2, _ := handle(t, h, record("c1", fatal("heldack-2", "XID_ERROR_48", "GPU-1")))
	if got := kinds(append(a1, a2...)); got != "quarantine/applied,breaker_open/applied,quarantine/held_by_breaker" {
		t.Fatalf("faults: %s", got)
	}
	uncordonSeen(t, h, k, getNode(t, k, "heldack-1"))
	acts, _ := handle(t, h, record("c1", fatal("heldack-1", "XID_ERROR_48", "GPU-2")))
	if kinds(acts) != "manual_uncordon/decided,quarantine/held_by_breaker" {
		t.Fatalf("new fault after the uncordon: %s", kinds(acts))
	}
	n := getNode(t, k, "heldack-1")
	if n.Spec.Unschedulable || hasTaint(n, "faultline.io/unhealthy") || n.Labels[LabelQuarantined] != "" || n.Annotations[AnnotationManualUncordon] == "" {
		t.Fatalf("uncordon not acknowledged: unschedulable %v, taints %v, labels %v, annotations %v",
			n.Spec.Unschedulable, n.Spec.Taints, n.Labels, n.Annotations)
	}
	st, _ := ReadState(n)
	if own, _ := st.unsaid("c1", "heldack-1"); len(manualUncordonIDs(own)) != 1 || manualUncordonIDs(own)[0] != acts[0].GetId() {
		t.Fatalf("unsaid on the node %v, want the manual_uncordon %s", own, acts[0].GetId())
	}
	if f := st.Faults[FaultKey("XID_ERROR_48", events.EntityKey(fatal("heldack-1", "XID_ERROR_48", "GPU-1")))]; len(st.Faults) != 1 || f == nil || !f.Acked {
		t.Fatalf("faults %v: want the first, acknowledged; the held one not written", st.Faults)
	}
	if a, err := h.AcknowledgeUncordon(ctx, "c1", "heldack-1"); a != nil || err != nil {
		t.Fatalf("the watch's notice acknowledged again: %v, %v", a, err)
	}
}

// The same, with the acknowledgement's write meeting a conflict: someone
// cordoned the node again meanwhile. Re-decided on the node as it is now,
// nothing is uncordoned and the new fault joins the standing quarantine
// (no breaker slot asked): it is applied, not reported held by the
// breaker. Before, the first run's "held" stayed set: the fault stood on
// the node while its action said held_by_breaker, and nothing drained it.
func TestHeldThenConflictReDecided(t *testing.T) {
	cfg := testConfig("heldcf")
	cfg.Breaker.MaxPercent = 10 // of 4 nodes: 1
	h, k, _ := fakeHandler(t, cfg, "heldcf", "heldcf-1", "heldcf-2", "heldcf-3", "heldcf-4")
	handle(t, h, record("c1", fatal("heldcf-1", "XID_ERROR_48", "GPU-1")))
	handle(t, h, record("c1", fatal("heldcf-2", "XID_ERROR_48", "GPU-1")))
	uncordonSeen(t, h, k, getNode(t, k, "heldcf-1"))
	var once sync.Once
	k.PrependReactor("patch", "nodes", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.(clienttesting.PatchActionImpl).GetName() != "heldcf-1" {
			return false, nil, nil
		}
		conflict := false
		once.Do(func() {
			conflict = true
			obj, err := k.Tracker().Get(a.GetResource(), "", "heldcf-1")
			if err != nil {
				t.Error(err)
				return
			}
			n := obj.(*corev1.Node).DeepCopy()
			n.Spec.Unschedulable = true // cordoned again, by hand
			n.ResourceVersion += "-again"
			if err := k.Tracker().Update(a.GetResource(), n, ""); err != nil {
				t.Error(err)
			}
		})
		if conflict {
			return true, nil, apierrors.NewConflict(a.GetResource().GroupResource(), "heldcf-1", errors.New("the object has been modified"))
		}
		return false, nil, nil
	})
	acts, _ := handle(t, h, record("c1", fatal("heldcf-1", "XID_ERROR_48", "GPU-2")))
	if got := kinds(acts); strings.Contains(got, events.OutcomeHeld) || !strings.Contains(got, "quarantine/applied") {
		t.Fatalf("the re-decided fault: %s, want it applied (it stands on the node)", got)
	}
	if st, _ := ReadState(getNode(t, k, "heldcf-1")); len(st.Faults) != 2 {
		t.Fatalf("faults on the node %v, want both", st.Faults)
	}
}
