package quarantine

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestStateRepeats(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	taint := &Taint{Key: "faultline.io/unhealthy", Value: "GPU", Effect: "NoSchedule"}
	standing := Fault{Check: "XID_ERROR_79", Class: "GPU", Entity: "GPU=GPU-1", Rule: "r", Message: "fell off the bus",
		Cordon: true, Taint: taint, Condition: true, Since: t0, LastSeen: t0}
	key := FaultKey(standing.Check, standing.Entity)
	for _, tc := range []struct {
		name   string
		edit   func(f *Fault)
		acked  bool
		within time.Duration
		want   bool
	}{
		{"same, inside the interval", func(f *Fault) { f.LastSeen = t0.Add(5 * time.Second) }, false, 10 * time.Second, true},
		{"same, older occurrence", func(f *Fault) { f.LastSeen = t0.Add(-time.Minute) }, false, 10 * time.Second, true},
		{"same, interval passed", func(f *Fault) { f.LastSeen = t0.Add(10 * time.Second) }, false, 10 * time.Second, false},
		{"other message", func(f *Fault) { f.Message = "double-bit ECC" }, false, 10 * time.Second, false},
		{"other rule", func(f *Fault) { f.Rule = "r2" }, false, 10 * time.Second, false},
		{"no longer cordons: the cordon stands", func(f *Fault) { f.Cordon = false }, false, 10 * time.Second, true},
		{"other taint", func(f *Fault) { f.Taint = &Taint{Key: "k", Effect: "NoExecute"} }, false, 10 * time.Second, false},
		{"no taint: the taint stands", func(f *Fault) { f.Taint = nil }, false, 10 * time.Second, true},
		{"acknowledged by a manual uncordon", func(*Fault) {}, true, 10 * time.Second, true},
		{"acknowledged, interval passed", func(f *Fault) { f.LastSeen = t0.Add(10 * time.Second) }, true, 10 * time.Second, false},
		{"acknowledged, other message", func(f *Fault) { f.Message = "double-bit ECC" }, true, 10 * time.Second, false},
		{"other fault", func(f *Fault) { f.Entity = "GPU=GPU-2" }, false, 10 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &State{Faults: map[string]*Fault{}}
			st.AddFault(key, standing, "ev-1")
			st.Faults[key].Acked = tc.acked
			f := standing
			tc.edit(&f)
			if got := st.Repeats(FaultKey(f.Check, f.Entity), f, tc.within); got != tc.want {
				t.Fatalf("Repeats = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestObjectAndStatusPatch(t *testing.T) {
	before := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n", ResourceVersion: "7",
			Labels:      map[string]string{"keep": "1", "gone": "x"},
			Annotations: map[string]string{"a": "1"}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "team", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: "GPUHealthy", Status: corev1.ConditionTrue, Message: conditionPrefix + "ok"},
			{Type: "NICHealthy", Status: corev1.ConditionTrue, Message: conditionPrefix + "ok"},
		}},
	}
	after := before.DeepCopy()
	after.Labels["new"] = "y"
	delete(after.Labels, "gone")
	after.Spec.Unschedulable = true
	after.Spec.Taints = append(after.Spec.Taints, corev1.Taint{Key: "faultline.io/unhealthy", Effect: corev1.TaintEffectNoSchedule})
	after.Status.Conditions[0].Status = corev1.ConditionFalse

	for _, tc := range []struct {
		name  string
		patch map[string]any
		want  string
	}{
		{"object", objectPatch(before, after),
			`{"metadata":{"labels":{"gone":null,"new":"y"},"resourceVersion":"7"},"spec":{"taints":[{"key":"team","effect":"NoSchedule"},{"key":"faultline.io/unhealthy","effect":"NoSchedule"}],"unschedulable":true}}`},
		{"object unchanged", objectPatch(before, before.DeepCopy()), `{"metadata":{"resourceVersion":"7"}}`},
		{"status: only the changed condition", statusPatch(before, after),
			`{"metadata":{"resourceVersion":"7"},"status":{"conditions":[{"type":"GPUHealthy","status":"False","lastHeartbeatTime":null,"lastTransitionTime":null,"message":"faultline: ok"}]}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.patch)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Fatalf("patch\n got %s\nwant %s", b, tc.want)
			}
		})
	}
}

// Repeats of a fault a person acknowledged (by uncordoning the node) are
// decided from the node watch, as those of a fault that cordons: each is
// recorded (quarantine/skipped, "acknowledged") without a request. Before,
// every one rewrote the node's state annotation (a PATCH, often a GET
// after a conflict): 20 repeats cost 37 requests.
func TestRepeatsOfAnAcknowledgedFault(t *testing.T) {
	h, k, advance := fakeHandler(t, testConfig("ackrep"), "ackrep", "ackrep-1")
	if acts, _ := handle(t, h, record("c1", fatal("ackrep-1", "XID_ERROR_48", "GPU-1"))); kinds(acts) != "quarantine/applied" {
		t.Fatalf("fault: %s", kinds(acts))
	}
	uncordonSeen(t, h, k, getNode(t, k, "ackrep-1"))
	if acts, _ := handle(t, h, record("c1", fatal("ackrep-1", "XID_ERROR_48", "GPU-1"))); kinds(acts) != "manual_uncordon/decided,quarantine/skipped" {
		t.Fatalf("first occurrence after the uncordon: %s", kinds(acts))
	}
	advance(recentWrite)
	cl, _ := h.reg.Get("c1")
	waitUntil(t, 10*time.Second, func() bool {
		c, ok := h.nodes.Cached(cl, "ackrep-1", h.now())
		return ok && c.Annotations[AnnotationManualUncordon] != ""
	}, "the node watch to show the acknowledgement")
	k.ClearActions()
	for i := range 20 {
		acts, _ := handle(t, h, record("c1", fatal("ackrep-1", "XID_ERROR_48", "GPU-1")))
		if kinds(acts) != "quarantine/skipped" || !strings.Contains(acts[0].GetReason(), "acknowledged") {
			t.Fatalf("repeat %d: %s %v", i, kinds(acts), acts)
		}
	}
	var requests []string
	for _, a := range k.Actions() {
		if a.GetResource().Resource == "nodes" && a.GetVerb() != "list" && a.GetVerb() != "watch" {
			requests = append(requests, a.GetVerb()+" "+a.GetSubresource())
		}
	}
	if len(requests) != 0 {
		t.Fatalf("20 repeats of an acknowledged fault: %d node requests %v; want none", len(requests), requests)
	}
	if n := getNode(t, k, "ackrep-1"); n.Spec.Unschedulable {
		t.Fatal("cordoned again")
	}
}

// TestStateRepeatsAWeakerOccurrence: an occurrence decided by a weaker
// rule than the standing fault's leaves it as it is (Fault.strengthen):
// a repeat; one that would strengthen it is not.
func TestStateRepeatsAWeakerOccurrence(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	fatal := Fault{Check: "SysLogsXIDError", Class: "GPU", Entity: "GPU=GPU-1", Rule: "fatal-xid", Message: "Xid 79",
		Cordon: true, Taint: &Taint{Key: "faultline.io/unhealthy", Effect: "NoSchedule"}, Condition: true, Since: t0, LastSeen: t0}
	soft := Fault{Check: "SysLogsXIDError", Class: "GPU", Entity: "GPU=GPU-1", Rule: "soft-xid", Message: "Xid 13",
		Taint: &Taint{Key: "faultline.io/degraded", Effect: "PreferNoSchedule"}, Since: t0.Add(time.Second), LastSeen: t0.Add(time.Second)}
	key := FaultKey(fatal.Check, fatal.Entity)
	st := &State{Faults: map[string]*Fault{}}
	st.AddFault(key, fatal, "ev-1")
	if !st.Repeats(key, soft, 10*time.Second) {
		t.Fatal("a weaker occurrence within the interval is not a repeat")
	}
	if late := soft; st.Repeats(key, func() Fault { late.LastSeen = t0.Add(10 * time.Second); return late }(), 10*time.Second) {
		t.Fatal("a weaker occurrence past the interval is a repeat")
	}
	stronger := fatal
	stronger.Taint = &Taint{Key: "faultline.io/unhealthy", Effect: "NoExecute"}
	if st.Repeats(key, stronger, 10*time.Second) {
		t.Fatal("a stronger occurrence is a repeat")
	}
	st = &State{Faults: map[string]*Fault{}}
	st.AddFault(key, soft, "ev-1")
	if st.Repeats(key, fatal, 10*time.Second) {
		t.Fatal("a fatal occurrence of a weak fault is a repeat")
	}
}
