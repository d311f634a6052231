package quarantine

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestQuarantineBeginsAgainAfterManualUncordon: quarantined-at is when the
// current quarantine began. A fault coming back to a node a person
// uncordoned (its acknowledged faults kept) begins a new one: the drain
// took a whole-node drain of before the uncordon for one of this
// quarantine, and drained a node back in service whole for one GPU's
// fault. A second fault of a standing quarantine keeps its start.
func TestQuarantineBeginsAgainAfterManualUncordon(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	at := func(n *corev1.Node) string { return n.Annotations[AnnotationAt] }
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	st := &State{Faults: map[string]*Fault{}}
	st.AddFault("a", Fault{Check: "XID_ERROR_79", Entity: "GPU=GPU-A", Rule: "r", Cordon: true, Since: t0, LastSeen: t0}, "e1")
	RenderObject(n, st, "me", t0)
	if at(n) != t0.Format(time.RFC3339) || !n.Spec.Unschedulable {
		t.Fatalf("first quarantine: at %q unschedulable %v", at(n), n.Spec.Unschedulable)
	}
	t1 := t0.Add(time.Hour)
	st.AddFault("b", Fault{Check: "XID_ERROR_48", Entity: "GPU=GPU-B", Rule: "r", Cordon: true, Since: t1, LastSeen: t1}, "e2")
	RenderObject(n, st, "me", t1)
	if at(n) != t0.Format(time.RFC3339) {
		t.Fatalf("a second fault of the standing quarantine moved its start to %q", at(n))
	}
	// A person uncordons: the faults are acknowledged and stay.
	t2 := t1.Add(time.Hour)
	n.Spec.Unschedulable = false
	if !st.DetectManualUncordon(n, t2) {
		t.Fatal("manual uncordon not detected")
	}
	RenderObject(n, st, "me", t2)
	if n.Labels[LabelQuarantined] == "true" || at(n) != t0.Format(time.RFC3339) {
		t.Fatalf("after the uncordon: label %q at %q", n.Labels[LabelQuarantined], at(n))
	}
	// Days later a new fault: a new quarantine.
	t3 := t2.Add(48 * time.Hour)
	st.AddFault("c", Fault{Check: "GpuMemWatch", Entity: "GPU=GPU-C", Rule: "r", Cordon: true, Since: t3, LastSeen: t3}, "e3")
	RenderObject(n, st, "me", t3)
	if at(n) != t3.Format(time.RFC3339) || n.Labels[LabelQuarantined] != "true" {
		t.Fatalf("a fault after the uncordon: at %q (want %s, the new quarantine's start) label %q", at(n), t3.Format(time.RFC3339), n.Labels[LabelQuarantined])
	}
	// The uncordon noticed by the event that brings the new fault (one
	// write: acknowledge, add, render; the node still has the label).
	n2 := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}
	st2 := &State{Faults: map[string]*Fault{}}
	st2.AddFault("a", Fault{Check: "XID_ERROR_79", Entity: "GPU=GPU-A", Rule: "r", Cordon: true, Since: t0, LastSeen: t0}, "e1")
	RenderObject(n2, st2, "me", t0)
	n2.Spec.Unschedulable = false
	st2, err := ReadState(n2)
	if err != nil {
		t.Fatal(err)
	}
	if !st2.DetectManualUncordon(n2, t3) {
		t.Fatal("manual uncordon not detected")
	}
	st2.AddFault("c", Fault{Check: "GpuMemWatch", Entity: "GPU=GPU-C", Rule: "r", Cordon: true, Since: t3, LastSeen: t3}, "e3")
	RenderObject(n2, st2, "me", t3)
	if at(n2) != t3.Format(time.RFC3339) {
		t.Fatalf("a fault in the write that noticed the uncordon: at %q, want %s", at(n2), t3.Format(time.RFC3339))
	}
}
