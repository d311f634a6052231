package janitor

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestSlotsGivenBackWhenTheWatchStops: a janitor that stops working a
// cluster (its Lease lost, its watch failed) gives back the cluster's
// slots, and takes them again for the operations still in progress when
// it works the cluster again. Before, the slots lived on in the process:
// a resource finished and deleted by another janitor meanwhile (the
// remediate role prunes finished ones) held its slot for ever, and with
// max_concurrent_per_rack = 2 two such resources froze their rack.
func TestSlotsGivenBackWhenTheWatchStops(t *testing.T) {
	t.Parallel()
	f := newFakeCluster(t, fakeNode("n1", "r1", "boot-n1"), fakeNode("n2", "r1", "boot-n2"))
	cfg := fakeConfig()
	cfg.MaxConcurrent = 1
	prov := &signals{Provider: noop{}, n: map[string]int{}}
	j, _ := f.janitor(cfg, false, prov)
	signalled := func(o *unstructured.Unstructured) bool { return condOf(o, CondSignalSent) == "True/"+ReasonSucceeded }

	// Holding the Lease: R1 is signalled (its node never comes back).
	stop := f.run(j)
	f.create(kindReboot, "r1", "n1", nil)
	f.waitFor(kindReboot, "r1", 5*time.Second, "signalled", signalled)
	stop() // the Lease lost
	if n := j.lim.inProgress(cluster); n != 0 {
		t.Fatalf("%d slots held after the watch stopped, want 0", n)
	}

	// Back: R1, still in progress, takes its slot again before R2 starts.
	f.create(kindReboot, "r2", "n2", nil)
	stop = f.run(j)
	// The restarted watch syncs, then R1 takes its slot again; waited
	// for, not a fixed sleep (under load the sync took longer). Once R1
	// holds it, R2 can take none: 1 in progress, R2 not started.
	for deadline := time.Now().Add(5 * time.Second); !holds(j.lim, "/r1"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("r1 took no slot again within 5s of the restart: %d in progress", j.lim.inProgress(cluster))
		}
	}
	if o := f.get(kindReboot, "r2"); stateOf(o) != nil || j.lim.inProgress(cluster) != 1 {
		t.Fatalf("r2 started beside r1 in progress (max_concurrent 1): %d in progress, %v", j.lim.inProgress(cluster), o.Object)
	}
	stop()

	// Another janitor finished R1 and it was pruned meanwhile: R2 gets its
	// slot.
	if err := f.dyn.Resource(kindReboot.GVR).Delete(t.Context(), "r1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.run(j)
	f.waitFor(kindReboot, "r2", 5*time.Second, "signalled (r1's slot was given back)", signalled)
	if got := prov.count()["reboot/graceful"]; got != 2 {
		t.Fatalf("%d reboots sent, want 2", got)
	}
}

// holds reports whether a resource whose key ends in suffix holds a slot.
func holds(l *limiter, suffix string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for res := range l.holders {
		if strings.HasSuffix(res, suffix) {
			return true
		}
	}
	return false
}
