package janitor

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// dying is the actions topic of a janitor killed while it produces an
// action: the nth action that is "kind/outcome" at never reaches the
// topic, and the janitor is dead from then on (every produce, that one
// included, waits until the janitor is stopped and fails).
type dying struct {
	recorder
	at  string
	nth int

	mu   sync.Mutex
	seen int
	lost *faultlinev1.Action // the action it was killed producing
	hit  chan struct{}       // closed then
}

func newDying(at string, nth int) *dying { return &dying{at: at, nth: nth, hit: make(chan struct{})} }

func (d *dying) ProduceSync(ctx context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	a, err := events.UnmarshalAction(rs[0].Value)
	d.mu.Lock()
	dead := d.lost != nil
	if !dead && err == nil && a.Kind+"/"+a.Outcome == d.at {
		if d.seen++; d.seen == d.nth {
			d.lost, dead = a, true
			close(d.hit)
		}
	}
	d.mu.Unlock()
	if !dead {
		return d.recorder.ProduceSync(ctx, rs...)
	}
	<-ctx.Done()
	return kgo.ProduceResults{{Record: rs[0], Err: ctx.Err()}}
}

// signals counts the signals that pass to its provider ("reboot/graceful",
// "reboot/force", "terminate").
type signals struct {
	Provider
	mu sync.Mutex
	n  map[string]int
}

func (s *signals) add(what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n[what]++
}

func (s *signals) count() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.n)
}

func (s *signals) Reboot(ctx context.Context, t Target, mode RebootMode) error {
	s.add("reboot/" + mode.String())
	return s.Provider.Reboot(ctx, t, mode)
}

func (s *signals) Terminate(ctx context.Context, t Target) error {
	s.add("terminate")
	return s.Provider.Terminate(ctx, t)
}

// TestJanitorActionSurvivesKill: a janitor killed while it produces a
// step's action (SIGKILL stands-in: its producer never delivers it and it
// is stopped there) loses no audit record. The next janitor finds the step
// not written and does it again, producing the same action (same id) —
// or, where the step was a signal it may have sent, the resumed action —
// and no signal goes out twice. Before the action was produced ahead of
// the status it reports, a kill after the status write lost it for ever.
func TestJanitorActionSurvivesKill(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 8)
	for _, tc := range []struct {
		name     string
		kd       kind
		node     string
		sys      int
		drained  bool
		force    time.Duration // force_after, with the node's graceful reboot ignored; 0: off
		die      string        // the action A is killed producing ("kind/outcome") ...
		nth      int           // ... the nth of them
		wantB    []string      // the actions of B, the janitor after it
		sameID   bool          // B produces the lost action again, with its id
		signalsA map[string]int
	}{
		{name: "Refused", kd: kindReboot, node: "kill-refused", sys: 0, die: "reboot/refused", nth: 1,
			wantB: []string{"reboot/refused"}, sameID: true, signalsA: map[string]int{}},
		{name: "SignalSent", kd: kindReboot, node: "kill-signal", sys: 1, drained: true, die: "reboot/applied", nth: 1,
			wantB: []string{"reboot/in_progress", "reboot/succeeded"}, signalsA: map[string]int{"reboot/graceful": 1}},
		{name: "Completed", kd: kindReboot, node: "kill-complete", sys: 2, drained: true, die: "reboot/succeeded", nth: 1,
			wantB: []string{"reboot/succeeded"}, sameID: true, signalsA: map[string]int{"reboot/graceful": 1}},
		{name: "Forced", kd: kindReboot, node: "kill-force", sys: 3, drained: true, force: 2 * time.Second, die: "reboot/applied", nth: 2,
			wantB: []string{"reboot/in_progress", "reboot/succeeded"}, signalsA: map[string]int{"reboot/graceful": 1, "reboot/force": 1}},
		{name: "Terminated", kd: kindTerminate, node: "kill-terminate", sys: 4, drained: true, die: "terminate/succeeded", nth: 1,
			wantB: []string{"terminate/succeeded"}, sameID: true, signalsA: map[string]int{"terminate": 1}},
		// Resumed (Recorded): its Node goes once the machine is down.
		{name: "TerminateSignalSent", kd: kindTerminate, node: "kill-terminate-signal", sys: 6, drained: true, die: "terminate/applied", nth: 1,
			wantB: []string{"terminate/in_progress", "terminate/succeeded"}, signalsA: map[string]int{"terminate": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.node(tc.node, sysID(tc.sys), tc.drained, nil)
			cfg := e.config()
			cfg.ForceAfter = tc.force
			provs := func() (map[string]Provider, *signals) {
				p := e.providers(cfg)
				if tc.force > 0 {
					p[ProviderRedfish] = gracefulIgnored{p[ProviderRedfish]}
				}
				s := &signals{Provider: p[ProviderRedfish], n: map[string]int{}}
				p[ProviderRedfish] = s
				return p, s
			}
			pa, sa := provs()
			prodA := newDying(tc.die, tc.nth)
			stopA := run(t, e.janitorTo(prodA, cfg, false, pa))
			e.create(tc.kd, tc.node, tc.node, false)
			select {
			case <-prodA.hit:
			case <-time.After(60 * time.Second):
				t.Fatalf("janitor A produced no %s #%d; its actions %v", tc.die, tc.nth, prodA.of(tc.node))
			}
			stopA()

			pb, sb := provs()
			b, recB := e.janitor(cfg, false, pb)
			stopB := run(t, b)
			defer stopB() // the next case's janitors have its resources to themselves
			e.wait(tc.kd, tc.node, 60*time.Second)
			recB.expect(t, tc.node, tc.wantB)
			if tc.sameID {
				recB.mu.Lock()
				i := slices.IndexFunc(recB.acts, func(a *faultlinev1.Action) bool {
					return a.Node == tc.node && a.Kind == prodA.lost.Kind && a.Outcome == prodA.lost.Outcome
				})
				again := recB.acts[i]
				recB.mu.Unlock()
				if again.Id != prodA.lost.Id {
					t.Fatalf("B produced the lost action with id %s, A's was %s", again.Id, prodA.lost.Id)
				}
			}
			if got := sa.count(); !maps.Equal(got, tc.signalsA) {
				t.Fatalf("janitor A sent %v, want %v", got, tc.signalsA)
			}
			if got := sb.count(); len(got) != 0 {
				t.Fatalf("janitor B sent %v, want nothing (at most once)", got)
			}
			if tc.kd == kindReboot && tc.drained {
				if n := e.m.cyclesOf(tc.node); n != 1 {
					t.Fatalf("%d power cycles of %s, want 1", n, tc.node)
				}
			}
			if tc.kd == kindTerminate {
				if _, err := e.kube.CoreV1().Nodes().Get(context.Background(), tc.node, metav1.GetOptions{}); err == nil {
					t.Fatalf("node %s still exists after its terminate", tc.node)
				}
			}
		})
	}

	// Kafka refuses every action of a reboot: the reboot goes on, each
	// action kept on the resource; the next janitor produces them (the
	// same ids) and removes them. A forged entry about another node, or of
	// another kind, is removed, never produced.
	t.Run("KeptWhileKafkaIsDown", func(t *testing.T) {
		const node = "kept-1"
		e.node(node, sysID(7), true, nil)
		stopA := run(t, e.janitorTo(&flakyProducer{err: kerr.NotEnoughReplicas}, e.config(), false, nil))
		e.create(kindReboot, node, node, false)
		o := e.wait(kindReboot, node, 60*time.Second)
		stopA()
		kept := keptActions(t, o)
		if len(kept) != 2 || kept[0].Kind+"/"+kept[0].Outcome != "reboot/applied" || kept[1].Kind+"/"+kept[1].Outcome != "reboot/succeeded" ||
			condOf(o, CondNodeReady) != "True/"+ReasonSucceeded {
			t.Fatalf("kept %v; status %v", kept, o.Object["status"])
		}
		forged := `[{"id":"f1","cluster":"c1","node":"other","role":"janitor","kind":"reboot","outcome":"succeeded"},` +
			`{"id":"f2","cluster":"c1","node":"kept-1","role":"quarantine","kind":"quarantine","outcome":"applied"},`
		ann := strings.Replace(o.GetAnnotations()[AnnotationUnsaid], "[", forged, 1)
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{AnnotationUnsaid: ann}}})
		if _, err := e.dyn.Resource(kindReboot.GVR).Patch(context.Background(), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}

		b, recB := e.janitor(e.config(), false, nil)
		run(t, b)
		recB.expect(t, node, []string{"reboot/applied", "reboot/succeeded"})
		if forgedOut := recB.of("other"); len(forgedOut) > 0 {
			t.Fatalf("forged actions produced: %v", forgedOut)
		}
		recB.mu.Lock()
		for i, a := range recB.acts {
			if a.Id != kept[i].Id {
				t.Errorf("produced %s/%s with id %s, kept with %s", a.Kind, a.Outcome, a.Id, kept[i].Id)
			}
		}
		recB.mu.Unlock()
		e.waitUnsaidCleared(kindReboot, node, 10*time.Second)
		if n := e.m.cyclesOf(node); n != 1 {
			t.Fatalf("%d power cycles, want 1", n)
		}
	})

	// A terminate recorded by a janitor killed before its provider sent it
	// (the state cannot tell): the next janitor resumes it as Recorded and
	// keeps the Node of a machine still Ready — a timeout, not a Node
	// deleted from under a running machine and the terminate called done.
	t.Run("TerminateRecordedNeverSent", func(t *testing.T) {
		const node = "kill-unsent"
		e.node(node, sysID(5), true, nil)
		cfg := e.config()
		cfg.TerminateTimeout = 3 * time.Second
		pa := e.providers(cfg)
		called := make(chan struct{})
		pa[ProviderRedfish] = unsent{Provider: pa[ProviderRedfish], called: called}
		stopA := run(t, e.janitorTo(&recorder{}, cfg, false, pa))
		e.create(kindTerminate, node, node, false)
		select {
		case <-called:
		case <-time.After(60 * time.Second):
			t.Fatal("janitor A never tried the terminate")
		}
		stopA()
		b, recB := e.janitor(cfg, false, nil)
		run(t, b)
		o := e.wait(kindTerminate, node, 60*time.Second)
		if condOf(o, CondSignalSent) != "True/"+ReasonRecorded || condOf(o, CondNodeTerminated) != "False/"+ReasonTimeout {
			t.Fatalf("status %v", o.Object["status"])
		}
		if _, err := e.kube.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{}); err != nil {
			t.Fatalf("the Ready node of a terminate never sent: %v", err)
		}
		recB.expect(t, node, []string{"terminate/in_progress", "terminate/failed"})
	})
}

// unsent stands in for a janitor killed inside its provider's call,
// before the terminate went out: it says it was called and blocks.
type unsent struct {
	Provider
	called chan struct{}
}

func (u unsent) Terminate(ctx context.Context, _ Target) error {
	close(u.called)
	<-ctx.Done()
	return ctx.Err()
}
