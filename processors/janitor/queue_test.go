package janitor

import (
	"context"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/quarantine"
	"github.com/faultline/faultline/processors/remediate"
	"github.com/faultline/faultline/schemas/events"
)

// clock is a test clock, moved by set.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.t = t }

// TestQueuedResourcesNotStartedLate: a rack-wide fault scaled down — four
// RebootNodes of one rack, one at a time (max_concurrent_per_rack 1), the
// first holding the slot. One whose node the remediate role escalated
// after it was created, and one still queued past max_queue_age, end
// SignalSent=False (Escalated, QueueTimeout) with nothing sent; one
// started within the bound is rebooted. Before, the janitor started every
// one whenever its slot came, however old, rebooting nodes the remediate
// role had failed (its completion_timeout) and handed to a human.
func TestQueuedResourcesNotStartedLate(t *testing.T) {
	t.Parallel()
	if annotationEscalated != remediate.AnnotationEscalated || annotationCreated != remediate.AnnotationCreated {
		t.Fatalf("annotations %q, %q; the remediate role writes %q, %q", annotationEscalated, annotationCreated,
			remediate.AnnotationEscalated, remediate.AnnotationCreated)
	}
	if annotationQuarantinedAt != quarantine.AnnotationAt {
		t.Fatalf("the janitor reads %q; the quarantine role writes %q", annotationQuarantinedAt, quarantine.AnnotationAt)
	}
	names := []string{"q0", "q1", "q2", "q3"}
	f := newFakeCluster(t, fakeNode("q0", "r1", "b0"), fakeNode("q1", "r1", "b1"), fakeNode("q2", "r1", "b2"), fakeNode("q3", "r1", "b3"))
	t0 := time.Now().UTC().Truncate(time.Second)
	clk := &clock{t: t0.Add(time.Minute)}
	ctx := context.Background()
	for _, n := range names {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": Group + "/v1alpha1", "kind": kindReboot.Name,
			"metadata": map[string]any{"name": n, "uid": "uid-" + n}, "spec": map[string]any{"nodeName": n}}}
		u.SetCreationTimestamp(metav1.NewTime(t0))
		if _, err := f.dyn.Resource(kindReboot.GVR).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := fakeConfig()
	cfg.MaxConcurrent, cfg.MaxConcurrentPerRack = 0, 1
	cfg.MaxQueueAge = time.Hour
	cfg.RebootTimeout, cfg.ForceAfter, cfg.HungAfter = 100*time.Hour, 0, 0
	prov := &tally{}
	rec := &recorder{}
	reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	reg.SetClient(cluster, f.kube, false)
	reg.SetDynamic(cluster, f.dyn)
	j, err := New(cfg, clusters.Config{}, reg, Options{Log: testLog, Now: clk.now,
		Providers: map[string]Provider{ProviderRedfish: prov}, Producer: rec})
	if err != nil {
		t.Fatal(err)
	}
	f.run(j)

	sent := func(o *unstructured.Unstructured) bool { return condIs(o, CondSignalSent, "True") }
	ended := func(reason string) func(*unstructured.Unstructured) bool {
		return func(o *unstructured.Unstructured) bool {
			c := condition(o, CondSignalSent)
			return c != nil && c["status"] == "False" && c["reason"] == reason && finished(o)
		}
	}
	// One of the rack's four holds its slot; the others wait.
	var first string
	deadline := time.Now().Add(10 * time.Second)
	for first == "" {
		for _, n := range names {
			if sent(f.get(kindReboot, n)) {
				first = n
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no reboot started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var queued []string
	for _, n := range names {
		if n != first {
			queued = append(queued, n)
		}
	}
	// The remediate role escalates one queued node 5 minutes on.
	patch := []byte(`{"metadata":{"annotations":{"` + annotationEscalated + `":"` + t0.Add(5*time.Minute).Format(time.RFC3339) + ` the last reboot failed"}}}`)
	if _, err := f.kube.CoreV1().Nodes().Patch(ctx, queued[0], types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor(kindReboot, queued[0], 10*time.Second, "refused Escalated", ended(ReasonEscalated))
	// The first is over (deleted): the next one starts, within the bound.
	if err := f.dyn.Resource(kindReboot.GVR).Delete(ctx, first, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var next, last string
	for deadline := time.Now().Add(10 * time.Second); next == ""; time.Sleep(20 * time.Millisecond) {
		switch {
		case sent(f.get(kindReboot, queued[1])):
			next, last = queued[1], queued[2]
		case sent(f.get(kindReboot, queued[2])):
			next, last = queued[2], queued[1]
		case time.Now().After(deadline):
			t.Fatal("no queued reboot started once the slot was free")
		}
	}
	// The last waits past max_queue_age: ended, never started.
	clk.set(t0.Add(2 * time.Hour))
	f.waitFor(kindReboot, last, 10*time.Second, "ended QueueTimeout", ended(ReasonQueueTimeout))
	calls := prov.calls()
	for _, n := range []string{first, next} {
		if calls["reboot/graceful "+n] != 1 {
			t.Errorf("node %s: %d reboots, want 1 (%v)", n, calls["reboot/graceful "+n], calls)
		}
	}
	for _, n := range []string{queued[0], last} {
		if calls["reboot/graceful "+n] != 0 {
			t.Errorf("node %s rebooted after it was escalated or queued past max_queue_age (%v)", n, calls)
		}
	}
	// Escalated is a refusal (remediate reads it as cancelled), not a
	// failure; a queue past max_queue_age is a failure.
	deferred := events.KindReboot + "/" + events.OutcomeDeferred // waiting for the rack's slot
	rec.expect(t, queued[0], []string{deferred, events.KindReboot + "/" + events.OutcomeRefused})
	rec.expect(t, last, []string{deferred, events.KindReboot + "/" + events.OutcomeFailed})
}

// TestEscalatedSinceToTheNanosecond: the remediate role writes its
// escalation's time and the resource's creation with nanoseconds, and
// the two are compared exactly; only a time with whole seconds (an older
// remediate role's escalation, the apiserver's creationTimestamp) is
// compared to the second. Before, the creation was truncated to the
// second: a resource created half a second after an escalation, in the
// same second, was refused Escalated.
func TestEscalatedSinceToTheNanosecond(t *testing.T) {
	t.Parallel()
	sec := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	nano := func(d time.Duration) string { return sec.Add(d).Format(time.RFC3339Nano) }
	for _, tc := range []struct {
		name, escalated, created string // created: annotationCreated ("": creationTimestamp only, sec)
		refused                  bool
	}{
		{"escalated 0.5s before, same second", nano(200 * time.Millisecond), nano(700 * time.Millisecond), false},
		{"escalated after", nano(900 * time.Millisecond), nano(700 * time.Millisecond), true},
		{"escalated at the creation", nano(700 * time.Millisecond), nano(700 * time.Millisecond), true},
		{"escalated the second before", nano(-100 * time.Millisecond), nano(700 * time.Millisecond), false},
		{"whole-second escalation of the same second", sec.Format(time.RFC3339), nano(700 * time.Millisecond), true},
		{"whole-second escalation the second before", sec.Add(-time.Second).Format(time.RFC3339), nano(700 * time.Millisecond), false},
		{"creationTimestamp: same second", nano(200 * time.Millisecond), "", true},
		{"creationTimestamp: the second before", nano(-200 * time.Millisecond), "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "r"}}}
			u.SetCreationTimestamp(metav1.NewTime(sec))
			if tc.created != "" {
				u.SetAnnotations(map[string]string{annotationCreated: tc.created})
			}
			node := fakeNode("n1", "r1", "b1")
			node.Annotations = map[string]string{annotationEscalated: tc.escalated + " the last reboot failed"}
			op := &operation{kd: kindReboot, u: u, nodeName: "n1", node: node}
			if why := op.escalatedSince(); (why != "") != tc.refused {
				t.Fatalf("escalated %s, created %q: refused %q, want refused %v", tc.escalated, tc.created, why, tc.refused)
			}
		})
	}
}
