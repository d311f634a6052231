package clusters

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
)

func TestRecentWrites(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		wrote string // the rv the write produced; "-": no write
		copy  string // the watch's copy's rv
		after time.Duration
		want  bool
	}{
		{"never written", "-", "5", 0, true},
		{"the copy holds the write", "7", "7", time.Second, true},
		{"the copy is older than the write", "7", "5", time.Second, false},
		{"the write in flight or failed", "", "5", time.Second, false},
		{"the copy older, the write no longer recent", "7", "5", RecentWrite, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r recentWrites
			if tc.wrote != "-" {
				r.wrote("c/n", t0, tc.wrote)
			}
			if got := r.trusted("c/n", tc.copy, t0.Add(tc.after)); got != tc.want {
				t.Fatalf("trusted = %v, want %v", got, tc.want)
			}
			if !r.trusted("c/other", tc.copy, t0) {
				t.Fatal("another key is not trusted")
			}
		})
	}
	// Old writes are pruned.
	var r recentWrites
	r.wrote("c/a", t0, "1")
	r.wrote("c/b", t0.Add(2*RecentWrite), "2")
	if _, ok := r.writes["c/a"]; ok || len(r.writes) != 1 {
		t.Fatalf("writes after the prune: %v", r.writes)
	}
}

func TestNodeWatches(t *testing.T) {
	k := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: "5", Labels: map[string]string{"a": "1", "b": "2"}}})
	reg := NewRegistry(DefaultConfig(), nil)
	cl := reg.SetClient("c", k, false)
	keepA := func(o any) (any, error) {
		n := o.(*corev1.Node)
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, ResourceVersion: n.ResourceVersion, Labels: map[string]string{"a": n.Labels["a"]}}}, nil
	}
	updates := make(chan string, 10)
	w := NewNodeWatches(slog.New(slog.DiscardHandler), keepA, func(cluster string, _, n *corev1.Node) { updates <- cluster + "/" + n.Name })
	defer w.Close()

	if w.Get(nil) != nil || w.Get(&Client{Name: "none"}) != nil {
		t.Fatal("a watch of a cluster without a client")
	}
	deadline := time.Now().Add(10 * time.Second)
	for w.Synced(cl) == nil {
		if time.Now().After(deadline) {
			t.Fatal("the watch did not sync")
		}
		time.Sleep(10 * time.Millisecond)
	}
	now := time.Now()
	n, ok := w.Cached(cl, "n1", now)
	if !ok || n.Labels["a"] != "1" || n.Labels["b"] != "" {
		t.Fatalf("Cached = %v %v, want the transformed copy", n, ok)
	}
	if _, ok := w.Cached(cl, "missing", now); ok {
		t.Fatal("a node the watch does not hold is cached")
	}
	w.Wrote("c", "n1", now, "")
	if _, ok := w.Cached(cl, "n1", now); ok {
		t.Fatal("the copy is used while this replica's write is in flight")
	}
	if l, ok := w.List(cl, labels.SelectorFromSet(labels.Set{"a": "1"})); !ok || len(l) != 1 {
		t.Fatalf("List = %v %v", l, ok)
	}
	if got := w.Names(); len(got) != 1 || got[0] != "c" {
		t.Fatalf("Names = %v", got)
	}

	up := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: "6", Labels: map[string]string{"a": "2"}}}
	if _, err := k.CoreV1().Nodes().Update(context.Background(), up, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-updates:
		if got != "c/n1" {
			t.Fatalf("update told as %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the update was not told")
	}

	w.Close()
	w.Close() // twice: no panic
	select {
	case <-w.Done():
	default:
		t.Fatal("Done is not closed after Close")
	}
	if w.Get(reg.SetClient("d", k, false)) != nil {
		t.Fatal("a watch started after Close")
	}
}

// A watch whose lists are refused is behind until it lists again: its
// copies may miss another writer's changes meanwhile.
func TestNodeWatchBehind(t *testing.T) {
	k := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	var (
		down    atomic.Bool
		lists   atomic.Int64
		refused atomic.Int32
		mu      sync.Mutex
		open    []*watch.RaceFreeFakeWatcher
	)
	list := clienttesting.ObjectReaction(k.Tracker())
	k.PrependReactor("list", "nodes", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			refused.Add(1)
			return true, nil, errors.New("apiserver unreachable")
		}
		_, obj, err := list(a)
		if err == nil {
			m, _ := meta.ListAccessor(obj)
			m.SetResourceVersion(strconv.FormatInt(lists.Add(1), 10)) // each list sees a newer cluster
		}
		return true, obj, err
	})
	k.PrependWatchReactor("nodes", func(clienttesting.Action) (bool, watch.Interface, error) {
		if down.Load() {
			refused.Add(1)
			return true, nil, errors.New("apiserver unreachable")
		}
		w := watch.NewRaceFreeFake()
		mu.Lock()
		open = append(open, w)
		mu.Unlock()
		return true, w, nil
	})
	cl := NewRegistry(DefaultConfig(), nil).SetClient("c", k, false)
	w := NewNodeWatches(slog.New(slog.DiscardHandler), nil, nil)
	defer w.Close()
	wait := func(cond func() bool, what string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	wait(func() bool { return w.Synced(cl) != nil }, "the watch to sync")
	if w.Behind(cl) || w.Behind(&Client{Name: "none"}) {
		t.Fatal("a watch that never failed is behind")
	}
	down.Store(true)
	mu.Lock()
	for _, fw := range open {
		fw.Stop()
	}
	mu.Unlock()
	wait(func() bool { return refused.Load() >= 2 }, "the watch refused twice")
	if !w.Behind(cl) {
		t.Fatal("a watch whose lists are refused is not behind")
	}
	if _, ok := w.Cached(cl, "n1", time.Now()); !ok {
		t.Fatal("Cached changed: it tells this replica's own writes only")
	}
	down.Store(false)
	wait(func() bool { return !w.Behind(cl) }, "the watch to list again")
}

// A watch whose lists fail with EOF — a load balancer that accepts each
// connection and closes it, no apiserver behind it (a control-plane
// upgrade) — is behind: client-go hands the watch error handler failed
// lists and watch starts only (a watch that closes normally never reaches
// it), so EOF there is a failure like any other.
func TestNodeWatchBehindOnEOF(t *testing.T) {
	var down atomic.Bool
	cut := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			if c, _, err := w.(http.Hijacker).Hijack(); err == nil {
				c.Close()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") == "true" {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
			case <-cut:
			}
			return
		}
		fmt.Fprint(w, `{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"n1","resourceVersion":"1"}}]}`)
	}))
	defer srv.Close()
	k, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	cl := NewRegistry(DefaultConfig(), nil).SetClient("c", k, false)
	w := NewNodeWatches(slog.New(slog.DiscardHandler), nil, nil)
	defer w.Close()
	wait := func(cond func() bool, what string) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	wait(func() bool { return w.Synced(cl) != nil }, "the watch to sync")
	if w.Behind(cl) {
		t.Fatal("a watch that never failed is behind")
	}
	down.Store(true)
	close(cut)
	wait(func() bool { return w.Behind(cl) }, "the watch whose lists fail with EOF to be behind")
}
