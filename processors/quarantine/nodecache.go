package quarantine

import (
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/faultline/faultline/processors/clusters"
)

// recentWrite is how long after this replica wrote a node's state the
// cache is not trusted for that node (the watch may not have delivered the
// write yet).
const recentWrite = clusters.RecentWrite

// nodeCaches watch each live cluster's nodes so that a healthy event for a
// node with no standing fault — by far the most common event — is decided
// without an API request, and so that a person uncordoning a node faultline
// cordoned is noticed as it happens, and so that a fault is written as a
// patch of the watch's copy, without a GET first. Only what quarantine reads
// and writes is kept (metadata, cordon, taints, faultline's conditions).
//
// The cache can lag a write by the watch's latency. A write this replica
// made is covered by remembering the resourceVersion it produced for
// recentWrite (the copy is trusted again once it has it); a write by another
// replica lags only around a partition rebalance, which takes longer than
// the watch. Anything the cache says is standing is re-read live.
type nodeCaches struct {
	stop chan struct{}
	log  *slog.Logger
	// uncordoned is told of a node faultline cordoned that became
	// schedulable (a person uncordoned it); nil: nobody.
	uncordoned func(cluster, node string)

	mu     sync.Mutex
	closed bool
	byName map[string]*nodeCache
	// written: this replica's writes, by cluster/node.
	written clusters.RecentWrites
}

type nodeCache struct {
	lister corelisters.NodeLister
	synced func() bool
}

func newNodeCaches(log *slog.Logger, uncordoned func(cluster, node string)) *nodeCaches {
	return &nodeCaches{stop: make(chan struct{}), log: log, uncordoned: uncordoned, byName: map[string]*nodeCache{}}
}

// get returns the cluster's cache, starting its watch on first use.
func (c *nodeCaches) get(cl *clusters.Client) *nodeCache {
	c.mu.Lock()
	defer c.mu.Unlock()
	if nc, ok := c.byName[cl.Name]; ok || c.closed {
		return nc
	}
	f := informers.NewSharedInformerFactory(cl.WatchKube, 0)
	inf := f.Core().V1().Nodes()
	_ = inf.Informer().SetWatchErrorHandler(clusters.WatchErrorLogger(c.log.With("cluster", cl.Name), "nodes"))
	_ = inf.Informer().SetTransform(watchCopy)
	if c.uncordoned != nil {
		name := cl.Name
		_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Node)
			n, ok2 := newObj.(*corev1.Node)
			if !ok1 || !ok2 || !o.Spec.Unschedulable || n.Spec.Unschedulable {
				return
			}
			if st, err := ReadState(n); err == nil && st.Cordoned {
				c.uncordoned(name, n.Name)
			}
		}})
	}
	nc := &nodeCache{lister: inf.Lister(), synced: inf.Informer().HasSynced}
	f.Start(c.stop)
	c.byName[cl.Name] = nc
	return nc
}

// watchCopy is what the node watch keeps of a node: name, UID,
// resourceVersion, creationTimestamp, labels and annotations (interned), unschedulable,
// taints, faultline's conditions and the machine's system UUID (a fault of
// another machine is not acted on: otherMachine).
func watchCopy(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	var conds []corev1.NodeCondition
	for _, c := range n.Status.Conditions {
		if strings.HasPrefix(c.Message, conditionPrefix) {
			conds = append(conds, c)
		}
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, CreationTimestamp: n.CreationTimestamp, Labels: clusters.Interned(n.Labels), Annotations: clusters.Interned(n.Annotations),
	}, Spec: corev1.NodeSpec{Unschedulable: n.Spec.Unschedulable, Taints: n.Spec.Taints},
		Status: corev1.NodeStatus{Conditions: conds, NodeInfo: corev1.NodeSystemInfo{SystemUUID: n.Status.NodeInfo.SystemUUID}}}, nil
}

// cached returns the watch's copy of the node (name, UID, labels,
// annotations, taints, unschedulable, the conditions faultline set, its
// machine's system UUID: all that quarantine reads and writes) when the
// watch has synced and this replica has not written the node recently;
// false: read it live. The copy is shared with the cache: never modify it.
func (c *nodeCaches) cached(cl *clusters.Client, node string, now time.Time) (*corev1.Node, bool) {
	if cl == nil || cl.WatchKube == nil {
		return nil, false
	}
	nc := c.get(cl)
	if nc == nil || !nc.synced() {
		return nil, false
	}
	n, err := nc.lister.Get(node)
	if err != nil {
		return nil, false
	}
	if !c.written.Trusted(cl.Name+"/"+node, n.ResourceVersion, now) {
		return nil, false // the watch has not delivered this replica's write yet
	}
	return n, true
}

// lister returns a list of the cluster's watched nodes that a selector
// matches (false until the watch has synced). The copies are the cache's:
// never modify them.
func (c *nodeCaches) lister(cl *clusters.Client) func(labels.Selector) ([]*corev1.Node, bool) {
	return func(sel labels.Selector) ([]*corev1.Node, bool) {
		nc := c.get(cl)
		if nc == nil || !nc.synced() {
			return nil, false
		}
		l, err := nc.lister.List(sel)
		return l, err == nil
	}
}

// wrote remembers that this replica changes a node (rv "": the write is in
// flight) or changed it (rv: the resourceVersion the write produced; the
// cache is trusted again once its copy has it).
func (c *nodeCaches) wrote(cluster, node string, now time.Time, rv string) {
	c.written.Wrote(cluster+"/"+node, now, rv)
}

// names returns the clusters whose nodes are watched.
func (c *nodeCaches) names() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	names := make([]string, 0, len(c.byName))
	for name := range c.byName {
		names = append(names, name)
	}
	return names
}

// close stops every watch.
func (c *nodeCaches) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		close(c.stop)
	}
}
