package janitor

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clienttesting "k8s.io/client-go/testing"
)

// TestTerminateNodeDeleteRefused: a terminate whose Node the apiserver
// refuses to delete (RBAC, an admission webhook) ends at terminate_timeout,
// NodeTerminated=False/Timeout naming the refusal, and gives its slot
// back. Before, the refused delete was retried with backoff for ever,
// ahead of the timeout, the resource holding its slot.
func TestTerminateNodeDeleteRefused(t *testing.T) {
	t.Parallel()
	f := newFakeCluster(t, fakeNode("n-term", "r1", "boot-n-term"))
	f.kube.PrependReactor("delete", "nodes", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "n-term", nil)
	})
	cfg := fakeConfig()
	cfg.TerminateTimeout = time.Second
	prov := &tally{}
	j, rec := f.janitor(cfg, false, prov)
	f.run(j)
	f.create(kindTerminate, "term", "n-term", nil)

	o := f.waitFor(kindTerminate, "term", 10*time.Second, "finished", finished)
	if got := condOf(o, CondNodeTerminated); got != "False/"+ReasonTimeout {
		t.Errorf("NodeTerminated %s, want False/%s", got, ReasonTimeout)
	}
	if msg, _ := condition(o, CondNodeTerminated)["message"].(string); !strings.Contains(msg, "forbidden") {
		t.Errorf("the message does not name the refusal: %q", msg)
	}
	if n := prov.calls()["terminate n-term"]; n != 1 {
		t.Errorf("%d terminates sent, want 1", n)
	}
	rec.expect(t, "n-term", []string{"terminate/applied", "terminate/failed"})
	for deadline := time.Now().Add(2 * time.Second); j.lim.inProgress(cluster) != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the terminate ended, its slot still held")
		}
	}
}

// TestTerminateSparesANewNodeOfTheName: a terminate whose Node was
// replaced, before the follow step, by a new one of the same name (a
// recycled name: ip-… of a private IP given again) is done, the new Node
// not deleted; the signalled Node (its UID recorded) is deleted, and so,
// by name, is the Node of a record written before the UID was kept.
// Before, the new Node was deleted.
func TestTerminateSparesANewNodeOfTheName(t *testing.T) {
	t.Parallel()
	f := newFakeCluster(t, fakeNode("n-new", "r1", "boot-n-new"), fakeNode("n-same", "r2", "boot-n-same"), fakeNode("n-old", "r3", "boot-n-old"))
	recorded := func(node, uid string) *opState {
		return &opState{Step: "signal", At: time.Now().UTC().Add(-time.Minute), BootID: "boot-" + node, NodeUID: uid, Provider: ProviderRedfish, By: "janitor"}
	}
	sent := cond{CondSignalSent, "True", ReasonSucceeded, "signal sent via redfish"}
	waiting := cond{CondNodeTerminated, "Unknown", ReasonInitializing, "waiting"}
	f.create(kindTerminate, "new", "n-new", recorded("n-new", "uid-the-terminated-one"), sent, waiting)
	f.create(kindTerminate, "same", "n-same", recorded("n-same", "uid-n-same"), sent, waiting)
	f.create(kindTerminate, "old", "n-old", recorded("n-old", ""), sent, waiting)
	prov := &tally{}
	j, _ := f.janitor(fakeConfig(), false, prov)
	f.run(j)
	for _, name := range []string{"new", "same", "old"} {
		if o := f.waitFor(kindTerminate, name, 5*time.Second, "finished", finished); condOf(o, CondNodeTerminated) != "True/"+ReasonSucceeded {
			t.Errorf("%s: NodeTerminated %s, want True/%s", name, condOf(o, CondNodeTerminated), ReasonSucceeded)
		}
	}
	for node, want := range map[string]bool{"n-new": true, "n-same": false, "n-old": false} {
		_, err := f.kube.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if exists := err == nil; exists != want {
			t.Errorf("node %s exists: %v, want %v (%v)", node, exists, want, err)
		}
	}
}
