package fleet

import (
	"context"
	"fmt"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/faultline/faultline/internal/fleetsim"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// DrainPodsPerNode are the pods each node of the drain scale rounds runs.
const DrainPodsPerNode = 3

// drainNamespace holds the drain scale rounds' pods.
const drainNamespace = "scale-drain"

// QuarantineApplied is the quarantine role's action for an Xid 79 on node
// it cordoned (RESTART_BM, the whole node, with the event's entities and
// submitter role as quarantine writes them): what starts a drain.
func QuarantineApplied(cluster, node string) *faultlinev1.Action {
	ev := fleetsim.Xid(node, 0, 79)
	return &faultlinev1.Action{
		Id: "scale-q-" + node, Cluster: cluster, Node: node, Role: events.RoleQuarantine, Kind: events.KindQuarantine,
		Outcome: events.OutcomeApplied, EventIds: []string{"scale-ev-" + node}, CheckName: ev.GetCheckName(),
		RecommendedAction: ev.GetRecommendedAction().String(), Timestamp: timestamppb.Now(),
		Details: map[string]string{events.DetailEntities: events.EntityKey(ev), events.DetailSubmitterRole: events.RoleName(events.SubmitterRole(ev))},
	}
}

// scaleDrain: before each round its nodes are left as the quarantine role
// leaves them (label faultline.io/quarantined=true, cordoned) with
// DrainPodsPerNode pods each, bound with spec.nodeName, status Running
// (the test writes the status, as a kubelet would) and
// terminationGracePeriodSeconds 0, so an eviction (shipped grace_period:
// the pod's own) deletes the pod at once: there is no kubelet to finish a
// graceful deletion. An eviction cut off inside the apiserver (its client
// SIGKILLed between the deletionTimestamp write and the delete) leaves the
// pod terminating with grace period 0: the pod watch plays its kubelet and
// deletes it (counted). Then quarantine/applied actions are produced to the
// actions topic; a node is done when a drain/succeeded action for it is on
// the topic. The apiserver side: evictions counted at the proxy by answer
// (201, 429, 404, cut off) and per pod (a pod evicted twice), pod
// deletions seen on a watch of the apiserver (not through the proxy).
// Nothing applied twice: no pod evicted (201) twice, no node with two
// drain/in_progress ids (a drain started twice; one resumed after the
// SIGKILL says its start again with the same id); a replayed drain/succeeded
// (same id: the role repeats a finished drain's result, by design) and a
// replayed eviction answered 404 are counted and reported.
func (e *Env) scaleDrain(ctx context.Context, cluster string, k *testenv.Kube, proxy *LatencyProxy) (*scaleTarget, error) {
	// The rounds' setup (outside the clock) with no client rate limit.
	rc := rest.CopyConfig(k.RESTConfig())
	rc.QPS = -1
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	if err := createDrainNamespace(ctx, kc); err != nil {
		return nil, err
	}
	pw := WatchPods(ctx, e.TB, k, drainNamespace, true)
	produce := e.actionProducer(cluster, QuarantineApplied)
	const (
		succeeded = events.KindDrain + "/" + events.OutcomeSucceeded
		started   = events.KindDrain + "/" + events.OutcomeInProgress
	)
	count := func() (done, twice int) {
		return e.Actions.NodesIn(succeeded, cluster), e.Actions.Repeated(started, cluster) + proxy.Repeated("eviction", "201")
	}
	var (
		from, n         int
		t0              time.Time
		ev0             map[string]int
		deleted0, acts0 int
		finished0       int
		ev              map[string]int
		deleted         int
		podBase         float64
	)
	return &scaleTarget{prefix: "scale drain", noun: "nodes drained", unit: "drains", done: "drained", twice: "drained twice (a drain started twice or a pod evicted twice)",
		prepare: func(ctx context.Context, f, m int) error {
			return quarantineWithPods(ctx, kc, nodeNames(f, m))
		},
		probe: func(ctx context.Context, probe string) (bool, error) {
			if err := createNamedNode(k, probe); err != nil {
				return false, err
			}
			if err := quarantineWithPods(ctx, kc, []string{probe}); err != nil {
				return false, err
			}
			if err := produce(ctx, []string{probe}); err != nil {
				return false, err
			}
			// Its drain/succeeded: a drain in progress would put a
			// requeue record in a replica's poll.
			return waitFor(ctx, 120*time.Second, func() bool { return e.Actions.NodeSetIn(succeeded, cluster)[probe] }), nil
		},
		blast: func(ctx context.Context, f, m int) LoadResult {
			from, n = f, m
			if err := produce(ctx, nodeNames(from, n)); err != nil {
				e.TB.Logf("fleet: produce quarantine actions: %v", err)
				return LoadResult{Failed: int64(n)}
			}
			return LoadResult{Sent: int64(n)}
		},
		count: count,
		// The drains succeed in bursts, a poll_interval after their
		// evictions: the SIGKILL lands a third of the way through the
		// evictions, mid-batch.
		progress: func() int { d, _ := pw.Deleted(""); return d / DrainPodsPerNode },
		killUnit: "nodes' worth of pods deleted",
		mark: func() {
			ev0 = proxy.Answers("eviction")
			deleted0, _ = pw.Deleted("")
			acts0, _ = e.Actions.Count(succeeded)
			finished0 = pw.Finished()
			t0 = time.Now()
		},
		detail: func(done int) string {
			// The pods' deletions follow the evictions on the watch.
			waitFor(ctx, 30*time.Second, func() bool { d, _ := pw.Deleted(""); return d-deleted0 >= n*DrainPodsPerNode })
			d, last := pw.Deleted("")
			deleted = d - deleted0
			ev = proxy.Answers("eviction")
			for a := range ev {
				ev[a] -= ev0[a]
			}
			a, _ := e.Actions.Count(succeeded)
			var other []string
			for ans, c := range ev {
				if ans != "201" && ans != "429" && ans != "404" && ans != "unanswered" && c > 0 {
					other = append(other, fmt.Sprintf("%d answered %s", c, ans))
				}
			}
			extra := ""
			if len(other) > 0 {
				extra = ", " + strings.Join(other, ", ")
			}
			podRate := 0.0
			if last.After(t0) {
				podRate = float64(deleted) / last.Sub(t0).Seconds()
			}
			if podBase == 0 {
				podBase = podRate
			}
			at := pw.Since(t0)
			q := func(f float64) time.Duration {
				if len(at) == 0 {
					return 0
				}
				return at[min(len(at)-1, int(f*float64(len(at))))].Round(time.Millisecond)
			}
			return fmt.Sprintf("; %d pods deleted on the watch (p50 %s, p90 %s, p99 %s), last %s after the start = %.1f pods/s (%.2fx of the first round); evictions: %d answered 201, %d 429, %d 404, %d cut off unanswered%s; %d pods left terminating finished by the test as their kubelet; %d drain/succeeded actions for %d nodes",
				deleted, q(0.5), q(0.9), q(0.99), last.Sub(t0).Round(time.Millisecond), podRate, podRate/podBase, ev["201"], ev["429"], ev["404"], ev["unanswered"], extra, pw.Finished()-finished0, a-acts0, done)
		},
		ceiling: func(ctx context.Context, r *Report, m int) error {
			return drainCeiling(ctx, k, proxy, pw, r, m)
		},
		settle: func(ctx context.Context, r *Report, done int) error {
			pods := n * DrainPodsPerNode
			r.Check(deleted == pods, "%d of %d pods deleted on the watch", deleted, pods)
			r.Check(ev["201"] <= pods && ev["201"]+ev["unanswered"] >= pods, "%d pods, %d evictions answered 201 and %d cut off", pods, ev["201"], ev["unanswered"])
			left, err := podsLeft(ctx, kc, from, n)
			if err != nil {
				return err
			}
			r.Check(left == 0, "%d pods of the round's nodes left on the apiserver", left)
			return nil
		},
	}, nil
}

// quarantineWithPods leaves nodes as the quarantine role does (label
// faultline.io/quarantined=true, cordoned) and gives each
// DrainPodsPerNode Running pods (see scaleDrain).
func quarantineWithPods(ctx context.Context, kc kubernetes.Interface, nodes []string) error {
	patch := []byte(`{"metadata":{"labels":{"` + events.LabelQuarantined + `":"true"}},"spec":{"unschedulable":true}}`)
	var g errgroup.Group
	g.SetLimit(16)
	for _, node := range nodes {
		g.Go(func() error {
			if _, err := kc.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				return fmt.Errorf("quarantine node %s: %w", node, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return createPods(ctx, kc, nodes)
}

// createDrainNamespace creates drainNamespace unless it exists.
func createDrainNamespace(ctx context.Context, kc kubernetes.Interface) error {
	_, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: drainNamespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", drainNamespace, err)
	}
	return nil
}

// createPods gives each of nodes DrainPodsPerNode Running pods in
// drainNamespace, which must exist.
func createPods(ctx context.Context, kc kubernetes.Interface, nodes []string) error {
	zero := int64(0)
	var g errgroup.Group
	g.SetLimit(16)
	for _, node := range nodes {
		for j := range DrainPodsPerNode {
			g.Go(func() error {
				name := fmt.Sprintf("%s-p%d", node, j)
				p := &corev1.Pod{
					ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: drainNamespace, Labels: map[string]string{"app": "trainer"}},
					Spec: corev1.PodSpec{
						NodeName:                      node,
						TerminationGracePeriodSeconds: &zero,
						Containers:                    []corev1.Container{{Name: "c", Image: "busybox"}},
						Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					},
				}
				p, err := kc.CoreV1().Pods(drainNamespace).Create(ctx, p, metav1.CreateOptions{})
				if err != nil {
					return fmt.Errorf("create pod %s: %w", name, err)
				}
				p.Status.Phase = corev1.PodRunning
				if _, err := kc.CoreV1().Pods(drainNamespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
					return fmt.Errorf("pod %s Running: %w", name, err)
				}
				return nil
			})
		}
	}
	return g.Wait()
}

// podsLeft counts the pods of nodes from..from+n still on the apiserver.
func podsLeft(ctx context.Context, kc kubernetes.Interface, from, n int) (int, error) {
	l, err := kc.CoreV1().Pods(drainNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("list pods: %w", err)
	}
	in := map[string]bool{}
	for _, node := range nodeNames(from, n) {
		in[node] = true
	}
	left := 0
	for _, p := range l.Items {
		if in[p.Spec.NodeName] {
			left++
		}
	}
	return left, nil
}

// drainCeiling: the evictions alone, made by the test through the latency
// proxy for m fresh nodes' pods, ceilingInFlight at once and no client
// rate limit: what the apiserver behind the proxy sustains on this machine
// without the drain's other requests (get node, list pods, two state
// patches per step) or its client QPS.
func drainCeiling(ctx context.Context, k *testenv.Kube, proxy *LatencyProxy, pw *PodWatch, r *Report, m int) error {
	const ceilingInFlight = 256
	nodes, kc, err := ceilingNodes(k, proxy, m)
	if err != nil {
		return err
	}
	if err := quarantineWithPods(ctx, k.Client(), nodes); err != nil {
		return err
	}
	d0, _ := pw.Deleted("ceiling-")
	ev0 := proxy.Answers("eviction")
	t0 := time.Now()
	var g errgroup.Group
	g.SetLimit(ceilingInFlight)
	for _, node := range nodes {
		for j := range DrainPodsPerNode {
			g.Go(func() error {
				ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-p%d", node, j), Namespace: drainNamespace}}
				return kc.CoreV1().Pods(drainNamespace).EvictV1(ctx, ev)
			})
		}
	}
	err = g.Wait()
	took := time.Since(t0)
	pods := m * DrainPodsPerNode
	waitFor(ctx, 30*time.Second, func() bool { d, _ := pw.Deleted("ceiling-"); return d-d0 >= pods })
	d, last := pw.Deleted("ceiling-")
	created := proxy.Answers("eviction")["201"] - ev0["201"]
	r.Figure("scale drain ceiling: the test's own evictions through the proxy, %d in flight, no client rate limit: %d of %d answered 201 in %s = %.1f evictions/s; %d pods deleted on the watch, last %s after the start = %.1f pods/s",
		ceilingInFlight, created, pods, took.Round(time.Millisecond), float64(created)/took.Seconds(), d-d0, last.Sub(t0).Round(time.Millisecond), float64(d-d0)/last.Sub(t0).Seconds())
	r.Check(err == nil && created == pods, "ceiling: %d of %d evictions answered 201 (%v)", created, pods, err)
	return nil
}
