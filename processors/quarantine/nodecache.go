package quarantine

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/faultline/faultline/processors/clusters"
)

// recentWrite is how long after this replica wrote a node's state the
// cache is not trusted for that node (the watch may not have delivered the
// write yet).
const recentWrite = 10 * time.Second

// nodeCaches watch each live cluster's nodes so that a healthy event for a
// node with no standing fault — by far the most common event — is decided
// without an API request, and so that a person uncordoning a node faultline
// cordoned is noticed as it happens. Only the metadata faultline reads (and
// spec.unschedulable) is kept.
//
// The cache can lag a write by the watch's latency. A write this replica
// made is covered by remembering it for recentWrite; a write by another
// replica lags only around a partition rebalance, which takes longer than
// the watch. Anything the cache says is standing is re-read live.
type nodeCaches struct {
	stop chan struct{}
	// uncordoned is told of a node faultline cordoned that became
	// schedulable (a person uncordoned it); nil: nobody.
	uncordoned func(cluster, node string)

	mu        sync.Mutex
	closed    bool
	byName    map[string]*nodeCache
	written   map[string]time.Time // cluster/node -> last write by this replica
	lastPrune time.Time
}

type nodeCache struct {
	lister corelisters.NodeLister
	synced func() bool
}

func newNodeCaches(uncordoned func(cluster, node string)) *nodeCaches {
	return &nodeCaches{stop: make(chan struct{}), uncordoned: uncordoned, byName: map[string]*nodeCache{}, written: map[string]time.Time{}}
}

// get returns the cluster's cache, starting its watch on first use.
func (c *nodeCaches) get(cl *clusters.Client) *nodeCache {
	c.mu.Lock()
	defer c.mu.Unlock()
	if nc, ok := c.byName[cl.Name]; ok || c.closed {
		return nc
	}
	f := informers.NewSharedInformerFactory(cl.Kube, 0)
	inf := f.Core().V1().Nodes()
	_ = inf.Informer().SetTransform(func(obj any) (any, error) {
		n, ok := obj.(*corev1.Node)
		if !ok {
			return obj, nil
		}
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: n.Labels, Annotations: n.Annotations,
		}, Spec: corev1.NodeSpec{Unschedulable: n.Spec.Unschedulable, Taints: n.Spec.Taints}}, nil
	})
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

// nothingStanding reports whether the cache knows the node carries no
// faultline fault and this replica has not written it recently.
func (c *nodeCaches) nothingStanding(cl *clusters.Client, node string, now time.Time) bool {
	n, ok := c.cached(cl, node, now)
	if !ok {
		return false
	}
	st, err := ReadState(n)
	return err == nil && len(st.Faults) == 0
}

// cached returns the watch's copy of the node (name, UID, labels,
// annotations, taints, unschedulable) when the watch has synced and this
// replica has not written the node recently; false: read it live. The copy
// is shared with the cache: never modify it.
func (c *nodeCaches) cached(cl *clusters.Client, node string, now time.Time) (*corev1.Node, bool) {
	if cl == nil || cl.Kube == nil {
		return nil, false
	}
	nc := c.get(cl)
	if nc == nil || !nc.synced() {
		return nil, false
	}
	c.mu.Lock()
	w, recent := c.written[cl.Name+"/"+node]
	c.mu.Unlock()
	if recent && now.Sub(w) < recentWrite {
		return nil, false
	}
	n, err := nc.lister.Get(node)
	if err != nil {
		return nil, false
	}
	return n, true
}

// wrote remembers that this replica changed a node.
func (c *nodeCaches) wrote(cluster, node string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.written[cluster+"/"+node] = now
	if now.Sub(c.lastPrune) > recentWrite {
		for k, t := range c.written {
			if now.Sub(t) >= recentWrite {
				delete(c.written, k)
			}
		}
		c.lastPrune = now
	}
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
