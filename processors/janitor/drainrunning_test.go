package janitor

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/faultline/faultline/schemas/events"
)

// TestWaitsForARunningDrain: a resource whose quarantined node is being
// drained (a fault that came while it waited: a GPU's reset after the
// node's whole-node drain) waits for the drain (one deferred action)
// and is sent once it ends; one with no drain at all is refused as
// before. Before, the running drain refused it NotDrained, remediate read
// that as cancelled, and nothing remediated the node's standing fault.
func TestWaitsForARunningDrain(t *testing.T) {
	t.Parallel()
	running, undrained := fakeNode("n-running", "r1", "boot-a"), fakeNode("n-undrained", "r2", "boot-b")
	running.Labels[labelDrain] = "running"
	delete(undrained.Labels, labelDrain)
	f := newFakeCluster(t, running, undrained)
	f.create(kindReboot, "waits", "n-running", nil)
	f.create(kindReboot, "refused", "n-undrained", nil)
	prov := &tally{}
	j, rec := f.janitor(fakeConfig(), false, prov)
	f.run(j)
	f.waitFor(kindReboot, "refused", 10*time.Second, "refused NotDrained", func(o *unstructured.Unstructured) bool {
		c := condition(o, CondSignalSent)
		return c != nil && c["reason"] == ReasonNotDrained && finished(o)
	})
	rec.expect(t, "n-running", []string{events.KindReboot + "/" + events.OutcomeDeferred})
	time.Sleep(300 * time.Millisecond) // several polls
	if o := f.get(kindReboot, "waits"); finished(o) || prov.calls()["reboot/graceful n-running"] != 0 {
		t.Fatalf("the reboot of a node being drained ended or was sent: %v, calls %v", o.Object["status"], prov.calls())
	}
	n, err := f.kube.CoreV1().Nodes().Get(context.Background(), "n-running", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels[labelDrain] = "succeeded"
	if _, err := f.kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor(kindReboot, "waits", 10*time.Second, "signal sent", func(o *unstructured.Unstructured) bool { return condIs(o, CondSignalSent, "True") })
	if c := prov.calls()["reboot/graceful n-running"]; c != 1 {
		t.Fatalf("reboots of n-running: %d, want 1", c)
	}
}
