package janitor

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
)

// loseAnswer has the first update of a kind's resource that lost matches
// stored, and answered with an error, as when the connection is cut or
// the answer times out after the apiserver wrote it.
func (f *fakeCluster) loseAnswer(k kind, lost func(*unstructured.Unstructured) bool) {
	var done atomic.Bool
	f.dyn.PrependReactor("update", k.GVR.Resource, func(a clienttesting.Action) (bool, runtime.Object, error) {
		u, ok := a.(clienttesting.UpdateAction).GetObject().(*unstructured.Unstructured)
		if !ok || !lost(u) || !done.CompareAndSwap(false, true) {
			return false, nil, nil
		}
		if err := f.dyn.Tracker().Update(k.GVR, u, ""); err != nil {
			return true, nil, err
		}
		return true, nil, errors.New("http2: client connection lost")
	})
}

// TestRecordStoredAnswerLost: the write of a signal's record (and of a
// forced reboot's) stored by the apiserver though this janitor read an
// error is not taken for a predecessor's record that may have been sent:
// this janitor knows it sent nothing, and sends it, once. Before, it
// wrote SignalSent=True/Recorded "not sent again" and the node was never
// rebooted (NodeReady=False/Timeout after reboot_timeout, escalated); a
// forced reboot was "resumed" and never sent.
func TestRecordStoredAnswerLost(t *testing.T) {
	t.Parallel()
	f := newFakeCluster(t, fakeNode("n-sig", "r1", "boot-n-sig"), fakeNode("n-force", "r2", "boot-n-force"))
	f.loseAnswer(kindReboot, func(u *unstructured.Unstructured) bool {
		st := stateOf(u)
		return st != nil && u.GetName() == "sig"
	})
	// Signalled 15 minutes ago (force_after is 10m), still Ready with its
	// old boot ID: forced, its ForcedAt's write answered an error.
	f.loseAnswer(kindReboot, func(u *unstructured.Unstructured) bool {
		st := stateOf(u)
		return st != nil && !st.ForcedAt.IsZero() && u.GetName() == "force"
	})
	f.create(kindReboot, "force", "n-force", &opState{Step: "signal", At: time.Now().UTC().Add(-15 * time.Minute), BootID: "boot-n-force", Provider: ProviderRedfish, By: "janitor"},
		cond{CondSignalSent, "True", ReasonSucceeded, "signal sent via redfish"}, cond{CondNodeReady, "Unknown", ReasonInitializing, "waiting"})
	prov := &tally{}
	j, rec := f.janitor(fakeConfig(), false, prov)
	f.run(j)
	f.create(kindReboot, "sig", "n-sig", nil)

	o := f.waitFor(kindReboot, "sig", 5*time.Second, "SignalSent=True", func(o *unstructured.Unstructured) bool {
		return condOf(o, CondSignalSent) != "none"
	})
	if got := condOf(o, CondSignalSent); got != "True/"+ReasonSucceeded {
		t.Errorf("SignalSent %s, want True/%s (sent by this janitor, which knew it had not)", got, ReasonSucceeded)
	}
	for deadline := time.Now().Add(5 * time.Second); prov.calls()["reboot/force n-force"] == 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(10 * fakeConfig().PollInterval) // a second signal would land meanwhile
	calls := prov.calls()
	if calls["reboot/graceful n-sig"] != 1 || calls["reboot/force n-force"] != 1 || len(calls) != 2 {
		t.Fatalf("signals %v, want the reboot of n-sig and the forced reboot of n-force, once each", calls)
	}
	rec.expect(t, "n-sig", []string{"reboot/applied"})
	rec.expect(t, "n-force", []string{"reboot/applied"})
}
