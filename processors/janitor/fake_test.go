package janitor

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
)

// fakeCluster is a cluster of client-go's fake clients: its nodes in a
// fake clientset, the janitor's resources in a fake dynamic client. No
// apiserver: the tests that need none of its behaviour (resource
// versions, the status subresource) run in milliseconds.
type fakeCluster struct {
	t    *testing.T
	kube *fake.Clientset
	dyn  *dynamicfake.FakeDynamicClient
}

func newFakeCluster(t *testing.T, nodes ...*corev1.Node) *fakeCluster {
	t.Helper()
	var objs []runtime.Object
	for _, n := range nodes {
		objs = append(objs, n)
	}
	lists := map[schema.GroupVersionResource]string{}
	for _, k := range kinds {
		lists[k.GVR] = k.Name + "List"
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), lists)
	dyn.PrependReactor("update", "*", resourceVersions(dyn.Tracker()))
	dyn.PrependReactor("create", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if o, ok := a.(clienttesting.CreateAction).GetObject().(metav1.Object); ok && o.GetResourceVersion() == "" {
			o.SetResourceVersion("1")
		}
		return false, nil, nil
	})
	return &fakeCluster{t: t, kube: fake.NewClientset(objs...), dyn: dyn}
}

// resourceVersions gives the fake's updates (and creates, above) the API server's optimistic
// concurrency, which the janitor relies on to send a signal once (its
// state written with the resourceVersion it read): an update of an older
// resourceVersion than the stored one is a conflict, and each update
// stores the next one. Without it an update from the watch's stale copy
// succeeded and the signal was sent twice.
func resourceVersions(tr clienttesting.ObjectTracker) clienttesting.ReactionFunc {
	return func(a clienttesting.Action) (bool, runtime.Object, error) {
		ua := a.(clienttesting.UpdateAction)
		obj, ok := ua.GetObject().(*unstructured.Unstructured)
		if !ok {
			return false, nil, nil
		}
		cur, err := tr.Get(ua.GetResource(), ua.GetNamespace(), obj.GetName())
		if err != nil {
			return false, nil, nil // the tracker's own answer (not found)
		}
		rv := cur.(metav1.Object).GetResourceVersion()
		if obj.GetResourceVersion() != "" && obj.GetResourceVersion() != rv {
			return true, nil, apierrors.NewConflict(ua.GetResource().GroupResource(), obj.GetName(),
				fmt.Errorf("resourceVersion %s is not the stored %s", obj.GetResourceVersion(), rv))
		}
		n, _ := strconv.Atoi(rv)
		obj.SetResourceVersion(strconv.Itoa(n + 1))
		return false, nil, nil // stored by the tracker's reactor
	}
}

// fakeNode is a node served by the redfish provider (the tests install
// their own under that name), quarantined and drained, Ready with bootID.
func fakeNode(name, rack, bootID string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Labels: map[string]string{
		AnnotationProvider: ProviderRedfish, "faultline.io/rack": rack, events.LabelQuarantined: "true", labelDrain: "succeeded"}}}
	n.Status.NodeInfo.BootID = bootID
	setReady(n, corev1.ConditionTrue)
	return n
}

// fakeConfig is the defaults with leader election off (runCluster is
// called directly), no cooldown and a short poll.
func fakeConfig() Config {
	c := DefaultConfig()
	c.LeaderElection = false
	c.Cooldown = 0
	c.PollInterval = 50 * time.Millisecond
	return c
}

// janitor is a janitor of the cluster with prov as its redfish provider.
func (f *fakeCluster) janitor(cfg Config, dryRun bool, prov Provider) (*Janitor, *recorder) {
	f.t.Helper()
	reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	reg.SetClient(cluster, f.kube, dryRun)
	reg.SetDynamic(cluster, f.dyn)
	rec := &recorder{}
	j, err := New(cfg, clusters.Config{}, reg, Options{Log: testLog, Providers: map[string]Provider{ProviderRedfish: prov}, Producer: rec})
	if err != nil {
		f.t.Fatal(err)
	}
	return j, rec
}

// run runs j's watch of the cluster (runCluster: as while it holds the
// Lease) until the returned stop is called (or the test ends); stop
// returns once runCluster has.
func (f *fakeCluster) run(j *Janitor) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = j.runCluster(ctx, cluster) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	f.t.Cleanup(stop)
	return stop
}

// create creates a resource of kind k for node, with a UID (the fake
// gives none); st, when not nil, as its state record, and the conditions
// cs as its status.
func (f *fakeCluster) create(k kind, name, node string, st *opState, cs ...cond) {
	f.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": Group + "/v1alpha1", "kind": k.Name,
		"metadata": map[string]any{"name": name, "uid": "uid-" + name}, "spec": map[string]any{"nodeName": node}}}
	if st != nil {
		u.SetAnnotations(map[string]string{AnnotationState: st.encode()})
	}
	if len(cs) > 0 {
		u.Object["status"] = map[string]any{"conditions": setConditions(u, time.Now(), cs...)}
	}
	if _, err := f.dyn.Resource(k.GVR).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeCluster) get(k kind, name string) *unstructured.Unstructured {
	f.t.Helper()
	o, err := f.dyn.Resource(k.GVR).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return o
}

// waitFor polls the resource until ok holds of it, up to within.
func (f *fakeCluster) waitFor(k kind, name string, within time.Duration, what string, ok func(*unstructured.Unstructured) bool) *unstructured.Unstructured {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for {
		o := f.get(k, name)
		if ok(o) {
			return o
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%s %s: not %s within %v: %v", k.Name, name, what, within, o.Object)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tally is a provider that accepts every call at once and counts them by
// "<call> <node>": reboot/graceful, reboot/force, terminate, reset,
// power-on (it tells every machine off).
type tally struct {
	mu sync.Mutex
	n  map[string]int
}

func (p *tally) add(call string, t Target) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == nil {
		p.n = map[string]int{}
	}
	p.n[call+" "+t.Node.Name]++
	return nil
}

func (p *tally) calls() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.n)
}

func (p *tally) Reboot(_ context.Context, t Target, mode RebootMode) error {
	return p.add("reboot/"+mode.String(), t)
}
func (p *tally) Terminate(_ context.Context, t Target) error { return p.add("terminate", t) }
func (p *tally) ResetGPUs(_ context.Context, t Target, _ []string) error {
	return p.add("reset", t)
}
func (p *tally) PowerOnIfOff(_ context.Context, t Target) error { return p.add("power-on", t) }
