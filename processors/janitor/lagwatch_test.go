package janitor

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/faultline/faultline/schemas/events"
)

// TestStartReadsTheNodeFromTheAPIServer: a resource is started on the
// API server's copy of its node, not on a node watch lagging behind it
// (a re-list after "too old resource version", a slow apiserver) that
// still shows the node quarantined and drained: a node lifted since is
// refused NotDrained, one being drained again waits for its drain;
// neither is sent a reboot. Before, the watch's copy let the reboot
// through: a healthy node taking pods again was rebooted, its pods
// killed without eviction or their PDBs.
func TestStartReadsTheNodeFromTheAPIServer(t *testing.T) {
	t.Parallel()
	f := newFakeCluster(t, fakeNode("n-lifted", "r1", "boot-a"), fakeNode("n-draining", "r2", "boot-b"))
	prov := &tally{}
	j, rec := f.janitor(fakeConfig(), false, prov)
	f.run(j)
	cached(t, j, "n-lifted", events.LabelQuarantined, "true")
	cached(t, j, "n-draining", events.LabelQuarantined, "true")
	j.mu.Lock()
	cr := j.running[cluster]
	j.mu.Unlock()
	lagging := map[string]*corev1.Node{}
	for _, name := range []string{"n-lifted", "n-draining"} {
		o, _, _ := cr.nodes.GetByKey(name)
		lagging[name] = o.(*corev1.Node).DeepCopy()
	}
	f.lift("n-lifted")
	n, err := f.kube.CoreV1().Nodes().Get(context.Background(), "n-draining", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels[labelDrain] = "running"
	if _, err := f.kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cached(t, j, "n-draining", labelDrain, "running")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if o, _, _ := cr.nodes.GetByKey("n-lifted"); o.(*corev1.Node).Labels[events.LabelQuarantined] == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the janitor's cache does not show n-lifted lifted")
		}
	}
	// The watch falls behind: its copies from before the lift and the drain.
	for _, n := range lagging {
		if err := cr.nodes.Update(n); err != nil {
			t.Fatal(err)
		}
	}
	f.create(kindReboot, "lifted", "n-lifted", nil)
	f.create(kindReboot, "draining", "n-draining", nil)
	f.waitFor(kindReboot, "lifted", 10*time.Second, "refused NotDrained", func(o *unstructured.Unstructured) bool {
		c := condition(o, CondSignalSent)
		return c != nil && c["reason"] == ReasonNotDrained && finished(o)
	})
	rec.expect(t, "n-draining", []string{events.KindReboot + "/" + events.OutcomeDeferred})
	time.Sleep(300 * time.Millisecond) // several polls
	if o := f.get(kindReboot, "draining"); finished(o) {
		t.Fatalf("the reboot of a node being drained ended: %v", o.Object["status"])
	}
	if c := prov.calls(); len(c) != 0 {
		t.Fatalf("signals sent from the lagging watch's copy: %v", c)
	}
}
