package remediate

import (
	"io"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestResourceCacheFailsOnEOF: a watch whose lists fail with EOF (a load
// balancer closing each connection, no apiserver behind it) is not
// trusted: items reads live. client-go hands the watch error handler
// failed lists and watch starts only, so an EOF there is a failure (no
// server: client-go's fake dynamic client).
func TestResourceCacheFailsOnEOF(t *testing.T) {
	gvr := schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "things"}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "ThingList"})
	var (
		down atomic.Bool
		mu   sync.Mutex
		open []*watch.RaceFreeFakeWatcher
	)
	eof := &url.Error{Op: "Get", URL: "https://lb/apis/example.com/v1/things", Err: io.EOF}
	dyn.PrependReactor("list", gvr.Resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			return true, nil, eof
		}
		return false, nil, nil
	})
	dyn.PrependWatchReactor(gvr.Resource, func(k8stesting.Action) (bool, watch.Interface, error) {
		if down.Load() {
			return true, nil, eof
		}
		w := watch.NewRaceFreeFake()
		mu.Lock()
		open = append(open, w)
		mu.Unlock()
		return true, w, nil
	})
	c := newResourceCaches(testLog)
	defer c.close()
	g := nodeGroup{watchKey: watchKey{cluster: "c", gvr: gvr}, node: "n1", group: "g"}
	wait := func(want bool, what string) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, ok := c.items(dyn, g); ok == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	wait(true, "the watch to sync")
	down.Store(true)
	mu.Lock()
	for _, w := range open {
		w.Stop()
	}
	mu.Unlock()
	wait(false, "a watch whose lists fail with EOF to be read live")
}
