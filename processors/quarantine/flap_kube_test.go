package quarantine

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// TestFlapKube: on a real apiserver, a fault that flaps keeps its node
// cordoned through its recoveries from the third occurrence on, and the
// role's stabilization sweep lifts it once the entity stayed healthy for
// the window, on the replica that owns the node only; a dry-run cluster's
// sweep reports the would-lift once and writes nothing.
func TestFlapKube(t *testing.T) {
	t.Parallel() // its own servers; mostly waiting
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	k := kube.Client()
	createNodes(t, k, "flap", "flap-1")
	cfg := testConfig("flap")
	cfg.FlapThreshold, cfg.FlapWindow, cfg.StabilizationWindow = 3, time.Minute, 6*time.Second // the window outlasts the calls before the first sweep on a loaded machine
	h := newTestHandler(t, cfg, map[string]kubernetes.Interface{"c1": k})
	t.Cleanup(h.Close)

	const check, gpu = "XID_ERROR_79", "GPU-1"
	cordoned := func() bool { return getNode(t, k, "flap-1").Spec.Unschedulable }
	var cordons int
	for cycle := 1; cycle <= 4; cycle++ {
		wasCordoned := cordoned()
		acts, _ := handle(t, h, record("c1", fatal("flap-1", check, gpu)))
		if kinds(acts) != "quarantine/applied" || !cordoned() {
			t.Fatalf("cycle %d: fault: %s, cordoned %v", cycle, kinds(acts), cordoned())
		}
		if !wasCordoned {
			cordons++
		}
		acts, _ = handle(t, h, record("c1", healthy("flap-1", check, gpu)))
		switch {
		case cycle < 3:
			if kinds(acts) != "unquarantine/applied" || cordoned() {
				t.Fatalf("cycle %d: a recovery of a fault that is not flapping: %s, cordoned %v", cycle, kinds(acts), cordoned())
			}
		default:
			if kinds(acts) != "unquarantine/deferred" || acts[0].Details[events.DetailLiftAt] == "" || !cordoned() {
				t.Fatalf("cycle %d: a recovery of a flapping fault: %s %v, cordoned %v", cycle, kinds(acts), acts[0].GetDetails(), cordoned())
			}
		}
	}
	if cordons != 3 {
		t.Fatalf("cordoned %d times, want 3 (the third occurrence sticks)", cordons)
	}
	n := getNode(t, k, "flap-1")
	if c := condition(n, "GPUHealthy"); c == nil || c.Status != corev1.ConditionFalse || !strings.Contains(c.Message, "stabilizing until") {
		t.Fatalf("condition while stabilizing: %+v", c)
	}
	if n.Labels[LabelQuarantined] != "true" || !hasTaint(n, "faultline.io/unhealthy") {
		t.Fatalf("not quarantined while stabilizing: labels %v taints %v", n.Labels, n.Spec.Taints)
	}
	st, _ := ReadState(n)
	liftAt := st.Faults[FaultKey(check, "GPU="+gpu)].LiftAt
	if liftAt.IsZero() {
		t.Fatalf("no deadline in the state: %+v", st.Faults)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The recoveries' actions were written on the node with their changes
	// and went out with their batches: resay only removes them.
	if !strings.Contains(n.Annotations[AnnotationUnsaid], `"deferred"`) {
		t.Fatalf("the recoveries' actions not on the node: %v", n.Annotations)
	}
	waitWatchedUnsaid(t, h, "flap-1", some, "the watch has the last recovery")
	var said actionSink
	if err := h.resay(ctx, &said); err != nil || len(said.snapshot()) > 0 {
		t.Fatalf("resay of actions the batches produced: %s, %v", kinds(said.snapshot()), err)
	}
	if n := getNode(t, k, "flap-1"); n.Annotations[AnnotationUnsaid] != "" {
		t.Fatalf("produced actions left on the node: %s", n.Annotations[AnnotationUnsaid])
	}
	// Before the deadline the sweep lifts nothing.
	if acts, err := h.SweepStabilized(ctx, []string{"c1"}); err != nil || len(acts) > 0 || !cordoned() {
		t.Fatalf("sweep before the deadline: %s, %v; cordoned %v", kinds(acts), err, cordoned())
	}
	time.Sleep(time.Until(liftAt) + 100*time.Millisecond)

	// A dry-run view of the same cluster reports the would-lift, once.
	reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	reg.SetClient("c1", k, true)
	dry, err := New(cfg, reg, Options{Log: testLog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dry.Close)
	var dryActs []*faultlinev1.Action
	for time.Now().Before(liftAt.Add(10*time.Second)) && len(dryActs) == 0 {
		if dryActs, err = dry.SweepStabilized(ctx, []string{"c1"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // the dry handler's watch syncs
	}
	if kinds(dryActs) != "unquarantine/dry_run" || !dryActs[0].DryRun || !cordoned() {
		t.Fatalf("dry-run sweep: %s, cordoned %v", kinds(dryActs), cordoned())
	}
	if again, _ := dry.SweepStabilized(ctx, []string{"c1"}); len(again) > 0 {
		t.Fatalf("dry-run would-lift reported again: %s", kinds(again))
	}

	// A replica that does not own the node's partition leaves it.
	h.PartitionsAssigned(events.TopicEvents, nil, 12)
	if acts, err := h.SweepStabilized(ctx, []string{"c1"}); err != nil || len(acts) > 0 || !cordoned() {
		t.Fatalf("sweep of a replica owning nothing: %s, %v; cordoned %v", kinds(acts), err, cordoned())
	}
	h.PartitionsAssigned(events.TopicEvents, []int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 12)

	// The role's loop lifts it; the broker refuses the action: it stays on
	// the node (AnnotationUnsaid), which a replica started after this one
	// stopped produces and removes.
	prod := actionSink{refuse: 1}
	loopCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { h.RunStabilization(loopCtx, &prod, []string{"c1"}); close(done) }()
	waitUntil(t, 20*time.Second, func() bool {
		prod.mu.Lock()
		defer prod.mu.Unlock()
		return prod.refused == 1
	}, "the lift's action refused")
	stop()
	<-done
	n = getNode(t, k, "flap-1")
	if n.Spec.Unschedulable || !strings.Contains(n.Annotations[AnnotationUnsaid], `"unquarantine"`) {
		t.Fatalf("lifted, its action refused: cordoned %v, annotations %v", n.Spec.Unschedulable, n.Annotations)
	}
	h2 := newTestHandler(t, cfg, map[string]kubernetes.Interface{"c1": k})
	t.Cleanup(h2.Close)
	watchSynced(t, h2)
	if err := h2.resay(ctx, &prod); err != nil {
		t.Fatal(err)
	}
	acts := prod.snapshot()
	if kinds(acts) != "unquarantine/applied" || acts[0].CheckName != check || acts[0].Details[events.DetailUncordoned] != "true" ||
		acts[0].Details[events.DetailEntities] != "GPU="+gpu {
		t.Fatalf("sweep actions: %s %v", kinds(acts), acts[0].GetDetails())
	}
	n = getNode(t, k, "flap-1")
	if _, ok := n.Annotations[AnnotationUnsaid]; ok {
		t.Fatalf("produced action left on the node: %s", n.Annotations[AnnotationUnsaid])
	}
	if n.Spec.Unschedulable || hasTaint(n, "faultline.io/unhealthy") || n.Labels[LabelQuarantined] != "" || n.Annotations[AnnotationReason] != "" {
		t.Fatalf("not lifted: %+v labels %v annotations %v", n.Spec, n.Labels, n.Annotations)
	}
	if c := condition(n, "GPUHealthy"); c == nil || c.Status != corev1.ConditionTrue {
		t.Fatalf("condition after the lift: %+v", c)
	}
	// The dry-run view forgets its would-lift once a sweep no longer finds
	// it (its watch sees the lift).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := dry.SweepStabilized(ctx, []string{"c1"}); err != nil {
			t.Fatal(err)
		}
		dry.mu.Lock()
		left := len(dry.dryRunLifts)
		dry.mu.Unlock()
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d would-lifts kept after the lift", left)
		}
	}
	// The onsets stay for the flap window: the next occurrence is the
	// fifth within it, so its recovery is held at once.
	if st, _ := ReadState(n); len(st.Faults) != 0 || len(st.History) != 1 {
		t.Fatalf("state after the lift: %+v", st)
	}
	if acts, _ := handle(t, h, record("c1", fatal("flap-1", check, gpu))); kinds(acts) != "quarantine/applied" {
		t.Fatalf("fault after the lift: %s", kinds(acts))
	}
	if acts, _ := handle(t, h, record("c1", healthy("flap-1", check, gpu))); kinds(acts) != "unquarantine/deferred" || !cordoned() {
		t.Fatalf("recovery within the flap window after a lift: %s, cordoned %v", kinds(acts), cordoned())
	}
}
