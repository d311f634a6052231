package fleet

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/timestamppb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/remediate"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// RebootNodes is the janitor's RebootNode resource.
var RebootNodes = schema.GroupVersionResource{Group: remediate.JanitorGroup, Version: "v1alpha1", Resource: "rebootnodes"}

// DrainSucceeded is the drain role's result for a finished drain of node
// (RESTART_BM, the whole node), what starts a remediation.
func DrainSucceeded(cluster, node string) *faultlinev1.Action {
	return &faultlinev1.Action{
		Id: "scale-drain-" + node, Cluster: cluster, Node: node, Role: events.RoleDrain, Kind: events.KindDrain,
		Outcome: events.OutcomeSucceeded, EventIds: []string{"scale-ev-" + node}, CheckName: "XID_ERROR_79",
		RecommendedAction: datamodels.RecommendedAction_RESTART_BM.String(), Timestamp: timestamppb.Now(),
		Details: map[string]string{events.DetailDrainID: "scale-" + node, events.DetailScope: "node"},
	}
}

// janitorCRDs are the janitor's CRDs the chart installs (RebootNode,
// GPUReset, TerminateNode): a glob.
func janitorCRDs() string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(self), "..", "..", "deploy", "crds", "*.yaml")
}

// scaleRemediate: drain/succeeded actions produced to the actions topic,
// RebootNodes seen ADDED on a watch of the apiserver (not through the
// proxy). Nothing applied twice is shown three ways: RebootNodes per node
// on the watch, create attempts as the apiserver answered them (201 or
// 409 AlreadyExists, counted at the proxy), remediate/applied actions per
// node on the actions topic. After each round the test plays the janitor
// (every RebootNode NodeReady=True, completionTime set) and waits until
// the replicas followed each to remediate/succeeded (a poll every
// poll_interval, shipped 15s), so one round's polls do not load the next;
// the probe is completed so too before the round starts (see probe).
func (e *Env) scaleRemediate(ctx context.Context, cluster string, k *testenv.Kube, proxy *LatencyProxy) (*scaleTarget, error) {
	k.ApplyCRDs(e.TB, janitorCRDs())
	w, err := WatchResources(ctx, e.TB, k, RebootNodes)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(k.RESTConfig())
	if err != nil {
		return nil, err
	}
	produce := e.actionProducer(cluster, DrainSucceeded)
	const applied = events.KindRemediate + "/" + events.OutcomeApplied
	// finish plays the janitor and waits until every RebootNode was
	// followed to remediate/succeeded: no remediation is left in progress.
	finish := func(ctx context.Context) (ok bool, succeeded, nodes int, err error) {
		if err := completeRebootNodes(ctx, dyn); err != nil {
			return false, 0, 0, err
		}
		nodes, _ = w.Count()
		ok = waitFor(ctx, 2*time.Minute, func() bool {
			_, succeeded = e.Actions.Count(events.KindRemediate + "/" + events.OutcomeSucceeded)
			return succeeded >= nodes
		})
		return ok, succeeded, nodes, nil
	}
	var created0, exists0, cut0, applied0, appliedNodes0 int
	var created, exists, cut, appliedNodes int
	return &scaleTarget{prefix: "scale remediate", noun: "RebootNodes created", unit: "RebootNodes", done: "with a RebootNode", twice: "with more than one",
		probe: func(ctx context.Context, probe string) (bool, error) {
			if err := produce(ctx, []string{probe}); err != nil {
				return false, err
			}
			// Its applied action too, so none of it falls in the round;
			// then its completion: a remediation in progress would go
			// round the requeue topic during the round (handed on, the
			// topic resting up to requeue.Hold; before that change the
			// poll held for it up to Hold, before that up to
			// poll_interval) — the round would measure that, not only the
			// creates.
			if !waitFor(ctx, 120*time.Second, func() bool { return w.Has(probe) && e.Actions.NodeSetIn(applied, cluster)[probe] }) {
				return false, nil
			}
			ok, _, _, err := finish(ctx)
			return ok, err
		},
		blast: func(ctx context.Context, from, n int) LoadResult {
			if err := produce(ctx, nodeNames(from, n)); err != nil {
				e.TB.Logf("fleet: produce drain results: %v", err)
				return LoadResult{Failed: int64(n)}
			}
			return LoadResult{Sent: int64(n)}
		},
		count: w.Count,
		mark: func() {
			created0, exists0, cut0 = proxy.Creates(RebootNodes.Resource)
			applied0, appliedNodes0 = e.Actions.Count(applied)
		},
		detail: func(done int) string {
			// The applied actions follow their batch; after a SIGKILL
			// between a create and its batch's output, the replay's come
			// once the survivor has the partitions (the group's session
			// timeout, 45s).
			waitFor(ctx, 90*time.Second, func() bool { _, n := e.Actions.Count(applied); return n-appliedNodes0 >= done })
			c, x, u := proxy.Creates(RebootNodes.Resource)
			created, exists, cut = c-created0, x-exists0, u-cut0
			a, n := e.Actions.Count(applied)
			appliedNodes = n - appliedNodes0
			return fmt.Sprintf(", creates: %d Created, %d AlreadyExists, %d cut off unanswered; %d remediate/applied actions for %d nodes", created, exists, cut, a-applied0, appliedNodes)
		},
		ceiling: func(ctx context.Context, r *Report, m int) error {
			return remediateCeiling(ctx, k, proxy, w, r, m)
		},
		settle: func(ctx context.Context, r *Report, done int) error {
			r.Check(created <= done && created+cut >= done, "%d RebootNodes, %d creates answered Created and %d cut off", done, created, cut)
			r.Check(appliedNodes == done, "remediate/applied recorded for %d of %d nodes with a RebootNode", appliedNodes, done)
			ok, n, nodes, err := finish(ctx)
			r.Check(ok, "remediate/succeeded for %d of %d nodes with a completed RebootNode", n, nodes)
			return err
		},
	}, nil
}

// actionProducer returns a function that produces action(cluster, node)
// for each node to the actions topic, as the role before the one under
// test would.
func (e *Env) actionProducer(cluster string, action func(cluster, node string) *faultlinev1.Action) func(context.Context, []string) error {
	cl := e.KafkaClient()
	return func(ctx context.Context, nodes []string) error {
		recs := make([]*kgo.Record, len(nodes))
		for i, n := range nodes {
			rec, err := pipeline.ActionRecord(action(cluster, n))
			if err != nil {
				return err
			}
			recs[i] = rec
		}
		return cl.ProduceSync(ctx, recs...).FirstErr()
	}
}

// completeRebootNodes plays the janitor: every RebootNode not yet finished
// gets the status of a successful reboot (NodeReady=True, completionTime).
func completeRebootNodes(ctx context.Context, dyn dynamic.Interface) error {
	res := dyn.Resource(RebootNodes)
	list, err := res.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list rebootnodes: %w", err)
	}
	now := time.Now().UTC().Format(time.RFC3339)
	var g errgroup.Group
	g.SetLimit(16)
	for i := range list.Items {
		o := &list.Items[i]
		if _, ok := o.Object["status"]; ok {
			continue
		}
		g.Go(func() error {
			o.Object["status"] = map[string]any{"startTime": now, "completionTime": now, "conditions": []any{
				map[string]any{"type": "SignalSent", "status": "True", "reason": "Succeeded", "message": "fleetload janitor", "lastTransitionTime": now},
				map[string]any{"type": "NodeReady", "status": "True", "reason": "Succeeded", "message": "fleetload janitor", "lastTransitionTime": now},
			}}
			if _, err := res.UpdateStatus(ctx, o, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("complete rebootnode %s: %w", o.GetName(), err)
			}
			return nil
		})
	}
	return g.Wait()
}

// remediateCeiling: a remediation's one request alone, the RebootNode's
// create (the object the role creates: labels, annotations, spec), made by
// the test through the latency proxy for m nodes, 1,024 at once and no
// client rate limit: what the apiserver behind the proxy sustains on this
// machine without the role's client QPS or the broker. Twice: with no
// watch of the RebootNodes but the test's, and with four more through the
// proxy, decoded in this process, as four replicas hold. (Its creates are
// the role's one request since it reads a node's RebootNodes from its
// watch; before that a list by label came first.)
func remediateCeiling(ctx context.Context, k *testenv.Kube, proxy *LatencyProxy, w *ResourceWatch, r *Report, m int) error {
	const inFlight = 1024
	dyn, err := dynamic.NewForConfig(unthrottled(k, proxy))
	if err != nil {
		return err
	}
	res := dyn.Resource(RebootNodes)
	for _, watches := range []int{0, 4} {
		stop := make(chan struct{})
		for range watches {
			inf := dynamicinformer.NewFilteredDynamicInformer(dyn, RebootNodes, "", 0, cache.Indexers{},
				func(o *metav1.ListOptions) { o.LabelSelector = remediate.LabelManagedBy + "=faultline" }).Informer()
			go inf.Run(stop)
			if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
				close(stop)
				return fmt.Errorf("scale remediate ceiling: a watch did not sync")
			}
		}
		n0, _ := w.Count()
		t0 := time.Now()
		var g errgroup.Group
		g.SetLimit(inFlight)
		for i := range m {
			node := fmt.Sprintf("ceiling-w%d-%05d", watches, i)
			g.Go(func() error {
				at := time.Now().UTC().Format(time.RFC3339Nano)
				o := &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": RebootNodes.Group + "/" + RebootNodes.Version, "kind": "RebootNode",
					"metadata": map[string]any{
						"name":   "maintenance-" + node + "-000000000000",
						"labels": map[string]any{remediate.LabelNode: node, remediate.LabelGroup: "reboot", remediate.LabelManagedBy: "faultline"},
						"annotations": map[string]any{remediate.AnnotationTriggers: "ceiling-" + node, remediate.AnnotationCreated: at,
							remediate.AnnotationBy: "ceiling", remediate.AnnotationEvents: "ceiling-ev-" + node},
					},
					"spec": map[string]any{"nodeName": node, "force": false},
				}}
				_, err := res.Create(ctx, o, metav1.CreateOptions{FieldManager: "ceiling"})
				return err
			})
		}
		err = g.Wait()
		took := time.Since(t0)
		waitFor(ctx, 30*time.Second, func() bool { n, _ := w.Count(); return n-n0 >= m })
		n1, _ := w.Count()
		close(stop)
		r.Figure("scale remediate ceiling: the test's own RebootNode creates through the proxy, %d in flight, no client rate limit, %d more watches of the RebootNodes: %d in %s = %.1f RebootNodes/s; %d seen on the watch",
			inFlight, watches, m, took.Round(time.Millisecond), float64(m)/took.Seconds(), n1-n0)
		r.Check(err == nil && n1-n0 == m, "ceiling with %d more watches: %d of %d RebootNodes created (%v)", watches, n1-n0, m, err)
	}
	return nil
}
