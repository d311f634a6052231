package quarantine

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// A person uncordons a node held by a stabilizing (flapping) fault and a
// standing one, and the sweep lifts the first before the watch's notice
// of the uncordon is handled: the sweep acknowledges the uncordon with
// its lift and does not cordon the node again for the fault still
// standing.
func TestSweepKeepsAManualUncordon(t *testing.T) {
	cfg := testConfig("sweepack")
	cfg.FlapThreshold, cfg.FlapWindow, cfg.StabilizationWindow = 3, 10*time.Minute, time.Minute
	h, k, advance := fakeHandler(t, cfg, "sweepack", "sweepack-1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Each event generated a second after the last, on the handler's
	// clock (the onsets are the events' times, the deadline the clock's).
	now := func(ev *datamodels.HealthEvent) *kgo.Record {
		ev.GeneratedTimestamp = timestamppb.New(advance(time.Second))
		return record("c1", ev)
	}
	for range 3 {
		handle(t, h, now(fatal("sweepack-1", "XID_ERROR_79", "GPU-1")))
		handle(t, h, now(healthy("sweepack-1", "XID_ERROR_79", "GPU-1")))
	}
	if acts, _ := handle(t, h, now(fatal("sweepack-1", "XID_ERROR_48", "GPU-2"))); kinds(acts) != "quarantine/applied" {
		t.Fatalf("second fault: %s", kinds(acts))
	}
	n := getNode(t, k, "sweepack-1")
	st, _ := ReadState(n)
	if f := st.Faults[FaultKey("XID_ERROR_79", "GPU=GPU-1")]; f == nil || !f.Stabilizing() || !n.Spec.Unschedulable {
		t.Fatalf("before the uncordon: unschedulable %v, faults %v", n.Spec.Unschedulable, st.Faults)
	}
	uncordonSeen(t, h, k, n)

	advance(2 * time.Minute)
	acts, err := h.SweepStabilized(ctx, []string{"c1"})
	if err != nil || kinds(acts) != "manual_uncordon/decided,unquarantine/in_progress" {
		t.Fatalf("sweep: %s, %v", kinds(acts), err)
	}
	n = getNode(t, k, "sweepack-1")
	if n.Spec.Unschedulable || hasTaint(n, "faultline.io/unhealthy") || n.Labels[LabelQuarantined] != "" ||
		n.Annotations[AnnotationManualUncordon] == "" {
		t.Fatalf("the person's uncordon undone: unschedulable %v, taints %v, labels %v, annotations %v",
			n.Spec.Unschedulable, n.Spec.Taints, n.Labels, n.Annotations)
	}
	if a, err := h.AcknowledgeUncordon(ctx, "c1", "sweepack-1"); a != nil || err != nil {
		t.Fatalf("acknowledged twice: %v, %v", a, err)
	}
}

// refuseObjectPatches makes k refuse the object patches (metadata and
// spec, not nodes/status) of the nodes set, each with its error: a
// webhook that denies them, a persistent 4xx, an unavailable webhook.
// nil lets the node's patches through again.
func refuseObjectPatches(k *fake.Clientset) func(node string, err error) {
	var (
		mu      sync.Mutex
		refused = map[string]error{}
	)
	k.PrependReactor("patch", "nodes", func(a clienttesting.Action) (bool, runtime.Object, error) {
		p := a.(clienttesting.PatchActionImpl)
		mu.Lock()
		defer mu.Unlock()
		if err := refused[p.GetName()]; err != nil && p.GetSubresource() == "" {
			return true, nil, err
		}
		return false, nil, nil
	})
	return func(node string, err error) {
		mu.Lock()
		defer mu.Unlock()
		refused[node] = err
	}
}

// sweptAfter waits until h's node watch shows what the API has of each
// node (the sweep decides on its copy), then runs one sweep.
func sweptAfter(t *testing.T, h *Handler, k kubernetes.Interface, nodes ...string) []*faultlinev1.Action {
	t.Helper()
	cl, _ := h.reg.Get("c1")
	for _, name := range nodes {
		rv := getNode(t, k, name).ResourceVersion
		waitUntil(t, 10*time.Second, func() bool {
			c, err := h.nodes.Get(cl).Lister.Get(name)
			return err == nil && c.ResourceVersion == rv
		}, "the node watch to show "+name)
	}
	acts, err := h.SweepStabilized(context.Background(), []string{"c1"})
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	return acts
}

// conditionIs fails t unless node shows condition typ with status (and,
// when given, reason).
func conditionIs(t *testing.T, k kubernetes.Interface, node, typ string, status corev1.ConditionStatus, reason string) {
	t.Helper()
	c := condition(getNode(t, k, node), typ)
	if c == nil || c.Status != status || (reason != "" && c.Reason != reason) {
		t.Fatalf("%s %s: %+v; want %s %s", node, typ, c, status, reason)
	}
}

// The condition is written (nodes/status) before the object patch that
// cordons the node and records the fault; an object patch refused for
// good left GPUHealthy=False on a node faultline never quarantined, and
// nothing lifted it (only a standing fault's recovery does). The sweep
// sets such a condition True once a batch's bound has passed since it
// was written; a quarantine's own condition stays, on the same node too.
func TestUnwrittenQuarantineConditionCleared(t *testing.T) {
	cfg := testConfig("orphan")
	h, k, advance := fakeHandler(t, cfg, "orphan", "orphan-1", "orphan-2")
	refuse := refuseObjectPatches(k)
	watchSynced(t, h)
	denied := apierrors.NewBadRequest(`admission webhook "nodes.policy.example.com" denied the request: taint not allowed`)

	refuse("orphan-1", denied)
	if acts, _ := handle(t, h, record("c1", fatal("orphan-1", "XID_ERROR_79", "GPU-1"))); kinds(acts) != "quarantine/failed" {
		t.Fatalf("refused fault: %s", kinds(acts))
	}
	if n := getNode(t, k, "orphan-1"); n.Spec.Unschedulable || n.Annotations[AnnotationState] != "" {
		t.Fatalf("refused fault wrote the object: unschedulable %v, annotations %v", n.Spec.Unschedulable, n.Annotations)
	}
	conditionIs(t, k, "orphan-1", "GPUHealthy", corev1.ConditionFalse, "XidError79") // what the bug left

	// orphan-2: a GPU fault quarantines it; a NIC fault's object patch
	// is then refused, leaving NICHealthy=False beside the quarantine.
	if acts, _ := handle(t, h, record("c1", fatal("orphan-2", "XID_ERROR_48", "GPU-1"))); kinds(acts) != "quarantine/applied" {
		t.Fatalf("fault: %s", kinds(acts))
	}
	refuse("orphan-2", denied)
	nic := fatal("orphan-2", "NIC_LINK_DOWN", "")
	nic.ComponentClass = "NIC"
	if acts, _ := handle(t, h, record("c1", nic)); kinds(acts) != "quarantine/failed" {
		t.Fatalf("refused NIC fault: %s", kinds(acts))
	}
	refuse("orphan-2", nil)
	conditionIs(t, k, "orphan-2", "NICHealthy", corev1.ConditionFalse, "")

	// Within the grace an apply may still be in flight: left alone.
	if acts := sweptAfter(t, h, k, "orphan-1", "orphan-2"); len(acts) > 0 {
		t.Fatalf("sweep within the grace: %s", kinds(acts))
	}
	conditionIs(t, k, "orphan-1", "GPUHealthy", corev1.ConditionFalse, "")
	conditionIs(t, k, "orphan-2", "NICHealthy", corev1.ConditionFalse, "")

	advance(cfg.BatchTimeout)
	if acts := sweptAfter(t, h, k, "orphan-1", "orphan-2"); len(acts) > 0 {
		t.Fatalf("sweep: %s", kinds(acts))
	}
	conditionIs(t, k, "orphan-1", "GPUHealthy", corev1.ConditionTrue, "NoFaultStanding")
	conditionIs(t, k, "orphan-2", "NICHealthy", corev1.ConditionTrue, "NoFaultStanding")
	conditionIs(t, k, "orphan-2", "GPUHealthy", corev1.ConditionFalse, "XidError48") // the quarantine's own
	n := getNode(t, k, "orphan-2")
	if st, _ := ReadState(n); !n.Spec.Unschedulable || len(st.Faults) != 1 || !slices.Equal(st.Conditions, []string{"GPUHealthy"}) {
		t.Fatalf("quarantine changed: unschedulable %v, state %+v", n.Spec.Unschedulable, st)
	}
	if n := getNode(t, k, "orphan-1"); n.Spec.Unschedulable || n.Annotations[AnnotationState] != "" {
		t.Fatalf("the sweep quarantined orphan-1: unschedulable %v, annotations %v", n.Spec.Unschedulable, n.Annotations)
	}

	// The fault again, let through: quarantined, its condition False.
	refuse("orphan-1", nil)
	if acts, _ := handle(t, h, record("c1", fatal("orphan-1", "XID_ERROR_79", "GPU-1"))); kinds(acts) != "quarantine/applied" {
		t.Fatalf("fault again: %s", kinds(acts))
	}
	conditionIs(t, k, "orphan-1", "GPUHealthy", corev1.ConditionFalse, "XidError79")
	advance(cfg.BatchTimeout)
	sweptAfter(t, h, k, "orphan-1")
	conditionIs(t, k, "orphan-1", "GPUHealthy", corev1.ConditionFalse, "XidError79")
}

// A fault whose object patch failed (an unavailable webhook) is deferred
// with its condition written; retried after the breaker's window, the
// breaker, opened meanwhile by other nodes, holds it: nothing is written,
// and the condition stayed False on a node faultline never quarantined.
// The sweep sets it True.
func TestHeldRetryConditionCleared(t *testing.T) {
	cfg := testConfig("orphanheld")
	cfg.Breaker.MaxPercent = 34 // of 3 nodes: 1
	cfg.RetryWait = 100 * time.Millisecond
	h, k, advance := fakeHandler(t, cfg, "orphanheld", "held-1", "held-2", "held-3")
	cl, _ := h.reg.Get("c1")
	cl.Gate.MinBackoff, cl.Gate.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	refuse := refuseObjectPatches(k)
	watchSynced(t, h)

	refuse("held-1", apierrors.NewServiceUnavailable("webhook nodes.policy.example.com unavailable"))
	_, deferred := handle(t, h, record("c1", fatal("held-1", "XID_ERROR_79", "GPU-1")))
	if len(deferred) != 1 {
		t.Fatalf("deferred %d records, want 1", len(deferred))
	}
	conditionIs(t, k, "held-1", "GPUHealthy", corev1.ConditionFalse, "XidError79")
	refuse("held-1", nil)

	advance(cfg.Breaker.Window + time.Minute) // held-1's slot leaves the window
	waitUntil(t, 5*time.Second, func() bool { return !h.deferring("c1") }, "the cluster's deferral grace to pass")
	if acts, _ := handle(t, h, record("c1", fatal("held-2", "XID_ERROR_79", "GPU-1"))); kinds(acts) != "quarantine/applied" {
		t.Fatalf("held-2: %s", kinds(acts))
	}
	if acts, _ := handle(t, h, record("c1", fatal("held-3", "XID_ERROR_79", "GPU-1"))); !strings.Contains(kinds(acts), "quarantine/held_by_breaker") {
		t.Fatalf("held-3: %s", kinds(acts))
	}
	if acts := retryUntil(t, h, deferred, 10*time.Second); !strings.Contains(kinds(acts), "quarantine/held_by_breaker") {
		t.Fatalf("retried held-1: %s", kinds(acts))
	}
	if n := getNode(t, k, "held-1"); n.Spec.Unschedulable || n.Annotations[AnnotationState] != "" {
		t.Fatalf("held-1 quarantined: unschedulable %v, annotations %v", n.Spec.Unschedulable, n.Annotations)
	}
	conditionIs(t, k, "held-1", "GPUHealthy", corev1.ConditionFalse, "") // what the bug left

	sweptAfter(t, h, k, "held-1", "held-2")
	conditionIs(t, k, "held-1", "GPUHealthy", corev1.ConditionTrue, "NoFaultStanding")
	conditionIs(t, k, "held-2", "GPUHealthy", corev1.ConditionFalse, "XidError79")
}

// orphanConditions: only a False condition of faultline's that no
// standing fault holds, written at least the grace ago.
func TestOrphanConditions(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	grace := 2 * time.Minute
	gpu := Fault{Check: "XID_ERROR_79", Class: "GPU", Rule: "r", Condition: true, Cordon: true, Since: t0, LastSeen: t0}
	cond := func(typ string, status corev1.ConditionStatus, msg string, written time.Time) corev1.NodeCondition {
		return corev1.NodeCondition{Type: corev1.NodeConditionType(typ), Status: status, Message: msg,
			LastHeartbeatTime: metav1.NewTime(written), LastTransitionTime: metav1.NewTime(written)}
	}
	old := t0.Add(-grace)
	for _, tc := range []struct {
		name  string
		fault func(f *Fault) // nil: no fault stands
		cond  corev1.NodeCondition
		want  []string
	}{
		{"no fault", nil, cond("GPUHealthy", corev1.ConditionFalse, conditionPrefix+"XID_ERROR_79", old), []string{"GPUHealthy"}},
		{"no fault, within the grace", nil, cond("GPUHealthy", corev1.ConditionFalse, conditionPrefix+"XID_ERROR_79", old.Add(time.Second)), nil},
		{"no fault, no heartbeat", nil, cond("GPUHealthy", corev1.ConditionFalse, conditionPrefix+"XID_ERROR_79", time.Time{}), []string{"GPUHealthy"}},
		{"no fault, True", nil, cond("GPUHealthy", corev1.ConditionTrue, conditionPrefix+"every fault of this component recovered", old), nil},
		{"no fault, someone else's", nil, cond("GPUHealthy", corev1.ConditionFalse, "gpu-operator: XID 79", old), nil},
		{"standing fault", func(*Fault) {}, cond("GPUHealthy", corev1.ConditionFalse, conditionPrefix+"XID_ERROR_79", old), nil},
		{"acknowledged fault", func(f *Fault) { f.Acked = true }, cond("GPUHealthy", corev1.ConditionFalse, conditionPrefix+"XID_ERROR_79", old), nil},
		{"stabilizing fault", func(f *Fault) { f.Flapping, f.RecoveredAt, f.LiftAt = true, old, t0.Add(time.Hour) },
			cond("GPUHealthy", corev1.ConditionFalse, conditionPrefix+"XID_ERROR_79", old), nil},
		{"fault of another class", func(f *Fault) { f.Class = "NIC" }, cond("GPUHealthy", corev1.ConditionFalse, conditionPrefix+"XID_ERROR_79", old), []string{"GPUHealthy"}},
		{"fault without a condition", func(f *Fault) { f.Condition = false }, cond("GPUHealthy", corev1.ConditionFalse, conditionPrefix+"XID_ERROR_79", old), []string{"GPUHealthy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &State{Faults: map[string]*Fault{}}
			if tc.fault != nil {
				f := gpu
				tc.fault(&f)
				st.Faults[FaultKey(f.Check, f.Entity)] = &f
			}
			n := &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
				cond("Ready", corev1.ConditionTrue, "kubelet is posting ready status", old), tc.cond}}}
			if got := st.orphanConditions(n, t0, grace); !slices.Equal(got, tc.want) {
				t.Fatalf("orphanConditions = %v, want %v", got, tc.want)
			}
			// What the sweep's write makes of it: the orphan True, the
			// rest as a write without it renders it.
			plain, stPlain := n.DeepCopy(), *st
			RenderConditions(plain, &stPlain, t0)
			st.orphaned = st.orphanConditions(n, t0, grace)
			RenderConditions(n, st, t0)
			c, p := condition(n, string(tc.cond.Type)), condition(plain, string(tc.cond.Type))
			switch {
			case len(tc.want) > 0 && (c.Status != corev1.ConditionTrue || c.Reason != "NoFaultStanding"):
				t.Fatalf("orphan rendered %+v; want True NoFaultStanding", c)
			case len(tc.want) == 0 && *c != *p:
				t.Fatalf("rendered %+v; want %+v", c, p)
			}
		})
	}
}

// A fault stabilizing when flapping is turned off (flap_threshold 0, no
// recovery memory) and the role restarted: the sweep still lifts it once
// its deadline passed (before: nothing was due, the node cordoned for
// good).
func TestSweepLiftsStabilizingAfterFlappingOff(t *testing.T) {
	cfg := testConfig("flapoff")
	cfg.FlapThreshold, cfg.FlapWindow, cfg.StabilizationWindow = 3, 10*time.Minute, time.Minute
	h, k, advance := fakeHandler(t, cfg, "flapoff", "flapoff-1")
	at := func(ev *datamodels.HealthEvent) *kgo.Record {
		ev.GeneratedTimestamp = timestamppb.New(advance(time.Second))
		return record("c1", ev)
	}
	for range 3 {
		handle(t, h, at(fatal("flapoff-1", "XID_ERROR_79", "GPU-1")))
		handle(t, h, at(healthy("flapoff-1", "XID_ERROR_79", "GPU-1")))
	}
	n := getNode(t, k, "flapoff-1")
	st, _ := ReadState(n)
	if f := st.Faults[FaultKey("XID_ERROR_79", "GPU=GPU-1")]; f == nil || !f.Stabilizing() || !n.Spec.Unschedulable {
		t.Fatalf("not stabilizing: unschedulable %v, faults %v", n.Spec.Unschedulable, st.Faults)
	}

	off := cfg
	off.FlapThreshold, off.RecoveryMemory = 0, 0
	restarted, _ := clockHandler(t, off, k, advance(0).Add(time.Hour))
	acts := sweptAfter(t, restarted, k, "flapoff-1")
	if kinds(acts) != "unquarantine/applied" {
		t.Fatalf("sweep: %s", kinds(acts))
	}
	n = getNode(t, k, "flapoff-1")
	if n.Spec.Unschedulable || hasTaint(n, "faultline.io/unhealthy") || n.Annotations[AnnotationState] != "" {
		t.Fatalf("not lifted: unschedulable %v, taints %v, annotations %v", n.Spec.Unschedulable, n.Spec.Taints, n.Annotations)
	}
}

// A person uncordons a node held by a one-shot fault while no replica
// owns its partition (a rebalance): the watch's notice is dropped and no
// event follows. The sweep of the replica that owns it again acknowledges
// the uncordon (before: the node kept faultline's taint and label for
// good, with no manual_uncordon action).
func TestSweepAcknowledgesAMissedUncordon(t *testing.T) {
	cfg := testConfig("sweepmiss")
	h, k, advance := fakeHandler(t, cfg, "sweepmiss", "sweepmiss-1")
	// The watch started first: the fake's watch begun after its list
	// misses what was written in between (the uncordon, below).
	h.WatchClusters([]string{"c1"})
	sweptAfter(t, h, k, "sweepmiss-1")
	if acts, _ := handle(t, h, record("c1", fatal("sweepmiss-1", "XID_ERROR_48", "GPU-1"))); kinds(acts) != "quarantine/applied" {
		t.Fatalf("fault: %s", kinds(acts))
	}
	n := getNode(t, k, "sweepmiss-1")
	if !n.Spec.Unschedulable || n.Labels[LabelQuarantined] != "true" {
		t.Fatalf("not quarantined: unschedulable %v, labels %v", n.Spec.Unschedulable, n.Labels)
	}
	sweptAfter(t, h, k, "sweepmiss-1") // the watch shows the cordon: it is live
	h.PartitionsAssigned(events.TopicEvents, nil, 12)
	uncordonSeen(t, h, k, n)
	h.PartitionsAssigned(events.TopicEvents, []int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 12)
	advance(time.Minute)

	acts := sweptAfter(t, h, k, "sweepmiss-1")
	if kinds(acts) != "manual_uncordon/decided" {
		t.Fatalf("sweep: %s", kinds(acts))
	}
	n = getNode(t, k, "sweepmiss-1")
	if n.Spec.Unschedulable || hasTaint(n, "faultline.io/unhealthy") || n.Labels[LabelQuarantined] != "" ||
		n.Annotations[AnnotationManualUncordon] == "" {
		t.Fatalf("uncordon not acknowledged: unschedulable %v, taints %v, labels %v, annotations %v",
			n.Spec.Unschedulable, n.Spec.Taints, n.Labels, n.Annotations)
	}
	if again := sweptAfter(t, h, k, "sweepmiss-1"); len(again) > 0 {
		t.Fatalf("acknowledged twice: %s", kinds(again))
	}
}

// A fault that never recovers (GPU_FALLEN_OFF_BUS) becomes the oldest of
// more than maxFaults cordoning faults and is dropped; the others all
// recover: the node stays cordoned and tainted (Overflow) until a person
// uncordons it (before: uncordoned, a dead GPU back in service).
func TestDroppedCordoningFaultHoldsTheNode(t *testing.T) {
	cfg := testConfig("overflow")
	h, k, advance := fakeHandler(t, cfg, "overflow", "overflow-1")
	h.WatchClusters([]string{"c1"}) // live before the uncordon (TestSweepAcknowledgesAMissedUncordon)
	sweptAfter(t, h, k, "overflow-1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	at := func(ev *datamodels.HealthEvent) *kgo.Record {
		ev.GeneratedTimestamp = timestamppb.New(advance(time.Second))
		return record("c1", ev)
	}
	handle(t, h, at(fatal("overflow-1", "GPU_FALLEN_OFF_BUS", "GPU-0")))
	for i := range maxFaults {
		handle(t, h, at(fatal("overflow-1", "XID_ERROR_74", "GPU-L"+strconv.Itoa(i))))
	}
	n := getNode(t, k, "overflow-1")
	st, _ := ReadState(n)
	if st.Faults[FaultKey("GPU_FALLEN_OFF_BUS", "GPU=GPU-0")] != nil || st.Overflow == nil || st.Overflow.Dropped != 1 {
		t.Fatalf("after %d more faults: %d faults, overflow %+v", maxFaults, len(st.Faults), st.Overflow)
	}
	if got := testutil.ToFloat64(h.m.faultsDropped.WithLabelValues("c1")); got != 1 {
		t.Fatalf("faults dropped counted %v, want 1", got)
	}
	var last []*faultlinev1.Action
	for i := range maxFaults {
		last, _ = handle(t, h, at(healthy("overflow-1", "XID_ERROR_74", "GPU-L"+strconv.Itoa(i))))
	}
	if kinds(last) != "unquarantine/in_progress" {
		t.Fatalf("last recovery: %s", kinds(last))
	}
	n = getNode(t, k, "overflow-1")
	if !n.Spec.Unschedulable || !hasTaint(n, "faultline.io/unhealthy") || n.Labels[LabelQuarantined] != "true" ||
		n.Annotations[AnnotationState] == "" {
		t.Fatalf("every fault kept recovered: unschedulable %v, taints %v, labels %v", n.Spec.Unschedulable, n.Spec.Taints, n.Labels)
	}

	// The runbook's manual uncordon releases it.
	uncordonSeen(t, h, k, n)
	if a, err := h.AcknowledgeUncordon(ctx, "c1", "overflow-1"); err != nil || a == nil {
		t.Fatalf("acknowledge: %v, %v", a, err)
	}
	n = getNode(t, k, "overflow-1")
	if n.Spec.Unschedulable || hasTaint(n, "faultline.io/unhealthy") || n.Labels[LabelQuarantined] != "" ||
		n.Annotations[AnnotationState] != "" {
		t.Fatalf("after the uncordon: unschedulable %v, taints %v, labels %v, annotations %v",
			n.Spec.Unschedulable, n.Spec.Taints, n.Labels, n.Annotations)
	}
}

// trim drops acknowledged faults first, then those that neither cordon
// nor taint, then the oldest cordoning ones (held by Overflow); never the
// one just added.
func TestTrimDropsLeastValuableFirst(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	add := func(st *State, name string, at time.Time, cordon, acked bool) string {
		key := FaultKey("XID_ERROR_74", "GPU="+name)
		st.AddFault(key, Fault{Check: "XID_ERROR_74", Entity: "GPU=" + name, Rule: "r", Since: at, LastSeen: at, Cordon: cordon}, "")
		if f := st.Faults[key]; f != nil {
			f.Acked = acked
		}
		return key
	}
	for _, tc := range []struct {
		name        string
		oldest      [2]bool // cordon, acked of the oldest fault
		second      [2]bool // of the second oldest
		wantDropped int     // 0: the oldest, 1: the second
		wantHeld    bool
	}{
		{"oldest cordoning, second acknowledged", [2]bool{true, false}, [2]bool{true, true}, 1, false},
		{"oldest cordoning, second warns only", [2]bool{true, false}, [2]bool{false, false}, 1, false},
		{"both cordoning", [2]bool{true, false}, [2]bool{true, false}, 0, true},
		{"oldest warns only", [2]bool{false, false}, [2]bool{true, false}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &State{Faults: map[string]*Fault{}}
			keys := []string{
				add(st, "old-0", t0, tc.oldest[0], tc.oldest[1]),
				add(st, "old-1", t0.Add(time.Second), tc.second[0], tc.second[1]),
			}
			for i := range maxFaults - 2 {
				add(st, "new-"+strconv.Itoa(i), t0.Add(time.Hour+time.Duration(i)*time.Second), true, false)
			}
			late := add(st, "late", t0.Add(-time.Hour), true, false) // older than all: kept
			if len(st.Faults) != maxFaults || st.Faults[late] == nil {
				t.Fatalf("%d faults, the late one kept: %v", len(st.Faults), st.Faults[late] != nil)
			}
			if !slices.Equal(st.dropped, keys[tc.wantDropped:tc.wantDropped+1]) {
				t.Fatalf("dropped %v, want %v", st.dropped, keys[tc.wantDropped])
			}
			if (st.Overflow != nil) != tc.wantHeld {
				t.Fatalf("overflow %+v, want held %v", st.Overflow, tc.wantHeld)
			}
		})
	}
}
