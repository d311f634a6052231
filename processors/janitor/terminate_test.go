package janitor

import (
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
