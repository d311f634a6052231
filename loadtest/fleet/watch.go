package fleet

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/drain"
	"github.com/faultline/faultline/processors/remediate"
	"github.com/faultline/faultline/schemas/events"
)

// CordonWatch sees nodes become unschedulable on the apiservers, through
// an informer (what an operator's kubectl would see), and remembers when.
type CordonWatch struct {
	mu    sync.Mutex
	first map[string]time.Time // cluster/node -> first seen cordoned
	flips map[string]int       // cluster/node -> schedulable->unschedulable transitions
	state map[string]bool
	mods  map[string]int // cluster/node -> updates seen (each a write to the Node)
}

// WatchCordons watches the nodes of every cluster until ctx ends; it
// returns once every cluster's first list is seen.
func WatchCordons(ctx context.Context, tb testing.TB, kubes map[string]*testenv.Kube) *CordonWatch {
	w := &CordonWatch{first: map[string]time.Time{}, flips: map[string]int{}, state: map[string]bool{}, mods: map[string]int{}}
	var synced []cache.InformerSynced
	for c, k := range kubes {
		inf := informers.NewSharedInformerFactory(k.Client(), 0).Core().V1().Nodes().Informer()
		synced = append(synced, inform(ctx, tb, "nodes of "+c, inf, cache.ResourceEventHandlerFuncs{
			AddFunc: func(o any) { w.see(c, o.(*corev1.Node), false) },
			// A relist delivers every node as an update: only a new
			// resourceVersion is a write.
			UpdateFunc: func(old, o any) {
				w.see(c, o.(*corev1.Node), old.(*corev1.Node).ResourceVersion != o.(*corev1.Node).ResourceVersion)
			},
		}))
	}
	cache.WaitForCacheSync(ctx.Done(), synced...)
	return w
}

// inform has inf's events go to h and its list and watch failures logged
// on tb while ctx lasts, and runs it until ctx ends; the InformerSynced
// reports whether h has seen the first list.
func inform(ctx context.Context, tb testing.TB, what string, inf cache.SharedIndexInformer, h cache.ResourceEventHandler) cache.InformerSynced {
	_ = inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		// A watch closed or expired is listed afresh: no failure.
		if ctx.Err() == nil && err != io.EOF && !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
			tb.Logf("fleet: watch %s: %v", what, err)
		}
	})
	reg, _ := inf.AddEventHandler(h) // fails only once inf stopped
	go inf.Run(ctx.Done())
	return reg.HasSynced
}

func (w *CordonWatch) see(cluster string, n *corev1.Node, write bool) {
	now := time.Now()
	key := cluster + "/" + n.Name
	w.mu.Lock()
	defer w.mu.Unlock()
	if write {
		w.mods[key]++
	}
	was := w.state[key]
	w.state[key] = n.Spec.Unschedulable
	if n.Spec.Unschedulable && !was {
		w.flips[key]++
		if _, ok := w.first[key]; !ok {
			w.first[key] = now
		}
	}
}

// At returns when cluster/node was first seen cordoned.
func (w *CordonWatch) At(cluster, node string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.first[cluster+"/"+node]
	return t, ok
}

// Count returns the nodes seen cordoned (ever) and those cordoned more
// than once (uncordoned in between).
func (w *CordonWatch) Count() (cordoned, twice int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range w.flips {
		if n > 1 {
			twice++
		}
	}
	return len(w.first), twice
}

// Uncordoned returns the nodes seen cordoned that are schedulable now.
func (w *CordonWatch) Uncordoned() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for k := range w.first {
		if !w.state[k] {
			n++
		}
	}
	return n
}

// CountIn returns the nodes of cluster seen cordoned (ever).
func (w *CordonWatch) CountIn(cluster string) int { return len(w.FirstIn(cluster)) }

// FirstIn returns, for each node of cluster seen cordoned, when it was
// first seen cordoned.
func (w *CordonWatch) FirstIn(cluster string) map[string]time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]time.Time{}
	for k, t := range w.first {
		if c, n, _ := strings.Cut(k, "/"); c == cluster {
			out[n] = t
		}
	}
	return out
}

// NodeWrites returns the Node updates seen on the watch, in all and for
// the nodes seen cordoned (a cordon with a taint and a condition in one
// update is one write; the apiserver may coalesce none of them).
func (w *CordonWatch) NodeWrites() (all, ofCordoned int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, n := range w.mods {
		all += n
		if _, ok := w.first[k]; ok {
			ofCordoned += n
		}
	}
	return all, ofCordoned
}

// ActionWatch counts the audit actions on the actions topic by
// kind/outcome ("quarantine/applied", "quarantine/held_by_breaker", ...),
// and the distinct nodes of each. Per node (Of, Repeated) it counts
// distinct ids, as the store does: an action produced again with its id
// (a drain resumed after a kill says its start again) is one.
type ActionWatch struct {
	mu    sync.Mutex
	count map[string]int
	nodes map[string]map[string]bool
	per   map[string]int       // kind/outcome cluster/node -> distinct action ids
	ids   map[string]bool      // kind/outcome cluster/node id -> seen
	first map[string]time.Time // kind/outcome cluster/node -> when the first was seen
	made  map[string]time.Time // … -> when the first was produced (its record's timestamp)
}

// DrainJoined is what ActionWatch counts a fault that joined a drain in
// progress under: a drain/in_progress action that starts no drain.
const DrainJoined = events.KindDrain + "/joined"

// WatchActions counts the actions cl consumes (the actions topic) until
// ctx ends.
func WatchActions(ctx context.Context, cl *kgo.Client) *ActionWatch {
	w := &ActionWatch{count: map[string]int{}, nodes: map[string]map[string]bool{}, per: map[string]int{}, ids: map[string]bool{}, first: map[string]time.Time{}, made: map[string]time.Time{}}
	go func() {
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			fs.EachRecord(func(r *kgo.Record) {
				a, err := events.UnmarshalAction(r.Value)
				if err != nil {
					return
				}
				k := a.GetKind() + "/" + a.GetOutcome()
				if a.GetKind() == events.KindDrain && a.GetOutcome() == events.OutcomeInProgress && strings.HasPrefix(a.GetReason(), drain.ReasonJoined) {
					k = DrainJoined
				}
				w.mu.Lock()
				w.count[k]++
				if w.nodes[k] == nil {
					w.nodes[k] = map[string]bool{}
				}
				w.nodes[k][a.GetCluster()+"/"+a.GetNode()] = true
				kn := k + " " + a.GetCluster() + "/" + a.GetNode()
				if id := kn + " " + a.GetId(); !w.ids[id] {
					w.ids[id] = true
					if w.per[kn]++; w.per[kn] == 1 {
						w.first[kn], w.made[kn] = time.Now(), r.Timestamp
					}
				}
				w.mu.Unlock()
			})
		}
	}()
	return w
}

// Count returns the actions of kind/outcome and their distinct nodes.
func (w *ActionWatch) Count(kindOutcome string) (actions, nodes int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.count[kindOutcome], len(w.nodes[kindOutcome])
}

// NodesIn returns the distinct nodes of cluster with actions of
// kind/outcome.
func (w *ActionWatch) NodesIn(kindOutcome, cluster string) int {
	return len(w.NodeSetIn(kindOutcome, cluster))
}

// NodeSetIn returns the nodes of cluster with actions of kind/outcome.
func (w *ActionWatch) NodeSetIn(kindOutcome, cluster string) map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]bool{}
	for k := range w.nodes[kindOutcome] {
		if c, n, _ := strings.Cut(k, "/"); c == cluster {
			out[n] = true
		}
	}
	return out
}

// Kinds returns every kind/outcome seen and its count, sorted: what a
// failed check shows of what the roles did instead.
func (w *ActionWatch) Kinds() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for k, n := range w.count {
		out = append(out, fmt.Sprintf("%s=%d", k, n))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// Repeated returns the nodes of cluster with more than one action of
// kind/outcome (distinct ids).
func (w *ActionWatch) Repeated(kindOutcome, cluster string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return repeated(w.per, kindOutcome+" "+cluster+"/")
}

// Of returns the actions of kind/outcome for cluster/node (distinct ids),
// and when the first was seen.
func (w *ActionWatch) Of(kindOutcome, cluster, node string) (int, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	kn := kindOutcome + " " + cluster + "/" + node
	return w.per[kn], w.first[kn]
}

// Produced returns the actions of kind/outcome for cluster/node (distinct
// ids), and when the first was produced: its record's timestamp, the
// producing role's clock — without the watch's own lag behind the topic.
func (w *ActionWatch) Produced(kindOutcome, cluster, node string) (int, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	kn := kindOutcome + " " + cluster + "/" + node
	return w.per[kn], w.made[kn]
}

// Distinct returns the distinct action ids of kind/outcome (Count's
// records less those said again with their ids).
func (w *ActionWatch) Distinct(kindOutcome string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for kn, c := range w.per {
		if k, _, _ := strings.Cut(kn, " "); k == kindOutcome {
			n += c
		}
	}
	return n
}

// Snapshot returns every kind/outcome count.
func (w *ActionWatch) Snapshot() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int, len(w.count))
	for k, v := range w.count {
		out[k] = v
	}
	return out
}

// ResourceWatch counts the objects of one resource created on an
// apiserver (RebootNodes), seen ADDED on a watch, by name and by the node
// of their faultline.io/node label.
type ResourceWatch struct {
	mu    sync.Mutex
	names map[string]bool
	nodes map[string]int       // node label -> objects
	first map[string]time.Time // node label -> when its first object was seen
}

// WatchResources watches gvr (cluster-scoped) on k until ctx ends; it
// returns once the first list is seen.
func WatchResources(ctx context.Context, tb testing.TB, k *testenv.Kube, gvr schema.GroupVersionResource) (*ResourceWatch, error) {
	dyn, err := dynamic.NewForConfig(k.RESTConfig())
	if err != nil {
		return nil, err
	}
	w := &ResourceWatch{names: map[string]bool{}, nodes: map[string]int{}, first: map[string]time.Time{}}
	inf := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0).ForResource(gvr).Informer()
	cache.WaitForCacheSync(ctx.Done(), inform(ctx, tb, gvr.Resource, inf, cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { w.see(o.(*unstructured.Unstructured)) },
	}))
	return w, ctx.Err()
}

func (w *ResourceWatch) see(o *unstructured.Unstructured) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.names[o.GetName()] {
		node := o.GetLabels()[remediate.LabelNode]
		w.names[o.GetName()] = true
		if w.nodes[node]++; w.nodes[node] == 1 {
			w.first[node] = time.Now()
		}
	}
}

// Has reports whether an object of node was seen.
func (w *ResourceWatch) Has(node string) bool {
	_, ok := w.At(node)
	return ok
}

// At returns when the first object of node was seen.
func (w *ResourceWatch) At(node string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.first[node]
	return t, ok
}

// Count returns the nodes with an object and those with more than one.
func (w *ResourceWatch) Count() (nodes, twice int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range w.nodes {
		if n > 1 {
			twice++
		}
	}
	return len(w.nodes), twice
}

// PodWatch counts the pods of one namespace deleted on an apiserver, seen
// DELETED on a watch, and when the last was seen. With kubelet, it also
// plays the kubelet for a pod left terminating (deletionTimestamp set, the
// object still there) and deletes it with grace period 0, as a kubelet
// does once the containers stopped.
type PodWatch struct {
	mu          sync.Mutex
	deleted     map[string]int // pod name -> deletions seen
	terminating map[string]bool
	finished    map[string]bool // deleted by the watch, playing the kubelet
	last        time.Time
	at          []time.Time // each deletion seen, in order
}

// WatchPods watches the pods of namespace ns on k until ctx ends; it
// returns once the first list is seen.
func WatchPods(ctx context.Context, tb testing.TB, k *testenv.Kube, ns string, kubelet bool) *PodWatch {
	w := &PodWatch{deleted: map[string]int{}, terminating: map[string]bool{}, finished: map[string]bool{}}
	pods := k.Client().CoreV1().Pods(ns)
	// A pod the apiserver deletes at once (grace period 0) is seen
	// terminating just before it is gone: only one still there a second
	// later is finished.
	finish := func(p *corev1.Pod) {
		if !kubelet || p.DeletionTimestamp == nil {
			return
		}
		w.mu.Lock()
		seen := w.terminating[p.Name]
		w.terminating[p.Name] = true
		w.mu.Unlock()
		if seen {
			return
		}
		var try func()
		try = func() {
			w.mu.Lock()
			gone := w.deleted[p.Name] > 0
			w.mu.Unlock()
			if gone {
				return
			}
			zero, uid := int64(0), p.UID
			err := pods.Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid}})
			switch {
			case err == nil:
				w.mu.Lock()
				w.finished[p.Name] = true
				w.mu.Unlock()
			case !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && ctx.Err() == nil:
				// As a kubelet does, again until the apiserver answers.
				tb.Logf("fleet: finish terminating pod %s (again in 1s): %v", p.Name, err)
				time.AfterFunc(time.Second, try)
			}
		}
		time.AfterFunc(time.Second, try)
	}
	inf := informers.NewSharedInformerFactoryWithOptions(k.Client(), 0, informers.WithNamespace(ns)).Core().V1().Pods().Informer()
	cache.WaitForCacheSync(ctx.Done(), inform(ctx, tb, "pods", inf, cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { finish(o.(*corev1.Pod)) },
		UpdateFunc: func(_, o any) { finish(o.(*corev1.Pod)) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok { // missed on the watch, found by a relist
				o = d.Obj
			}
			if p, ok := o.(*corev1.Pod); ok {
				w.mu.Lock()
				w.deleted[p.Name]++
				w.last = time.Now()
				w.at = append(w.at, w.last)
				w.mu.Unlock()
			}
		},
	}))
	return w
}

// Since returns how long after t0 each deletion seen since t0 came, in
// order.
func (w *PodWatch) Since(t0 time.Time) []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []time.Duration
	for _, t := range w.at {
		if t.After(t0) {
			out = append(out, t.Sub(t0))
		}
	}
	return out
}

// Finished returns the pods the watch found left terminating and deleted
// (playing the kubelet).
func (w *PodWatch) Finished() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.finished)
}

// Deleted returns the pods seen deleted whose names start with prefix
// ("" for all), and when the last deletion was seen.
func (w *PodWatch) Deleted(prefix string) (pods int, last time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for name := range w.deleted {
		if strings.HasPrefix(name, prefix) {
			pods++
		}
	}
	return pods, w.last
}
