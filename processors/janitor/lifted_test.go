package janitor

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"github.com/faultline/faultline/schemas/events"
)

// machineOn is a tally whose machines are all on (PowerOnIfOff: ErrNotOff).
type machineOn struct{ tally }

func (p *machineOn) PowerOnIfOff(_ context.Context, t Target) error {
	_ = p.add("power-on", t)
	return ErrNotOff
}

// lift removes the quarantine's mark from node, as the quarantine role
// does once the fault recovered.
func (f *fakeCluster) lift(node string) {
	f.t.Helper()
	n, err := f.kube.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	delete(n.Labels, events.LabelQuarantined)
	if _, err := f.kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// TestLiftedMidRebootNotForced: a reboot whose node the quarantine role
// lifted while the machine ignored the graceful signal (still Ready with
// its old boot ID past force_after), or while its shutdown hung (down past
// hung_after, its machine on), is not forced: it ends
// NodeReady=False/NotDrained, a refused action, nothing sent — whether
// its signal was confirmed or resumed (Recorded), and for a forced reboot
// recorded but not sent (its record's answer lost) whose node was lifted
// meanwhile. spec.force, or a node still drained, is forced as before.
// Before, a node released back to its workloads got a ForceRestart.
func TestLiftedMidRebootNotForced(t *testing.T) {
	t.Parallel()
	hung := fakeNode("n-hung", "r3", "boot-n-hung")
	hung.Status.Conditions[0].Status = corev1.ConditionFalse
	hung.Status.Conditions[0].LastTransitionTime = metav1.NewTime(time.Now().Add(-16 * time.Minute))
	var nodes []*corev1.Node
	for i, name := range []string{"n-up", "n-rec", "n-unsent", "n-drained", "n-forced"} {
		nodes = append(nodes, fakeNode(name, "r"+string(rune('a'+i)), "boot-"+name))
	}
	f := newFakeCluster(t, append(nodes, hung)...)
	for _, n := range []string{"n-up", "n-rec", "n-hung", "n-forced"} {
		f.lift(n)
	}
	// n-unsent is lifted between its forced reboot's record (stored, its
	// answer lost) and the send this janitor then owes it; the error
	// comes once the watch has the record (else the retry, reading the
	// resource without it, would take the force_after path again).
	var lost atomic.Bool
	f.dyn.PrependReactor("update", kindReboot.GVR.Resource, func(a clienttesting.Action) (bool, runtime.Object, error) {
		u, ok := a.(clienttesting.UpdateAction).GetObject().(*unstructured.Unstructured)
		if st := stateOf(u); !ok || st == nil || st.ForcedAt.IsZero() || u.GetName() != "unsent" || !lost.CompareAndSwap(false, true) {
			return false, nil, nil
		}
		if err := f.dyn.Tracker().Update(kindReboot.GVR, u, ""); err != nil {
			return true, nil, err
		}
		f.lift("n-unsent")
		time.Sleep(300 * time.Millisecond)
		return true, nil, errors.New("http2: client connection lost")
	})
	now := time.Now().UTC()
	recorded := func(node string, ago time.Duration) *opState {
		return &opState{Step: "signal", At: now.Add(-ago), BootID: "boot-" + node, Provider: ProviderRedfish, By: "janitor"}
	}
	waiting := cond{CondNodeReady, "Unknown", ReasonInitializing, "waiting"}
	sent := cond{CondSignalSent, "True", ReasonSucceeded, "signal sent via redfish"}
	f.create(kindReboot, "up", "n-up", recorded("n-up", 11*time.Minute), sent, waiting)
	f.create(kindReboot, "rec", "n-rec", recorded("n-rec", 11*time.Minute), cond{CondSignalSent, "True", ReasonRecorded, "resumed"}, waiting)
	f.create(kindReboot, "hung", "n-hung", recorded("n-hung", 16*time.Minute), sent, waiting)
	f.create(kindReboot, "unsent", "n-unsent", recorded("n-unsent", 11*time.Minute), sent, waiting)
	f.create(kindReboot, "drained", "n-drained", recorded("n-drained", 11*time.Minute), sent, waiting)
	f.create(kindReboot, "forced", "n-forced", recorded("n-forced", 11*time.Minute), sent, waiting)
	o := f.get(kindReboot, "forced")
	o.Object["spec"].(map[string]any)["force"] = true
	if _, err := f.dyn.Resource(kindReboot.GVR).Update(context.Background(), o, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	prov := &machineOn{}
	j, rec := f.janitor(fakeConfig(), false, prov)
	f.run(j)
	for _, name := range []string{"up", "rec", "hung", "unsent"} {
		o := f.waitFor(kindReboot, name, 5*time.Second, "ended", finished)
		if got := condOf(o, CondNodeReady); got != "False/"+ReasonNotDrained {
			t.Errorf("%s: NodeReady %s, want False/%s (lifted mid-reboot: not forced)", name, got, ReasonNotDrained)
		}
		rec.expect(t, "n-"+name, []string{"reboot/" + events.OutcomeRefused})
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c := prov.calls(); c["reboot/force n-drained"] > 0 && c["reboot/force n-forced"] > 0 {
			break
		}
	}
	time.Sleep(10 * fakeConfig().PollInterval) // a forced reboot it must not send lands meanwhile
	calls := prov.calls()
	for _, n := range []string{"n-up", "n-rec", "n-hung", "n-unsent"} {
		if calls["reboot/force "+n] != 0 {
			t.Errorf("%s, lifted mid-reboot, was forced: %v", n, calls)
		}
	}
	if calls["reboot/force n-drained"] != 1 || calls["reboot/force n-forced"] != 1 {
		t.Errorf("a drained node's reboot, and one with spec.force, are forced once each: %v", calls)
	}
}
