package quarantine

import (
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRecoveredRemembered: a lifted fault's recovery is kept on the node
// for the memory, and an occurrence generated no later than it is
// superseded; one generated after it, one of a fault standing again, or
// one with no time is not; past the memory the node forgets it (and the
// sweep is due then); a memory of 0 or a recovery with no time remembers
// nothing.
func TestRecoveredRemembered(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	now := t0.Add(time.Minute)
	key := FaultKey("XID_ERROR_48", "GPU=GPU-1")
	lifted := func(recoveredAt time.Time, memory time.Duration) *State {
		st := &State{Faults: map[string]*Fault{}}
		st.AddFault(key, Fault{Check: "XID_ERROR_48", Entity: "GPU=GPU-1", Rule: "r", Cordon: true, Since: t0, LastSeen: t0}, "e1")
		removed, _, _ := st.RecoverFlapping("XID_ERROR_48", []string{"GPU=GPU-1"}, recoveredAt, now, FlapPolicy{})
		for _, k := range removed {
			st.rememberRecovery(k, recoveredAt, now, memory)
		}
		// As the node carries it, and read back.
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
		RenderObject(n, st, "test", now)
		back, err := ReadState(n)
		if err != nil {
			t.Fatal(err)
		}
		return back
	}
	edited := func(r Recovery) *State {
		return &State{Faults: map[string]*Fault{}, Recovered: map[string]Recovery{key: r}}
	}
	for _, tc := range []struct {
		name       string
		st         *State
		at         time.Time
		standing   bool
		superseded bool
	}{
		{"the occurrence the recovery lifted", lifted(t0.Add(20*time.Second), time.Hour), t0, false, true},
		{"an occurrence between it and the recovery", lifted(t0.Add(20*time.Second), time.Hour), t0.Add(10 * time.Second), false, true},
		{"an occurrence generated with the recovery", lifted(t0.Add(20*time.Second), time.Hour), t0.Add(20 * time.Second), false, true},
		{"an occurrence after the recovery", lifted(t0.Add(20*time.Second), time.Hour), t0.Add(21 * time.Second), false, false},
		{"an occurrence with no time", lifted(t0.Add(20*time.Second), time.Hour), time.Time{}, false, false},
		{"the fault stands again", lifted(t0.Add(20*time.Second), time.Hour), t0, true, false},
		{"memory 0", lifted(t0.Add(20*time.Second), 0), t0, false, false},
		{"a recovery with no time", lifted(time.Time{}, time.Hour), t0, false, false},
		{"an entry kept longer than the memory (edited)", edited(Recovery{At: t0.Add(20 * time.Second), Until: now.Add(48 * time.Hour)}), t0, false, false},
		{"an entry generated after it is forgotten (edited)", edited(Recovery{At: now.Add(2 * time.Hour), Until: now.Add(time.Hour)}), t0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.standing {
				tc.st.AddFault(key, Fault{Check: "XID_ERROR_48", Entity: "GPU=GPU-1", Rule: "r", Cordon: true, Since: t0.Add(30 * time.Second), LastSeen: t0.Add(30 * time.Second)}, "e2")
			}
			if _, got := tc.st.Superseded(key, tc.at, now, time.Hour); got != tc.superseded {
				t.Fatalf("Superseded(%v) = %v, want %v (remembered %v)", tc.at, got, tc.superseded, tc.st.Recovered)
			}
		})
	}

	t.Run("forgotten after the memory, by the sweep", func(t *testing.T) {
		st := lifted(t0.Add(20*time.Second), time.Hour)
		due := st.NextSweep(FlapPolicy{})
		if want := now.Add(time.Hour); due.Before(want) || due.After(want.Add(time.Second)) {
			t.Fatalf("next sweep %v, want just after %v", due, want)
		}
		if _, changed := st.LiftStabilized(now.Add(30*time.Minute), FlapPolicy{}); changed || st.pruneRecovered(now.Add(30*time.Minute)) {
			t.Fatal("forgotten before the memory passed")
		}
		if !st.pruneRecovered(due) {
			t.Fatal("not forgotten once the memory passed")
		}
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{AnnotationRecovered: `{}`}}}
		RenderObject(n, st, "test", due)
		if _, ok := n.Annotations[AnnotationRecovered]; ok || !st.NextSweep(FlapPolicy{}).IsZero() {
			t.Fatalf("annotation %q left, next sweep %v", n.Annotations[AnnotationRecovered], st.NextSweep(FlapPolicy{}))
		}
	})

	t.Run("bounded, and dropped first over the budget", func(t *testing.T) {
		st := &State{Faults: map[string]*Fault{}}
		for i := range maxRecovered + 10 {
			st.rememberRecovery(FaultKey("CHECK", string(rune('a'+i%26))+time.Duration(i).String()), t0, now.Add(time.Duration(i)*time.Second), time.Hour)
		}
		if len(st.Recovered) != maxRecovered {
			t.Fatalf("%d remembered, want %d", len(st.Recovered), maxRecovered)
		}
		st.History = map[string][]time.Time{key: {t0}}
		b, _ := json.Marshal(st)
		h, _ := json.Marshal(st.History)
		if rep := st.Fit(len(b) + len(h)); len(st.Recovered) != 0 || len(st.History) != 1 {
			t.Fatalf("over the budget: %d recoveries, %d onsets kept (%d bytes)", len(st.Recovered), len(st.History), rep.Bytes)
		}
	})
}
