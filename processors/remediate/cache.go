package remediate

import (
	"log/slog"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/faultline/faultline/processors/clusters"
)

// recentWrite is how long after this replica wrote a node's resources of a
// group the watch's copy is not trusted unless it delivered the write.
const recentWrite = clusters.RecentWrite

// watchDown is how long after a watch failed its copy is not trusted at
// all: client-go's reflector retries a failing list and watch at most
// every 30s, jittered up to 60s, so a watch that keeps failing (its verb
// forbidden, the apiserver refusing) is never trusted between its tries.
const watchDown = time.Minute

const indexNodeGroup = "node/group"

// resourceCaches watch the resources faultline created (label
// app.kubernetes.io/managed-by=faultline) of each cluster and template
// resource, indexed by node and group, so that a step reads its node's
// resources without a request: a remediation costs one create, and the
// poll of one in progress (every poll_interval while the janitor works)
// none, instead of a list by label each, which the apiserver answers by
// filtering every resource of the kind it holds.
//
// The copy can lag the apiserver by the watch's latency:
//   - this replica's own create or join: the node's group is read live
//     until the watch delivered the write (its resourceVersion), at most
//     recentWrite;
//   - another replica's: only around a partition rebalance, which takes
//     longer than the watch. Should the copy miss a resource anyway, the
//     create meets its name (AlreadyExists) or the join its
//     resourceVersion precondition (Conflict), and the step is decided
//     again on a live list, so the budget and the escalations count what
//     the apiserver holds;
//   - a failed watch: live reads for watchDown after each failure.
//
// A status the janitor just wrote is seen one poll later at worst.
type resourceCaches struct {
	stop chan struct{}
	log  *slog.Logger

	mu        sync.Mutex
	closed    bool
	byKey     map[watchKey]*resourceCache
	written   map[nodeGroup]write
	lastPrune time.Time
}

// watchKey is one watch: a template's resource on a cluster.
type watchKey struct {
	cluster   string
	gvr       schema.GroupVersionResource
	namespace string
}

// nodeGroup is a node's resources of one group: what a step reads and
// writes.
type nodeGroup struct {
	watchKey
	node, group string // the node as a label value (nodeLabel)
}

// write is a create or join by this replica: when, and the resource and
// resourceVersion it produced ("" while in flight or after it failed).
type write struct {
	at       time.Time
	name, rv string
}

type resourceCache struct {
	inf cache.SharedIndexInformer

	mu        sync.Mutex
	failedAt  time.Time
	notServed bool // the last failure was a 404: warned once
}

func newResourceCaches(log *slog.Logger) *resourceCaches {
	return &resourceCaches{stop: make(chan struct{}), log: log, byKey: map[watchKey]*resourceCache{}, written: map[nodeGroup]write{}}
}

// get returns the watch of k, starting it on first use; nil once closed.
func (c *resourceCaches) get(dyn dynamic.Interface, k watchKey) *resourceCache {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rc, ok := c.byKey[k]; ok || c.closed {
		return rc
	}
	inf := dynamicinformer.NewFilteredDynamicInformer(dyn, k.gvr, k.namespace, 0,
		cache.Indexers{indexNodeGroup: func(o any) ([]string, error) {
			u, ok := o.(*unstructured.Unstructured)
			if !ok {
				return nil, nil
			}
			return []string{u.GetLabels()[LabelNode] + "/" + u.GetLabels()[LabelGroup]}, nil
		}},
		func(o *metav1.ListOptions) { o.LabelSelector = LabelManagedBy + "=faultline" }).Informer()
	rc := &resourceCache{inf: inf}
	delivered := func(o any) {
		if u, ok := o.(*unstructured.Unstructured); ok {
			c.delivered(nodeGroup{watchKey: k, node: u.GetLabels()[LabelNode], group: u.GetLabels()[LabelGroup]}, u)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: delivered, UpdateFunc: func(_, o any) { delivered(o) }})
	log := c.log.With("cluster", k.cluster)
	logErr := clusters.WatchErrorLogger(log, k.gvr.Resource)
	_ = inf.SetWatchErrorHandler(func(r *cache.Reflector, err error) {
		if clusters.WatchStopped(err) {
			return
		}
		rc.mu.Lock()
		rc.failedAt = time.Now()
		warned := rc.notServed
		rc.notServed = apierrors.IsNotFound(err)
		rc.mu.Unlock()
		switch {
		case !apierrors.IsNotFound(err):
			logErr(r, err)
		case !warned:
			// Once, not at every retry: a template whose resource is not
			// installed fails its remediations, each with its own error.
			log.Warn("the cluster does not serve "+k.gvr.Resource+" (its CRD is not installed?); remediations of that kind fail until it does", "err", err)
		}
	})
	_ = inf.SetTransform(func(o any) (any, error) {
		if u, ok := o.(*unstructured.Unstructured); ok {
			u.SetManagedFields(nil)
		}
		return o, nil
	})
	go inf.Run(c.stop)
	c.byKey[k] = rc
	return rc
}

// items returns deep copies of the group's resources from the watch, and
// true; false: read them live (the watch has not synced, failed recently,
// or has not shown this replica's last write to the group yet).
func (c *resourceCaches) items(dyn dynamic.Interface, g nodeGroup) ([]unstructured.Unstructured, bool) {
	rc := c.get(dyn, g.watchKey)
	if rc == nil || !rc.inf.HasSynced() {
		return nil, false
	}
	now := time.Now()
	rc.mu.Lock()
	failed := now.Sub(rc.failedAt) < watchDown
	rc.mu.Unlock()
	if failed {
		return nil, false
	}
	objs, err := rc.inf.GetIndexer().ByIndex(indexNodeGroup, g.node+"/"+g.group)
	if err != nil {
		return nil, false
	}
	c.mu.Lock()
	w, pending := c.written[g]
	c.mu.Unlock()
	if pending && now.Sub(w.at) < recentWrite {
		return nil, false
	}
	out := make([]unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			return nil, false
		}
		out = append(out, *u.DeepCopy())
	}
	return out, true
}

// wrote remembers a write of this replica to the group: name and rv ""
// before it is sent (and after it failed), the resource and the
// resourceVersion it produced after, unless the watch delivered it
// already.
func (c *resourceCaches) wrote(g nodeGroup, name, rv string) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if rc := c.byKey[g.watchKey]; rc != nil && rv != "" {
		// The watch's handler (delivered) waits for c.mu, so a write it
		// delivers after this look is cleared there.
		o, ok, _ := rc.inf.GetIndexer().GetByKey(cache.ObjectName{Namespace: g.namespace, Name: name}.String())
		if u, isU := o.(*unstructured.Unstructured); ok && isU && u.GetResourceVersion() == rv {
			delete(c.written, g)
			return
		}
	}
	c.written[g] = write{at: now, name: name, rv: rv}
	if now.Sub(c.lastPrune) > recentWrite {
		for k, w := range c.written {
			if now.Sub(w.at) >= recentWrite {
				delete(c.written, k)
			}
		}
		c.lastPrune = now
	}
}

// delivered is told of each object the watch delivers: the group's
// pending write is done once it is this replica's write.
func (c *resourceCaches) delivered(g nodeGroup, u *unstructured.Unstructured) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w, ok := c.written[g]; ok && w.rv != "" && w.name == u.GetName() && w.rv == u.GetResourceVersion() {
		delete(c.written, g)
	}
}

// close stops every watch.
func (c *resourceCaches) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		close(c.stop)
	}
}
