package clusters

import (
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// RecentWrite is how long after this replica wrote an object a watch's
// copy of it is used only once it holds that write.
const RecentWrite = 10 * time.Second

// NodeWatches watch each cluster's nodes, one watch per cluster started on
// first use, keeping of each node what the role's transform returns, so
// that a role reads a node without a request.
//
// A copy can lag the apiserver by the watch's latency. This replica's own
// writes are covered by remembering the resourceVersion each produced: for
// RecentWrite a node's copy is used only once it holds this replica's last
// write (Cached). A write by another writer is the role's to cover (every
// write carries the resourceVersion it was decided on, so a stale copy
// costs a conflict, never a wrong write).
type NodeWatches struct {
	log       *slog.Logger
	transform cache.TransformFunc
	updated   func(cluster string, old, updated *corev1.Node)

	stop    chan struct{}
	mu      sync.Mutex
	closed  bool
	byName  map[string]*NodeWatch
	written recentWrites
}

// NodeWatch is one cluster's node watch. Its copies are shared: never
// modify them.
type NodeWatch struct {
	Lister corelisters.NodeLister
	Synced func() bool

	// progress is the resourceVersion the watch last listed or received
	// (nil: not known); failedAt, what it was when a list or watch last
	// failed ("" when none failed, or something came since). Under mu.
	progress func() string
	mu       sync.Mutex
	failedAt string
	failed   bool
}

// fail notes a failed list or watch, the watch at resourceVersion rv.
func (nw *NodeWatch) fail(rv string) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.failed, nw.failedAt = true, rv
}

// behind reports whether the watch failed and has listed or received
// nothing since.
func (nw *NodeWatch) behind() bool {
	if nw.progress == nil {
		return false
	}
	nw.mu.Lock()
	defer nw.mu.Unlock()
	if nw.failed && nw.progress() != nw.failedAt {
		nw.failed = false
	}
	return nw.failed
}

// NewNodeWatches returns the watches of a role: transform reduces each
// node to what the role keeps; updated, when not nil, is told of every
// update the watch delivers.
func NewNodeWatches(log *slog.Logger, transform cache.TransformFunc, updated func(cluster string, old, updated *corev1.Node)) *NodeWatches {
	return &NodeWatches{log: log, transform: transform, updated: updated, stop: make(chan struct{}), byName: map[string]*NodeWatch{}}
}

// Get returns the cluster's watch, starting it on first use; nil once
// closed or when the cluster has no client to watch with.
func (w *NodeWatches) Get(cl *Client) *NodeWatch {
	if cl == nil || cl.WatchKube == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if nw, ok := w.byName[cl.Name]; ok || w.closed {
		return nw
	}
	f := informers.NewSharedInformerFactory(cl.WatchKube, 0)
	inf := f.Core().V1().Nodes().Informer()
	nw := &NodeWatch{Lister: f.Core().V1().Nodes().Lister(), Synced: inf.HasSynced, progress: inf.LastSyncResourceVersion}
	logErr := WatchErrorLogger(w.log.With("cluster", cl.Name), "nodes")
	_ = inf.SetWatchErrorHandler(func(r *cache.Reflector, err error) {
		logErr(r, err)
		if !WatchStopped(err) {
			nw.fail(r.LastSyncResourceVersion())
		}
	})
	_ = inf.SetTransform(w.transform)
	if w.updated != nil {
		name := cl.Name
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Node)
			n, ok2 := newObj.(*corev1.Node)
			if ok1 && ok2 {
				w.updated(name, o, n)
			}
		}})
	}
	f.Start(w.stop)
	w.byName[cl.Name] = nw
	return nw
}

// Synced returns the cluster's watch once it has listed the nodes; nil
// before (or when it cannot watch).
func (w *NodeWatches) Synced(cl *Client) *NodeWatch {
	if nw := w.Get(cl); nw != nil && nw.Synced() {
		return nw
	}
	return nil
}

// Cached returns the watch's copy of the node when the watch has synced
// and holds this replica's last write of it (or it made none within
// RecentWrite); false: read it live.
func (w *NodeWatches) Cached(cl *Client, node string, now time.Time) (*corev1.Node, bool) {
	nw := w.Synced(cl)
	if nw == nil {
		return nil, false
	}
	n, err := nw.Lister.Get(node)
	if err != nil || !w.written.trusted(cl.Name+"/"+node, n.ResourceVersion, now) {
		return nil, false
	}
	return n, true
}

// Behind reports whether the cluster's watch failed (a list or a watch
// refused: the informer in backoff) and has listed or received nothing
// since: its copies may lag another writer's by as long as that lasts.
// Cached does not tell (it guards against this replica's own writes
// only); a role that decides from a copy without writing — so without a
// resourceVersion conflict to correct it — reads live meanwhile. Not told:
// the second or so between a watch cut off and its list again, and a
// watch client-go restarts without a list (right after one, or after a
// 429 or an internal error) that is refused as connection refused or
// 429: client-go retries those itself and reports nothing.
func (w *NodeWatches) Behind(cl *Client) bool {
	nw := w.Synced(cl)
	return nw != nil && nw.behind()
}

// List returns the cluster's watched nodes that sel matches; false until
// the watch has synced.
func (w *NodeWatches) List(cl *Client, sel labels.Selector) ([]*corev1.Node, bool) {
	nw := w.Synced(cl)
	if nw == nil {
		return nil, false
	}
	l, err := nw.Lister.List(sel)
	return l, err == nil
}

// Wrote notes this replica's write of a node at now: rv is the
// resourceVersion it produced, "" while it is in flight or when it failed
// (the copy is not used for RecentWrite: read the node live).
func (w *NodeWatches) Wrote(cluster, node string, now time.Time, rv string) {
	w.written.wrote(cluster+"/"+node, now, rv)
}

// Names returns the clusters whose nodes are watched.
func (w *NodeWatches) Names() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	names := make([]string, 0, len(w.byName))
	for name := range w.byName {
		names = append(names, name)
	}
	return names
}

// Replace puts lister in place of the cluster's watch (synced): a test's
// copy that lags the apiserver.
func (w *NodeWatches) Replace(cluster string, lister corelisters.NodeLister) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.byName[cluster] = &NodeWatch{Lister: lister, Synced: func() bool { return true }}
}

// Done is closed by Close: the role's other watches end with its node
// watches.
func (w *NodeWatches) Done() <-chan struct{} { return w.stop }

// Close stops every watch.
func (w *NodeWatches) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		close(w.stop)
	}
}

// recentWrites remembers this replica's writes of watched objects (by key,
// e.g. cluster/node) and the resourceVersion each produced: a watch may not
// have delivered a write yet, so for RecentWrite its copy is trusted only
// once it has that resourceVersion. The zero value is ready to use.
type recentWrites struct {
	mu     sync.Mutex
	writes map[string]recentWrite
	pruned time.Time
}

type recentWrite struct {
	at time.Time
	rv string
}

// wrote notes a write of key at now: rv is the resourceVersion it
// produced, "" while it is in flight or when it failed (the copy is not
// trusted for RecentWrite).
func (r *recentWrites) wrote(key string, now time.Time, rv string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.writes == nil {
		r.writes = map[string]recentWrite{}
	}
	r.writes[key] = recentWrite{at: now, rv: rv}
	if now.Sub(r.pruned) > RecentWrite {
		for k, w := range r.writes {
			if now.Sub(w.at) >= RecentWrite {
				delete(r.writes, k)
			}
		}
		r.pruned = now
	}
}

// trusted reports whether a watch's copy of key at resourceVersion rv may
// be used at now: this replica made no write of it within RecentWrite, or
// the copy holds the last one.
func (r *recentWrites) trusted(key, rv string, now time.Time) bool {
	r.mu.Lock()
	w, ok := r.writes[key]
	r.mu.Unlock()
	return !ok || now.Sub(w.at) >= RecentWrite || (w.rv != "" && w.rv == rv)
}
