package janitor

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	clienttesting "k8s.io/client-go/testing"
)

// TestDryRunFollowsNothing: operations already in progress in a cluster
// made dry-run (an operator pausing remediation during an incident, then
// restarting the janitor) are not acted on: no forced reboot, power-on,
// GPU reset asked again or Node deleted, no status written; each gets its
// one dry_run action. Before, only a new operation was held: a reboot in
// progress got its ForceRestart after force_after, and a terminated
// node's Node was deleted.
func TestDryRunFollowsNothing(t *testing.T) {
	t.Parallel()
	down := fakeNode("n-down", "r2", "boot-n-down")
	setReady(down, corev1.ConditionFalse)
	f := newFakeCluster(t, fakeNode("n-up", "r1", "boot-n-up"), down, fakeNode("n-term", "r3", "boot-n-term"), fakeNode("n-gpu", "r4", "boot-n-gpu"))
	now := time.Now().UTC()
	recorded := func(node string, ago time.Duration) *opState {
		return &opState{Step: "signal", At: now.Add(-ago), BootID: "boot-" + node, Provider: ProviderRedfish, By: "another-janitor"}
	}
	sent := cond{CondSignalSent, "True", ReasonSucceeded, "signal sent via redfish"}
	// Past force_after (10m) and still Ready with its old boot ID: forced
	// when followed.
	f.create(kindReboot, "up", "n-up", recorded("n-up", 15*time.Minute), sent, cond{CondNodeReady, "Unknown", ReasonInitializing, "waiting"})
	// Past force_after and down with its old boot ID: asked whether it is
	// off, and powered on.
	f.create(kindReboot, "down", "n-down", recorded("n-down", 12*time.Minute), sent, cond{CondNodeReady, "Unknown", ReasonInitializing, "waiting"})
	// Terminated: its Node deleted.
	f.create(kindTerminate, "term", "n-term", recorded("n-term", time.Minute), sent, cond{CondNodeTerminated, "Unknown", ReasonInitializing, "waiting"})
	// Its reset asked again.
	f.create(kindGPUReset, "gpu", "n-gpu", recorded("n-gpu", time.Minute))
	f.kube.ClearActions()
	f.dyn.ClearActions()

	prov := &tally{}
	j, rec := f.janitor(fakeConfig(), true, prov)
	stop := f.run(j)
	want := map[string][]string{"n-up": {"reboot/dry_run"}, "n-down": {"reboot/dry_run"}, "n-term": {"terminate/dry_run"}, "n-gpu": {"gpu_reset/dry_run"}}
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if rec.of("n-up") != nil && rec.of("n-down") != nil && rec.of("n-term") != nil && rec.of("n-gpu") != nil {
			break
		}
	}
	time.Sleep(10 * fakeConfig().PollInterval) // a step it must not take lands meanwhile
	stop()

	if calls := prov.calls(); len(calls) != 0 {
		t.Errorf("the provider was called in a dry-run cluster: %v", calls)
	}
	writes := func(acts []clienttesting.Action) (out []string) {
		for _, a := range acts {
			if slices.Contains([]string{"create", "update", "patch", "delete"}, a.GetVerb()) {
				out = append(out, a.GetVerb()+" "+a.GetResource().Resource+" "+a.GetSubresource())
			}
		}
		return out
	}
	if w := writes(f.kube.Actions()); len(w) != 0 {
		t.Errorf("a dry-run cluster was written (nodes, events): %v", w)
	}
	if w := writes(f.dyn.Actions()); len(w) != 0 {
		t.Errorf("a dry-run cluster's resources were written: %v", w)
	}
	for node, w := range want {
		if got := rec.of(node); !slices.Equal(got, w) {
			t.Errorf("actions of %s: %v, want %v", node, got, w)
		}
	}
}
