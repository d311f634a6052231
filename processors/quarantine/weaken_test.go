package quarantine

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
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

// weakRules: a fatal event cordons and taints NoSchedule; a non-fatal one
// only taints PreferNoSchedule (a fatal Xid 79 and a non-fatal Xid 13 of
// one GPU are one fault: the key has no error code).
const weakRules = `
[[rule-sets]]
name = "fatal-xid"
priority = 100
  [[rule-sets.match.all]]
  expression = "event.isFatal"
  [rule-sets.cordon]
  shouldCordon = true
  [rule-sets.taint]
  key = "faultline.io/unhealthy"
  value = "gpu"
  effect = "NoSchedule"
[[rule-sets]]
name = "soft-xid"
priority = 50
condition = false
  [[rule-sets.match.all]]
  expression = "!event.isFatal"
  [rule-sets.taint]
  key = "faultline.io/degraded"
  value = "gpu"
  effect = "PreferNoSchedule"
`

// TestWeakerOccurrencesOfAStandingFault: a flood of non-fatal Xid 13s on
// a GPU whose fatal Xid 79 cordoned the node changes nothing on it, so it
// is written at most once per repeat_write_interval (before, every
// occurrence rewrote the node: its decision differs from the fault's, so
// none counted as a repeat); and each says what holds the node — the
// fatal rule, its cordon and NoSchedule taint — not the weak rule's
// decision (the fleet node page reads the latest applied action).
func TestWeakerOccurrencesOfAStandingFault(t *testing.T) {
	cfg := testConfig("weak")
	cfg.Rules = filepath.Join(t.TempDir(), "rules.toml")
	if err := os.WriteFile(cfg.Rules, []byte(weakRules), 0o600); err != nil {
		t.Fatal(err)
	}
	h, k, _ := fakeHandler(t, cfg, "weak", "weak-1")
	if acts, _ := handle(t, h, record("c1", fatal("weak-1", "SysLogsXIDError", "GPU-1"))); kinds(acts) != "quarantine/applied" {
		t.Fatalf("fatal: %s", kinds(acts))
	}
	soft := func() *datamodels.HealthEvent {
		ev := fatal("weak-1", "SysLogsXIDError", "GPU-1")
		ev.IsFatal, ev.Message, ev.RecommendedAction = false, "Xid 13", datamodels.RecommendedAction_NONE
		return ev
	}
	k.ClearActions()
	var last *faultlinev1.Action
	for i := range 20 {
		acts, _ := handle(t, h, record("c1", soft()))
		if kinds(acts) != "quarantine/applied" {
			t.Fatalf("occurrence %d: %s", i, kinds(acts))
		}
		last = acts[0]
	}
	var writes []string
	for _, a := range k.Actions() {
		if a.GetResource().Resource == "nodes" && (a.GetVerb() == "patch" || a.GetVerb() == "update") {
			writes = append(writes, a.GetVerb()+" "+a.GetSubresource())
		}
	}
	if len(writes) != 0 {
		t.Fatalf("20 weaker occurrences within repeat_write_interval: %d node writes %v; want none (the fatal's one write stands)", len(writes), writes)
	}
	if last.GetRule() != "fatal-xid" || last.Details[events.DetailCordon] != "true" ||
		last.Details[events.DetailTaint] != "faultline.io/unhealthy=gpu:NoSchedule" {
		t.Fatalf("latest applied action: rule %q cordon %q taint %q; want what holds the node (fatal-xid, true, faultline.io/unhealthy=gpu:NoSchedule)",
			last.GetRule(), last.Details[events.DetailCordon], last.Details[events.DetailTaint])
	}
	if n := getNode(t, k, "weak-1"); !n.Spec.Unschedulable || !hasTaint(n, "faultline.io/unhealthy") {
		t.Fatalf("node lost its quarantine: unschedulable %v taints %v", n.Spec.Unschedulable, n.Spec.Taints)
	}
}
