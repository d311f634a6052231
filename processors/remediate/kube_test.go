package remediate

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/faultline/faultline/internal/syncbuf"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/drain"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

var testLog = slog.New(slog.NewTextHandler(io.Discard, nil))

const cluster = "c1"

var (
	rebootGVR    = schema.GroupVersionResource{Group: JanitorGroup, Version: "v1alpha1", Resource: "rebootnodes"}
	resetGVR     = schema.GroupVersionResource{Group: JanitorGroup, Version: "v1alpha1", Resource: "gpuresets"}
	terminateGVR = schema.GroupVersionResource{Group: JanitorGroup, Version: "v1alpha1", Resource: "terminatenodes"}
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func newHandler(t testing.TB, cfg Config, k kubernetes.Interface, dyn dynamic.Interface, clk *clock) *Handler {
	t.Helper()
	return newLoggedHandler(t, cfg, k, dyn, clk, testLog)
}

// newLoggedHandler is newHandler logging to log.
func newLoggedHandler(t testing.TB, cfg Config, k kubernetes.Interface, dyn dynamic.Interface, clk *clock, log *slog.Logger) *Handler {
	t.Helper()
	reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	reg.SetClient(cluster, k, false)
	h, err := New(cfg, reg, Options{Log: log, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	reg.SetDynamic(cluster, dyn)
	t.Cleanup(h.Close)
	return h
}

func testConfig() Config {
	c := DefaultConfig()
	c.Identity = "faultline-remediate/test"
	c.Budget = 2
	c.BudgetWindow = time.Hour
	c.Templates = []Template{{
		// Every GPU of the node: no selector.
		Action: "custom:drain-and-flash",
		Object: `apiVersion: janitor.dgxc.nvidia.com/v1alpha1
kind: GPUReset
metadata:
  name: {{ .Name }}
spec:
  nodeName: {{ .NodeName }}
`,
		Group: "flash",
	}, {Action: "custom:terminate", Object: TerminateNodeTemplate, Group: "terminate"}}
	return c
}

// drained is the drain role's result for a drain of node.
func drained(node, drainID, action string, details map[string]string) *kgo.Record {
	d := map[string]string{events.DetailDrainID: drainID}
	for k, v := range details {
		d[k] = v
	}
	a := &faultlinev1.Action{
		Id: "d-" + drainID, Cluster: cluster, Node: node, Role: events.RoleDrain, Kind: events.KindDrain,
		Outcome: events.OutcomeSucceeded, EventIds: []string{"ev-" + drainID}, CheckName: "XID_ERROR_79",
		RecommendedAction: action, Details: d,
	}
	b, _ := events.MarshalAction(a)
	return &kgo.Record{Topic: events.TopicActions, Key: events.Key(cluster, node), Value: b}
}

func handle(t testing.TB, h *Handler, recs ...*kgo.Record) ([]*faultlinev1.Action, []*kgo.Record) {
	t.Helper()
	acts, rq, lane := handleWith(t, h.Handle, recs...)
	if len(lane) > 0 {
		t.Fatalf("%d records to the slow lane", len(lane))
	}
	return acts, rq
}

// handleWith runs one batch through handler and splits its outputs into
// actions, requeues and records handed to the slow lane.
func handleWith(t testing.TB, handler func(context.Context, []*kgo.Record) (pipeline.Result, error), recs ...*kgo.Record) (acts []*faultlinev1.Action, rq, lane []*kgo.Record) {
	t.Helper()
	res, err := handler(context.Background(), recs)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Out {
		switch r.Topic {
		case TopicRequeue:
			rq = append(rq, r)
		case TopicSlow:
			lane = append(lane, r)
		default:
			a, err := events.UnmarshalAction(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			acts = append(acts, a)
		}
	}
	return acts, rq, lane
}

func outcomes(acts []*faultlinev1.Action) string {
	var out []string
	for _, a := range acts {
		out = append(out, a.Kind+"/"+a.Outcome+":"+a.Reason)
	}
	return strings.Join(out, " | ")
}

func list(t testing.TB, dyn dynamic.Interface, gvr schema.GroupVersionResource, node string) []unstructured.Unstructured {
	t.Helper()
	l, err := dyn.Resource(gvr).List(context.Background(), metav1.ListOptions{LabelSelector: LabelNode + "=" + node})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// cond is one status condition: type, status, reason.
type cond [3]string

// setStatus plays the janitor: it writes the resource's status as the
// janitor's controllers do (NVIDIA/NVSentinel janitor/pkg/controller):
// the conditions, startTime, and completionTime when finished (set on
// success and failure alike).
func setStatus(t testing.TB, dyn dynamic.Interface, gvr schema.GroupVersionResource, name string, finished bool, conds ...cond) {
	t.Helper()
	if err := writeStatus(dyn, gvr, name, finished, conds...); err != nil {
		t.Fatal(err)
	}
}

// writeStatus is setStatus returning its error (for other goroutines than
// the test's).
func writeStatus(dyn dynamic.Interface, gvr schema.GroupVersionResource, name string, finished bool, conds ...cond) error {
	o, err := dyn.Resource(gvr).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	now := time.Now().UTC().Format(time.RFC3339)
	var cs []any
	for _, c := range conds {
		cs = append(cs, map[string]any{"type": c[0], "status": c[1], "reason": c[2], "message": "set by the test", "lastTransitionTime": now})
	}
	st := map[string]any{"startTime": now, "conditions": cs}
	if finished {
		st["completionTime"] = now
	}
	o.Object["status"] = st
	_, err = dyn.Resource(gvr).UpdateStatus(context.Background(), o, metav1.UpdateOptions{})
	return err
}

// poll handles a requeue record after a poll interval: the remediation's
// actions and the next requeue records.
func poll(t testing.TB, h *Handler, clk *clock, rq *kgo.Record) ([]*faultlinev1.Action, []*kgo.Record) {
	t.Helper()
	clk.Add(testConfig().PollInterval)
	caughtUp(t, h)
	return handle(t, h, rq)
}

// caughtUp waits until the handler's watches show what the apiserver holds
// (the test's status writes just before a poll; in production a poll
// interval lies between them, and a status the watch has not delivered yet
// is seen a poll later).
func caughtUp(t testing.TB, h *Handler) {
	t.Helper()
	h.caches.mu.Lock()
	watches := maps.Clone(h.caches.byKey)
	h.caches.mu.Unlock()
	for k, rc := range watches {
		cl, err := h.reg.Get(k.cluster)
		if err != nil {
			t.Fatal(err)
		}
		want, err := cl.Dynamic.Resource(k.gvr).List(context.Background(), metav1.ListOptions{LabelSelector: LabelManagedBy + "=faultline"})
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			behind := 0
			for _, o := range want.Items {
				got, ok, _ := rc.inf.GetIndexer().GetByKey(o.GetName())
				if u, isU := got.(*unstructured.Unstructured); !ok || !isU || u.GetResourceVersion() != o.GetResourceVersion() {
					behind++
				}
			}
			if rc.inf.HasSynced() && behind == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the watch of %s is %d resources behind after 5s", k.gvr.Resource, behind)
			}
		}
	}
}

func createNode(t testing.TB, k kubernetes.Interface, name string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{events.LabelQuarantined: "true"}}}
	if _, err := k.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestRemediateKube(t *testing.T) {
	if testing.Short() {
		t.Skip("real kube-apiserver test")
	}
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	k := kube.Client()
	dyn, err := dynamic.NewForConfig(kube.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	kube.ApplyCRDs(t, "../../deploy/crds/*.yaml")
	kube.ApplyRBAC(t, "../../deploy/rbac/remediate.yaml")
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	// clientsAs are a typed and a dynamic client acting as user.
	clientsAs := func(t *testing.T, user string) (kubernetes.Interface, dynamic.Interface) {
		as, rc := kube.ClientAs(t, user)
		asDyn, err := dynamic.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		return as, asDyn
	}
	const sa = "system:serviceaccount:faultline:faultline-remediate"

	t.Run("RebootNodeOnceAcrossRetriesAndReplicas", func(t *testing.T) {
		node := "gpu-node-42"
		createNode(t, k, node)
		a := newHandler(t, testConfig(), k, dyn, clk)
		b := newHandler(t, testConfig(), k, dyn, clk)
		rec := drained(node, "drain-1", "REPLACE_VM", nil)
		// Two replicas handle the same result at once, then a retry.
		var wg sync.WaitGroup
		var actsA, actsB []*faultlinev1.Action
		wg.Add(2)
		go func() { defer wg.Done(); actsA, _ = handle(t, a, rec) }()
		go func() { defer wg.Done(); actsB, _ = handle(t, b, rec) }()
		wg.Wait()
		retry, rq := handle(t, a, rec)
		items := list(t, dyn, rebootGVR, node)
		if len(items) != 1 {
			t.Fatalf("want 1 RebootNode, got %d (%s / %s)", len(items), outcomes(actsA), outcomes(actsB))
		}
		rn := items[0]
		if got, _, _ := unstructured.NestedString(rn.Object, "spec", "nodeName"); got != node {
			t.Fatalf("spec.nodeName %q", got)
		}
		if !strings.HasPrefix(rn.GetName(), "maintenance-"+node+"-") {
			t.Fatalf("name %s", rn.GetName())
		}
		if len(retry) != 1 || retry[0].Outcome != events.OutcomeApplied || len(rq) != 1 || actsA[0].Id != retry[0].Id || actsB[0].Id != retry[0].Id {
			t.Fatalf("retry: %s", outcomes(retry))
		}
		// A second fault while the reboot is in progress joins it.
		joined, _ := handle(t, b, drained(node, "drain-2", "RESTART_BM", nil))
		if len(joined) != 1 || joined[0].Outcome != events.OutcomeInProgress || len(list(t, dyn, rebootGVR, node)) != 1 {
			t.Fatalf("second fault: %s", outcomes(joined))
		}
		// The janitor starts it (both conditions Unknown, "Initializing"),
		// then sends the signal: still in progress.
		setStatus(t, dyn, rebootGVR, rn.GetName(), false, cond{"SignalSent", "Unknown", "Initializing"}, cond{"NodeReady", "Unknown", "Initializing"})
		acts, rq := poll(t, a, clk, rq[0])
		if len(acts) != 0 || len(rq) != 1 {
			t.Fatalf("initialized: %s, %d requeued", outcomes(acts), len(rq))
		}
		setStatus(t, dyn, rebootGVR, rn.GetName(), false, cond{"SignalSent", "True", "Succeeded"}, cond{"NodeReady", "Unknown", "Initializing"})
		acts, rq = poll(t, a, clk, rq[0])
		if len(acts) != 0 || len(rq) != 1 {
			t.Fatalf("signal sent: %s, %d requeued", outcomes(acts), len(rq))
		}
		// The node is back: NodeReady=True, completionTime. Success.
		setStatus(t, dyn, rebootGVR, rn.GetName(), true, cond{"SignalSent", "True", "Succeeded"}, cond{"NodeReady", "True", "Succeeded"})
		done, rq2 := poll(t, a, clk, rq[0])
		if len(done) != 1 || done[0].Outcome != events.OutcomeSucceeded || len(rq2) != 0 {
			t.Fatalf("completion: %s", outcomes(done))
		}
	})

	// A cluster whose writes average over slow_cluster, beside a fast
	// one, has its remediations handed to the slow lane before any
	// request (requeue.Lane), the batch not held by them; alone it is
	// stepped in the batch; the lane creates its RebootNode.
	t.Run("SlowClusterGoesToTheLane", func(t *testing.T) {
		for _, n := range []string{"rlane-slow-0", "rlane-slow-1", "rlane-fast-1"} {
			createNode(t, k, n)
		}
		const delay = 1500 * time.Millisecond
		var slowBy atomic.Int64
		slowBy.Store(int64(delay))
		reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
		if _, err := reg.SetConfig("slow", testenv.Delayed(kube.RESTConfig(), &slowBy)); err != nil {
			t.Fatal(err)
		}
		h, err := New(testConfig(), reg, Options{Log: testLog, Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		on := func(c, node string) *kgo.Record {
			a, err := events.UnmarshalAction(drained(node, "lane-"+node, "RESTART_BM", nil).Value)
			if err != nil {
				t.Fatal(err)
			}
			a.Cluster = c
			r, err := pipeline.ActionRecord(a)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		// run hands recs to handler: the nodes it acted on, the records it
		// handed to the lane.
		run := func(handler func(context.Context, []*kgo.Record) (pipeline.Result, error), recs ...*kgo.Record) (acted []string, lane []*kgo.Record) {
			t.Helper()
			acts, _, lane := handleWith(t, handler, recs...)
			for _, a := range acts {
				acted = append(acted, a.Node)
			}
			return acted, lane
		}
		if acted, lane := run(h.Handle, on("slow", "rlane-slow-0")); len(lane) != 0 || !slices.Equal(acted, []string{"rlane-slow-0"}) {
			t.Fatalf("the only cluster: actions for %v, %d records to the lane", acted, len(lane))
		}
		reg.SetClient("fast", k, false)
		reg.SetDynamic("fast", dyn)
		start := time.Now()
		acted, lane := run(h.Handle, on("slow", "rlane-slow-1"), on("fast", "rlane-fast-1"))
		took := time.Since(start)
		if !slices.Equal(acted, []string{"rlane-fast-1"}) || len(lane) != 1 || string(lane[0].Key) != string(events.Key("slow", "rlane-slow-1")) {
			t.Fatalf("beside the slow cluster: actions for %v, %d records to the lane", acted, len(lane))
		}
		if took >= delay {
			t.Fatalf("the batch took %v: the slow cluster held the other's remediation", took.Round(time.Millisecond))
		}
		var m dto.Metric
		if _ = h.m.slowLane.WithLabelValues("slow").Write(&m); m.GetCounter().GetValue() != 1 {
			t.Fatalf("faultline_remediate_slow_lane_handovers_total{cluster=slow} = %v, want 1", m.GetCounter().GetValue())
		}
		if acted, again := run(h.SlowHandler().Handle, lane...); len(again) != 0 || !slices.Contains(acted, "rlane-slow-1") || len(list(t, dyn, rebootGVR, "rlane-slow-1")) != 1 {
			t.Fatalf("the slow lane: actions for %v, %d records to the lane again, %d RebootNodes", acted, len(again), len(list(t, dyn, rebootGVR, "rlane-slow-1")))
		}
		t.Logf("the batch beside the slow cluster took %v", took.Round(time.Millisecond))
	})

	t.Run("JoinRedoneAfterConflict", func(t *testing.T) {
		node := "gpu-node-43"
		createNode(t, k, node)
		a := newHandler(t, testConfig(), k, dyn, clk)
		if acts, _ := handle(t, a, drained(node, "c-1", "RESTART_BM", nil)); len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied {
			t.Fatalf("first fault: %s", outcomes(acts))
		}
		// Another writer changes the RebootNode between the second
		// fault's read and its join.
		b := newHandler(t, testConfig(), k, racedPatch{Interface: dyn, once: &sync.Once{}}, clk)
		joined, _ := handle(t, b, drained(node, "c-2", "RESTART_BM", nil))
		if len(joined) != 1 || joined[0].Outcome != events.OutcomeInProgress {
			t.Fatalf("second fault: %s", outcomes(joined))
		}
		items := list(t, dyn, rebootGVR, node)
		if len(items) != 1 || len(triggersOf(&items[0])) != 2 || items[0].GetLabels()["raced"] != "true" {
			t.Fatalf("%d RebootNodes, triggers %v, labels %v", len(items), triggersOf(&items[0]), items[0].GetLabels())
		}
	})

	// More faults join a reboot in progress than its list keeps; the
	// first one's follow-up (or replay) after the reboot finished must not
	// reboot the node again: it is answered by the reboot it joined. A
	// fault after the reboot is a new remediation.
	t.Run("TrimmedTriggerFollowsItsReboot", func(t *testing.T) {
		node := "gpu-node-44"
		createNode(t, k, node)
		h := newHandler(t, testConfig(), k, dyn, clk)
		at := func(drainID string) *kgo.Record {
			r := drained(node, drainID, "RESTART_BM", nil)
			a, _ := events.UnmarshalAction(r.Value)
			a.Timestamp = timestamppb.New(clk.Now())
			r.Value, _ = events.MarshalAction(a)
			clk.Add(time.Second)
			return r
		}
		first := at("t-0")
		if acts, _ := handle(t, h, first); len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied {
			t.Fatalf("first fault: %s", outcomes(acts))
		}
		for i := 1; i <= maxTriggers; i++ {
			caughtUp(t, h)
			if acts, _ := handle(t, h, at(fmt.Sprintf("t-%d", i))); len(acts) != 1 || acts[0].Outcome != events.OutcomeInProgress {
				t.Fatalf("fault %d: %s", i, outcomes(acts))
			}
		}
		items := list(t, dyn, rebootGVR, node)
		if len(items) != 1 || slices.Contains(triggersOf(&items[0]), "t-0") {
			t.Fatalf("%d RebootNodes, triggers %v: want one, t-0 trimmed", len(items), triggersOf(&items[0]))
		}
		setStatus(t, dyn, rebootGVR, items[0].GetName(), true, cond{"SignalSent", "True", "Succeeded"}, cond{"NodeReady", "True", "Succeeded"})
		clk.Add(time.Minute)
		caughtUp(t, h)
		acts, rq := handle(t, h, first)
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeSucceeded || len(rq) != 0 || len(list(t, dyn, rebootGVR, node)) != 1 {
			t.Fatalf("the trimmed fault again: %s, %d RebootNodes", outcomes(acts), len(list(t, dyn, rebootGVR, node)))
		}
		if acts, _ := handle(t, h, at("t-new")); len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || len(list(t, dyn, rebootGVR, node)) != 2 {
			t.Fatalf("a fault after the reboot: %s", outcomes(acts))
		}
	})

	t.Run("EscalationAfterBudget", func(t *testing.T) {
		node := "flaky-1"
		createNode(t, k, node)
		h := newHandler(t, testConfig(), k, dyn, clk) // budget 2 per hour
		for i, id := range []string{"b1", "b2"} {
			acts, _ := handle(t, h, drained(node, id, "RESTART_VM", nil))
			if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied {
				t.Fatalf("reboot %d: %s", i+1, outcomes(acts))
			}
			for _, it := range list(t, dyn, rebootGVR, node) {
				setStatus(t, dyn, rebootGVR, it.GetName(), true, cond{"SignalSent", "True", "Succeeded"}, cond{"NodeReady", "True", "Succeeded"})
			}
			clk.Add(10 * time.Minute)
		}
		acts, rq := handle(t, h, drained(node, "b3", "RESTART_VM", nil))
		if len(acts) != 1 || acts[0].Kind != events.KindEscalate || acts[0].RecommendedAction != "CONTACT_SUPPORT" || len(rq) != 0 {
			t.Fatalf("third fault: %s", outcomes(acts))
		}
		if n := len(list(t, dyn, rebootGVR, node)); n != 2 {
			t.Fatalf("%d RebootNodes, want 2", n)
		}
		n, _ := k.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if !strings.Contains(n.Annotations[AnnotationEscalated], "budget spent") {
			t.Fatalf("node annotation %q", n.Annotations[AnnotationEscalated])
		}
		// After the window the budget is free again.
		clk.Add(time.Hour)
		acts, _ = handle(t, h, drained(node, "b4", "RESTART_VM", nil))
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied {
			t.Fatalf("after the window: %s", outcomes(acts))
		}
	})

	t.Run("FailedRemediationEscalates", func(t *testing.T) {
		// The janitor's failures of a reboot (rebootnode_controller.go):
		// NodeReady=False (Timeout, MaxRetriesExceeded, Failed) or
		// SignalSent=False (Failed), each with completionTime.
		for _, tc := range []struct {
			node, why string
			conds     []cond
		}{
			{"broken-timeout", "NodeReady=False Timeout", []cond{{"SignalSent", "True", "Succeeded"}, {"NodeReady", "False", "Timeout"}}},
			{"broken-retries", "NodeReady=False MaxRetriesExceeded", []cond{{"SignalSent", "True", "Succeeded"}, {"NodeReady", "False", "MaxRetriesExceeded"}}},
			{"broken-signal", "SignalSent=False Failed", []cond{{"SignalSent", "False", "Failed"}, {"NodeReady", "Unknown", "Initializing"}}},
		} {
			t.Run(tc.node, func(t *testing.T) {
				node := tc.node
				createNode(t, k, node)
				h := newHandler(t, testConfig(), k, dyn, clk)
				_, rq := handle(t, h, drained(node, "f1", "RESTART_VM", nil))
				items := list(t, dyn, rebootGVR, node)
				setStatus(t, dyn, rebootGVR, items[0].GetName(), true, tc.conds...)
				acts, _ := poll(t, h, clk, rq[0])
				if len(acts) != 2 || acts[0].Outcome != events.OutcomeFailed || acts[1].Kind != events.KindEscalate {
					t.Fatalf("failed reboot: %s", outcomes(acts))
				}
				if !strings.Contains(acts[0].Reason, tc.why) {
					t.Fatalf("reason %q does not say why", acts[0].Reason)
				}
				// The next fault is escalated too, without another reboot.
				acts, _ = handle(t, h, drained(node, "f2", "RESTART_VM", nil))
				if len(acts) != 1 || acts[0].Kind != events.KindEscalate || len(list(t, dyn, rebootGVR, node)) != 1 {
					t.Fatalf("fault after a failed reboot: %s", outcomes(acts))
				}
			})
		}
	})

	// A node name outlives its machine: on AWS the private DNS name of an
	// IP a REPLACE_VM'd instance's replacement is often given, on premises
	// a replaced server's hostname. The old machine's resources under the
	// name (its last reboot failed: it was replaced for that; or it spent
	// the budget) must not escalate the new machine's first fault.
	t.Run("ReplacedMachineStartsAfresh", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			old  []cond // the old machine's reboots' results, in order
		}{
			{"its last reboot failed", []cond{{"NodeReady", "False", "Timeout"}}},
			{"it spent the budget", []cond{{"NodeReady", "True", "Succeeded"}, {"NodeReady", "True", "Succeeded"}}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				node := "reused-" + strings.ReplaceAll(tc.name, " ", "-")
				createNode(t, k, node)
				h := newHandler(t, testConfig(), k, dyn, clk) // budget 2 per hour
				for i, c := range tc.old {
					id := fmt.Sprintf("old%d", i)
					acts, _ := handle(t, h, drained(node, id, "RESTART_VM", nil))
					if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied {
						t.Fatalf("old machine's reboot %d: %s", i+1, outcomes(acts))
					}
					items := list(t, dyn, rebootGVR, node)
					setStatus(t, dyn, rebootGVR, items[len(items)-1].GetName(), true, cond{"SignalSent", "True", "Succeeded"}, c)
					clk.Add(5 * time.Minute)
				}
				// Replaced: its Node deleted, the new machine registers
				// one under the name. The drain's result says when (the
				// apiserver's creationTimestamp; here on the test's clock,
				// which the resources' created-at annotations are on).
				if err := k.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				createNode(t, k, node)
				clk.Add(5 * time.Minute)
				created := clk.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
				acts, rq := handle(t, h, drained(node, "new1", "RESTART_VM", map[string]string{events.DetailNodeCreated: created}))
				if len(acts) != 1 || acts[0].Kind != events.KindRemediate || acts[0].Outcome != events.OutcomeApplied || len(rq) != 1 {
					t.Fatalf("the new machine's first fault (node created %s): %s, want remediate/applied (a reboot of its own)", created, outcomes(acts))
				}
				if n := len(list(t, dyn, rebootGVR, node)); n != len(tc.old)+1 {
					t.Fatalf("%d RebootNodes, want %d", n, len(tc.old)+1)
				}
			})
		}
	})

	t.Run("RefusedNotDrainedIsCancelled", func(t *testing.T) {
		// The janitor held the RebootNode (a slot, its cooldown), the
		// fault recovered meanwhile and the quarantine lifted the node:
		// the janitor refuses it, no signal sent (janitor.go start:
		// SignalSent=False/NotDrained, NodeReady=False/NotDrained,
		// completionTime). Not a failure: no escalation, the node's next
		// faults are rebooted, and it spends no budget (2 here).
		node := "lifted-1"
		createNode(t, k, node)
		h := newHandler(t, testConfig(), k, dyn, clk)
		notDrained := []cond{{"SignalSent", "False", "NotDrained"}, {"NodeReady", "False", "NotDrained"}}
		for i, f := range []string{"l1", "l2", "l3"} {
			acts, rq := handle(t, h, drained(node, f, "RESTART_VM", nil))
			items := list(t, dyn, rebootGVR, node)
			if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || len(items) != i+1 {
				t.Fatalf("fault %s after %d refused reboots: %s (%d RebootNodes)", f, i, outcomes(acts), len(items))
			}
			sort.Slice(items, func(a, b int) bool { return createdAt(&items[a]).Before(createdAt(&items[b])) })
			setStatus(t, dyn, rebootGVR, items[i].GetName(), true, notDrained...)
			acts, rq = poll(t, h, clk, rq[0])
			if len(acts) != 1 || acts[0].Kind != events.KindRemediate || acts[0].Outcome != events.OutcomeCancelled || len(rq) != 0 ||
				!strings.Contains(acts[0].Reason, "SignalSent=False NotDrained") {
				t.Fatalf("reboot %s refused NotDrained: %s", f, outcomes(acts))
			}
		}
		n, err := k.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := n.Annotations[AnnotationEscalated]; ok {
			t.Fatalf("node escalated: %s", v)
		}
		// A genuine failure after them still escalates.
		_, rq := handle(t, h, drained(node, "l4", "RESTART_VM", nil))
		items := list(t, dyn, rebootGVR, node)
		sort.Slice(items, func(a, b int) bool { return createdAt(&items[a]).Before(createdAt(&items[b])) })
		setStatus(t, dyn, rebootGVR, items[len(items)-1].GetName(), true, cond{"SignalSent", "True", "Succeeded"}, cond{"NodeReady", "False", "Timeout"})
		if acts, _ := poll(t, h, clk, rq[0]); len(acts) != 2 || acts[1].Kind != events.KindEscalate {
			t.Fatalf("failed reboot after refused ones: %s", outcomes(acts))
		}
	})

	t.Run("RefusedEscalatedIsCancelled", func(t *testing.T) {
		// A GPUReset queued on the node (a slot, its cooldown) when the
		// node is escalated (here a CONTACT_SUPPORT event): the janitor
		// refuses it unstarted, Complete=True/Escalated. Not a failure:
		// read as one, it escalated the node again (a newer time on the
		// annotation, refusing the node's next queued resource in turn),
		// and the group escalated every later fault instead of resetting.
		node := "escalated-1"
		createNode(t, k, node)
		h := newHandler(t, testConfig(), k, dyn, clk)
		gpu := map[string]string{events.DetailEntities: "GPU=GPU-0a1b2c3d-0000-1111-2222-333344449999"}
		acts, rq := handle(t, h, drained(node, "e1", "COMPONENT_RESET", gpu))
		items := list(t, dyn, resetGVR, node)
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || len(items) != 1 {
			t.Fatalf("reset: %s", outcomes(acts))
		}
		clk.Add(time.Minute)
		if acts, _ := handle(t, h, drained(node, "e2", "CONTACT_SUPPORT", nil)); len(acts) != 1 || acts[0].Kind != events.KindEscalate {
			t.Fatalf("CONTACT_SUPPORT: %s", outcomes(acts))
		}
		escalated := func() string {
			n, err := k.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return n.Annotations[AnnotationEscalated]
		}
		mark := escalated()
		setStatus(t, dyn, resetGVR, items[0].GetName(), true, cond{"Complete", "True", "Escalated"})
		clk.Add(time.Minute)
		acts, rq = poll(t, h, clk, rq[0])
		if len(acts) != 1 || acts[0].Kind != events.KindRemediate || acts[0].Outcome != events.OutcomeCancelled || len(rq) != 0 ||
			!strings.Contains(acts[0].Reason, "Complete=True Escalated") {
			t.Fatalf("reset refused Escalated: %s", outcomes(acts))
		}
		if now := escalated(); now != mark {
			t.Fatalf("node escalated again: %q, was %q", now, mark)
		}
		// The human lifted the node: its next fault is reset, not escalated.
		acts, _ = handle(t, h, drained(node, "e3", "COMPONENT_RESET", gpu))
		if n := len(list(t, dyn, resetGVR, node)); len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || n != 2 {
			t.Fatalf("next fault after a reset refused Escalated: %s (%d GPUResets, want 2)", outcomes(acts), n)
		}
	})

	t.Run("LateRepeatFollowsTheReboot", func(t *testing.T) {
		// An Xid flood: repeats generated before the reboot reach the
		// pipeline after it, from the agent's spool once the node is back;
		// decided after the first drain had finished, they start a new
		// drain whose result comes long after the first RebootNode's
		// covers-until. Generated before that reboot was created, the
		// reboot answers them: no second reboot. A fault generated after
		// it is remediated again.
		node := "flood-1"
		createNode(t, k, node)
		h := newHandler(t, testConfig(), k, dyn, clk)
		at := func(r *kgo.Record, generated time.Time) *kgo.Record {
			a, err := events.UnmarshalAction(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			a.Timestamp = timestamppb.New(clk.Now())
			a.Details[events.DetailGeneratedAt] = generated.UTC().Format(time.RFC3339Nano)
			r.Value, _ = events.MarshalAction(a)
			return r
		}
		first := clk.Now().Add(-2 * time.Minute)
		acts, rq := handle(t, h, at(drained(node, "fl1", "RESTART_BM", nil), first))
		items := list(t, dyn, rebootGVR, node)
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || len(items) != 1 {
			t.Fatalf("first fault: %s", outcomes(acts))
		}
		rebootAt := createdAt(&items[0])
		setStatus(t, dyn, rebootGVR, items[0].GetName(), true, cond{"SignalSent", "True", "Succeeded"}, cond{"NodeReady", "True", "Succeeded"})
		if acts, _ = poll(t, h, clk, rq[0]); len(acts) != 1 || acts[0].Outcome != events.OutcomeSucceeded {
			t.Fatalf("reboot: %s", outcomes(acts))
		}
		clk.Add(10 * time.Minute) // the node is back; its spool is sent
		acts, _ = handle(t, h, at(drained(node, "fl2", "RESTART_BM", nil), rebootAt.Add(-time.Second)))
		if n := len(list(t, dyn, rebootGVR, node)); len(acts) != 1 || acts[0].Outcome != events.OutcomeSucceeded ||
			acts[0].Details[events.DetailResource] != "RebootNode/"+items[0].GetName() || n != 1 {
			t.Fatalf("repeat generated before the reboot, drained after it: %s (%d RebootNodes, want 1)", outcomes(acts), n)
		}
		acts, _ = handle(t, h, at(drained(node, "fl3", "RESTART_BM", nil), rebootAt.Add(time.Second)))
		if n := len(list(t, dyn, rebootGVR, node)); len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || n != 2 {
			t.Fatalf("fault generated after the reboot began: %s (%d RebootNodes, want 2)", outcomes(acts), n)
		}
	})

	t.Run("GPUResetCustomAndNone", func(t *testing.T) {
		node := "reset-1"
		createNode(t, k, node)
		h := newHandler(t, testConfig(), k, dyn, clk)
		gpu := "GPU-0a1b2c3d-0000-1111-2222-333344445555"
		acts, rq := handle(t, h, drained(node, "r1", "COMPONENT_RESET", map[string]string{events.DetailEntities: "GPU=" + gpu}))
		items := list(t, dyn, resetGVR, node)
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || len(items) != 1 {
			t.Fatalf("reset: %s", outcomes(acts))
		}
		if g, _, _ := unstructured.NestedStringSlice(items[0].Object, "spec", "selector", "uuids"); len(g) != 1 || g[0] != gpu {
			t.Fatalf("spec.selector.uuids %v", g)
		}
		// The janitor's steps (gpureset_controller.go) are not the result,
		// not even a failed reset job before the services are restored.
		reset := items[0].GetName()
		for _, step := range [][]cond{
			{{"Ready", "False", "Pending"}},
			{{"Ready", "True", "ReadyForReset"}, {"ServicesTornDown", "True", "Skipped"}, {"ResetJobCreated", "True", "ResetJobCreationSucceeded"}, {"ResetJobCompleted", "False", "ResetJobRunning"}},
			{{"Ready", "True", "ReadyForReset"}, {"ResetJobCompleted", "True", "ResetJobFailed"}, {"ServicesRestored", "False", "RestoringServices"}},
		} {
			setStatus(t, dyn, resetGVR, reset, false, step...)
			if acts, rq = poll(t, h, clk, rq[0]); len(acts) != 0 || len(rq) != 1 {
				t.Fatalf("step %v: %s", step, outcomes(acts))
			}
		}
		// The result: Complete=True with a failure reason, completionTime.
		setStatus(t, dyn, resetGVR, reset, true, cond{"ResetJobCompleted", "True", "ResetJobFailed"}, cond{"Complete", "True", "ResetJobFailed"})
		acts, _ = poll(t, h, clk, rq[0])
		if len(acts) != 2 || acts[0].Outcome != events.OutcomeFailed || !strings.Contains(acts[0].Reason, "Complete=True ResetJobFailed") || acts[1].Kind != events.KindEscalate {
			t.Fatalf("failed reset: %s", outcomes(acts))
		}

		acts, rq = handle(t, h, drained(node, "r2", "CUSTOM", map[string]string{events.DetailCustomAction: "drain-and-flash"}))
		items = list(t, dyn, resetGVR, node)
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || len(items) != 2 {
			t.Fatalf("custom: %s", outcomes(acts))
		}
		for _, it := range items {
			if it.GetLabels()[LabelGroup] != "flash" {
				continue
			}
			if _, ok := it.Object["spec"].(map[string]any)["selector"]; ok {
				t.Fatalf("custom reset has a selector: %v", it.Object["spec"])
			}
			// Success: Complete=True, GPUResetSucceeded.
			setStatus(t, dyn, resetGVR, it.GetName(), true, cond{"ServicesRestored", "True", "ServiceRestoreSucceeded"}, cond{"Complete", "True", "GPUResetSucceeded"})
		}
		if acts, _ = poll(t, h, clk, rq[0]); len(acts) != 1 || acts[0].Outcome != events.OutcomeSucceeded {
			t.Fatalf("custom reset done: %s", outcomes(acts))
		}
		acts, _ = handle(t, h, drained(node, "r3", "NONE", nil))
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeSkipped || len(list(t, dyn, rebootGVR, node)) != 0 {
			t.Fatalf("NONE: %s", outcomes(acts))
		}
	})

	// A fault that names its GPU by PCI address (the fabric agent's
	// gpuIDByPCI fallback) or index, not UUID: the GPUReset is of every
	// GPU of the drained node. Its address in spec.selector.uuids was
	// refused by the CRD (422): remediate/failed alone, the node left
	// cordoned, its GPU never reset, nobody told.
	t.Run("GPUResetOfAGPUNamedByPCI", func(t *testing.T) {
		for i, ents := range []string{"GPU=0000:18:00,NVSwitch=0000:05:00", "GPU=index:3", "GPU=3"} {
			node := "reset-pci-" + strconv.Itoa(i)
			createNode(t, k, node)
			h := newHandler(t, testConfig(), k, dyn, clk)
			acts, rq := handle(t, h, drained(node, "p1", "COMPONENT_RESET", map[string]string{events.DetailEntities: ents}))
			items := list(t, dyn, resetGVR, node)
			if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || len(items) != 1 || len(rq) != 1 {
				t.Fatalf("%s: %s, %d GPUResets", ents, outcomes(acts), len(items))
			}
			if sel, ok := items[0].Object["spec"].(map[string]any)["selector"]; ok {
				t.Fatalf("%s: spec.selector %v, want none (every GPU)", ents, sel)
			}
			if v, ok := items[0].GetAnnotations()[AnnotationGPUs]; !ok || v != "" {
				t.Fatalf("%s: %s %q, want empty (every GPU)", ents, AnnotationGPUs, v)
			}
		}
	})

	// A resource the apiserver refuses for good — its schema (Invalid) or
	// its CRD missing (NotFound) — or a template that does not render for
	// the fault escalates the node: trying again changes nothing, and it
	// stays cordoned and drained.
	t.Run("UncreatableResourceEscalates", func(t *testing.T) {
		cfg := testConfig()
		cfg.Templates = append(cfg.Templates, Template{Action: "custom:bad-selector", Group: "bad", Object: `apiVersion: janitor.dgxc.nvidia.com/v1alpha1
kind: GPUReset
metadata:
  name: {{ .Name }}
spec:
  nodeName: {{ .NodeName }}
  selector:
    uuids: ["0000:18:00"]
`}, Template{Action: "custom:no-crd", Group: "nocrd", Object: `apiVersion: janitor.dgxc.nvidia.com/v1alpha1
kind: GPUFlash
metadata:
  name: {{ .Name }}
spec:
  nodeName: {{ .NodeName }}
`}, Template{Action: "custom:bad-render", Group: "badrender", Object: `apiVersion: janitor.dgxc.nvidia.com/v1alpha1
kind: GPUReset
metadata:
  name: {{ .Name }}
spec:
  nodeName: {{ .NodeName }}
  selector:
    uuids: [{{ index .GPUs 0 | quote }}]
`})
		for _, tc := range []struct{ action, want string }{{"bad-selector", "Invalid"}, {"no-crd", "not find"}, {"bad-render", "template:"}} {
			node := "uncreatable-" + tc.action
			createNode(t, k, node)
			h := newHandler(t, cfg, k, dyn, clk)
			acts, rq := handle(t, h, drained(node, "u1", "CUSTOM", map[string]string{events.DetailCustomAction: tc.action}))
			if len(acts) != 2 || acts[0].Outcome != events.OutcomeFailed || !strings.Contains(acts[0].Reason, tc.want) ||
				acts[1].Kind != events.KindEscalate || acts[1].Outcome != events.OutcomeApplied || len(rq) != 0 {
				t.Fatalf("%s: %s, %d requeued", tc.action, outcomes(acts), len(rq))
			}
			n, err := k.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(n.GetAnnotations()[AnnotationEscalated], "cannot be created") {
				t.Fatalf("%s: node annotation %q", tc.action, n.GetAnnotations()[AnnotationEscalated])
			}
		}
	})

	// A GPU's reset does not join a reset of other GPUs in progress (its
	// selector names only those): it waits for it to finish and is then
	// created. Joining it answered the second GPU's fault with the first
	// GPU's reset: remediate/succeeded, the second GPU never reset.
	t.Run("GPUResetOfOtherGPUsWaits", func(t *testing.T) {
		node := "reset-2"
		createNode(t, k, node)
		h := newHandler(t, testConfig(), k, dyn, clk)
		gpuA, gpuB := "GPU-aaaaaaaa-0000-1111-2222-333344445555", "GPU-bbbbbbbb-0000-1111-2222-333344445555"
		acts, rqA := handle(t, h, drained(node, "ga", "COMPONENT_RESET", map[string]string{events.DetailEntities: "GPU=" + gpuA}))
		items := list(t, dyn, resetGVR, node)
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || len(items) != 1 {
			t.Fatalf("GPU A: %s", outcomes(acts))
		}
		resetA := items[0].GetName()
		caughtUp(t, h)
		acts, rqB := handle(t, h, drained(node, "gb", "COMPONENT_RESET", map[string]string{events.DetailEntities: "GPU=" + gpuB}))
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeInProgress || strings.Contains(acts[0].Reason, "joined") || len(rqB) != 1 {
			t.Fatalf("GPU B while GPU A's reset is in progress: %s", outcomes(acts))
		}
		if trs := triggersOf(&list(t, dyn, resetGVR, node)[0]); len(trs) != 1 {
			t.Fatalf("GPU B joined GPU A's reset: triggers %v", trs)
		}
		if acts, rqB = poll(t, h, clk, rqB[0]); len(acts) != 0 || len(rqB) != 1 || len(list(t, dyn, resetGVR, node)) != 1 {
			t.Fatalf("GPU B's poll while A's reset runs: %s", outcomes(acts))
		}
		setStatus(t, dyn, resetGVR, resetA, true, cond{"ServicesRestored", "True", "ServiceRestoreSucceeded"}, cond{"Complete", "True", "GPUResetSucceeded"})
		if acts, _ = poll(t, h, clk, rqA[0]); len(acts) != 1 || acts[0].Outcome != events.OutcomeSucceeded {
			t.Fatalf("GPU A's reset done: %s", outcomes(acts))
		}
		acts, _ = poll(t, h, clk, rqB[0])
		items = list(t, dyn, resetGVR, node)
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || len(items) != 2 {
			t.Fatalf("GPU B after A's reset: %s, %d resets", outcomes(acts), len(items))
		}
		for _, it := range items {
			if it.GetName() == resetA {
				continue
			}
			if g, _, _ := unstructured.NestedStringSlice(it.Object, "spec", "selector", "uuids"); len(g) != 1 || g[0] != gpuB {
				t.Fatalf("GPU B's reset: spec.selector.uuids %v", g)
			}
		}
	})

	// Client strings in a custom template stay strings where it put them
	// (the check name of the security review cannot set force: true nor
	// retarget the reboot), and an object that names another node is
	// refused with an audit action, nothing created.
	t.Run("HostileValuesStayValues", func(t *testing.T) {
		node := "hostile-1"
		createNode(t, k, node)
		cfg := testConfig()
		cfg.Templates = append(cfg.Templates,
			Template{Action: "custom:reason", Object: reasonTemplate, Group: "reason"},
			Template{Action: "custom:annotated", Object: annotatedTemplate, Group: "annotated"},
			Template{Action: "custom:suffix", Group: "suffix", Object: "apiVersion: janitor.dgxc.nvidia.com/v1alpha1\nkind: RebootNode\n" +
				"metadata: {name: {{ .Name }}}\nspec:\n  nodeName: {{ .NodeName }}{{ index .Details \"suffix\" }}\n  force: false\n"})
		h := newHandler(t, cfg, k, dyn, clk)
		hostile := func(id, custom string, details map[string]string) *kgo.Record {
			d := map[string]string{events.DetailDrainID: id, events.DetailCustomAction: custom}
			for k, v := range details {
				d[k] = v
			}
			a := &faultlinev1.Action{
				Id: "d-" + id, Cluster: cluster, Node: node, Role: events.RoleDrain, Kind: events.KindDrain, Outcome: events.OutcomeSucceeded,
				EventIds: []string{"ev-" + id}, CheckName: hostileCheck, RecommendedAction: "CUSTOM", Details: d,
			}
			b, _ := events.MarshalAction(a)
			return &kgo.Record{Topic: events.TopicActions, Key: events.Key(cluster, node), Value: b}
		}
		acts, _ := handle(t, h, hostile("h1", "reason", nil))
		items := list(t, dyn, rebootGVR, node)
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || len(items) != 1 {
			t.Fatalf("hostile check name: %s, %d RebootNodes", outcomes(acts), len(items))
		}
		// (The CRD prunes spec.reason; what matters is what stayed.)
		spec := items[0].Object["spec"].(map[string]any)
		if spec["nodeName"] != node || spec["force"] != false {
			t.Fatalf("RebootNode spec %v", spec)
		}
		acts, _ = handle(t, h, hostile("h0", "annotated", map[string]string{events.DetailEntities: "GPU=GPU-1\"\n  nodeName: victim"}))
		var annotated *unstructured.Unstructured
		for _, it := range list(t, dyn, rebootGVR, node) {
			if it.GetLabels()[LabelGroup] == "annotated" {
				annotated = &it
			}
		}
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || annotated == nil {
			t.Fatalf("annotated: %s", outcomes(acts))
		}
		if ann := annotated.GetAnnotations(); ann["example.com/check"] != hostileCheck || ann["example.com/entities"] != "GPU=GPU-1\"\n  nodeName: victim" ||
			annotated.Object["spec"].(map[string]any)["nodeName"] != node || annotated.Object["spec"].(map[string]any)["force"] != false {
			t.Fatalf("annotated RebootNode %v", annotated.Object)
		}
		acts, _ = handle(t, h, hostile("h2", "suffix", map[string]string{"suffix": "-victim"}))
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeRefused || !strings.Contains(acts[0].Reason, `spec.nodeName is "hostile-1-victim"`) {
			t.Fatalf("retargeted object: %s", outcomes(acts))
		}
		if n := len(list(t, dyn, rebootGVR, node)); n != 2 {
			t.Fatalf("%d RebootNodes after the refusal, want 2", n)
		}
		l, err := dyn.Resource(rebootGVR).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range l.Items {
			if n, _, _ := unstructured.NestedString(it.Object, "spec", "nodeName"); n == node+"-victim" {
				t.Fatalf("a RebootNode for %s was created", n)
			}
		}
	})

	// The role as the ServiceAccount of deploy/rbac/remediate.yaml: create,
	// join, and escalate work, and nothing it does not call is granted.
	t.Run("RBACIsEnough", func(t *testing.T) {
		node := "rbac-1"
		createNode(t, k, node)
		as, asDyn := clientsAs(t, sa)
		cfg := testConfig()
		cfg.Budget = 1
		h := newHandler(t, cfg, as, asDyn, clk)
		acts, _ := handle(t, h, drained(node, "rb1", "RESTART_VM", nil))
		joined, _ := handle(t, h, drained(node, "rb2", "RESTART_VM", nil))
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || len(joined) != 1 || joined[0].Outcome != events.OutcomeInProgress {
			t.Fatalf("create and join: %s / %s", outcomes(acts), outcomes(joined))
		}
		for _, it := range list(t, dyn, rebootGVR, node) {
			setStatus(t, dyn, rebootGVR, it.GetName(), true, cond{"SignalSent", "True", "Succeeded"}, cond{"NodeReady", "True", "Succeeded"})
		}
		esc, _ := handle(t, h, drained(node, "rb3", "RESTART_VM", nil))
		n, _ := k.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if len(esc) != 1 || esc[0].Kind != events.KindEscalate || n.Annotations[AnnotationEscalated] == "" {
			t.Fatalf("escalation: %s", outcomes(esc))
		}
		caughtUp(t, h) // its watch works as its ServiceAccount
		for _, tc := range []struct {
			a    testenv.Access
			want bool
		}{
			{testenv.Access{Verb: "create", Group: JanitorGroup, Resource: "rebootnodes"}, true},
			{testenv.Access{Verb: "patch", Group: JanitorGroup, Resource: "gpuresets"}, true},
			{testenv.Access{Verb: "delete", Group: JanitorGroup, Resource: "rebootnodes"}, true},
			{testenv.Access{Verb: "deletecollection", Group: JanitorGroup, Resource: "rebootnodes"}, false},
			{testenv.Access{Verb: "update", Group: JanitorGroup, Resource: "rebootnodes"}, false},
			{testenv.Access{Verb: "watch", Group: JanitorGroup, Resource: "rebootnodes"}, true},
			{testenv.Access{Verb: "create", Group: JanitorGroup, Resource: "terminatenodes"}, false},
			{testenv.Access{Verb: "patch", Resource: "nodes"}, true},
			{testenv.Access{Verb: "get", Resource: "nodes"}, true}, // a failure already escalated is not stamped again
			{testenv.Access{Verb: "update", Resource: "nodes"}, false},
			{testenv.Access{Verb: "list", Resource: "pods"}, false},
		} {
			if got := kube.Allowed(t, sa, tc.a); got != tc.want {
				t.Errorf("%+v: allowed %v, want %v", tc.a, got, tc.want)
			}
		}
	})

	t.Run("OldFinishedPruned", func(t *testing.T) {
		// As the role's ServiceAccount: a finished RebootNode older than
		// the retention goes once a newer one exists; the newest stays
		// (also when old, also when failed); names are never used again; a
		// trigger older than the retention is not acted on.
		node := "pruned-1"
		createNode(t, k, node)
		// The handler's deletes lose their answers while lose is set.
		as, rc := kube.ClientAs(t, sa)
		lose := &answerLost{}
		rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { lose.rt = rt; return lose })
		asDyn, err := dynamic.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		cfg := testConfig()
		cfg.Retention = 48 * time.Hour
		h := newHandler(t, cfg, as, asDyn, clk)
		names := func() []string {
			var out []string
			for _, it := range list(t, dyn, rebootGVR, node) {
				out = append(out, it.GetName())
			}
			sort.Strings(out)
			return out
		}
		sent := clk.Now() // the first trigger's time
		// remediate runs the node's next remediation (#seq) to done (ok
		// or failed): the actions of its fault and of the poll that saw
		// it done, as "kind/outcome resource".
		remediate := func(id string, seq int, ok bool) string {
			t.Helper()
			caughtUp(t, h)
			acts, rq := handle(t, h, drained(node, id, "RESTART_VM", nil))
			name := h.name(node, "reboot", seq)
			if len(acts) == 0 || acts[0].Details[events.DetailResource] != "RebootNode/"+name || len(rq) != 1 {
				t.Fatalf("fault %s, want RebootNode #%d: %s", id, seq, outcomes(acts))
			}
			o, err := dyn.Resource(rebootGVR).Get(context.Background(), name, metav1.GetOptions{})
			if err != nil || o.GetAnnotations()[AnnotationSeq] != strconv.Itoa(seq) {
				t.Fatalf("RebootNode #%d: %v %v", seq, err, o.GetAnnotations())
			}
			result := cond{"NodeReady", "True", "Succeeded"}
			if !ok {
				result = cond{"NodeReady", "False", "Timeout"}
			}
			setStatus(t, dyn, rebootGVR, name, true, cond{"SignalSent", "True", "Succeeded"}, result)
			polled, _ := poll(t, h, clk, rq[0])
			var out []string
			for _, a := range append(acts, polled...) {
				r := a.Details[events.DetailResource]
				for i := 1; i < 10; i++ {
					r = strings.Replace(r, h.name(node, "reboot", i), "#"+strconv.Itoa(i), 1)
				}
				out = append(out, a.Kind+"/"+a.Outcome+" "+r)
			}
			return strings.Join(out, ", ")
		}
		// Each step: the clock moved by after, #seq run to done (ok or
		// failed), its actions, and the RebootNodes left.
		for _, st := range []struct {
			after time.Duration
			seq   int
			ok    bool
			lose  bool // the prunes' deletes lose their answers
			want  string
			left  []int
		}{
			{0, 1, true, false, "remediate/applied RebootNode/#1, remediate/succeeded RebootNode/#1", []int{1}},
			// #1 is past the retention but the newest at #2's fault:
			// kept; pruned at #2's poll.
			{49 * time.Hour, 2, true, false, "remediate/applied RebootNode/#2, remediate/succeeded RebootNode/#2, prune/applied RebootNode/#1", []int{2}},
			// #3 is the node's third, though one RebootNode is left.
			{time.Hour, 3, true, false, "remediate/applied RebootNode/#3, remediate/succeeded RebootNode/#3", []int{2, 3}},
			// #4's fault prunes #2, its poll #3 (old, no longer the
			// newest); their deletes' answers are lost, and each is said
			// all the same (read again, it is gone).
			{49 * time.Hour, 4, true, true,
				"remediate/applied RebootNode/#4, prune/applied RebootNode/#2, remediate/succeeded RebootNode/#4, prune/applied RebootNode/#3", []int{4}},
			// One RebootNode left: the next is #5, not the pruned #2's
			// name again.
			{time.Hour, 5, false, false, "remediate/applied RebootNode/#5, remediate/failed RebootNode/#5, escalate/applied ", []int{4, 5}},
		} {
			clk.Add(st.after)
			lose.on.Store(st.lose)
			if got := remediate(fmt.Sprintf("p%d", st.seq), st.seq, st.ok); got != st.want {
				t.Fatalf("#%d: %s, want %s", st.seq, got, st.want)
			}
			if lost := lose.lost.Swap(0); st.lose && lost != 2 {
				t.Fatalf("#%d: %d deletes' answers lost, want the two prunes'", st.seq, lost)
			}
			var left []string
			for _, seq := range st.left {
				left = append(left, h.name(node, "reboot", seq))
			}
			sort.Strings(left)
			if got := names(); !slices.Equal(got, left) {
				t.Fatalf("after #%d: RebootNodes %v, want %v (#%v)", st.seq, got, left, st.left)
			}
		}
		// An old failed newest stays: the next fault is escalated, and #4
		// pruned.
		clk.Add(49 * time.Hour)
		caughtUp(t, h)
		acts, _ := handle(t, h, drained(node, "p6", "RESTART_VM", nil))
		if len(acts) != 2 || acts[0].Kind != events.KindEscalate || acts[1].Kind != events.KindPrune || !strings.Contains(acts[1].Reason, h.name(node, "reboot", 4)) {
			t.Fatalf("fault after an old failed reboot: %s", outcomes(acts))
		}
		if got := names(); len(got) != 1 || got[0] != h.name(node, "reboot", 5) {
			t.Fatalf("RebootNodes %v, want only the failed newest #5", got)
		}

		// The first trigger replayed (its RebootNode is gone): skipped.
		first := drained(node, "p1", "RESTART_VM", nil)
		a, err := events.UnmarshalAction(first.Value)
		if err != nil {
			t.Fatal(err)
		}
		a.Timestamp = timestamppb.New(sent)
		first.Value, _ = events.MarshalAction(a)
		if acts, _ = handle(t, h, first); len(acts) != 1 || acts[0].Outcome != events.OutcomeSkipped || !strings.Contains(acts[0].Reason, "older than remediate.retention") {
			t.Fatalf("replayed first trigger: %s", outcomes(acts))
		}
		if got := names(); len(got) != 1 {
			t.Fatalf("RebootNodes %v after the replay", got)
		}
	})

	t.Run("TerminateNode", func(t *testing.T) {
		// terminatenode_controller.go: NodeTerminated=True is success,
		// NodeTerminated=False (Timeout) a failure.
		for _, tc := range []struct {
			node    string
			result  cond
			outcome string
		}{
			{"term-ok", cond{"NodeTerminated", "True", "Succeeded"}, events.OutcomeSucceeded},
			{"term-timeout", cond{"NodeTerminated", "False", "Timeout"}, events.OutcomeFailed},
		} {
			createNode(t, k, tc.node)
			h := newHandler(t, testConfig(), k, dyn, clk)
			acts, rq := handle(t, h, drained(tc.node, "t1", "CUSTOM", map[string]string{events.DetailCustomAction: "terminate"}))
			items := list(t, dyn, terminateGVR, tc.node)
			if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || len(items) != 1 {
				t.Fatalf("%s: %s", tc.node, outcomes(acts))
			}
			setStatus(t, dyn, terminateGVR, items[0].GetName(), false, cond{"SignalSent", "True", "Succeeded"}, cond{"NodeTerminated", "Unknown", "Initializing"})
			if acts, rq = poll(t, h, clk, rq[0]); len(acts) != 0 || len(rq) != 1 {
				t.Fatalf("%s in progress: %s", tc.node, outcomes(acts))
			}
			setStatus(t, dyn, terminateGVR, items[0].GetName(), true, cond{"SignalSent", "True", "Succeeded"}, tc.result)
			if acts, _ = poll(t, h, clk, rq[0]); len(acts) == 0 || acts[0].Outcome != tc.outcome {
				t.Fatalf("%s: %s", tc.node, outcomes(acts))
			}
		}
	})

	// The apiserver takes a create or a join and its answer is lost (the
	// connection cut as it dies): the retry finds the resource its own and
	// says what the lost step did, with the id its answer would have had;
	// a poll after a step that was said says nothing.
	t.Run("LostAnswerSaidByTheRetry", func(t *testing.T) {
		node := "gpu-node-49"
		createNode(t, k, node)
		lost := lostAnswer{Interface: dyn, next: &atomic.Bool{}}
		h := newHandler(t, testConfig(), k, lost, clk)
		for _, tc := range []struct{ drainID, outcome string }{
			{"l-1", events.OutcomeApplied},    // its create
			{"l-2", events.OutcomeInProgress}, // its join
		} {
			lost.next.Store(true)
			acts, rq := handle(t, h, drained(node, tc.drainID, "RESTART_BM", nil))
			if len(acts) != 0 || len(rq) != 1 || lost.next.Load() {
				t.Fatalf("%s, its answer lost: %s, %d requeued", tc.drainID, outcomes(acts), len(rq))
			}
			time.Sleep(700 * time.Millisecond) // the cluster's probe, at most one per 500ms (wall clock)
			acts, rq = handle(t, h, rq[0])
			if len(acts) != 1 || acts[0].Outcome != tc.outcome || len(rq) != 1 {
				t.Fatalf("%s, the retry: %s, %d requeued", tc.drainID, outcomes(acts), len(rq))
			}
			if acts, _ = poll(t, h, clk, rq[0]); len(acts) != 0 {
				t.Fatalf("%s, the poll after: %s", tc.drainID, outcomes(acts))
			}
		}
		if items := list(t, dyn, rebootGVR, node); len(items) != 1 || len(triggersOf(&items[0])) != 2 {
			t.Fatalf("%d RebootNodes", len(items))
		}
	})

	t.Run("PollsReadTheWatch", func(t *testing.T) {
		node := "watched-1"
		createNode(t, k, node)
		lists := &listCounter{}
		cfg := kube.RESTConfig()
		cfg.Wrap(lists.wrap)
		cdyn, err := dynamic.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		h := newHandler(t, testConfig(), k, cdyn, clk)
		acts, rq := handle(t, h, drained(node, "w1", "RESTART_BM", nil))
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || len(rq) != 1 {
			t.Fatalf("fault: %s", outcomes(acts))
		}
		rn := list(t, dyn, rebootGVR, node)[0]
		g := nodeGroup{watchKey: watchKey{cluster: cluster, gvr: rebootGVR}, node: node, group: "reboot"}
		// watched waits until the watch shows the RebootNode as cond says
		// (its own create first: read live until then).
		watched := func(what string, cond func(o *unstructured.Unstructured) bool) {
			t.Helper()
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if items, ok := h.caches.items(cdyn, g); ok && len(items) == 1 && cond(&items[0]) {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("the watch did not show %s within 5s", what)
				}
			}
		}
		watched("the create", func(*unstructured.Unstructured) bool { return true })
		if acts, rq = poll(t, h, clk, rq[0]); len(acts) != 0 || len(rq) != 1 {
			t.Fatalf("in progress: %s", outcomes(acts))
		}
		setStatus(t, dyn, rebootGVR, rn.GetName(), true, cond{"SignalSent", "True", "Succeeded"}, cond{"NodeReady", "True", "Succeeded"})
		watched("the completion", func(o *unstructured.Unstructured) bool { _, ok := o.Object["status"]; return ok })
		if acts, rq = poll(t, h, clk, rq[0]); len(acts) != 1 || acts[0].Outcome != events.OutcomeSucceeded || len(rq) != 0 {
			t.Fatalf("completed: %s", outcomes(acts))
		}
		// One list (the fault's, before the watch synced); the two polls
		// read the watch.
		if n := lists.n.Load(); n != 1 {
			t.Fatalf("%d list requests by label, want 1 (reads: %v live, %v from the watch)", n, reads(h, "live"), reads(h, "watch"))
		}
		if n := reads(h, "watch"); n != 2 {
			t.Fatalf("%v reads from the watch, want 2", n)
		}
	})

	t.Run("StaleWatchDecidedLive", func(t *testing.T) {
		// Another replica spent the node's budget (2 per hour); this
		// replica's watch shows one of the two RebootNodes only (a watch
		// that lags). The next fault must still be escalated, not a third
		// reboot: the create meets the second's name and the step is
		// decided again on a live list.
		node := "stale-1"
		createNode(t, k, node)
		other := newHandler(t, testConfig(), k, dyn, clk)
		for _, id := range []string{"s1", "s2"} {
			if acts, _ := handle(t, other, drained(node, id, "RESTART_VM", nil)); len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied {
				t.Fatalf("reboot %s: %s", id, outcomes(acts))
			}
			for _, it := range list(t, dyn, rebootGVR, node) {
				setStatus(t, dyn, rebootGVR, it.GetName(), true, cond{"SignalSent", "True", "Succeeded"}, cond{"NodeReady", "True", "Succeeded"})
			}
			clk.Add(10 * time.Minute)
		}
		h := newHandler(t, testConfig(), k, dyn, clk)
		g := nodeGroup{watchKey: watchKey{cluster: cluster, gvr: rebootGVR}, node: node, group: "reboot"}
		var items []unstructured.Unstructured
		for deadline := time.Now().Add(5 * time.Second); len(items) != 2; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the watch shows %d RebootNodes, want 2", len(items))
			}
			items, _ = h.caches.items(dyn, g)
		}
		sort.Slice(items, func(i, j int) bool { return createdAt(&items[i]).Before(createdAt(&items[j])) })
		if err := h.caches.byKey[g.watchKey].inf.GetIndexer().Delete(&items[1]); err != nil {
			t.Fatal(err)
		}
		acts, _ := handle(t, h, drained(node, "s3", "RESTART_VM", nil))
		if len(acts) != 1 || acts[0].Kind != events.KindEscalate || !strings.Contains(acts[0].Reason, "budget spent") {
			t.Fatalf("third fault: %s", outcomes(acts))
		}
		if n := len(list(t, dyn, rebootGVR, node)); n != 2 {
			t.Fatalf("%d RebootNodes, want 2", n)
		}
		if w, l := reads(h, "watch"), reads(h, "live"); w != 1 || l != 1 {
			t.Fatalf("reads: %v from the watch, %v live; want 1 and 1", w, l)
		}
	})

	t.Run("ResourceNotServedWarnedOnce", func(t *testing.T) {
		// A template whose resource the cluster does not serve (its CRD
		// not installed): its watch fails at every retry (client-go's
		// backoff starts at 800ms), the role warns once.
		cfg := testConfig()
		cfg.Templates = append(cfg.Templates, Template{Action: "custom:widget", Group: "widget",
			Object: "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: {{ .Name }}\nspec:\n  nodeName: {{ .NodeName }}\n"})
		var buf syncbuf.Buffer
		h := newLoggedHandler(t, cfg, k, dyn, clk, slog.New(slog.NewTextHandler(&buf, nil)))
		h.WatchClusters([]string{cluster})
		time.Sleep(3 * time.Second)
		if n := strings.Count(buf.String(), "level=WARN"); n != 1 || !strings.Contains(buf.String(), "does not serve widgets") {
			t.Fatalf("%d warnings, want 1 about widgets:\n%s", n, buf.String())
		}
		if _, ok := h.caches.items(dyn, nodeGroup{watchKey: watchKey{cluster: cluster, gvr: rebootGVR}, node: "any", group: "reboot"}); !ok {
			t.Fatal("the RebootNode watch, started beside it, is not in use")
		}
	})

	t.Run("WatchForbiddenReadsLive", func(t *testing.T) {
		// The ClusterRole before the role watched (get, list, create,
		// patch): the watch keeps failing, the role warns and reads live,
		// and still remediates.
		const user = "faultline-remediate-before-watch"
		ctx := context.Background()
		cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{JanitorGroup}, Resources: []string{"rebootnodes", "gpuresets"}, Verbs: []string{"get", "list", "create", "patch"}},
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"patch"}},
		}}
		if _, err := k.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
		if _, err := k.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		node := "old-rbac-1"
		createNode(t, k, node)
		as, asDyn := clientsAs(t, user)
		var buf syncbuf.Buffer
		h := newLoggedHandler(t, testConfig(), as, asDyn, clk, slog.New(slog.NewTextHandler(&buf, nil)))
		h.WatchClusters([]string{cluster})
		for deadline := time.Now().Add(5 * time.Second); !strings.Contains(buf.String(), "watch of rebootnodes failed"); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no warning of the forbidden watch within 5s:\n%s", buf.String())
			}
		}
		acts, rq := handle(t, h, drained(node, "o1", "RESTART_BM", nil))
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || len(rq) != 1 {
			t.Fatalf("fault: %s", outcomes(acts))
		}
		setStatus(t, dyn, rebootGVR, list(t, dyn, rebootGVR, node)[0].GetName(), true, cond{"SignalSent", "True", "Succeeded"}, cond{"NodeReady", "True", "Succeeded"})
		clk.Add(testConfig().PollInterval)
		if acts, _ = handle(t, h, rq[0]); len(acts) != 1 || acts[0].Outcome != events.OutcomeSucceeded {
			t.Fatalf("completed: %s", outcomes(acts))
		}
		if w, l := reads(h, "watch"), reads(h, "live"); w != 0 || l != 2 {
			t.Fatalf("reads: %v from the watch, %v live; want 0 and 2", w, l)
		}
	})

	t.Run("EmptyNodeQuarantineToRebootNode", func(t *testing.T) {
		// The chain the pipeline runs: quarantine action → drain (empty
		// node) → drain result → RebootNode. Kafka hops are not included.
		node := "empty-1"
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{events.LabelQuarantined: "true"}}}
		if _, err := k.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
		reg.SetClient(cluster, k, false)
		dcfg := drain.DefaultConfig()
		dh, err := drain.New(dcfg, reg, drain.Options{Log: testLog})
		if err != nil {
			t.Fatal(err)
		}
		rh := newHandler(t, testConfig(), k, dyn, &clock{t: time.Now()})
		rh.now = time.Now
		qa := &faultlinev1.Action{Id: "q1", Cluster: cluster, Node: node, Role: events.RoleQuarantine, Kind: events.KindQuarantine,
			Outcome: events.OutcomeApplied, EventIds: []string{"ev-empty"}, RecommendedAction: "RESTART_BM", Details: map[string]string{}}
		b, _ := events.MarshalAction(qa)
		start := time.Now()
		res, err := dh.Handle(context.Background(), []*kgo.Record{{Topic: events.TopicActions, Key: events.Key(cluster, node), Value: b}})
		if err != nil {
			t.Fatal(err)
		}
		acts, _ := handle(t, rh, res.Out...)
		took := time.Since(start)
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied || len(list(t, dyn, rebootGVR, node)) != 1 {
			t.Fatalf("chain: %s", outcomes(acts))
		}
		t.Logf("MEASURE quarantine action → RebootNode created for an empty node: %s (drain step + remediate step, in-process)", took.Round(time.Microsecond))
	})
}

// racedPatch is a dynamic client whose first Patch is raced by another
// writer: the object changes just before the patch, so a patch carrying
// the resourceVersion it read meets a real conflict.
type racedPatch struct {
	dynamic.Interface
	once *sync.Once
}

func (d racedPatch) Resource(gvr schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	return racedResource{d.Interface.Resource(gvr), d.once}
}

type racedResource struct {
	dynamic.NamespaceableResourceInterface
	once *sync.Once
}

func (r racedResource) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) (*unstructured.Unstructured, error) {
	r.once.Do(func() {
		o, err := r.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return
		}
		labels := o.GetLabels()
		labels["raced"] = "true"
		o.SetLabels(labels)
		_, _ = r.Update(ctx, o, metav1.UpdateOptions{})
	})
	return r.NamespaceableResourceInterface.Patch(ctx, name, pt, data, opts, sub...)
}

// lostAnswer makes the next create or patch (when next is set) on the
// apiserver and answers it with a cut connection, as an apiserver dying
// after its write does.
type lostAnswer struct {
	dynamic.Interface
	next *atomic.Bool
}

func (d lostAnswer) Resource(gvr schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	return lostResource{d.Interface.Resource(gvr), d.next}
}

type lostResource struct {
	dynamic.NamespaceableResourceInterface
	next *atomic.Bool
}

var errCut = &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}

func (r lostResource) Create(ctx context.Context, o *unstructured.Unstructured, opts metav1.CreateOptions, sub ...string) (*unstructured.Unstructured, error) {
	out, err := r.NamespaceableResourceInterface.Create(ctx, o, opts, sub...)
	if err == nil && r.next.CompareAndSwap(true, false) {
		return nil, errCut
	}
	return out, err
}

func (r lostResource) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) (*unstructured.Unstructured, error) {
	out, err := r.NamespaceableResourceInterface.Patch(ctx, name, pt, data, opts, sub...)
	if err == nil && r.next.CompareAndSwap(true, false) {
		return nil, errCut
	}
	return out, err
}

// listCounter counts the list requests by node label the apiserver
// answered (the remediate role's reads of a node's resources; not the
// watch's list, nor a 429 client-go retried while the CRD was new).
type listCounter struct{ n atomic.Int64 }

func (c *listCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(r)
		if err == nil && resp.StatusCode == http.StatusOK && r.Method == http.MethodGet && strings.Contains(r.URL.Query().Get("labelSelector"), LabelNode+"=") {
			c.n.Add(1)
		}
		return resp, err
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// reads is faultline_remediate_reads_total{from}.
func reads(h *Handler, from string) float64 {
	var m dto.Metric
	if err := h.m.reads.WithLabelValues(cluster, from).Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// answerLost passes requests through and, while on, answers each DELETE
// that the apiserver carried out with an error instead, as a connection cut
// after the apiserver acted.
type answerLost struct {
	rt   http.RoundTripper
	on   atomic.Bool
	lost atomic.Int32
}

func (a *answerLost) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := a.rt.RoundTrip(r)
	if err != nil || r.Method != http.MethodDelete || !a.on.Load() {
		return resp, err
	}
	resp.Body.Close()
	a.lost.Add(1)
	return nil, fmt.Errorf("connection reset by peer (the test lost the answer, %s)", resp.Status)
}
