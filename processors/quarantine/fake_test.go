package quarantine

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

// fakeKube is client-go's fake clientset keeping resourceVersions as an
// apiserver does: every write gets a new one, and an update or patch that
// carries another than the object's is refused with a conflict (the fake
// alone keeps none, so the breaker's create-or-update and the node watch's
// trust in this replica's writes would not work).
func fakeKube() *fake.Clientset {
	k := fake.NewClientset()
	var (
		mu sync.Mutex // one write at a time: the check and the write together
		rv int
	)
	react := clienttesting.ObjectReaction(k.Tracker())
	k.PrependReactor("*", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		var given string
		switch a := a.(type) {
		case clienttesting.CreateActionImpl:
			mu.Lock()
			defer mu.Unlock()
			rv++
			if m, err := meta.Accessor(a.GetObject()); err == nil && a.GetSubresource() == "" {
				m.SetResourceVersion(strconv.Itoa(rv))
			}
			return react(a)
		case clienttesting.UpdateActionImpl:
			if m, err := meta.Accessor(a.GetObject()); err == nil {
				given = m.GetResourceVersion()
			}
		case clienttesting.PatchActionImpl:
			var p struct {
				Metadata struct {
					ResourceVersion string `json:"resourceVersion"`
				} `json:"metadata"`
			}
			_ = json.Unmarshal(a.GetPatch(), &p)
			given = p.Metadata.ResourceVersion
		default:
			return false, nil, nil
		}
		mu.Lock()
		defer mu.Unlock()
		res := a.GetResource()
		stored, err := k.Tracker().Get(res, a.GetNamespace(), name(a))
		if err != nil {
			return true, nil, err
		}
		if m, err := meta.Accessor(stored); err == nil && given != "" && given != m.GetResourceVersion() {
			return true, nil, apierrors.NewConflict(res.GroupResource(), name(a), errors.New("the object has been modified"))
		}
		_, obj, err := react(a)
		if err != nil {
			return true, nil, err
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			return true, nil, err
		}
		rv++
		m.SetResourceVersion(strconv.Itoa(rv))
		return true, obj, k.Tracker().Update(res, obj, a.GetNamespace())
	})
	return k
}

// name is the name of the object an update or patch writes.
func name(a clienttesting.Action) string {
	switch a := a.(type) {
	case clienttesting.PatchActionImpl:
		return a.GetName()
	case clienttesting.UpdateActionImpl:
		if m, err := meta.Accessor(a.GetObject()); err == nil {
			return m.GetName()
		}
	}
	return ""
}

// fakeHandler returns a handler of cluster c1 over fakeKube, with nodes of
// group created, and the function that moves its clock on.
func fakeHandler(t testing.TB, cfg Config, group string, nodes ...string) (*Handler, *fake.Clientset, func(time.Duration) time.Time) {
	t.Helper()
	k := fakeKube()
	createNodes(t, k, group, nodes...)
	h, advance := clockHandler(t, cfg, k, time.Now())
	return h, k, advance
}

// uncordonSeen uncordons node n of cluster c1 as kubectl does, and waits
// until h's node watch shows it.
//
// The fake clientset's watch, begun after its list, misses what was
// written in between: a watch that started just before the uncordon never
// sees it (TestRepeatsOfAnAcknowledgedFault failed ~1 run in 5). The
// uncordon is written again, as it is, until the watch shows it.
func uncordonSeen(t testing.TB, h *Handler, k kubernetes.Interface, n *corev1.Node) {
	t.Helper()
	cl, _ := h.reg.Get("c1")
	seen := func() bool {
		c, err := h.nodes.Get(cl).Lister.Get(n.Name)
		return err == nil && !c.Spec.Unschedulable
	}
	for try := 0; ; try++ {
		cur := n
		if try > 0 {
			cur = getNode(t, k, n.Name)
		}
		cur.Spec.Unschedulable = false // kubectl uncordon
		if _, err := k.CoreV1().Nodes().Update(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(500 * time.Millisecond)
		for !seen() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if seen() {
			return
		}
		if try == 20 {
			t.Fatalf("the node watch did not see the uncordon of %s", n.Name)
		}
	}
}
