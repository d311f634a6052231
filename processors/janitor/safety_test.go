package janitor

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/faultline/faultline/schemas/events"
)

// gracefulIgnored is a BMC whose GracefulRestart does nothing (the OS
// does not shut down): only ForceRestart reaches the machine.
type gracefulIgnored struct{ Provider }

func (g gracefulIgnored) Reboot(ctx context.Context, t Target, mode RebootMode) error {
	if mode == Graceful {
		return nil
	}
	return g.Provider.Reboot(ctx, t, mode)
}

// TestJanitorSafety: the safety rules on a real kube-apiserver with the
// Redfish emulator: a dry-run cluster changes nothing; the per-rack limit
// holds the second reboot of a rack until the first completed; the cooldown
// holds a node's next operation; a graceful reboot that does not take the
// node down is followed by one forced reboot.
func TestJanitorSafety(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	ctx := context.Background()
	setRack := func(node, rack string) {
		t.Helper()
		p := []byte(`{"metadata":{"labels":{"faultline.io/rack":"` + rack + `"}}}`)
		if _, err := e.kube.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, p, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("DryRun", func(t *testing.T) {
		e.node("dry-1", sysID(0), true, nil)
		j, rec := e.janitor(e.config(), true, nil)
		stop := run(t, j)
		e.create(kindReboot, "dry-1", "dry-1", false)
		// Handled (its dry-run action recorded), then a second for a
		// write it must not make to land before the janitor stops.
		rec.expect(t, "dry-1", []string{"reboot/dry_run"})
		time.Sleep(time.Second)
		stop()
		o, err := e.dyn.Resource(kindReboot.GVR).Get(ctx, "dry-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if stateOf(o) != nil || o.Object["status"] != nil {
			t.Fatalf("dry-run changed the resource: %v", o.Object)
		}
		if e.m.cyclesOf("dry-1") != 0 {
			t.Fatal("dry-run power cycled")
		}
		if err := e.dyn.Resource(kindReboot.GVR).Delete(ctx, "dry-1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	cfg := e.config()
	cfg.MaxConcurrentPerRack = 1
	cfg.Cooldown = time.Hour
	cfg.ForceAfter = 0 // never: a node the stand-in is slow to mark down must not get a forced reboot here
	j, rec := e.janitor(cfg, false, nil)
	stop := run(t, j)

	t.Run("RackLimit", func(t *testing.T) {
		e.node("rack-2", sysID(1), true, nil)
		e.node("rack-3", sysID(2), true, nil)
		setRack("rack-2", "r7")
		setRack("rack-3", "r7")
		cached(t, j, "rack-2", cfg.RackLabel, "r7")
		cached(t, j, "rack-3", cfg.RackLabel, "r7")
		// rack-2 stays down after its power cycle until rack-3 was seen
		// and deferred: the second operation provably met the first in
		// progress (a quick first reboot would otherwise end before the
		// second is looked at, and nothing would be held).
		e.m.hold("rack-2", true)
		e.create(kindReboot, "rack-2", "rack-2", false)
		rec.expect(t, "rack-2", []string{"reboot/applied"})
		e.create(kindReboot, "rack-3", "rack-3", false)
		rec.expect(t, "rack-3", []string{"reboot/deferred"})
		e.m.hold("rack-2", false)
		first := e.wait(kindReboot, "rack-2", 60*time.Second)
		second := e.wait(kindReboot, "rack-3", 60*time.Second)
		done, _ := time.Parse(time.RFC3339, first.Object["status"].(map[string]any)["completionTime"].(string))
		if at := stateOf(second).At; at.Before(done) {
			t.Fatalf("second reboot of rack r7 signalled at %v, before the first completed at %v", at, done)
		}
		rec.expect(t, "rack-3", []string{"reboot/deferred", "reboot/applied", "reboot/succeeded"})
	})

	t.Run("Cooldown", func(t *testing.T) {
		e.create(kindReboot, "rack-2-again", "rack-2", false)
		// The new resource is handled (deferred) within seconds; then
		// a second for a write it must not make.
		rec.expect(t, "rack-2", []string{"reboot/applied", "reboot/succeeded", "reboot/deferred"})
		time.Sleep(time.Second)
		o, _ := e.dyn.Resource(kindReboot.GVR).Get(ctx, "rack-2-again", metav1.GetOptions{})
		if stateOf(o) != nil || finished(o) {
			t.Fatalf("acted within the node's cooldown: %v", o.Object)
		}
		if got := rec.of("rack-2"); len(got) != 3 {
			t.Fatalf("actions of rack-2 %v after the deferral", got)
		}
		if n := e.m.cyclesOf("rack-2"); n != 1 {
			t.Fatalf("%d power cycles", n)
		}
	})

	t.Run("ForceAfterGracefulIgnored", func(t *testing.T) {
		stop()
		cfg.ForceAfter = 6 * time.Second // longer than the stand-in takes to mark a reset node NotReady under load
		provs := e.providers(cfg)
		provs[ProviderRedfish] = realOrIgnored{real: provs[ProviderRedfish], ignore: map[string]bool{"force-4": true}}
		j, rec := e.janitor(cfg, false, provs)
		run(t, j)
		e.node("force-4", sysID(3), true, nil)
		e.create(kindReboot, "force-4", "force-4", false)
		o := e.wait(kindReboot, "force-4", 60*time.Second)
		if condOf(o, CondNodeReady) != "True/Succeeded" || stateOf(o).ForcedAt.IsZero() {
			t.Fatalf("status %v, state %v", o.Object["status"], o.GetAnnotations())
		}
		rec.expect(t, "force-4", []string{"reboot/applied", "reboot/applied", "reboot/succeeded"})
		if n := e.m.cyclesOf("force-4"); n != 1 {
			t.Fatalf("%d power cycles", n)
		}
	})
}

// cached waits until the janitor's node cache shows node's label key as
// value (the limits read the node from it; a patch reaches it later).
func cached(t *testing.T, j *Janitor, node, key, value string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		j.mu.Lock()
		cr := j.running[cluster]
		j.mu.Unlock()
		if cr != nil {
			if o, ok, _ := cr.nodes.GetByKey(node); ok && o.(*corev1.Node).Labels[key] == value {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the janitor's cache does not show node %s's %s=%s", node, key, value)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// realOrIgnored ignores GracefulRestart for the named nodes.
type realOrIgnored struct {
	real   Provider
	ignore map[string]bool
}

func (r realOrIgnored) Reboot(ctx context.Context, t Target, mode RebootMode) error {
	if r.ignore[t.Node.Name] {
		return gracefulIgnored{r.real}.Reboot(ctx, t, mode)
	}
	return r.real.Reboot(ctx, t, mode)
}
func (r realOrIgnored) Terminate(ctx context.Context, t Target) error {
	return r.real.Terminate(ctx, t)
}
func (r realOrIgnored) ResetGPUs(ctx context.Context, t Target, u []string) error {
	return r.real.ResetGPUs(ctx, t, u)
}

// perNode is a provider that accepts every signal at once and counts
// them per node.
type perNode struct {
	mu    sync.Mutex
	calls map[string]int
}

func (c *perNode) add(node string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.calls == nil {
		c.calls = map[string]int{}
	}
	c.calls[node]++
	return nil
}
func (c *perNode) of(node string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[node]
}
func (c *perNode) Reboot(_ context.Context, t Target, _ RebootMode) error { return c.add(t.Node.Name) }
func (c *perNode) Terminate(_ context.Context, t Target) error            { return c.add(t.Node.Name) }
func (c *perNode) ResetGPUs(_ context.Context, t Target, _ []string) error {
	return c.add(t.Node.Name)
}

// TestCooldownHoldsConcurrentResources: two resources of one node that
// two workers take at once — a RebootNode and a TerminateNode, or two
// RebootNodes — send one signal; the other waits for the node's cooldown.
// The cooldown was read from the watch's copy of the node's other
// resources, which the first one's state record reaches only later: both
// passed it, both were recorded and the node got two signals.
func TestCooldownHoldsConcurrentResources(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := context.Background()
	cfg := e.config()
	cfg.Cooldown = time.Hour
	cfg.MaxConcurrent, cfg.MaxConcurrentPerRack = 0, 0
	prov := &perNode{}
	j, _ := e.janitor(cfg, false, map[string]Provider{ProviderRedfish: prov})
	const rounds = 5
	for i := range rounds {
		name := fmt.Sprintf("cool-%d", i)
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{AnnotationProvider: ProviderRedfish,
			events.LabelQuarantined: "true", labelDrain: "succeeded"}}}
		if _, err := e.kube.CoreV1().Nodes().Create(ctx, booted(n), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Both there before the janitor starts: its workers take them at once.
		e.create(kindReboot, name+"-a", name, false)
		e.create(kindReboot, name+"-b", name, false)
	}
	run(t, j)
	time.Sleep(3 * time.Second)
	for i := range rounds {
		name := fmt.Sprintf("cool-%d", i)
		recorded := 0
		for _, r := range []string{name + "-a", name + "-b"} {
			o, err := e.dyn.Resource(kindReboot.GVR).Get(ctx, r, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if stateOf(o) != nil {
				recorded++
			}
		}
		if n := prov.of(name); n != 1 || recorded != 1 {
			t.Errorf("node %s: %d signals sent, %d resources recorded; want 1 (the other in the node's cooldown)", name, n, recorded)
		}
	}
}

// TestStaleDrain: a finished drain counts for the node's current
// quarantine unless it finished before that quarantine began (beyond the
// clocks' slack); a node without either mark's time is judged by its
// labels alone.
func TestStaleDrain(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	drain := func(finished time.Time) string {
		return fmt.Sprintf(`{"id":"d1","phase":"succeeded","finishedAt":%q}`, finished.Format(time.RFC3339Nano))
	}
	for _, tc := range []struct {
		name  string
		ann   map[string]string
		stale bool
	}{
		{"drained after the quarantine began", map[string]string{annotationQuarantinedAt: t0.Format(time.RFC3339), annotationDrainState: drain(t0.Add(time.Minute))}, false},
		{"drained before the quarantine began: lifted and quarantined since", map[string]string{annotationQuarantinedAt: t0.Format(time.RFC3339), annotationDrainState: drain(t0.Add(-time.Hour))}, true},
		{"within the clocks' slack", map[string]string{annotationQuarantinedAt: t0.Format(time.RFC3339), annotationDrainState: drain(t0.Add(-30 * time.Second))}, false},
		{"no quarantine time", map[string]string{annotationDrainState: drain(t0.Add(-time.Hour))}, false},
		{"no drain state", map[string]string{annotationQuarantinedAt: t0.Format(time.RFC3339)}, false},
		{"a drain state without a finish", map[string]string{annotationQuarantinedAt: t0.Format(time.RFC3339), annotationDrainState: `{"id":"d1","phase":"running"}`}, false},
		{"corrupt marks", map[string]string{annotationQuarantinedAt: "yesterday", annotationDrainState: "{"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why := staleDrain(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: tc.ann}})
			if (why != "") != tc.stale {
				t.Fatalf("staleDrain = %q, want stale %v", why, tc.stale)
			}
		})
	}
}

// TestPartialDrainRefusesWholeNode: a COMPONENT_RESET drain evicts only
// its GPUs' pods, so a RebootNode or TerminateNode on its node (one held
// while the node was lifted and quarantined again for a GPU's fault) is
// refused NotDrained unless forced; a GPUReset is not, nor a whole-node
// drain's reboot.
func TestPartialDrainRefusesWholeNode(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	partial := fmt.Sprintf(`{"id":"d2","phase":"succeeded","finishedAt":%q,"gpus":["GPU-2"]}`, t0.Add(time.Minute).Format(time.RFC3339Nano))
	whole := fmt.Sprintf(`{"id":"d1","phase":"succeeded","finishedAt":%q}`, t0.Add(time.Minute).Format(time.RFC3339Nano))
	// A GPU's reset on the node after its whole-node drain: the drain
	// role kept the whole node as its scope (processors/drain
	// drainedNode).
	resetWhole := fmt.Sprintf(`{"id":"d3","phase":"succeeded","finishedAt":%q,"trigger":{"recommendedAction":"COMPONENT_RESET"}}`,
		t0.Add(2*time.Hour).Format(time.RFC3339Nano))
	for _, tc := range []struct {
		name    string
		kd      kind
		drain   string
		force   bool
		refused bool
	}{
		{"reboot after a partial drain", kindReboot, partial, false, true},
		{"terminate after a partial drain", kindTerminate, partial, false, true},
		{"forced reboot after a partial drain", kindReboot, partial, true, false},
		{"GPU reset after a partial drain", kindGPUReset, partial, false, false},
		{"reboot after a whole-node drain", kindReboot, whole, false, false},
		{"reboot after a GPU's reset drained the whole node", kindReboot, resetWhole, false, false},
		{"reboot, no drain state", kindReboot, "", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ann := map[string]string{annotationQuarantinedAt: t0.Format(time.RFC3339)}
			if tc.drain != "" {
				ann[annotationDrainState] = tc.drain
			}
			op := &operation{
				j:  &Janitor{cfg: Config{RequireDrained: true}},
				kd: tc.kd, nodeName: "n1", force: tc.force,
				node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: ann,
					Labels: map[string]string{labelQuarantined: "true", labelDrain: "succeeded"}}},
			}
			if why := op.notDrained(); (why != "") != tc.refused {
				t.Fatalf("notDrained = %q, want refused %v", why, tc.refused)
			}
		})
	}
}
