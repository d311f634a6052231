package quarantine

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/faultline/faultline/agents/kmsg"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
	"github.com/faultline/faultline/schemas/validate"
)

// These tests run against a real kube-apiserver (internal/testenv).

var testLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// testConfig is the role's config for one test: the breaker counts only the
// test's own nodes (label test=<group>) and has its own ConfigMap.
func testConfig(group string) Config {
	c := DefaultConfig()
	c.Identity = "faultline-quarantine/test"
	c.ClusterWait = 500 * time.Millisecond
	c.RetryWait = 500 * time.Millisecond
	c.Breaker.MaxPercent = 100
	c.Breaker.GPUNodeSelector = "test=" + group
	c.Breaker.Name = "breaker-" + strings.ToLower(group)
	c.Breaker.NodeCountTTL = time.Minute
	return c
}

func newTestHandler(t testing.TB, cfg Config, kubes map[string]kubernetes.Interface) *Handler {
	t.Helper()
	reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	for name, k := range kubes {
		c := reg.SetClient(name, k, false)
		c.Gate.MinBackoff, c.Gate.MaxBackoff = 50*time.Millisecond, 300*time.Millisecond
	}
	h, err := New(cfg, reg, Options{Log: testLog})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// uncordonedByHand creates node (of group), quarantines it through a new
// handler of cluster c1 and uncordons it as a person would (kubectl
// uncordon); it returns the handler.
func uncordonedByHand(t *testing.T, k kubernetes.Interface, group, node string) *Handler {
	t.Helper()
	createNodes(t, k, group, node)
	h := newTestHandler(t, testConfig(group), map[string]kubernetes.Interface{"c1": k})
	handle(t, h, record("c1", fatal(node, "XID_ERROR_48", "GPU-1")))
	n := getNode(t, k, node)
	n.Spec.Unschedulable = false // kubectl uncordon
	if _, err := k.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return h
}

func createNodes(t testing.TB, k kubernetes.Interface, group string, names ...string) {
	t.Helper()
	for _, n := range names {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"test": group}}}
		if _, err := k.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create node %s: %v", n, err)
		}
	}
	// The breaker counts nodes from the apiserver's watch cache (a list at
	// resourceVersion 0), which has new nodes a moment later: wait for
	// them, so a count does not miss some (and hold for NodeCountTTL).
	sel := metav1.ListOptions{LabelSelector: "test=" + group, ResourceVersion: "0"}
	waitUntil(t, 30*time.Second, func() bool {
		list, err := k.CoreV1().Nodes().List(context.Background(), sel)
		if err != nil {
			return false
		}
		seen := map[string]bool{}
		for _, n := range list.Items {
			seen[n.Name] = true
		}
		return !slices.ContainsFunc(names, func(n string) bool { return !seen[n] })
	}, fmt.Sprintf("nodes %v in the apiserver's watch cache", names))
}

func getNode(t testing.TB, k kubernetes.Interface, name string) *corev1.Node {
	t.Helper()
	n, err := k.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node %s: %v", name, err)
	}
	return n
}

var offsets sync.Map

// machineBefore and machineAfter are the system UUIDs of a node's machine
// before and after a swap (the Node object kept).
const machineBefore, machineAfter = "4C4C4544-0042-3510-8052-B4C04F4E3732", "4C4C4544-0051-4710-8034-C3C04F4E3732"

// record wraps an event as a Kafka record of the events topic.
func record(cluster string, ev *datamodels.HealthEvent) *kgo.Record {
	ev.Cluster = cluster
	if ev.Id == "" {
		ev.Id = events.NewID()
	}
	b, err := events.Marshal(ev)
	if err != nil {
		panic(err)
	}
	v, _ := offsets.LoadOrStore(cluster, new(int64))
	off := atomic.AddInt64(v.(*int64), 1)
	return &kgo.Record{Topic: events.TopicEvents, Key: events.Key(cluster, ev.NodeName), Value: b, Offset: off}
}

func gpuEntity(gpu string) []*datamodels.Entity {
	if gpu == "" {
		return nil
	}
	return []*datamodels.Entity{{EntityType: "GPU", EntityValue: gpu}}
}

func fatal(node, check, gpu string) *datamodels.HealthEvent {
	return &datamodels.HealthEvent{
		Agent: "faultline-agent", ComponentClass: "GPU", CheckName: check, IsFatal: true,
		Message: "GPU reported a double-bit ECC error", RecommendedAction: datamodels.RecommendedAction_REPLACE_VM,
		EntitiesImpacted: gpuEntity(gpu), NodeName: node,
		GeneratedTimestamp: timestamppb.Now(),
	}
}

func healthy(node, check, gpu string) *datamodels.HealthEvent {
	return &datamodels.HealthEvent{
		Agent: "faultline-agent", ComponentClass: "GPU", CheckName: check, IsHealthy: true,
		EntitiesImpacted: gpuEntity(gpu), NodeName: node,
		GeneratedTimestamp: timestamppb.Now(),
	}
}

// operator marks ev as sent with an operator credential (what the gateway
// stamps).
func operator(ev *datamodels.HealthEvent) *datamodels.HealthEvent {
	ev.Submitter = &datamodels.Submitter{Name: "token:ops#1", Role: datamodels.SubmitterRole_SUBMITTER_ROLE_OPERATOR}
	return ev
}

// handle runs a batch and decodes the actions it produced.
func handle(t testing.TB, h *Handler, recs ...*kgo.Record) ([]*faultlinev1.Action, []*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := h.Handle(ctx, recs)
	if err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if len(res.Dead) > 0 {
		t.Fatalf("dead letters: %v", res.Dead[0].Reason)
	}
	if res.Produced != nil {
		res.Produced() // as the pipeline does once Out is produced
	}
	return splitOut(t, res.Out)
}

// retryOffsets numbers the deferred records as their retry topic would:
// each its own offset, so that a retry batch's records are told apart
// (recordKey) as the retry consumer's are.
var retryOffsets atomic.Int64

// splitOut splits a batch's output into actions and deferred records.
func splitOut(t testing.TB, out []*kgo.Record) ([]*faultlinev1.Action, []*kgo.Record) {
	var acts []*faultlinev1.Action
	var retry []*kgo.Record
	for _, r := range out {
		switch r.Topic {
		case events.TopicActions:
			a, err := events.UnmarshalAction(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			acts = append(acts, a)
		default:
			if c, _, err := pipeline.EventKey(r); err != nil || r.Topic != RetryTopic(c) {
				t.Fatalf("output to unexpected topic %s (cluster %q, %v)", r.Topic, c, err)
			}
			r.Offset = retryOffsets.Add(1)
			retry = append(retry, r)
		}
	}
	return acts, retry
}

// onNode returns the actions about node.
func onNode(acts []*faultlinev1.Action, node string) []*faultlinev1.Action {
	return slices.DeleteFunc(slices.Clone(acts), func(a *faultlinev1.Action) bool { return a.GetNode() != node })
}

func kinds(acts []*faultlinev1.Action) string {
	var s []string
	for _, a := range acts {
		s = append(s, a.Kind+"/"+a.Outcome)
	}
	return strings.Join(s, ",")
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

func condition(n *corev1.Node, typ string) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if string(n.Status.Conditions[i].Type) == typ {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// TestKube runs the single-cluster behaviours against one shared apiserver;
// each subtest has its own nodes.
func TestKube(t *testing.T) {
	t.Parallel() // its own servers; mostly waiting
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	k := kube.Client()

	t.Run("FatalCordonsTaintsAndSetsCondition", func(t *testing.T) {
		createNodes(t, k, "fatal", "fatal-1")
		h := newTestHandler(t, testConfig("fatal"), map[string]kubernetes.Interface{"c1": k})
		ev := fatal("fatal-1", "XID_ERROR_48", "GPU-1")
		ev.Metadata = map[string]string{events.MetaGPUPods: "ml/train-0", events.MetaGPUPodsAt: "2026-11-22T12:00:00Z"}
		acts, _ := handle(t, h, record("c1", ev))
		if kinds(acts) != "quarantine/applied" || acts[0].Rule != "faultline-agent-fatal" {
			t.Fatalf("actions %s rule %q", kinds(acts), acts[0].GetRule())
		}
		// What the drain of a GPU reset needs goes with the action.
		if d := acts[0].GetDetails(); d[events.MetaGPUPods] != "ml/train-0" || d[events.MetaGPUPodsAt] != "2026-11-22T12:00:00Z" {
			t.Fatalf("action details %v lack the GPU pods", d)
		}
		n := getNode(t, k, "fatal-1")
		if !n.Spec.Unschedulable || !hasTaint(n, "faultline.io/unhealthy") {
			t.Fatalf("node not cordoned and tainted: %+v", n.Spec)
		}
		c := condition(n, "GPUHealthy")
		if c == nil || c.Status != corev1.ConditionFalse || c.Reason != "XidError48" || !strings.Contains(c.Message, "double-bit") {
			t.Fatalf("condition %+v", c)
		}
		if n.Labels[LabelQuarantined] != "true" || n.Annotations[AnnotationBy] != "faultline-quarantine/test" ||
			!strings.Contains(n.Annotations[AnnotationReason], "check=XID_ERROR_48") || n.Annotations[AnnotationAt] == "" {
			t.Fatalf("labels %v annotations %v", n.Labels, n.Annotations)
		}
		// The same record again (a redelivery) changes nothing and decides
		// the same: no write, so the node's resourceVersion stays (no kubelet
		// or controller writes this node in this test).
		rv := n.ResourceVersion
		acts2, _ := handle(t, h, record("c1", ev))
		if kinds(acts2) != "quarantine/applied" || acts2[0].Details[events.DetailAlreadyQuarantined] != "true" || acts2[0].Id != acts[0].Id {
			t.Fatalf("redelivery: %s %v, id %s (first %s)", kinds(acts2), acts2[0].Details, acts2[0].Id, acts[0].Id)
		}
		if after := getNode(t, k, "fatal-1"); after.ResourceVersion != rv {
			t.Fatalf("the redelivery wrote the node: resourceVersion %s, then %s; annotations %v", rv, after.ResourceVersion, after.Annotations)
		}
	})

	t.Run("FaultFromWatchCacheWritesOnlyItsPart", func(t *testing.T) {
		// A node as a kubelet and a person left it: a condition of the
		// kubelet's, a podCIDR, someone's taint and label.
		createNodes(t, k, "cached", "cached-1", "cached-2")
		ctx := context.Background()
		latest := map[string]string{} // node → its resourceVersion after the writes below
		for _, name := range []string{"cached-1", "cached-2"} {
			n := getNode(t, k, name)
			n.Spec.PodCIDR, n.Spec.ProviderID = "10.1.0.0/24", "test://"+name
			n.Spec.Taints = []corev1.Taint{{Key: "team/maintenance", Value: "x", Effect: corev1.TaintEffectNoSchedule}}
			n.Labels["team/pool"] = "a"
			n, err := k.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status"}}
			n, err = k.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			latest[name] = n.ResourceVersion
		}
		// The handler's client counts its requests by verb.
		var gets, patches atomic.Int64
		cfg := kube.RESTConfig()
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if strings.Contains(r.URL.Path, "/nodes/cached-") {
					switch r.Method {
					case http.MethodGet:
						gets.Add(1)
					case http.MethodPatch:
						patches.Add(1)
					}
				}
				return rt.RoundTrip(r)
			})
		}
		counted := kubernetes.NewForConfigOrDie(cfg)
		h := newTestHandler(t, testConfig("cached"), map[string]kubernetes.Interface{"c1": counted})
		h.WatchClusters([]string{"c1"})
		cl, _ := h.reg.Get("c1")
		// The watch's first list may be older than the writes above (a
		// stale copy's patch conflicts and is redone: more requests).
		waitUntil(t, 10*time.Second, func() bool {
			for name, rv := range latest {
				if n, ok := h.nodes.Cached(cl, name, h.now()); !ok || n.ResourceVersion != rv {
					return false
				}
			}
			return true
		}, "the node watch to hold the nodes as written")
		acts, _ := handle(t, h, record("c1", fatal("cached-1", "XID_ERROR_48", "GPU-1")))
		if kinds(acts) != "quarantine/applied" {
			t.Fatalf("actions %s", kinds(acts))
		}
		// A copy that went stale (a person labelled the node since): the
		// write must not lose the label — the resourceVersion the patch
		// carries makes it re-read the node and redo the change.
		stale := getNode(t, k, "cached-2")
		stale.Status.Conditions = nil // as the watch keeps it
		n2 := getNode(t, k, "cached-2")
		n2.Labels["team/late"] = "yes"
		if _, err := k.CoreV1().Nodes().Update(ctx, n2, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.updateNode(ctx, cl, stale, func(n *corev1.Node, st *State) (bool, error) {
			now := h.now()
			return st.AddFault(FaultKey("XID_ERROR_48", "GPU-1"), Fault{Check: "XID_ERROR_48", Class: "GPU", Entity: "GPU-1",
				Cordon: true, Condition: true, Since: now, LastSeen: now}, "ev-1"), nil
		}); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"cached-1", "cached-2"} {
			n := getNode(t, k, name)
			if !n.Spec.Unschedulable || !hasTaint(n, "team/maintenance") ||
				n.Spec.PodCIDR != "10.1.0.0/24" || n.Spec.ProviderID != "test://"+name || n.Labels["team/pool"] != "a" ||
				n.Labels[LabelQuarantined] != "true" {
				t.Fatalf("%s after the fault: spec %+v labels %v", name, n.Spec, n.Labels)
			}
			if c := condition(n, "Ready"); c == nil || c.Reason != "KubeletReady" {
				t.Fatalf("%s: the kubelet's condition was not kept: %+v", name, n.Status.Conditions)
			}
			if c := condition(n, "GPUHealthy"); c == nil || c.Status != corev1.ConditionFalse {
				t.Fatalf("%s: condition %+v", name, c)
			}
		}
		if n := getNode(t, k, "cached-1"); !hasTaint(n, "faultline.io/unhealthy") {
			t.Fatalf("cached-1 not tainted: %+v", n.Spec.Taints)
		}
		if n := getNode(t, k, "cached-2"); n.Labels["team/late"] != "yes" {
			t.Fatalf("the write from a stale copy lost a label: %v", n.Labels)
		}
		// cached-1 from the watch: its two patches and no GET; cached-2:
		// a patch refused on the stale resourceVersion, one GET, then its
		// two patches.
		if g, p := gets.Load(), patches.Load(); g != 1 || p != 5 {
			t.Fatalf("requests for the two nodes: %d GETs, %d PATCHes; want 1 and 5", g, p)
		}
	})

	t.Run("NonMatchingDoesNothing", func(t *testing.T) {
		createNodes(t, k, "nomatch", "nomatch-1")
		h := newTestHandler(t, testConfig("nomatch"), map[string]kubernetes.Interface{"c1": k})
		before := getNode(t, k, "nomatch-1")
		unknown := fatal("nomatch-1", "SOMETHING", "GPU-1")
		unknown.Agent = "some-other-tool"
		storeOnly := fatal("nomatch-1", "XID_ERROR_48", "GPU-1")
		storeOnly.ProcessingStrategy = datamodels.ProcessingStrategy_STORE_ONLY
		skip := operator(fatal("nomatch-1", "XID_ERROR_48", "GPU-1"))
		skip.QuarantineOverrides = &datamodels.BehaviourOverrides{Skip: true}
		acts, _ := handle(t, h, record("c1", unknown), record("c1", storeOnly), record("c1", skip),
			record("c1", healthy("nomatch-1", "XID_ERROR_48", "GPU-1")))
		if kinds(acts) != "skip/skipped,skip/skipped,skip/skipped" {
			t.Fatalf("actions %s", kinds(acts))
		}
		after := getNode(t, k, "nomatch-1")
		if after.ResourceVersion != before.ResourceVersion {
			t.Fatalf("node changed: %+v", after)
		}
	})

	t.Run("NonFatalRecordsKubernetesEvent", func(t *testing.T) {
		createNodes(t, k, "nonfatal", "nonfatal-1")
		h := newTestHandler(t, testConfig("nonfatal"), map[string]kubernetes.Interface{"c1": k})
		ev := fatal("nonfatal-1", "GPU_THERMAL", "GPU-3")
		ev.IsFatal, ev.RecommendedAction, ev.Message = false, datamodels.RecommendedAction_NONE, "GPU 3 is warm"
		rec := record("c1", ev)
		acts, _ := handle(t, h, rec)
		acts2, _ := handle(t, h, rec) // redelivered: same Event, not a second one
		if kinds(acts) != "event/applied" || acts2[0].Id != acts[0].Id {
			t.Fatalf("actions %s / %s", kinds(acts), kinds(acts2))
		}
		// Created in the background: wait for it.
		var list *corev1.EventList
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			var err error
			if list, err = k.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=nonfatal-1"}); err != nil {
				t.Fatal(err)
			}
			if len(list.Items) > 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(list.Items) != 1 || list.Items[0].Reason != "GPUHealthIssue" || !strings.Contains(list.Items[0].Message, "warm") {
			t.Fatalf("events %+v", list.Items)
		}
		if n := getNode(t, k, "nonfatal-1"); n.Spec.Unschedulable {
			t.Fatal("non-fatal event cordoned the node")
		}
		// Another warning of the same reason inside node_event_interval is
		// merged: recorded as skipped, no second Event.
		ev2 := fatal("nonfatal-1", "GPU_THERMAL", "GPU-3")
		ev2.IsFatal, ev2.RecommendedAction, ev2.Message = false, datamodels.RecommendedAction_NONE, "GPU 3 is warmer"
		ev2.Id = ev.Id + "-2"
		acts3, _ := handle(t, h, record("c1", ev2))
		if kinds(acts3) != "event/skipped" || !strings.Contains(acts3[0].Reason, "merged") {
			t.Fatalf("second warning: %s %v", kinds(acts3), acts3)
		}
		if list, _ := k.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=nonfatal-1"}); len(list.Items) != 1 {
			t.Fatalf("merged warning created an Event: %d", len(list.Items))
		}
	})

	t.Run("RecoveryLiftsExactlyWhatFaultlineSet", func(t *testing.T) {
		createNodes(t, k, "recover", "recover-1")
		// A taint a person set before faultline came.
		n := getNode(t, k, "recover-1")
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "team/maintenance", Value: "x", Effect: corev1.TaintEffectNoSchedule})
		n.Annotations = map[string]string{"team/note": "keep"}
		if _, err := k.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		h := newTestHandler(t, testConfig("recover"), map[string]kubernetes.Interface{"c1": k})
		handle(t, h, record("c1", fatal("recover-1", "XID_ERROR_48", "GPU-1")), record("c1", fatal("recover-1", "XID_ERROR_79", "GPU-2")))
		// One of two faults recovers: still quarantined.
		acts, _ := handle(t, h, record("c1", healthy("recover-1", "XID_ERROR_48", "GPU-1")))
		if kinds(acts) != "unquarantine/in_progress" {
			t.Fatalf("actions %s", kinds(acts))
		}
		if n := getNode(t, k, "recover-1"); !n.Spec.Unschedulable || !hasTaint(n, "faultline.io/unhealthy") {
			t.Fatal("lifted while a fault still stands")
		}
		// A recovery of the other GPU's entity with another check lifts nothing.
		acts, _ = handle(t, h, record("c1", healthy("recover-1", "XID_ERROR_79", "GPU-9")))
		if len(acts) != 0 {
			t.Fatalf("unrelated recovery: %s", kinds(acts))
		}
		acts, _ = handle(t, h, record("c1", healthy("recover-1", "XID_ERROR_79", "GPU-2")))
		if kinds(acts) != "unquarantine/applied" || acts[0].Details[events.DetailUncordoned] != "true" {
			t.Fatalf("actions %s %v", kinds(acts), acts[0].GetDetails())
		}
		n = getNode(t, k, "recover-1")
		if n.Spec.Unschedulable || hasTaint(n, "faultline.io/unhealthy") || !hasTaint(n, "team/maintenance") {
			t.Fatalf("spec after recovery: %+v", n.Spec)
		}
		for _, key := range []string{AnnotationState, AnnotationReason, AnnotationBy, AnnotationAt} {
			if _, ok := n.Annotations[key]; ok {
				t.Errorf("annotation %s left behind", key)
			}
		}
		if n.Annotations["team/note"] != "keep" || n.Labels[LabelQuarantined] != "" {
			t.Fatalf("metadata after recovery: %v %v", n.Labels, n.Annotations)
		}
		if c := condition(n, "GPUHealthy"); c == nil || c.Status != corev1.ConditionTrue {
			t.Fatalf("condition %+v", c)
		}
	})

	// Copies of a lifted fault's occurrences that arrive after its recovery
	// — a gateway's produce that timed out and was written after the
	// agent's resend (to another gateway) and its recovery, a record of the
	// episode reordered otherwise — are not a new fault: nothing recovers
	// them again, so they quarantined a healthy node for good. An
	// occurrence generated after the recovery is a new fault and cordons.
	t.Run("LateCopyAfterRecoveryIgnored", func(t *testing.T) {
		createNodes(t, k, "late", "late-1")
		h := newTestHandler(t, testConfig("late"), map[string]kubernetes.Interface{"c1": k})
		t0 := time.Now().Add(-time.Minute)
		at := func(ev *datamodels.HealthEvent, d time.Duration) *datamodels.HealthEvent {
			ev.GeneratedTimestamp = timestamppb.New(t0.Add(d))
			return ev
		}
		first := at(fatal("late-1", "XID_ERROR_48", "GPU-1"), 0)
		handle(t, h, record("c1", first), record("c1", at(fatal("late-1", "XID_ERROR_48", "GPU-1"), 5*time.Second)))
		if n := getNode(t, k, "late-1"); !n.Spec.Unschedulable {
			t.Fatal("the fault did not cordon")
		}
		if acts, _ := handle(t, h, record("c1", at(healthy("late-1", "XID_ERROR_48", "GPU-1"), 20*time.Second))); kinds(acts) != "unquarantine/applied" {
			t.Fatalf("recovery: %s", kinds(acts))
		}
		for _, tc := range []struct {
			name string
			ev   *datamodels.HealthEvent
		}{
			{"the first occurrence's record again (same id)", first},
			{"another occurrence from before the recovery", at(fatal("late-1", "XID_ERROR_48", "GPU-1"), 10*time.Second)},
			{"an occurrence generated with the recovery", at(fatal("late-1", "XID_ERROR_48", "GPU-1"), 20*time.Second)},
		} {
			acts, _ := handle(t, h, record("c1", tc.ev))
			n := getNode(t, k, "late-1")
			if kinds(acts) != "quarantine/skipped" || n.Spec.Unschedulable || hasTaint(n, "faultline.io/unhealthy") || n.Labels[LabelQuarantined] != "" {
				t.Errorf("%s: actions %s, a healthy node quarantined again: unschedulable %v, taints %v, labels %v",
					tc.name, kinds(acts), n.Spec.Unschedulable, n.Spec.Taints, n.Labels)
			}
		}
		if acts, _ := handle(t, h, record("c1", at(fatal("late-1", "XID_ERROR_48", "GPU-1"), 30*time.Second))); kinds(acts) != "quarantine/applied" {
			t.Fatalf("an occurrence after the recovery: %s", kinds(acts))
		}
		if n := getNode(t, k, "late-1"); !n.Spec.Unschedulable {
			t.Fatal("an occurrence after the recovery did not cordon")
		}
	})

	// A machine replaced under the same name (an AWS node name is the
	// private DNS name of an IP the replacement is often given; a replaced
	// server keeps its hostname): the new machine registers a new Node
	// object, and the old machine's events still in flight — a Kafka
	// backlog, the cluster's retry topic after an outage, the correlator's
	// verdict on them — must not cordon it.
	t.Run("EventOfAnEarlierMachineIgnored", func(t *testing.T) {
		createNodes(t, k, "ident", "ident-1")
		h := newTestHandler(t, testConfig("ident"), map[string]kubernetes.Interface{"c1": k})
		received := func(ev *datamodels.HealthEvent, at time.Time) *datamodels.HealthEvent {
			ev.GeneratedTimestamp, ev.ReceivedTimestamp = timestamppb.New(at), timestamppb.New(at)
			return ev
		}
		oldAt := time.Now()
		old := received(fatal("ident-1", "XID_ERROR_48", "GPU-1"), oldAt)
		if acts, _ := handle(t, h, record("c1", old)); kinds(acts) != "quarantine/applied" {
			t.Fatalf("the old machine's fault: %s", kinds(acts))
		}
		// The machine is replaced: its Node goes (the cloud's node
		// controller deletes it), the new machine registers its own.
		if err := k.CoreV1().Nodes().Delete(context.Background(), "ident-1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, 30*time.Second, func() bool {
			_, err := k.CoreV1().Nodes().Get(context.Background(), "ident-1", metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		}, "the old node gone")
		time.Sleep(2 * time.Second) // creationTimestamp has seconds
		createNodes(t, k, "ident", "ident-1")
		created := getNode(t, k, "ident-1").CreationTimestamp.Time
		verdict := received(fatal("ident-1", "RepeatedXIDOnSameGPU", "GPU-1"), oldAt.Add(500*time.Millisecond))
		verdict.DerivedBy, verdict.RecommendedAction = "RepeatedXIDOnSameGPU", datamodels.RecommendedAction_CONTACT_SUPPORT
		for _, tc := range []struct {
			name string
			ev   *datamodels.HealthEvent
			want string
		}{
			{"the old machine's fault redelivered", old, "quarantine/skipped"},
			{"another fault of the old machine from a backlog", received(fatal("ident-1", "XID_ERROR_79", "GPU-2"), oldAt.Add(500*time.Millisecond)), "quarantine/skipped"},
			{"the correlator's verdict on the old machine's events", verdict, "quarantine/skipped"},
			{"the new machine's own fault", received(fatal("ident-1", "XID_ERROR_48", "GPU-1"), created.Add(time.Second)), "quarantine/applied"},
		} {
			acts, _ := handle(t, h, record("c1", tc.ev))
			n := getNode(t, k, "ident-1")
			// The Node object a quarantine applies to goes with it: the
			// correlator counts a node's remediations from its creation.
			if tc.want == "quarantine/applied" && acts[0].GetDetails()[events.DetailNodeCreated] != created.UTC().Format(time.RFC3339) {
				t.Errorf("%s: details %v, want %s=%s", tc.name, acts[0].GetDetails(), events.DetailNodeCreated, created.UTC().Format(time.RFC3339))
			}
			if got := kinds(acts); got != tc.want || n.Spec.Unschedulable != (tc.want == "quarantine/applied") {
				t.Errorf("%s (received %s, node created %s): actions %s, want %s; node unschedulable %v, taints %v",
					tc.name, tc.ev.GetReceivedTimestamp().AsTime().Format(time.RFC3339Nano), created.Format(time.RFC3339), got, tc.want,
					n.Spec.Unschedulable, n.Spec.Taints)
			}
		}
	})

	// A Node object kept across a machine swap: the new machine's kubelet
	// registered under the same name without the object being deleted,
	// and reports its own system UUID. The earlier machine's late faults
	// (its agent stamped its system UUID on them) and the verdicts they
	// triggered (the correlator passes the trigger's machine on) are not
	// acted on; the new machine's are, and so are events that name no
	// machine (another sender, an agent that could not read it).
	t.Run("EventOfTheMachineBeforeAKeptNodeIgnored", func(t *testing.T) {
		createNodes(t, k, "swap", "swap-1", "swap-2")
		h := newTestHandler(t, testConfig("swap"), map[string]kubernetes.Interface{"c1": k})
		machine := func(node, uuid string) {
			t.Helper()
			n := getNode(t, k, node)
			n.Status.NodeInfo.SystemUUID = uuid
			if _, err := k.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		of := func(ev *datamodels.HealthEvent, uuid string) *datamodels.HealthEvent {
			events.SetSystemUUID(ev, uuid, validate.MaxMetadata)
			return ev
		}
		verdict := fatal("swap-1", "RepeatedXIDOnSameGPU", "GPU-1")
		verdict.DerivedBy, verdict.RecommendedAction = "RepeatedXIDOnSameGPU", datamodels.RecommendedAction_CONTACT_SUPPORT
		machine("swap-1", machineBefore)
		machine("swap-2", machineBefore)
		machine("swap-1", machineAfter) // swapped, the Node kept
		machine("swap-2", machineAfter)
		for _, tc := range []struct {
			name string
			ev   *datamodels.HealthEvent
			want string
		}{
			{"the earlier machine's fault, late", of(fatal("swap-1", "XID_ERROR_79", "GPU-1"), machineBefore), "quarantine/skipped"},
			{"the correlator's verdict that the earlier machine's fault triggered", of(verdict, machineBefore), "quarantine/skipped"},
			{"the new machine's own fault (its UUID in lower case)", of(fatal("swap-1", "XID_ERROR_48", "GPU-2"), strings.ToLower(machineAfter)), "quarantine/applied"},
			{"a fault that names no machine", fatal("swap-2", "XID_ERROR_48", "GPU-1"), "quarantine/applied"},
		} {
			acts, _ := handle(t, h, record("c1", tc.ev))
			n := getNode(t, k, tc.ev.GetNodeName())
			if got := kinds(acts); got != tc.want || n.Spec.Unschedulable != (tc.want == "quarantine/applied") {
				t.Errorf("%s: actions %s, want %s; node unschedulable %v", tc.name, got, tc.want, n.Spec.Unschedulable)
			}
			if tc.want == "quarantine/skipped" && !strings.Contains(acts[0].GetReason(), "of the machine this node was before") {
				t.Errorf("%s: reason %q", tc.name, acts[0].GetReason())
			}
		}
	})

	// Right after a machine swap the node watch may still hold the
	// earlier machine's status: the swapped-in machine's first fault,
	// naming another machine than that copy, is decided on a live read,
	// not skipped as the earlier machine's.
	t.Run("NewMachineFaultReadLiveOverAStaleCopy", func(t *testing.T) {
		createNodes(t, k, "stalecopy", "stalecopy-1")
		n := getNode(t, k, "stalecopy-1")
		n.Status.NodeInfo.SystemUUID = machineAfter // the swapped-in machine's kubelet
		if _, err := k.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		h := newTestHandler(t, testConfig("stalecopy"), map[string]kubernetes.Interface{"c1": k})
		cl, _ := h.reg.Get("c1")
		// The watch's copy, from before the swap.
		stale := n.DeepCopy()
		stale.Status.NodeInfo.SystemUUID = machineBefore
		copied, _ := watchCopy(stale)
		idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
		if err := idx.Add(copied); err != nil {
			t.Fatal(err)
		}
		h.nodes.Replace(cl.Name, corelisters.NewNodeLister(idx))
		if got, cached := h.nodes.Cached(cl, "stalecopy-1", time.Now()); !cached || got.Status.NodeInfo.SystemUUID != machineBefore {
			t.Fatalf("the test's stale copy is not what the handler reads: %v %v", got, cached)
		}
		ev := fatal("stalecopy-1", "XID_ERROR_79", "GPU-1")
		events.SetSystemUUID(ev, machineAfter, validate.MaxMetadata)
		acts, _ := handle(t, h, record("c1", ev))
		if got := kinds(acts); got != "quarantine/applied" || !getNode(t, k, "stalecopy-1").Spec.Unschedulable {
			t.Fatalf("the new machine's fault over a stale copy: actions %s (%v), want quarantine/applied", got, acts)
		}
	})

	// A consumer group with no committed offset (first start, offsets
	// expired) reads the events topic from its start: days-old faults of
	// machines long repaired. The handler's clock is 3 days past the
	// nodes' creation, so what was received when they were created is 3
	// days old (and not of an earlier machine: received after the Node
	// objects were created).
	t.Run("StaleEventNotActedOn", func(t *testing.T) {
		createNodes(t, k, "stale", "stale-1", "stale-2")
		then := time.Now() // after the nodes' creation (seconds, rounded down)
		h, _ := clockHandler(t, testConfig("stale"), k, then.Add(72*time.Hour))
		now := h.now()
		at := func(ev *datamodels.HealthEvent, generated, received time.Time) *datamodels.HealthEvent {
			ev.GeneratedTimestamp, ev.ReceivedTimestamp = timestamppb.New(generated), timestamppb.New(received)
			return ev
		}
		verdict := fatal("stale-1", "RepeatedXIDOnSameGPU", "GPU-1")
		verdict.DerivedBy, verdict.RecommendedAction = "RepeatedXIDOnSameGPU", datamodels.RecommendedAction_CONTACT_SUPPORT
		for _, tc := range []struct {
			name     string
			ev       *datamodels.HealthEvent
			want     string
			cordoned bool
		}{
			{"a fault received 3 days ago, replayed", at(fatal("stale-1", "XID_ERROR_48", "GPU-1"), then, then), "quarantine/skipped", false},
			{"the correlator's verdict on it (its trigger's received time)", at(verdict, then, then.Add(time.Second)), "quarantine/skipped", false},
			{"a fault generated 3 days ago, received now (an agent's spool)", at(fatal("stale-2", "XID_ERROR_48", "GPU-1"), then, now), "quarantine/applied", true},
			{"its recovery, received 3 days ago: lifts", at(healthy("stale-2", "XID_ERROR_48", "GPU-1"), then.Add(time.Second), then.Add(time.Second)), "unquarantine/applied", false},
			{"a fresh fault", at(fatal("stale-1", "XID_ERROR_79", "GPU-2"), now, now), "quarantine/applied", true},
		} {
			acts, _ := handle(t, h, record("c1", tc.ev))
			n := getNode(t, k, tc.ev.GetNodeName())
			if got := kinds(acts); got != tc.want || n.Spec.Unschedulable != tc.cordoned || hasTaint(n, "faultline.io/unhealthy") != tc.cordoned {
				t.Errorf("%s (received %s, now %s): actions %s, want %s; node unschedulable %v, taints %v, want cordoned %v",
					tc.name, tc.ev.GetReceivedTimestamp().AsTime().Format(time.RFC3339), now.Format(time.RFC3339), got, tc.want,
					n.Spec.Unschedulable, n.Spec.Taints, tc.cordoned)
			}
			if tc.want == "quarantine/skipped" && len(acts) > 0 && !strings.Contains(acts[0].GetReason(), "older than quarantine.max_event_age (6h0m0s)") {
				t.Errorf("%s: reason %q does not say it is stale", tc.name, acts[0].GetReason())
			}
		}
	})

	// The life of an Xid the node is rebooted for, with the real kernel-log
	// check: its fault cordons the node; after the reboot the check's
	// healthy events (one per check, no entity, at the boot's start) lift
	// it — before them nothing did, and the node stayed cordoned.
	t.Run("RebootReportLiftsTheNode", func(t *testing.T) {
		createNodes(t, k, "reboot", "reboot-1")
		h := newTestHandler(t, testConfig("reboot"), map[string]kubernetes.Interface{"c1": k})
		dir := t.TempDir()
		logf, bootf := filepath.Join(dir, "kern.log"), filepath.Join(dir, "boot_id")
		bootA := time.Now().Add(-2 * time.Hour).UTC().Truncate(time.Second)
		bootB := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
		line := bootA.Add(time.Hour).Format("Jan _2 15:04:05") + " reboot-1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
		if err := os.WriteFile(logf, []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
		poll := func(boot string, at time.Time) []*kgo.Record {
			t.Helper()
			if err := os.WriteFile(bootf, []byte(boot), 0o644); err != nil {
				t.Fatal(err)
			}
			c, err := kmsg.New(kmsg.Config{Source: kmsg.SourceFile, File: logf, StateDir: dir, BootIDPath: bootf, ProcStatPath: "/nonexistent",
				Parser: kmsg.ParserConfig{BootTime: at, Year: at.Year(), Location: time.UTC}})
			if err != nil {
				t.Fatal(err)
			}
			evs, err := c.Check(context.Background())
			if err == nil {
				err = c.Commit()
			}
			if err != nil {
				t.Fatal(err)
			}
			var recs []*kgo.Record
			for _, ev := range evs {
				ev.NodeName = "reboot-1"
				recs = append(recs, record("c1", ev))
			}
			return recs
		}
		if acts, _ := handle(t, h, poll("boot-a", bootA)...); kinds(acts) != "quarantine/applied" {
			t.Fatalf("the Xid: %s", kinds(acts))
		}
		if n := getNode(t, k, "reboot-1"); !n.Spec.Unschedulable {
			t.Fatal("not cordoned")
		}
		recs := poll("boot-b", bootB)
		if len(recs) == 0 {
			t.Fatal("after the reboot the kernel-log check reported nothing: the node stays cordoned")
		}
		handle(t, h, recs...)
		if n := getNode(t, k, "reboot-1"); n.Spec.Unschedulable || hasTaint(n, "faultline.io/unhealthy") {
			t.Fatalf("still cordoned after the reboot's healthy events: %+v", n.Spec)
		}
	})

	t.Run("PreexistingCordonPreserved", func(t *testing.T) {
		createNodes(t, k, "precordon", "precordon-1")
		n := getNode(t, k, "precordon-1")
		n.Spec.Unschedulable = true
		if _, err := k.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		h := newTestHandler(t, testConfig("precordon"), map[string]kubernetes.Interface{"c1": k})
		acts, _ := handle(t, h, record("c1", fatal("precordon-1", "XID_ERROR_48", "GPU-1")))
		if acts[0].Details[events.DetailPreexistingCordon] != "true" {
			t.Fatalf("details %v", acts[0].Details)
		}
		handle(t, h, record("c1", healthy("precordon-1", "XID_ERROR_48", "GPU-1")))
		n = getNode(t, k, "precordon-1")
		if !n.Spec.Unschedulable {
			t.Fatal("recovery removed a cordon faultline did not set")
		}
		if hasTaint(n, "faultline.io/unhealthy") {
			t.Fatal("faultline's taint not removed")
		}
	})

	t.Run("ManualUncordonNoticedLive", func(t *testing.T) {
		// A person uncordons a node faultline cordoned and no event follows:
		// the node watch notices, faultline's taint and label go at once
		// (else the uncordon would not let pods back on), and the action is
		// produced; a replica that does not own the node leaves it alone.
		createNodes(t, k, "live", "live-1")
		h := newTestHandler(t, testConfig("live"), map[string]kubernetes.Interface{"c1": k})
		handle(t, h, record("c1", fatal("live-1", "XID_ERROR_48", "GPU-1")))
		if n := getNode(t, k, "live-1"); !n.Spec.Unschedulable || !hasTaint(n, "faultline.io/unhealthy") {
			t.Fatal("not quarantined")
		}
		watchSynced(t, h)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		p := &actionSink{}
		go h.RunUncordons(ctx, p)

		n := getNode(t, k, "live-1")
		n.Spec.Unschedulable = false // kubectl uncordon
		if _, err := k.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, 10*time.Second, func() bool { return len(p.kinds()) > 0 }, "manual_uncordon action")
		if got := strings.Join(p.kinds(), ","); got != "manual_uncordon/decided" {
			t.Fatalf("actions %s", got)
		}
		n = getNode(t, k, "live-1")
		if n.Spec.Unschedulable || hasTaint(n, "faultline.io/unhealthy") || n.Labels[LabelQuarantined] != "" || n.Annotations[AnnotationManualUncordon] == "" {
			t.Fatalf("uncordon not acknowledged: %+v %v %v", n.Spec, n.Labels, n.Annotations)
		}
		// Acknowledged once: again finds nothing to do.
		if a, err := h.AcknowledgeUncordon(context.Background(), "c1", "live-1"); a != nil || err != nil {
			t.Fatalf("second acknowledgement: %v %v", a, err)
		}
		// Not this replica's node: not queued.
		h.PartitionsAssigned(events.TopicEvents, nil, 12)
		h.noticeUncordon("c1", "live-1")
		if len(h.uncordons) != 0 {
			t.Fatal("a node of another replica's partition was queued")
		}
	})

	t.Run("ManualUncordonActionSurvivesKill", func(t *testing.T) {
		// The acknowledgement is written and the replica dies before its
		// action is produced: the node keeps the action; the replica that
		// owns the node next produces it (once the broker takes it) with
		// the same id, and removes it.
		h := uncordonedByHand(t, k, "unsaid", "unsaid-1")
		a, err := h.AcknowledgeUncordon(context.Background(), "c1", "unsaid-1")
		if err != nil || a == nil {
			t.Fatalf("acknowledged: %v %v", a, err)
		}
		h.Close() // killed before the produce
		if n := getNode(t, k, "unsaid-1"); !strings.Contains(n.Annotations[AnnotationUnsaid], a.Id) {
			t.Fatalf("action %s not kept on the node: %v", a.Id, n.Annotations)
		}
		// The node's own kubelet may write the annotation: an entry about
		// another node (a drain trigger there) is never produced.
		n := getNode(t, k, "unsaid-1")
		forged := `{"id":"forged","cluster":"c1","node":"other-node","role":"quarantine","kind":"quarantine","outcome":"applied"}`
		n.Annotations[AnnotationUnsaid] = strings.TrimSuffix(n.Annotations[AnnotationUnsaid], "]") + "," + forged + "]"
		if _, err := k.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}

		h2 := newTestHandler(t, testConfig("unsaid"), map[string]kubernetes.Interface{"c1": k})
		t.Cleanup(h2.Close)
		watchSynced(t, h2)
		p := &actionSink{refuse: 1}
		waitWatchedUnsaid(t, h2, "unsaid-1", func(u string) bool { return strings.Contains(u, "forged") }, "the watch sees the forged entry")
		if err := h2.resay(context.Background(), p); err == nil {
			t.Fatal("a refused produce reported no error")
		}
		if n = getNode(t, k, "unsaid-1"); !strings.Contains(n.Annotations[AnnotationUnsaid], a.Id) {
			t.Fatalf("refused action removed from the node: %v", n.Annotations)
		}
		// The refused round removed the forged entry; until the watch
		// delivers that write, resay leaves the node to a later round.
		waitWatchedUnsaid(t, h2, "unsaid-1", func(u string) bool { return !strings.Contains(u, "forged") }, "the watch sees the forged entry removed")
		if err := h2.resay(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		if got := onNode(p.snapshot(), "unsaid-1"); len(got) != 1 || got[0].Id != a.Id || got[0].Kind != events.KindManualUncordon {
			t.Fatalf("produced %v, want %s once", got, a.Id)
		}
		if n = getNode(t, k, "unsaid-1"); n.Annotations[AnnotationUnsaid] != "" || n.Annotations[AnnotationManualUncordon] == "" {
			t.Fatalf("after the produce: %v", n.Annotations)
		}
		// Nothing left: the next round produces nothing.
		waitWatchedUnsaid(t, h2, "unsaid-1", func(u string) bool { return u == "" }, "the watch sees the removal")
		if err := h2.resay(context.Background(), p); err != nil || len(onNode(p.snapshot(), "unsaid-1")) != 1 {
			t.Fatalf("produced again: %v %v", p.snapshot(), err)
		}
	})

	t.Run("ManualUncordonActionSaidOnce", func(t *testing.T) {
		// The loop produces its acknowledgement; the next resay round only
		// removes it from the node (from the watch's copy).
		h := uncordonedByHand(t, k, "saidonce", "saidonce-1")
		t.Cleanup(h.Close)
		a, err := h.AcknowledgeUncordon(context.Background(), "c1", "saidonce-1")
		if err != nil || a == nil {
			t.Fatalf("acknowledged: %v %v", a, err)
		}
		p := &actionSink{}
		h.sayLoop(context.Background(), p, "manual uncordon", []*faultlinev1.Action{a}, nil)
		h.WatchClusters([]string{"c1"})
		waitWatchedUnsaid(t, h, "saidonce-1", func(u string) bool { return strings.Contains(u, a.Id) }, "the watch has the acknowledgement")
		if err := h.resay(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		if got := onNode(p.snapshot(), "saidonce-1"); len(got) != 1 || got[0].Id != a.Id {
			t.Fatalf("produced %s, want %s once", kinds(got), a.Id)
		}
		if n := getNode(t, k, "saidonce-1"); n.Annotations[AnnotationUnsaid] != "" {
			t.Fatalf("produced action left on the node: %s", n.Annotations[AnnotationUnsaid])
		}
	})

	t.Run("RecoveryActionSurvivesKill", func(t *testing.T) {
		// The recovery lifts the node and the replica dies before its
		// batch's output is produced (resay leaves an action in flight
		// alone until then): redelivered, the recovery finds
		// nothing standing and decides nothing; the node kept the action,
		// which the replica owning it next produces, the same record.
		createNodes(t, k, "rekill", "rekill-1")
		h := newTestHandler(t, testConfig("rekill"), map[string]kubernetes.Interface{"c1": k})
		handle(t, h, record("c1", fatal("rekill-1", "XID_ERROR_48", "GPU-1")))
		rec := record("c1", healthy("rekill-1", "XID_ERROR_48", "GPU-1"))
		res, err := h.Handle(context.Background(), []*kgo.Record{rec})
		if err != nil {
			t.Fatal(err)
		}
		lifted, _ := splitOut(t, res.Out)
		if kinds(lifted) != "unquarantine/applied" || getNode(t, k, "rekill-1").Spec.Unschedulable {
			t.Fatalf("recovery: %s", kinds(lifted))
		}
		// While the batch's output is in flight, resay leaves its action.
		h.WatchClusters([]string{"c1"})
		waitWatchedUnsaid(t, h, "rekill-1", some, "the watch has the lift")
		inFlight := &actionSink{}
		if err := h.resay(context.Background(), inFlight); err != nil || len(onNode(inFlight.snapshot(), "rekill-1")) > 0 {
			t.Fatalf("resay of an action in flight: %s, %v", kinds(inFlight.snapshot()), err)
		}
		h.Close() // killed before the produce: res.Produced never called

		h2 := newTestHandler(t, testConfig("rekill"), map[string]kubernetes.Interface{"c1": k})
		t.Cleanup(h2.Close)
		watchSynced(t, h2)
		if again, _ := handle(t, h2, rec); len(again) > 0 {
			t.Fatalf("redelivered recovery decided %s", kinds(again))
		}
		p := &actionSink{}
		if err := h2.resay(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		got := onNode(p.snapshot(), "rekill-1")
		if len(got) != 1 || got[0].Id != lifted[0].Id || !proto.Equal(got[0].Timestamp, lifted[0].Timestamp) ||
			got[0].Details[events.DetailUncordoned] != "true" {
			t.Fatalf("produced %v, want %v", got, lifted[0])
		}
		if n := getNode(t, k, "rekill-1"); n.Annotations[AnnotationUnsaid] != "" {
			t.Fatalf("produced action left on the node: %s", n.Annotations[AnnotationUnsaid])
		}
	})

	t.Run("ManualUncordonRespected", func(t *testing.T) {
		h := uncordonedByHand(t, k, "manual", "manual-1")
		// The same fault again, once the node watch has seen the uncordon
		// (a repeat of a standing fault is decided on the watch's copy; one
		// that comes within the watch's latency is decided as the node
		// stood, and the watch then notices the uncordon on its own:
		// ManualUncordonNoticedLive): detected, recorded, not re-cordoned.
		cl, _ := h.reg.Get("c1")
		waitUntil(t, 10*time.Second, func() bool {
			c, ok := h.nodes.Cached(cl, "manual-1", h.now())
			return ok && !c.Spec.Unschedulable
		}, "the node watch to see the uncordon")
		acts, _ := handle(t, h, record("c1", fatal("manual-1", "XID_ERROR_48", "GPU-1")))
		if kinds(acts) != "manual_uncordon/decided,quarantine/skipped" {
			t.Fatalf("actions %s", kinds(acts))
		}
		n := getNode(t, k, "manual-1")
		if n.Spec.Unschedulable || hasTaint(n, "faultline.io/unhealthy") || n.Annotations[AnnotationManualUncordon] == "" ||
			n.Labels[LabelQuarantined] != "" {
			t.Fatalf("manual uncordon not respected: %+v %v", n.Spec, n.Annotations)
		}
		// A new fault (another GPU) cordons again.
		handle(t, h, record("c1", fatal("manual-1", "XID_ERROR_48", "GPU-2")))
		if n = getNode(t, k, "manual-1"); !n.Spec.Unschedulable || n.Labels[LabelQuarantined] != "true" {
			t.Fatal("a new fault after the manual uncordon did not cordon")
		}
		// Everything recovers: all of faultline's marks go.
		handle(t, h, record("c1", healthy("manual-1", "XID_ERROR_48", "")))
		n = getNode(t, k, "manual-1")
		if n.Spec.Unschedulable || n.Annotations[AnnotationState] != "" || n.Annotations[AnnotationManualUncordon] != "" {
			t.Fatalf("after recovery: %+v %v", n.Spec, n.Annotations)
		}
	})

	t.Run("OptOutLabelAndForce", func(t *testing.T) {
		createNodes(t, k, "optout", "optout-1")
		n := getNode(t, k, "optout-1")
		n.Labels["faultline.io/quarantine"] = "disabled"
		if _, err := k.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		h := newTestHandler(t, testConfig("optout"), map[string]kubernetes.Interface{"c1": k})
		acts, _ := handle(t, h, record("c1", fatal("optout-1", "XID_ERROR_48", "GPU-1")))
		if kinds(acts) != "skip/skipped" || getNode(t, k, "optout-1").Spec.Unschedulable {
			t.Fatalf("opted-out node: %s", kinds(acts))
		}
		// Not even an operator's force cordons a node that opted out.
		forced := operator(fatal("optout-1", "OPERATOR", ""))
		forced.Agent = "an-operator"
		forced.QuarantineOverrides = &datamodels.BehaviourOverrides{Force: true}
		acts, _ = handle(t, h, record("c1", forced))
		if kinds(acts) != "skip/skipped" || !strings.Contains(acts[0].Reason, "does not override the opt-out label") ||
			getNode(t, k, "optout-1").Spec.Unschedulable {
			t.Fatalf("force on an opted-out node: %s %q", kinds(acts), acts[0].GetReason())
		}
	})

	t.Run("DryRunCluster", func(t *testing.T) {
		createNodes(t, k, "dryrun", "dryrun-1")
		reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
		reg.SetClient("c1", k, true)
		h, err := New(testConfig("dryrun"), reg, Options{Log: testLog})
		if err != nil {
			t.Fatal(err)
		}
		acts, _ := handle(t, h, record("c1", fatal("dryrun-1", "XID_ERROR_48", "GPU-1")), record("nowhere", fatal("x", "XID_ERROR_48", "GPU-1")))
		if kinds(acts) != "quarantine/dry_run,quarantine/dry_run" || !acts[0].DryRun {
			t.Fatalf("actions %s", kinds(acts))
		}
		if getNode(t, k, "dryrun-1").Spec.Unschedulable {
			t.Fatal("dry-run cluster changed")
		}
	})

	t.Run("ConcurrentReplicasLoseNothing", func(t *testing.T) {
		createNodes(t, k, "concurrent", "concurrent-1")
		cfg := testConfig("concurrent")
		a := newTestHandler(t, cfg, map[string]kubernetes.Interface{"c1": k})
		b := newTestHandler(t, cfg, map[string]kubernetes.Interface{"c1": k})
		const perReplica = 15
		var wg sync.WaitGroup
		for r, h := range []*Handler{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perReplica {
					handle(t, h, record("c1", fatal("concurrent-1", "XID_ERROR_48", fmt.Sprintf("GPU-%d-%d", r, i))))
				}
			}()
		}
		wg.Wait()
		st, err := ReadState(getNode(t, k, "concurrent-1"))
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Faults) != 2*perReplica {
			t.Fatalf("%d faults on the node, want %d", len(st.Faults), 2*perReplica)
		}
		// Concurrent recoveries lift everything, exactly once.
		for r, h := range []*Handler{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perReplica {
					handle(t, h, record("c1", healthy("concurrent-1", "XID_ERROR_48", fmt.Sprintf("GPU-%d-%d", r, i))))
				}
			}()
		}
		wg.Wait()
		n := getNode(t, k, "concurrent-1")
		if n.Spec.Unschedulable || n.Annotations[AnnotationState] != "" {
			t.Fatalf("not lifted: %+v", n.Spec)
		}
	})

	t.Run("BreakerTripsAtThresholdAndReports", func(t *testing.T) {
		var names []string
		for i := range 20 {
			names = append(names, fmt.Sprintf("breaker-%02d", i))
		}
		createNodes(t, k, "breaker", names...)
		cfg := testConfig("breaker")
		cfg.Breaker.MaxPercent = 20 // 4 of 20 nodes
		cfg.Breaker.AutoClose = false
		h := newTestHandler(t, cfg, map[string]kubernetes.Interface{"c1": k})
		var recs []*kgo.Record
		for _, n := range names[:6] {
			recs = append(recs, record("c1", fatal(n, "XID_ERROR_48", "GPU-1")))
		}
		// One at a time so the order is known.
		var all []*faultlinev1.Action
		for _, r := range recs {
			acts, _ := handle(t, h, r)
			all = append(all, acts...)
		}
		want := "quarantine/applied,quarantine/applied,quarantine/applied,quarantine/applied," +
			"breaker_open/applied,quarantine/held_by_breaker,quarantine/held_by_breaker"
		if kinds(all) != want {
			t.Fatalf("actions\n %s\nwant\n %s", kinds(all), want)
		}
		cordoned := 0
		for _, n := range names {
			if getNode(t, k, n).Spec.Unschedulable {
				cordoned++
			}
		}
		if cordoned != 4 {
			t.Fatalf("%d nodes cordoned, want 4", cordoned)
		}
		cm, err := k.CoreV1().ConfigMaps("default").Get(context.Background(), cfg.Breaker.Name, metav1.GetOptions{})
		if err != nil || cm.Data["state"] != "open" {
			t.Fatalf("breaker configmap %v %v", cm.Data, err)
		}
		if got := breakerEvents(t, k, cfg); got != "QuarantineBreakerOpen" {
			t.Fatalf("breaker events %s", got)
		}
		// Another fault on an already quarantined node is still recorded.
		acts, _ := handle(t, h, record("c1", fatal(names[0], "XID_ERROR_79", "GPU-2")))
		if kinds(acts) != "quarantine/applied" {
			t.Fatalf("fault on a quarantined node while open: %s", kinds(acts))
		}
		// A second replica sees the same open breaker.
		h2 := newTestHandler(t, cfg, map[string]kubernetes.Interface{"c1": k})
		if acts, _ := handle(t, h2, record("c1", fatal(names[10], "XID_ERROR_48", "GPU-1"))); kinds(acts) != "quarantine/held_by_breaker" {
			t.Fatalf("second replica: %s", kinds(acts))
		}
		// A replica started while it is open (a rollout) shows it open once
		// it read the breakers, before any reservation of its own:
		// FaultlineBreakerTripped does not clear while it holds quarantines.
		h3 := newTestHandler(t, cfg, map[string]kubernetes.Interface{"c1": k})
		if unread := h3.ReadBreakers(context.Background(), []string{"c1", "not-configured"}); len(unread) != 0 {
			t.Fatalf("breakers of %v not read", unread)
		}
		if g := breakerGauge(h3); g != 1 {
			t.Fatalf("replica started while open: breaker_open %v after reading the breakers, want 1", g)
		}
		// An operator closes it as the runbook says (data.state alone):
		// held events are not replayed; the window that tripped it is
		// dropped, so new ones apply (before, its 4 still counted and the
		// next fault opened it again).
		cm.Data["state"] = "closed"
		if _, err := k.CoreV1().ConfigMaps("default").Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1100 * time.Millisecond) // the ConfigMap cache
		// Both replicas showed it open; with no new fault they show it
		// closed once they look again (it stayed 1 until their next
		// reservation: FaultlineBreakerTripped kept firing after the close
		// its runbook asks for).
		for i, r := range []*Handler{h, h2, h3} {
			if g := breakerGauge(r); g != 1 {
				t.Fatalf("replica %d: breaker_open %v before the close was looked at, want 1", i+1, g)
			}
			r.RefreshBreakerGauges(context.Background())
			if g := breakerGauge(r); g != 0 {
				t.Fatalf("replica %d: breaker_open %v after an operator closed it, want 0", i+1, g)
			}
		}
		if getNode(t, k, names[5]).Spec.Unschedulable {
			t.Fatal("held event replayed")
		}
		if acts, _ := handle(t, h, record("c1", fatal(names[11], "XID_ERROR_48", "GPU-1"))); kinds(acts) != "quarantine/applied" {
			t.Fatalf("after manual close: %s", kinds(acts))
		}
	})

	t.Run("BreakerAutoClosesAfterWindow", func(t *testing.T) {
		createNodes(t, k, "autoclose", "autoclose-0", "autoclose-1", "autoclose-2", "autoclose-3")
		cfg := testConfig("autoclose")
		cfg.Breaker.MaxPercent = 25 // 1 of 4
		cfg.Breaker.Window = time.Minute
		h, later := clockHandler(t, cfg, k, time.Now())
		a1, _ := handle(t, h, record("c1", fatal("autoclose-0", "X", "")))
		a2, _ := handle(t, h, record("c1", fatal("autoclose-1", "X", "")))
		if kinds(append(a1, a2...)) != "quarantine/applied,breaker_open/applied,quarantine/held_by_breaker" {
			t.Fatalf("actions %s", kinds(append(a1, a2...)))
		}
		h.RefreshBreakerGauges(context.Background())
		if g := breakerGauge(h); g != 1 {
			t.Fatalf("breaker_open %v within the window, want 1", g)
		}
		at := later(61 * time.Second)
		h.RefreshBreakerGauges(context.Background())
		if g := breakerGauge(h); g != 0 {
			t.Fatalf("breaker_open %v past the window (auto_close), want 0", g)
		}
		rec := record("c1", fatal("autoclose-2", "X", ""))
		a3, _ := handle(t, h, rec)
		if kinds(a3) != "breaker_close/applied,quarantine/applied" {
			t.Fatalf("after the window: %s", kinds(a3))
		}
		if getNode(t, k, "autoclose-1").Spec.Unschedulable {
			t.Fatal("held event replayed after close")
		}

		// Killed before the produce: the closing record was let through
		// and its node's write carries the closing, which the next
		// replica finds there (a redelivered fault on a quarantined node
		// reserves nothing).
		h.Close()
		h2, _ := clockHandler(t, cfg, k, at)
		watchSynced(t, h2)
		if again, _ := handle(t, h2, rec); kinds(again) != "quarantine/applied" {
			t.Fatalf("redelivered: %s", kinds(again))
		}
		closing := a3[0]
		waitWatchedUnsaid(t, h2, "autoclose-2", func(u string) bool { return strings.Contains(u, closing.Id) }, "the watch has the closing")
		p := &actionSink{}
		if err := h2.resay(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		if got := onNode(p.snapshot(), "autoclose-2"); len(got) != 1 || got[0].Id != closing.Id || !proto.Equal(got[0].Timestamp, closing.Timestamp) {
			t.Fatalf("produced %v, want %v", got, closing)
		}
		if got := breakerEvents(t, k, cfg); got != "QuarantineBreakerClosed,QuarantineBreakerOpen" {
			t.Fatalf("breaker events %s", got)
		}
	})

	// A breaker transition is reported by the record that made it; the
	// replica dies between the ConfigMap's write and its batch's produce,
	// and the record is handed to the next one. Each transition's action
	// is said again, the same id and figures, and its Event not doubled
	// (the closing let through: BreakerAutoClosesAfterWindow).
	t.Run("BreakerOpenSaidAgainAfterKill", func(t *testing.T) {
		createNodes(t, k, "openkill", "openkill-0", "openkill-1", "openkill-2", "openkill-3")
		cfg := testConfig("openkill")
		cfg.Breaker.MaxPercent = 25 // 1 of 4
		cfg.Breaker.AutoClose = false
		h := newTestHandler(t, cfg, map[string]kubernetes.Interface{"c1": k})
		handle(t, h, record("c1", fatal("openkill-0", "X", "")))
		rec := record("c1", fatal("openkill-1", "X", ""))
		first, _ := handle(t, h, rec)
		h.Close() // killed before the produce

		h2 := newTestHandler(t, cfg, map[string]kubernetes.Interface{"c1": k})
		t.Cleanup(h2.Close)
		again, _ := handle(t, h2, rec)
		const want = "breaker_open/applied,quarantine/held_by_breaker"
		if kinds(first) != want || kinds(again) != want {
			t.Fatalf("first %s, redelivered %s, want %s both", kinds(first), kinds(again), want)
		}
		if o, a := first[0], again[0]; o.Id != a.Id || o.Reason != a.Reason || !maps.Equal(o.Details, a.Details) {
			t.Fatalf("said again as\n %v\nfirst said as\n %v", a, o)
		}
		if acts, _ := handle(t, h2, record("c1", fatal("openkill-2", "X", ""))); kinds(acts) != "quarantine/held_by_breaker" {
			t.Fatalf("another record while open: %s", kinds(acts))
		}
		if got := breakerEvents(t, k, cfg); got != "QuarantineBreakerOpen" {
			t.Fatalf("breaker events %s", got)
		}
	})

	t.Run("BreakerReopenSaidAgainAfterKill", func(t *testing.T) {
		// The record that closes the breaker after its window opens it
		// again at once (the floor) and is held: its redelivery reserves
		// again and reports both.
		names := []string{"reopen-0", "reopen-1", "reopen-2", "reopen-3"}
		createNodes(t, k, "reopen", names...)
		cordonByHand(t, k, "reopen", names[2:]...)
		cfg := testConfig("reopen")
		cfg.Breaker.MinHealthy = 2 // 2 schedulable: any quarantine goes below
		cfg.Breaker.Window = time.Minute
		h, later := clockHandler(t, cfg, k, time.Now())
		if acts, _ := handle(t, h, record("c1", fatal(names[0], "X", ""))); kinds(acts) != "breaker_open/applied,quarantine/held_by_breaker" {
			t.Fatalf("first fault: %s", kinds(acts))
		}
		at := later(61 * time.Second)
		rec := record("c1", fatal(names[1], "X", ""))
		first, _ := handle(t, h, rec)
		h.Close() // killed before the produce

		h2, _ := clockHandler(t, cfg, k, at)
		again, _ := handle(t, h2, rec)
		const want = "breaker_close/applied,breaker_open/applied,quarantine/held_by_breaker"
		if kinds(first) != want || kinds(again) != want {
			t.Fatalf("first %s, redelivered %s, want %s both", kinds(first), kinds(again), want)
		}
		for i := range 2 {
			if first[i].Id != again[i].Id || !maps.Equal(first[i].Details, again[i].Details) {
				t.Fatalf("said again as\n %v\nfirst said as\n %v", again[i], first[i])
			}
		}
		if got := breakerEvents(t, k, cfg); got != "QuarantineBreakerClosed,QuarantineBreakerOpen,QuarantineBreakerOpen" {
			t.Fatalf("breaker events %s", got)
		}
	})

	t.Run("MinHealthyFloor", func(t *testing.T) {
		createNodes(t, k, "floor", "floor-0", "floor-1", "floor-2")
		cfg := testConfig("floor")
		cfg.Breaker.MinHealthy = 2
		h := newTestHandler(t, cfg, map[string]kubernetes.Interface{"c1": k})
		a1, _ := handle(t, h, record("c1", fatal("floor-0", "X", "")))
		a2, _ := handle(t, h, record("c1", fatal("floor-1", "X", "")))
		if kinds(append(a1, a2...)) != "quarantine/applied,breaker_open/applied,quarantine/held_by_breaker" {
			t.Fatalf("actions %s", kinds(append(a1, a2...)))
		}
	})

	// The breaker's ConfigMap cannot be written where it was: its namespace
	// does not exist in the cluster (quarantine.breaker.namespace changed,
	// a member cluster without it), or an operator deleted the ConfigMap
	// (to close the breaker) since this replica read it. The fault was
	// recorded as quarantine/failed and committed: the node was never
	// quarantined. A missing namespace is a configuration error an
	// operator fixes, as a Forbidden one: the cluster's records wait
	// (deferred); a deleted ConfigMap is read again and made anew.
	t.Run("BreakerConfigMapNotThere", func(t *testing.T) {
		for _, tc := range []struct {
			name      string
			namespace string
			deleted   bool // the ConfigMap is deleted after the first fault's write
			want      string
			deferred  int
		}{
			{"namespace missing", "no-such-namespace", false, "", 1},
			{"ConfigMap deleted since read", "default", true, "quarantine/applied", 0},
		} {
			t.Run(tc.name, func(t *testing.T) {
				group := "nocm" + strings.ReplaceAll(strings.ToLower(tc.name[:9]), " ", "")
				createNodes(t, k, group, group+"-0", group+"-1")
				cfg := testConfig(group)
				cfg.Breaker.Namespace = tc.namespace
				h := newTestHandler(t, cfg, map[string]kubernetes.Interface{"c1": k})
				if tc.deleted {
					if acts, _ := handle(t, h, record("c1", fatal(group+"-0", "XID_ERROR_79", "GPU-1"))); kinds(acts) != "quarantine/applied" {
						t.Fatalf("first fault: %s", kinds(acts))
					}
					if err := k.CoreV1().ConfigMaps(tc.namespace).Delete(context.Background(), cfg.Breaker.Name, metav1.DeleteOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				acts, deferred := handle(t, h, record("c1", fatal(group+"-1", "XID_ERROR_79", "GPU-1")))
				got := kinds(acts)
				for _, a := range acts {
					if a.GetOutcome() == events.OutcomeFailed {
						got += " (" + a.GetReason() + ")"
					}
				}
				if got != tc.want || len(deferred) != tc.deferred {
					t.Fatalf("actions %q, %d deferred; want %q, %d deferred", got, len(deferred), tc.want, tc.deferred)
				}
			})
		}
	})

	// A reservation reads the breaker and the node count from watches: its
	// one request is the ConfigMap's write. Another replica's write the
	// watch has not delivered yet costs a conflict and a GET, and is kept.
	t.Run("BreakerReadFromItsWatch", func(t *testing.T) {
		createNodes(t, k, "bwatch", "bwatch-1", "bwatch-2", "bwatch-3", "bwatch-4")
		cfg := testConfig("bwatch")
		cfg.Breaker.NodeCountTTL = time.Millisecond // counted at every reservation
		var gets, lists, writes atomic.Int64
		rc := kube.RESTConfig()
		rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				watch := r.URL.Query().Get("watch") == "true"
				switch {
				case strings.HasSuffix(r.URL.Path, "/configmaps/"+cfg.Breaker.Name) && r.Method == http.MethodGet:
					gets.Add(1)
				case strings.Contains(r.URL.Path, "/configmaps") && (r.Method == http.MethodPut || r.Method == http.MethodPost):
					writes.Add(1)
				case r.URL.Path == "/api/v1/nodes" && r.Method == http.MethodGet && !watch:
					lists.Add(1)
				}
				return rt.RoundTrip(r)
			})
		}
		h := newTestHandler(t, cfg, map[string]kubernetes.Interface{"c1": kubernetes.NewForConfigOrDie(rc)})
		t.Cleanup(h.Close)
		h.WatchClusters([]string{"c1"})
		cl, _ := h.reg.Get("c1")
		b := h.breaker(cl)
		waitUntil(t, 10*time.Second, func() bool {
			_, cmOK := b.watch.get(time.Now())
			n, nodesOK := b.listed(labels.SelectorFromSet(labels.Set{"test": "bwatch"}))
			return cmOK && nodesOK && len(n) == 4
		}, "the breaker's and the nodes' watches to sync")
		lists.Store(0) // the node watch's own list
		cms := k.CoreV1().ConfigMaps(cfg.Breaker.Namespace)
		shown := func() { // the watch has delivered the ConfigMap as it is now
			t.Helper()
			waitUntil(t, 10*time.Second, func() bool {
				live, err := cms.Get(context.Background(), cfg.Breaker.Name, metav1.GetOptions{})
				w, _ := b.watch.get(time.Now())
				return err == nil && w != nil && w.ResourceVersion == live.ResourceVersion
			}, "the breaker's watch to show its last write")
		}
		for _, node := range []string{"bwatch-1", "bwatch-2"} {
			if acts, _ := handle(t, h, record("c1", fatal(node, "XID_ERROR_79", "GPU-1"))); kinds(acts) != "quarantine/applied" {
				t.Fatalf("%s: %s", node, kinds(acts))
			}
			shown()
			time.Sleep(1100 * time.Millisecond) // past a read's reuse without the watch
		}
		if g, l, w := gets.Load(), lists.Load(), writes.Load(); g != 0 || l != 0 || w != 2 {
			t.Fatalf("two reservations: %d GETs of the ConfigMap, %d node lists, %d writes; want 0, 0, 2", g, l, w)
		}
		// Another replica reserves bwatch-4, and this one bwatch-3 before
		// its watch shows that: both kept.
		live, err := cms.Get(context.Background(), cfg.Breaker.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, entries, _ := parseBreaker(live)
		raw, _ := json.Marshal(append(entries, cordonEntry{Node: "bwatch-4", At: time.Now()}))
		live.Data[breakerKeyCordons] = string(raw)
		if _, err := cms.Update(context.Background(), live, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if acts, _ := handle(t, h, record("c1", fatal("bwatch-3", "XID_ERROR_79", "GPU-1"))); kinds(acts) != "quarantine/applied" {
			t.Fatalf("bwatch-3: %s", kinds(acts))
		}
		live, err = cms.Get(context.Background(), cfg.Breaker.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, entries, _ = parseBreaker(live)
		var got []string
		for _, e := range entries {
			got = append(got, e.Node)
		}
		slices.Sort(got)
		if want := []string{"bwatch-1", "bwatch-2", "bwatch-3", "bwatch-4"}; !slices.Equal(got, want) {
			t.Fatalf("the breaker's cordons %v; want %v", got, want)
		}
	})

	// A burst of faults (a fabric incident) reaches every replica at once,
	// each reserving breaker slots in the cluster's one ConfigMap: each
	// round of writes one wins, the others conflict and try again. A
	// replica that lost 20 rounds recorded its fault as quarantine/failed
	// and committed it — the node was never quarantined.
	t.Run("BreakerContendedByManyReplicas", func(t *testing.T) {
		for _, tc := range []struct {
			name     string
			replicas int
		}{
			{"two replicas", 2},
			{"forty replicas", 40},
		} {
			t.Run(tc.name, func(t *testing.T) {
				group := fmt.Sprintf("contend%d", tc.replicas)
				var names []string
				for i := range tc.replicas {
					names = append(names, fmt.Sprintf("%s-%02d", group, i))
				}
				createNodes(t, k, group, names...)
				cfg := testConfig(group)
				hs := make([]*Handler, tc.replicas)
				for i := range hs {
					// Each replica its own client (and rate limiter), as
					// each is its own process.
					ki, err := kubernetes.NewForConfig(kube.RESTConfig())
					if err != nil {
						t.Fatal(err)
					}
					hs[i] = newTestHandler(t, cfg, map[string]kubernetes.Interface{"c1": ki})
				}
				got := make([]string, tc.replicas)
				start := make(chan struct{})
				var wg sync.WaitGroup
				for i, h := range hs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rec := record("c1", fatal(names[i], "XID_ERROR_79", "GPU-1"))
						<-start
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						defer cancel()
						res, err := h.Handle(ctx, []*kgo.Record{rec})
						if err != nil {
							got[i] = "error: " + err.Error()
							return
						}
						var acts []*faultlinev1.Action
						for _, r := range res.Out {
							if a, err := events.UnmarshalAction(r.Value); err == nil {
								acts = append(acts, a)
							} else {
								acts = append(acts, &faultlinev1.Action{Kind: "deferred:" + r.Topic})
							}
						}
						got[i] = kinds(acts)
						for _, a := range acts {
							if a.GetOutcome() == events.OutcomeFailed {
								got[i] += " (" + a.GetReason() + ")"
							}
						}
					}()
				}
				close(start)
				wg.Wait()
				for i, g := range got {
					if g != "quarantine/applied" {
						t.Errorf("replica %d: %s, want quarantine/applied", i, g)
					}
					if !getNode(t, k, names[i]).Spec.Unschedulable {
						t.Errorf("node %s not cordoned", names[i])
					}
				}
			})
		}
	})
}

// actionSink records the actions produced to it.
type actionSink struct {
	mu   sync.Mutex
	acts []*faultlinev1.Action
	// refuse: how many more produce calls fail (the broker down), each
	// counted in refused.
	refuse, refused int
}

func (s *actionSink) ProduceSync(_ context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out kgo.ProduceResults
	if s.refuse > 0 {
		s.refuse--
		s.refused++
		for _, r := range rs {
			out = append(out, kgo.ProduceResult{Record: r, Err: kerr.NotEnoughReplicas})
		}
		return out
	}
	for _, r := range rs {
		a, err := events.UnmarshalAction(r.Value)
		if err == nil {
			s.acts = append(s.acts, a)
		}
		out = append(out, kgo.ProduceResult{Record: r, Err: err})
	}
	return out
}

func (s *actionSink) snapshot() []*faultlinev1.Action {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*faultlinev1.Action(nil), s.acts...)
}

func (s *actionSink) kinds() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, a := range s.acts {
		out = append(out, a.GetKind()+"/"+a.GetOutcome())
	}
	return out
}

// breakerGauge is the handler's faultline_quarantine_breaker_open of c1.
func breakerGauge(h *Handler) float64 { return gaugeValue(h.m.breakerOpen.WithLabelValues("c1")) }

func gaugeValue(g prometheus.Gauge) float64 {
	var m dto.Metric
	_ = g.Write(&m)
	return m.GetGauge().GetValue()
}

// clockHandler returns a handler of cluster c1 whose clock starts at
// start, and the function that moves it on (returning the new time).
func clockHandler(t testing.TB, cfg Config, k kubernetes.Interface, start time.Time) (*Handler, func(time.Duration) time.Time) {
	t.Helper()
	var mu sync.Mutex
	now := start
	reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	reg.SetClient("c1", k, false)
	h, err := New(cfg, reg, Options{Log: testLog, Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h, func(d time.Duration) time.Time { mu.Lock(); defer mu.Unlock(); now = now.Add(d); return now }
}

// cordonByHand cordons nodes of group as a person would, and waits until
// the apiserver's watch cache (what the breaker counts from) has it.
func cordonByHand(t testing.TB, k kubernetes.Interface, group string, names ...string) {
	t.Helper()
	for _, name := range names {
		n := getNode(t, k, name)
		n.Spec.Unschedulable = true
		if _, err := k.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 30*time.Second, func() bool {
		list, err := k.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{LabelSelector: "test=" + group, ResourceVersion: "0"})
		if err != nil {
			return false
		}
		cordoned := 0
		for _, n := range list.Items {
			if n.Spec.Unschedulable {
				cordoned++
			}
		}
		return cordoned == len(names)
	}, "the cordons in the watch cache")
}

// breakerEvents returns the reasons of the Kubernetes Events on cfg's
// breaker, sorted.
func breakerEvents(t testing.TB, k kubernetes.Interface, cfg Config) string {
	t.Helper()
	evs, err := k.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + cfg.Breaker.Name})
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	for _, e := range evs.Items {
		reasons = append(reasons, e.Reason)
	}
	slices.Sort(reasons)
	return strings.Join(reasons, ",")
}

// watchSynced starts h's node watch of c1 and waits until it has listed
// the nodes.
func watchSynced(t testing.TB, h *Handler) {
	t.Helper()
	h.WatchClusters([]string{"c1"})
	cl, _ := h.reg.Get("c1")
	waitUntil(t, 10*time.Second, h.nodes.Get(cl).Synced, "node watch synced")
}

// waitWatchedUnsaid waits until the node watch's copy of c1's node has
// unsaid actions that satisfy has (what resay decides on).
func waitWatchedUnsaid(t testing.TB, h *Handler, node string, has func(unsaid string) bool, what string) {
	t.Helper()
	cl, _ := h.reg.Get("c1")
	waitUntil(t, 10*time.Second, func() bool {
		c, ok := h.nodes.Cached(cl, node, h.now())
		return ok && has(c.Annotations[AnnotationUnsaid])
	}, what)
}

// some reports whether unsaid actions are kept.
func some(unsaid string) bool { return unsaid != "" }

func waitUntil(t testing.TB, d time.Duration, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
