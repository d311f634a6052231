package quarantine

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestAddFaultNeverWeakens: the fault key has no error code, so a later
// occurrence of the same check on the same entity may be decided by a
// weaker rule (a non-fatal Xid 13 after a fatal Xid 79 on one GPU). It
// must not lift what the standing fault holds: the cordon, the condition
// and the stronger taint stay, with the rule (and message) that decided
// them; a stronger occurrence still takes over.
func TestAddFaultNeverWeakens(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	noSched := &Taint{Key: "faultline.io/unhealthy", Value: "GPU", Effect: "NoSchedule"}
	prefer := &Taint{Key: "faultline.io/degraded", Value: "GPU", Effect: "PreferNoSchedule"}
	noExec := &Taint{Key: "faultline.io/unhealthy", Value: "GPU", Effect: "NoExecute"}
	fatal := Fault{Check: "SysLogsXIDError", Class: "GPU", Entity: "GPU=GPU-1", Rule: "fatal-xid", Message: "Xid 79",
		Cordon: true, Taint: noSched, Condition: true, Since: t0, LastSeen: t0}
	soft := Fault{Check: "SysLogsXIDError", Class: "GPU", Entity: "GPU=GPU-1", Rule: "soft-xid", Message: "Xid 13",
		Taint: prefer, Since: t0.Add(time.Minute), LastSeen: t0.Add(time.Minute)}
	with := func(f Fault, edit func(*Fault)) Fault { edit(&f); return f }
	for _, tc := range []struct {
		name          string
		standing, add Fault
		want          Fault // Rule, Message, Cordon, Taint, Condition compared
	}{
		{"weaker occurrence keeps the standing decision", fatal, soft, fatal},
		{"weaker without taint keeps the taint", fatal, with(soft, func(f *Fault) { f.Taint = nil }), fatal},
		{"same strength: the newest rule and message", fatal, with(fatal, func(f *Fault) { f.Rule, f.Message = "fatal-xid-2", "Xid 79 again" }),
			with(fatal, func(f *Fault) { f.Rule, f.Message = "fatal-xid-2", "Xid 79 again" })},
		{"stronger occurrence takes over", soft, fatal, fatal},
		{"stronger taint takes over", fatal, with(fatal, func(f *Fault) { f.Rule, f.Taint = "evict", noExec }),
			with(fatal, func(f *Fault) { f.Rule, f.Taint = "evict", noExec })},
		{"mixed: each holds what either held, the standing rule", with(fatal, func(f *Fault) { f.Taint = nil }),
			with(soft, func(f *Fault) { f.Taint = noExec }), with(fatal, func(f *Fault) { f.Taint = noExec })},
		{"condition alone is kept", with(soft, func(f *Fault) { f.Condition = true }), with(soft, func(f *Fault) { f.Rule = "soft-2" }),
			with(soft, func(f *Fault) { f.Condition = true })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &State{Faults: map[string]*Fault{}}
			key := FaultKey(tc.standing.Check, tc.standing.Entity)
			st.AddFault(key, tc.standing, "ev-1")
			if !st.AddFault(key, tc.add, "ev-2") {
				t.Fatal("AddFault reported no change")
			}
			got := st.Faults[key]
			sameTaint := (got.Taint == nil) == (tc.want.Taint == nil) && (got.Taint == nil || *got.Taint == *tc.want.Taint)
			if got.Rule != tc.want.Rule || got.Message != tc.want.Message || got.Cordon != tc.want.Cordon ||
				!sameTaint || got.Condition != tc.want.Condition {
				t.Fatalf("fault = rule %q message %q cordon %v taint %+v condition %v, want rule %q message %q cordon %v taint %+v condition %v",
					got.Rule, got.Message, got.Cordon, got.Taint, got.Condition,
					tc.want.Rule, tc.want.Message, tc.want.Cordon, tc.want.Taint, tc.want.Condition)
			}
			if !got.LastSeen.Equal(tc.add.LastSeen) && tc.add.LastSeen.After(tc.standing.LastSeen) {
				t.Fatalf("LastSeen = %v, want %v", got.LastSeen, tc.add.LastSeen)
			}
		})
	}

	// On the node: the weaker occurrence leaves it cordoned and tainted NoSchedule.
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	st := &State{Faults: map[string]*Fault{}}
	key := FaultKey(fatal.Check, fatal.Entity)
	st.AddFault(key, fatal, "ev-1")
	RenderObject(n, st, "test", t0)
	st.AddFault(key, soft, "ev-2")
	RenderObject(n, st, "test", t0.Add(time.Minute))
	if !n.Spec.Unschedulable {
		t.Fatal("node uncordoned by a weaker occurrence of a standing fault")
	}
	var hasNoSched bool
	for _, tt := range n.Spec.Taints {
		hasNoSched = hasNoSched || (tt.Key == noSched.Key && tt.Effect == corev1.TaintEffectNoSchedule)
	}
	if !hasNoSched {
		t.Fatalf("taints %v: NoSchedule dropped by a weaker occurrence", n.Spec.Taints)
	}
}
