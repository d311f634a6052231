package quarantine

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// flapStep is one thing that happens to a fault of a node, at an offset
// from t0: the fault occurs ("fault"), its entity recovers ("recover"), or
// the sweep runs ("sweep"); want is what must stand afterwards.
type flapStep struct {
	op   string
	at   time.Duration
	want string // "lifted" (nothing stands), "standing", "stabilizing"
	// liftAt: the stabilizing fault's deadline, as an offset from t0.
	liftAt time.Duration
}

func TestFlapping(t *testing.T) {
	pol := FlapPolicy{Threshold: 3, Window: 10 * time.Minute, Stabilization: 30 * time.Minute}
	const ms = time.Millisecond
	cases := []struct {
		name  string
		pol   FlapPolicy
		steps []flapStep
	}{
		{"a first recovery lifts at once", pol, []flapStep{
			{op: "fault", at: 0, want: "standing"},
			{op: "recover", at: time.Minute, want: "lifted"},
		}},
		{"a second occurrence's recovery lifts at once", pol, []flapStep{
			{op: "fault", at: 0, want: "standing"},
			{op: "recover", at: 250 * ms, want: "lifted"},
			{op: "fault", at: 500 * ms, want: "standing"},
			{op: "recover", at: 750 * ms, want: "lifted"},
		}},
		{"the third occurrence within the window is held", pol, []flapStep{
			{op: "fault", at: 0, want: "standing"},
			{op: "recover", at: 250 * ms, want: "lifted"},
			{op: "fault", at: 500 * ms, want: "standing"},
			{op: "recover", at: 750 * ms, want: "lifted"},
			{op: "fault", at: time.Second, want: "standing"},
			{op: "recover", at: 1250 * ms, want: "stabilizing", liftAt: 1250*ms + 30*time.Minute},
			{op: "sweep", at: 20 * time.Minute, want: "stabilizing", liftAt: 1250*ms + 30*time.Minute},
			{op: "sweep", at: 1250*ms + 30*time.Minute, want: "lifted"},
		}},
		{"occurrences spread wider than the window never flap", pol, []flapStep{
			{op: "fault", at: 0, want: "standing"},
			{op: "recover", at: time.Minute, want: "lifted"},
			{op: "fault", at: 6 * time.Minute, want: "standing"},
			{op: "recover", at: 7 * time.Minute, want: "lifted"},
			{op: "fault", at: 12 * time.Minute, want: "standing"},
			{op: "recover", at: 13 * time.Minute, want: "lifted"},
			{op: "fault", at: 18 * time.Minute, want: "standing"},
			{op: "recover", at: 19 * time.Minute, want: "lifted"},
		}},
		{"an occurrence while stabilizing cancels the lift; the next recovery restarts the window", pol, []flapStep{
			{op: "fault", at: 0}, {op: "recover", at: time.Second},
			{op: "fault", at: 2 * time.Second}, {op: "recover", at: 3 * time.Second},
			{op: "fault", at: 4 * time.Second}, {op: "recover", at: 5 * time.Second, want: "stabilizing", liftAt: 5*time.Second + 30*time.Minute},
			{op: "fault", at: 10 * time.Minute, want: "standing"},
			{op: "sweep", at: 40 * time.Minute, want: "standing"},
			{op: "recover", at: 41 * time.Minute, want: "stabilizing", liftAt: 71 * time.Minute},
			{op: "sweep", at: 70 * time.Minute, want: "stabilizing", liftAt: 71 * time.Minute},
			{op: "sweep", at: 71 * time.Minute, want: "lifted"},
		}},
		{"another recovery while stabilizing keeps the first deadline", pol, []flapStep{
			{op: "fault", at: 0}, {op: "recover", at: time.Second},
			{op: "fault", at: 2 * time.Second}, {op: "recover", at: 3 * time.Second},
			{op: "fault", at: 4 * time.Second}, {op: "recover", at: 5 * time.Second, want: "stabilizing", liftAt: 5*time.Second + 30*time.Minute},
			{op: "recover", at: 20 * time.Minute, want: "stabilizing", liftAt: 5*time.Second + 30*time.Minute},
			{op: "recover", at: 31 * time.Minute, want: "lifted"},
		}},
		{"after the lift, a fault that stays away is not flapping any more", pol, []flapStep{
			{op: "fault", at: 0}, {op: "recover", at: time.Second},
			{op: "fault", at: 2 * time.Second}, {op: "recover", at: 3 * time.Second},
			{op: "fault", at: 4 * time.Second}, {op: "recover", at: 5 * time.Second, want: "stabilizing", liftAt: 5*time.Second + 30*time.Minute},
			{op: "sweep", at: 31 * time.Minute, want: "lifted"},
			{op: "fault", at: 50 * time.Minute, want: "standing"},
			{op: "recover", at: 51 * time.Minute, want: "lifted"},
		}},
		{"threshold 2", FlapPolicy{Threshold: 2, Window: time.Minute, Stabilization: time.Minute}, []flapStep{
			{op: "fault", at: 0}, {op: "recover", at: time.Second, want: "lifted"},
			{op: "fault", at: 2 * time.Second}, {op: "recover", at: 3 * time.Second, want: "stabilizing", liftAt: 63 * time.Second},
		}},
		{"disabled: every recovery lifts", FlapPolicy{}, []flapStep{
			{op: "fault", at: 0}, {op: "recover", at: time.Second, want: "lifted"},
			{op: "fault", at: 2 * time.Second}, {op: "recover", at: 3 * time.Second, want: "lifted"},
			{op: "fault", at: 4 * time.Second}, {op: "recover", at: 5 * time.Second, want: "lifted"},
			{op: "fault", at: 6 * time.Second}, {op: "recover", at: 7 * time.Second, want: "lifted"},
		}},
		{"a zero stabilization window disables", FlapPolicy{Threshold: 2, Window: time.Minute}, []flapStep{
			{op: "fault", at: 0}, {op: "recover", at: time.Second, want: "lifted"},
			{op: "fault", at: 2 * time.Second}, {op: "recover", at: 3 * time.Second, want: "lifted"},
		}},
	}
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := &State{Faults: map[string]*Fault{}}
			key := FaultKey("NIC_LINK_STATE", "NICPort=mlx5_3/1")
			for i, s := range c.steps {
				at := t0.Add(s.at)
				switch s.op {
				case "fault":
					f := Fault{Check: "NIC_LINK_STATE", Entity: "NICPort=mlx5_3/1", Rule: "r", Since: at, LastSeen: at, Cordon: true, Condition: true}
					if !st.AddFault(key, f, fmt.Sprintf("ev-%d", i)) {
						t.Fatalf("step %d: AddFault changed nothing", i)
					}
				case "recover":
					st.RecoverFlapping("NIC_LINK_STATE", []string{"NICPort=mlx5_3/1"}, at, at, c.pol)
				case "sweep":
					st.LiftStabilized(at, c.pol)
				}
				if s.want == "" {
					continue
				}
				f := st.Faults[key]
				got := "lifted"
				switch {
				case f != nil && f.Stabilizing():
					got = "stabilizing"
				case f != nil:
					got = "standing"
				}
				if got != s.want {
					t.Fatalf("step %d (%s at %v): %s, want %s (history %v)", i, s.op, s.at, got, s.want, st.History[key])
				}
				if got == "stabilizing" && !f.LiftAt.Equal(t0.Add(s.liftAt)) {
					t.Fatalf("step %d: lift at %v, want %v", i, f.LiftAt.Sub(t0), s.liftAt)
				}
				if got != "lifted" && !st.Active() {
					t.Fatalf("step %d: a %s fault must cordon", i, got)
				}
			}
			if !c.pol.Enabled() && len(st.History) > 0 {
				t.Errorf("disabled policy kept history %v", st.History)
			}
		})
	}
}

func TestFlapStaleAndRepeats(t *testing.T) {
	pol := FlapPolicy{Threshold: 2, Window: time.Minute, Stabilization: time.Minute}
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	st := &State{Faults: map[string]*Fault{}}
	key := FaultKey("C", "")
	f := func(at time.Time) Fault { return Fault{Check: "C", Rule: "r", Since: at, LastSeen: at, Cordon: true} }
	st.AddFault(key, f(t0), "a")
	st.RecoverFlapping("C", nil, t0.Add(time.Second), t0.Add(time.Second), pol)
	st.AddFault(key, f(t0.Add(2*time.Second)), "b")
	if !st.Repeats(key, f(t0.Add(2*time.Second)), time.Minute) {
		t.Fatal("a standing fault's repeat must be a repeat")
	}
	// A recovery generated before the last occurrence is stale.
	if removed, held, stale := st.RecoverFlapping("C", nil, t0.Add(time.Second), t0.Add(3*time.Second), pol); len(removed)+len(held) > 0 || len(stale) != 1 {
		t.Fatalf("stale recovery: removed %v held %v stale %v", removed, held, stale)
	}
	if _, held, _ := st.RecoverFlapping("C", nil, t0.Add(3*time.Second), t0.Add(3*time.Second), pol); len(held) != 1 {
		t.Fatalf("held %v, want the fault", held)
	}
	// While stabilizing, an occurrence is never a repeat (it must be
	// written: it cancels the lift), and an occurrence older than the
	// recovery does not cancel it.
	if st.Repeats(key, f(t0.Add(4*time.Second)), time.Minute) {
		t.Fatal("an occurrence while stabilizing must be written")
	}
	st.AddFault(key, f(t0.Add(2500*time.Millisecond)), "late")
	if !st.Faults[key].Stabilizing() {
		t.Fatal("an occurrence generated before the recovery cancelled the lift")
	}
	st.AddFault(key, f(t0.Add(4*time.Second)), "c")
	if st.Faults[key].Stabilizing() {
		t.Fatal("a new occurrence did not cancel the lift")
	}
	if got := len(st.History[key]); got != 2 { // the lifted first episode and the re-occurrence
		t.Fatalf("history %v, want 2 onsets", st.History[key])
	}
}

func TestFlapHistoryBounds(t *testing.T) {
	pol := FlapPolicy{Threshold: 3, Window: time.Hour, Stabilization: time.Hour}
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	st := &State{Faults: map[string]*Fault{}}
	for i := range maxFaults + 10 {
		for j := range maxOnsets + 3 {
			st.addOnset(FaultKey("C", fmt.Sprint(i)), t0.Add(time.Duration(i*100+j)*time.Second))
		}
	}
	if len(st.History) != maxFaults {
		t.Fatalf("%d keys in history, want %d", len(st.History), maxFaults)
	}
	for k, h := range st.History {
		if len(h) != maxOnsets || !slices.IsSortedFunc(h, func(a, b time.Time) int { return a.Compare(b) }) {
			t.Fatalf("%s: %d onsets (sorted %v), want %d sorted", k, len(h), slices.IsSortedFunc(h, func(a, b time.Time) int { return a.Compare(b) }), maxOnsets)
		}
	}
	if _, ok := st.History[FaultKey("C", "0")]; ok {
		t.Fatal("the oldest key was kept")
	}
	// Within budget: Fit drops history before anything standing.
	st.Faults[FaultKey("X", "")] = &Fault{Check: "X", Rule: "r", Cordon: true, LastSeen: t0}
	b, _ := json.Marshal(st)
	hb, _ := json.Marshal(st.History)
	full := len(b) + len(hb)
	if rep := st.Fit(full); rep.Bytes != full || len(st.History) != maxFaults {
		t.Fatalf("fit within budget: %+v, %d keys of history", rep, len(st.History))
	}
	rep := st.Fit(full / 2)
	if rep.Bytes > full/2 || len(st.Faults) != 1 || len(rep.Dropped) != 0 || len(st.History) == 0 {
		t.Fatalf("fit: %+v, %d faults, %d keys of history", rep, len(st.Faults), len(st.History))
	}
	// Pruning: everything older than the window goes.
	if !st.PruneHistory(t0.Add(10*time.Hour), pol) || len(st.History) != 0 {
		t.Fatalf("history left after its window: %d keys", len(st.History))
	}
}

// The node carries only the onsets once every fault was lifted (no state,
// label, reason or cordon), and nothing at all once they expired.
func TestFlapHistoryOnNode(t *testing.T) {
	pol := FlapPolicy{Threshold: 3, Window: 10 * time.Minute, Stabilization: 30 * time.Minute}
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{"other": "x"}}}
	st := &State{Faults: map[string]*Fault{}}
	st.AddFault(FaultKey("C", ""), Fault{Check: "C", Class: "NIC", Rule: "r", Since: t0, LastSeen: t0, Cordon: true, Condition: true}, "a")
	RenderConditions(n, st, t0)
	RenderObject(n, st, "me", t0)
	if !n.Spec.Unschedulable || n.Labels[LabelQuarantined] != "true" {
		t.Fatal("not quarantined")
	}
	st.RecoverFlapping("C", nil, t0.Add(time.Second), t0.Add(time.Second), pol)
	RenderConditions(n, st, t0.Add(time.Second))
	RenderObject(n, st, "me", t0.Add(time.Second))
	if n.Spec.Unschedulable || n.Labels[LabelQuarantined] != "" || n.Annotations[AnnotationReason] != "" || n.Annotations[AnnotationBy] != "" {
		t.Fatalf("not lifted: unschedulable %v, labels %v, annotations %v", n.Spec.Unschedulable, n.Labels, n.Annotations)
	}
	if _, ok := n.Annotations[AnnotationState]; ok || n.Annotations[AnnotationOnsets] == "" {
		t.Fatalf("after the lift, want only the onsets annotation: %v", n.Annotations)
	}
	back, err := ReadState(n)
	if err != nil || len(back.Faults) != 0 || len(back.History[FaultKey("C", "")]) != 1 || !back.Since.IsZero() {
		t.Fatalf("state on the node: %+v, %v", back, err)
	}
	if next := back.NextSweep(pol); !next.Equal(t0.Add(pol.Window)) {
		t.Fatalf("next sweep %v, want the onset's window end", next)
	}
	if _, changed := back.LiftStabilized(t0.Add(pol.Window), pol); !changed {
		t.Fatal("expired history not pruned")
	}
	RenderObject(n, back, "me", t0.Add(pol.Window))
	if _, ok := n.Annotations[AnnotationOnsets]; ok || len(n.Annotations) != 1 || n.Annotations["other"] != "x" {
		t.Fatalf("annotations after the history expired: %v", n.Annotations)
	}
}

// A stabilizing fault says so in the condition and the reason.
func TestFlapStabilizingRendered(t *testing.T) {
	pol := FlapPolicy{Threshold: 2, Window: 10 * time.Minute, Stabilization: 30 * time.Minute}
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	st := &State{Faults: map[string]*Fault{}}
	f := Fault{Check: "NIC_LINK_STATE", Class: "NIC", Rule: "r", Since: t0, LastSeen: t0, Cordon: true, Condition: true}
	st.AddFault(FaultKey("NIC_LINK_STATE", ""), f, "a")
	st.RecoverFlapping("NIC_LINK_STATE", nil, t0, t0, pol)
	f.Since, f.LastSeen = t0.Add(time.Second), t0.Add(time.Second)
	st.AddFault(FaultKey("NIC_LINK_STATE", ""), f, "b")
	st.RecoverFlapping("NIC_LINK_STATE", nil, t0.Add(2*time.Second), t0.Add(2*time.Second), pol)
	RenderConditions(n, st, t0)
	RenderObject(n, st, "me", t0)
	if len(n.Status.Conditions) != 1 || n.Status.Conditions[0].Status != corev1.ConditionFalse ||
		!strings.Contains(n.Status.Conditions[0].Message, "stabilizing until 2026-11-23T12:30:02Z") {
		t.Fatalf("conditions %+v", n.Status.Conditions)
	}
	if !n.Spec.Unschedulable || !strings.Contains(n.Annotations[AnnotationReason], "stabilizing") {
		t.Fatalf("unschedulable %v, reason %q", n.Spec.Unschedulable, n.Annotations[AnnotationReason])
	}
}

func TestFlapConfig(t *testing.T) {
	for _, c := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) {}, ""},
		{func(c *Config) { c.FlapThreshold = 0 }, ""},
		{func(c *Config) { c.FlapWindow, c.StabilizationWindow = 0, 0 }, ""},
		{func(c *Config) { c.FlapThreshold = 1 }, "quarantine.flap_threshold"},
		{func(c *Config) { c.FlapThreshold = maxOnsets + 1 }, "quarantine.flap_threshold"},
		{func(c *Config) { c.FlapThreshold = -1 }, "quarantine.flap_threshold"},
		{func(c *Config) { c.FlapWindow = -time.Second }, "quarantine.flap_window"},
		{func(c *Config) { c.StabilizationWindow = -time.Second }, "quarantine.stabilization_window"},
	} {
		cfg := DefaultConfig()
		c.set(&cfg)
		err := cfg.Validate("quarantine.")
		if (err == nil) != (c.want == "") || (err != nil && !strings.HasPrefix(err.Error(), c.want+":")) {
			t.Errorf("Validate: %v, want %q", err, c.want)
		}
	}
	if p := DefaultConfig().Flap(); !p.Enabled() || p.Threshold != 3 || p.Window != 10*time.Minute || p.Stabilization != 30*time.Minute {
		t.Errorf("default policy %+v", p)
	}
	for _, c := range []struct{ window, want time.Duration }{
		{30 * time.Minute, 30 * time.Second}, {2 * time.Second, 200 * time.Millisecond}, {time.Millisecond, 100 * time.Millisecond},
	} {
		cfg := DefaultConfig()
		cfg.StabilizationWindow = c.window
		if got := cfg.sweepInterval(); got != c.want {
			t.Errorf("sweep interval of %v: %v, want %v", c.window, got, c.want)
		}
	}
}

// TestStateAtItsBounds: a fault recorded on a node holding maxFaults,
// older than all of them (a late event, an agent's clock behind), is kept
// and the oldest other goes (it dropped itself, and deciding on it read a
// nil fault: a panic, at every redelivery); a null fault in the
// annotation is no fault (every walk of the faults dereferenced it).
func TestStateAtItsBounds(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	st := &State{Faults: map[string]*Fault{}}
	for i := range maxFaults {
		st.AddFault(FaultKey("C", fmt.Sprint(i)), Fault{Check: "C", Rule: "r", Cordon: true, LastSeen: t0.Add(time.Duration(i) * time.Minute)}, "")
	}
	late := FaultKey("Late", "")
	if !st.AddFault(late, Fault{Check: "Late", Rule: "r", Cordon: true, LastSeen: t0.Add(-time.Hour)}, "e1") {
		t.Fatal("the late fault changed nothing")
	}
	if f := st.Faults[late]; f == nil || len(st.Faults) != maxFaults {
		t.Fatalf("late fault %v, %d faults; want it kept among %d", f, len(st.Faults), maxFaults)
	}
	if _, ok := st.Faults[FaultKey("C", "0")]; ok {
		t.Fatal("the oldest other fault was kept")
	}

	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{
		AnnotationState: `{"faults":{"a":null,"b":{"check":"B","rule":"r","cordon":true}}}`}}}
	got, err := ReadState(n)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got.Faults["a"]; ok || got.Faults["b"] == nil || !got.Active() {
		t.Fatalf("faults %v: want the null one dropped, b standing", got.Faults)
	}
}
