package drain

import (
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
)

// nodeWatch watches each cluster's nodes, keeping what a step reads (the
// drain state, faultline's labels, the creation time), so that a step
// reads its node without a request: a drain's next look after its own
// write, a repeated fault its finished drain already covers.
//
// The copy can lag by the watch's latency. This replica's own write is
// covered by remembering the resourceVersion it produced (for
// clusters.RecentWrite the copy is used only once it has it); a write the
// step makes from a copy another writer has changed since is refused
// (every write carries the resourceVersion read) and the redo reads the
// node live; and a copy that says the node is not quarantined (the
// quarantine role's write may not have arrived) is read again live
// (stepOnce).
type nodeWatch struct {
	stop chan struct{}
	log  *slog.Logger

	mu     sync.Mutex
	closed bool
	byName map[string]*watchedNodes
	// written: this replica's writes, by cluster/node.
	written clusters.RecentWrites
}

type watchedNodes struct {
	lister corelisters.NodeLister
	synced func() bool
}

func newNodeWatch(log *slog.Logger) *nodeWatch {
	return &nodeWatch{stop: make(chan struct{}), log: log, byName: map[string]*watchedNodes{}}
}

// watched returns the cluster's watch, starting it on first use (nil once
// closed).
func (w *nodeWatch) watched(cl *clusters.Client) *watchedNodes {
	w.mu.Lock()
	defer w.mu.Unlock()
	if wn, ok := w.byName[cl.Name]; ok || w.closed {
		return wn
	}
	f := informers.NewSharedInformerFactory(cl.WatchKube, 0)
	inf := f.Core().V1().Nodes()
	_ = inf.Informer().SetWatchErrorHandler(clusters.WatchErrorLogger(w.log.With("cluster", cl.Name), "nodes"))
	_ = inf.Informer().SetTransform(drainCopy)
	wn := &watchedNodes{lister: inf.Lister(), synced: inf.Informer().HasSynced}
	f.Start(w.stop)
	w.byName[cl.Name] = wn
	return wn
}

// drainCopy is what the watch keeps of a node: name, UID,
// resourceVersion, creation time, faultline's quarantine and drain labels
// and the drain state annotation.
func drainCopy(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	keep := func(m map[string]string, keys ...string) map[string]string {
		var out map[string]string
		for _, k := range keys {
			if v, ok := m[k]; ok {
				if out == nil {
					out = map[string]string{}
				}
				out[k] = v
			}
		}
		return out
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, CreationTimestamp: n.CreationTimestamp,
		Labels:      clusters.Interned(keep(n.Labels, events.LabelQuarantined, LabelDrain)),
		Annotations: keep(n.Annotations, AnnotationState),
	}}, nil
}

// cached returns the watch's copy of the node when the watch has synced
// and holds this replica's last write of it (or made none within
// clusters.RecentWrite); false: read it live. The copy is the watch's:
// never modify it.
func (w *nodeWatch) cached(cl *clusters.Client, node string, now time.Time) (*corev1.Node, bool) {
	if cl == nil || cl.WatchKube == nil {
		return nil, false
	}
	wn := w.watched(cl)
	if wn == nil || !wn.synced() {
		return nil, false
	}
	n, err := wn.lister.Get(node)
	if err != nil {
		return nil, false
	}
	if !w.written.Trusted(cl.Name+"/"+node, n.ResourceVersion, now) {
		return nil, false
	}
	return n, true
}

// wrote remembers this replica's write of a node: rv is the
// resourceVersion it produced, "" when it failed (read the node live).
func (w *nodeWatch) wrote(cluster, node string, now time.Time, rv string) {
	w.written.Wrote(cluster+"/"+node, now, rv)
}

// close stops every watch.
func (w *nodeWatch) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		close(w.stop)
	}
}
