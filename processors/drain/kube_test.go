package drain

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/requeue"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// These tests run against a real kube-apiserver with kube-controller-manager
// (PDB status) and KWOK (pods Running; evicted pods really go away), one
// control plane for all subtests.

var testLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

const cluster = "c1"

func newHandler(t testing.TB, cfg Config, kube kubernetes.Interface, clk *clock, dryRun bool) *Handler {
	t.Helper()
	reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	c := reg.SetClient(cluster, kube, dryRun)
	c.Gate.MinBackoff, c.Gate.MaxBackoff = 10*time.Millisecond, 100*time.Millisecond
	h, err := New(cfg, reg, Options{Log: testLog, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, isFake := kube.(*fake.Clientset); isFake {
		// The fake keeps no resourceVersions, which the node watch's copy
		// relies on (its own writes recognized, a write from a stale copy
		// refused): read the nodes live.
		h.nodes.Close()
	}
	return h
}

func testConfig() Config {
	c := DefaultConfig()
	c.Identity = "faultline-drain/test"
	c.PollInterval = time.Second
	c.PDBBackoff = time.Second
	c.MaxPDBBackoff = 2 * time.Second
	c.GracePeriod = 0
	c.Rules = []Rule{
		{Namespace: "batch", Mode: ModeAllowCompletion},
		{Namespace: "stubborn", Mode: ModeDeleteAfterTimeout, Timeout: 10 * time.Minute},
	}
	return c
}

// quarantined creates a node as the quarantine role leaves it.
func quarantined(t testing.TB, k kubernetes.Interface, name string) {
	t.Helper()
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{events.LabelQuarantined: "true", "type": "kwok"},
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"}},
		Spec: corev1.NodeSpec{Unschedulable: true},
	}
	if _, err := k.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
}

func ensureNS(t testing.TB, k kubernetes.Interface, ns string) {
	t.Helper()
	_, err := k.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
}

type podOpt func(*corev1.Pod)

func withLabels(kv ...string) podOpt {
	return func(p *corev1.Pod) {
		for i := 0; i+1 < len(kv); i += 2 {
			p.Labels[kv[i]] = kv[i+1]
		}
	}
}

func withAnnotation(k, v string) podOpt { return func(p *corev1.Pod) { p.Annotations[k] = v } }

func withGPULimit(p *corev1.Pod) {
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{resourceGPU: resource.MustParse("1")}
}

func daemonSetPod(p *corev1.Pod) {
	yes := true
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", UID: types.UID("ds-uid"), Controller: &yes}}
}

func createPod(t testing.TB, k kubernetes.Interface, ns, name, node string, opts ...podOpt) {
	t.Helper()
	ensureNS(t, k, ns)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{
			NodeName:    node,
			Containers:  []corev1.Container{{Name: "c", Image: "busybox"}},
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	if _, err := k.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s/%s: %v", ns, name, err)
	}
}

// waitRunning waits until KWOK made every pod of the node Running.
func waitRunning(t testing.TB, k kubernetes.Interface, node string, want int) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		pods := podsOn(t, k, node)
		running := 0
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		if running >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: %d of %d pods running", node, running, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func podsOn(t testing.TB, k kubernetes.Interface, node string) []corev1.Pod {
	t.Helper()
	l, err := k.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func podNames(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Namespace+"/"+p.Name)
	}
	return out
}

// trigger is the quarantine role's action for a fault on node.
func quarantineAction(node, eventID, action string, details map[string]string) *kgo.Record {
	if details == nil {
		details = map[string]string{}
	}
	a := &faultlinev1.Action{
		Id: "q-" + eventID, Cluster: cluster, Node: node, Role: events.RoleQuarantine, Kind: events.KindQuarantine,
		Outcome: events.OutcomeApplied, EventIds: []string{eventID}, CheckName: "XID_ERROR_48",
		RecommendedAction: action, Details: details,
	}
	b, err := events.MarshalAction(a)
	if err != nil {
		panic(err)
	}
	return &kgo.Record{Topic: events.TopicActions, Key: events.Key(cluster, node), Value: b}
}

// repeatAction is a quarantine of a node already quarantined, decided at
// decided; generated, when not zero, is when its fault was.
func repeatAction(node, eventID, action string, decided, generated time.Time) *kgo.Record {
	details := map[string]string{events.DetailAlreadyQuarantined: "true"}
	if !generated.IsZero() {
		details[events.DetailGeneratedAt] = generated.UTC().Format(time.RFC3339Nano)
	}
	return decidedAt(quarantineAction(node, eventID, action, details), decided)
}

// handle runs one batch and splits its outputs into actions and requeues.
func handle(t testing.TB, h *Handler, recs ...*kgo.Record) ([]*faultlinev1.Action, []*kgo.Record) {
	t.Helper()
	acts, rq, lane := handleWith(t, h.Handle, recs...)
	if len(lane) > 0 {
		t.Fatalf("%d records to the slow lane", len(lane))
	}
	return acts, rq
}

// triggerOn is a quarantine action asking to drain node of cluster c for
// a reboot.
func triggerOn(t testing.TB, c, node string) *kgo.Record {
	t.Helper()
	a, err := events.UnmarshalAction(quarantineAction(node, "e-"+node, "RESTART_VM", nil).Value)
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

// handleWith runs one batch through handler and splits its outputs into
// actions, requeues and records handed to the slow lane.
func handleWith(t testing.TB, handler func(context.Context, []*kgo.Record) (pipeline.Result, error), recs ...*kgo.Record) (acts []*faultlinev1.Action, rq, lane []*kgo.Record) {
	t.Helper()
	res, err := handler(context.Background(), recs)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Dead) > 0 {
		t.Fatalf("dead letters: %v", res.Dead[0].Reason)
	}
	for _, r := range res.Out {
		switch r.Topic {
		case events.TopicActions:
			a, err := events.UnmarshalAction(r.Value)
			if err != nil {
				t.Fatal(err)
			}
			acts = append(acts, a)
		case TopicRequeue:
			rq = append(rq, r)
		case TopicSlow:
			lane = append(lane, r)
		default:
			t.Fatalf("unexpected output topic %s", r.Topic)
		}
	}
	return acts, rq, lane
}

// decidedAt returns the action record r with its timestamp (when the
// quarantine decided it) at.
func decidedAt(r *kgo.Record, at time.Time) *kgo.Record {
	a, err := events.UnmarshalAction(r.Value)
	if err != nil {
		panic(err)
	}
	a.Timestamp = timestamppb.New(at)
	if r.Value, err = events.MarshalAction(a); err != nil {
		panic(err)
	}
	return r
}

// drive handles rec and then its requeues, advancing the clock by step
// each round, until no requeue is left or rounds run out; between rounds
// it gives KWOK real time to remove pods. It returns every action.
func drive(t testing.TB, h *Handler, clk *clock, step time.Duration, rounds int, rec *kgo.Record) ([]*faultlinev1.Action, *kgo.Record) {
	t.Helper()
	var all []*faultlinev1.Action
	recs := []*kgo.Record{rec}
	for i := 0; i < rounds && len(recs) > 0; i++ {
		acts, rq := handle(t, h, recs...)
		all = append(all, acts...)
		if len(rq) == 0 {
			return all, nil
		}
		recs = rq
		clk.Add(step)
		time.Sleep(300 * time.Millisecond)
	}
	if len(recs) > 0 {
		return all, recs[0]
	}
	return all, nil
}

func find(acts []*faultlinev1.Action, outcome string) *faultlinev1.Action {
	for _, a := range acts {
		if a.Outcome == outcome {
			return a
		}
	}
	return nil
}

// sameActions reports whether acts are want, one for one: the same ids,
// outcomes and times (a store row said twice).
func sameActions(acts []*faultlinev1.Action, want ...*faultlinev1.Action) bool {
	if len(acts) != len(want) {
		return false
	}
	for i, a := range acts {
		w := want[i]
		if w == nil || a.Id != w.Id || a.Outcome != w.Outcome || !a.Timestamp.AsTime().Equal(w.Timestamp.AsTime()) {
			return false
		}
	}
	return true
}

// drainState reads the node's drain state.
func drainState(t testing.TB, k kubernetes.Interface, node string) *State {
	t.Helper()
	n, err := k.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := ReadState(n)
	if err != nil || st == nil {
		t.Fatalf("node %s: drain state %v, %v", node, st, err)
	}
	return st
}

func outcomes(acts []*faultlinev1.Action) string {
	var out []string
	for _, a := range acts {
		out = append(out, a.Outcome+":"+a.Reason)
	}
	return strings.Join(out, " | ")
}

func pdb(t testing.TB, k kubernetes.Interface, ns, name string, minAvailable int, app string) {
	t.Helper()
	mi := intstr.FromInt32(int32(minAvailable))
	b := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &mi, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}},
	}
	if _, err := k.PolicyV1().PodDisruptionBudgets(ns).Create(context.Background(), b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitPDB waits until the disruption controller has observed the PDB.
func waitPDB(t testing.TB, k kubernetes.Interface, ns, name string, allowed int32) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, err := k.PolicyV1().PodDisruptionBudgets(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && b.Status.ObservedGeneration == b.Generation && b.Status.DisruptionsAllowed == allowed && b.Status.ExpectedPods > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pdb %s/%s: status %+v", ns, name, b.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestDrainKube(t *testing.T) {
	if testing.Short() {
		t.Skip("real kube-apiserver test")
	}
	kube := testenv.StartKube(t, testenv.KubeOptions{ControllerManager: true, KWOK: true})
	k := kube.Client()
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}

	t.Run("ImmediateSkipsSystemDaemonSetMirror", func(t *testing.T) {
		node := "imm-1"
		quarantined(t, k, node)
		for i := range 3 {
			createPod(t, k, "work", fmt.Sprintf("w%d", i), node)
		}
		createPod(t, k, "kube-system", "sys-imm", node)
		createPod(t, k, "work", "ds-imm", node, daemonSetPod)
		createPod(t, k, "work", "mirror-imm", node, withAnnotation(mirrorAnnotation, "abc"))
		waitRunning(t, k, node, 6)
		h := newHandler(t, testConfig(), k, clk, false)
		acts, left := drive(t, h, clk, time.Second, 40, quarantineAction(node, "e-imm", "RESTART_VM", nil))
		if left != nil {
			t.Fatalf("drain did not finish: %s", outcomes(acts))
		}
		res := find(acts, events.OutcomeSucceeded)
		if res == nil {
			t.Fatalf("no succeeded action: %s", outcomes(acts))
		}
		if res.Details[events.DetailEvicted] != "3" || res.Details[events.DetailSkipped] != "daemonset=1,mirror=1,system_namespace=1" {
			t.Fatalf("details %v", res.Details)
		}
		if res.RecommendedAction != "RESTART_VM" || res.Details[events.DetailDrainID] == "" {
			t.Fatalf("result lacks the trigger: %v", res)
		}
		// Which Node object was drained (remediate tells a replacement
		// machine under the same name by it).
		n0, _ := k.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if want := n0.CreationTimestamp.UTC().Format(time.RFC3339); res.Details[events.DetailNodeCreated] != want {
			t.Fatalf("result details %s=%q, want the node's creationTimestamp %s", events.DetailNodeCreated, res.Details[events.DetailNodeCreated], want)
		}
		names := podNames(podsOn(t, k, node))
		if strings.Join(names, ",") != "kube-system/sys-imm,work/ds-imm,work/mirror-imm" {
			t.Fatalf("pods left: %v", names)
		}
		// A replayed trigger says the same start and result again (same
		// ids: the store keeps one of each) and evicts nothing.
		again, _ := handle(t, h, quarantineAction(node, "e-imm", "RESTART_VM", nil))
		if !sameActions(again, find(acts, events.OutcomeInProgress), res) {
			t.Fatalf("replay: %s", outcomes(again))
		}
		n, _ := k.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if n.Labels[LabelDrain] != PhaseSucceeded {
			t.Fatalf("label %s=%q", LabelDrain, n.Labels[LabelDrain])
		}
	})

	t.Run("RepeatCoveredByTheFinishedDrain", func(t *testing.T) {
		node := "rep-1"
		quarantined(t, k, node)
		createPod(t, k, "work", "rep-w0", node)
		waitRunning(t, k, node, 1)
		h := newHandler(t, testConfig(), k, clk, false)
		acts, left := drive(t, h, clk, time.Second, 40, quarantineAction(node, "e-rep1", "RESTART_VM", nil))
		res := find(acts, events.OutcomeSucceeded)
		if left != nil || res == nil {
			t.Fatalf("drain did not finish: %s", outcomes(acts))
		}
		finished := res.Timestamp.AsTime()
		before, _ := k.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		// The same fault again, its quarantine decided before the drain
		// finished (an outage held it back): covered, nothing written.
		rep := repeatAction(node, "e-rep2", "RESTART_VM", finished.Add(-time.Second), time.Time{})
		got, _ := handle(t, h, rep)
		if len(got) != 1 || got[0].Outcome != events.OutcomeSkipped || !strings.HasPrefix(got[0].Reason, ReasonCovered+" ") ||
			got[0].Details[events.DetailDrainID] != res.Details[events.DetailDrainID] || !slices.Equal(got[0].EventIds, []string{"e-rep2"}) {
			t.Fatalf("repeat: %s", outcomes(got))
		}
		after, _ := k.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if after.ResourceVersion != before.ResourceVersion {
			t.Fatal("a covered repeat wrote the node")
		}
		if again, _ := handle(t, h, rep); len(again) != 1 || again[0].Id != got[0].Id {
			t.Fatalf("redelivered: %s, want %s again", outcomes(again), got[0].Id)
		}
		// A pod bound to the node since. A repeat generated before the
		// drain finished (so before the reboot that follows it), sent from
		// the agent's spool once the node is back and decided long after:
		// covered too, the pod left running.
		createPod(t, k, "work", "rep-w1", node)
		waitRunning(t, k, node, 1)
		late := repeatAction(node, "e-rep-late", "RESTART_VM", finished.Add(10*time.Minute), finished.Add(-time.Second))
		if got, _ := handle(t, h, late); len(got) != 1 || got[0].Outcome != events.OutcomeSkipped || !strings.HasPrefix(got[0].Reason, ReasonCovered+" ") ||
			got[0].Details[events.DetailDrainID] != res.Details[events.DetailDrainID] || len(podsOn(t, k, node)) != 1 {
			t.Fatalf("late repeat generated before the drain finished: %s (%d pods, want 1)", outcomes(got), len(podsOn(t, k, node)))
		}
		// A fault generated, or decided, after the drain finished: a new
		// drain, which evicts the pod.
		acts, left = drive(t, h, clk, time.Second, 40, repeatAction(node, "e-rep3", "RESTART_VM", finished.Add(time.Second), finished.Add(time.Second)))
		res2 := find(acts, events.OutcomeSucceeded)
		if left != nil || res2 == nil || res2.Details[events.DetailDrainID] == res.Details[events.DetailDrainID] || res2.Details[events.DetailEvicted] != "1" {
			t.Fatalf("the later fault: %s", outcomes(acts))
		}
	})

	// A consumer group with no committed offset (first start, offsets
	// expired) reads the actions topic of days ago: a node quarantined now
	// must not be drained (and remediated) for an earlier episode's
	// quarantine; a drain in progress goes on however old its trigger.
	t.Run("StaleTriggerStartsNoDrain", func(t *testing.T) {
		node, long := "stale-1", "stale-2"
		quarantined(t, k, node)
		quarantined(t, k, long)
		createPod(t, k, "work", "stale-w0", node)
		createPod(t, k, "batch", "stale-b0", long)
		waitRunning(t, k, node, 1)
		waitRunning(t, k, long, 1)
		sclk := &clock{t: time.Now()}
		h := newHandler(t, testConfig(), k, sclk, false)
		old := decidedAt(quarantineAction(node, "e-stale-old", "REPLACE_VM", nil), sclk.Now().Add(-72*time.Hour))
		got, rq := handle(t, h, old)
		n, _ := k.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		st, _ := ReadState(n)
		if len(got) != 1 || got[0].Outcome != events.OutcomeSkipped || !strings.Contains(got[0].Reason, "older than drain.max_trigger_age (6h0m0s)") ||
			len(rq) != 0 || st != nil || len(podsOn(t, k, node)) != 1 {
			t.Fatalf("a quarantine decided 3 days ago: actions %s, %d requeued, drain state %+v, %d pods; want one stale skip, no drain, the pod running",
				outcomes(got), len(rq), st, len(podsOn(t, k, node)))
		}
		// The node's fresh quarantine drains it.
		acts, left := drive(t, h, sclk, time.Second, 40, decidedAt(quarantineAction(node, "e-stale-new", "RESTART_VM", nil), sclk.Now()))
		if res := find(acts, events.OutcomeSucceeded); left != nil || res == nil || res.Details[events.DetailEvicted] != "1" {
			t.Fatalf("the fresh quarantine: %s", outcomes(acts))
		}
		// A drain waiting for a job (AllowCompletion) past the age goes on.
		acts, rq = handle(t, h, decidedAt(quarantineAction(long, "e-stale-long", "RESTART_VM", nil), sclk.Now()))
		if len(rq) != 1 {
			t.Fatalf("the long drain did not start: %s", outcomes(acts))
		}
		sclk.Add(7 * time.Hour)
		acts, rq = handle(t, h, rq...)
		if len(rq) != 1 || drainState(t, k, long).Phase != PhaseRunning || find(acts, events.OutcomeSkipped) != nil {
			t.Fatalf("the drain in progress 7h later: %s, %d requeued, phase %s; want it running", outcomes(acts), len(rq), drainState(t, k, long).Phase)
		}
	})

	t.Run("PDBBlocksThenAllows", func(t *testing.T) {
		node := "pdb-1"
		quarantined(t, k, node)
		createPod(t, k, "db", "db-0", node, withLabels("app", "db"))
		createPod(t, k, "db", "db-1", node, withLabels("app", "db"))
		waitRunning(t, k, node, 2)
		pdb(t, k, "db", "db-pdb", 2, "db")
		waitPDB(t, k, "db", "db-pdb", 0)
		h := newHandler(t, testConfig(), k, clk, false)
		acts, left := drive(t, h, clk, time.Second, 3, quarantineAction(node, "e-pdb", "REPLACE_VM", nil))
		if left == nil {
			t.Fatalf("drain finished under a blocking PDB: %s", outcomes(acts))
		}
		b := find(acts, events.OutcomeBlocked)
		if b == nil || b.Reason != "blocked by PDB db-pdb" {
			t.Fatalf("no blocked action: %s", outcomes(acts))
		}
		if len(podsOn(t, k, node)) != 2 {
			t.Fatal("a pod was evicted through the PDB")
		}
		// The PDB is relaxed: the drain goes on and finishes.
		patch := []byte(`{"spec":{"minAvailable":0}}`)
		if _, err := k.PolicyV1().PodDisruptionBudgets("db").Patch(context.Background(), "db-pdb", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPDB(t, k, "db", "db-pdb", 2)
		acts2, left := drive(t, h, clk, 3*time.Second, 40, left)
		if left != nil || find(acts2, events.OutcomeSucceeded) == nil {
			t.Fatalf("drain did not finish after the PDB allowed it: %s", outcomes(acts2))
		}
		if got := find(acts2, events.OutcomeSucceeded).Details[events.DetailEvicted]; got != "2" {
			t.Fatalf("evicted %s, want 2", got)
		}
	})

	t.Run("AllowCompletionWaits", func(t *testing.T) {
		node := "ac-1"
		quarantined(t, k, node)
		createPod(t, k, "batch", "job-0", node)
		waitRunning(t, k, node, 1)
		h := newHandler(t, testConfig(), k, clk, false)
		acts, left := drive(t, h, clk, time.Second, 3, quarantineAction(node, "e-ac", "RESTART_BM", nil))
		if left == nil || len(podsOn(t, k, node)) != 1 {
			t.Fatalf("AllowCompletion pod was evicted or drain ended: %s", outcomes(acts))
		}
		// The job finishes on its own.
		p, _ := k.CoreV1().Pods("batch").Get(context.Background(), "job-0", metav1.GetOptions{})
		p.Status.Phase = corev1.PodSucceeded
		if _, err := k.CoreV1().Pods("batch").UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		acts, left = drive(t, h, clk, time.Second, 20, left)
		res := find(acts, events.OutcomeSucceeded)
		if left != nil || res == nil || res.Details[events.DetailCompleted] != "1" || res.Details[events.DetailEvicted] != "0" {
			t.Fatalf("want succeeded with 1 completed: %s %v", outcomes(acts), res)
		}
	})

	t.Run("DeleteAfterTimeout", func(t *testing.T) {
		node := "dat-1"
		quarantined(t, k, node)
		createPod(t, k, "stubborn", "s-0", node, withLabels("app", "s"))
		waitRunning(t, k, node, 1)
		pdb(t, k, "stubborn", "s-pdb", 1, "s")
		waitPDB(t, k, "stubborn", "s-pdb", 0)
		h := newHandler(t, testConfig(), k, clk, false)
		acts, left := drive(t, h, clk, time.Second, 3, quarantineAction(node, "e-dat", "RESTART_VM", nil))
		if left == nil || find(acts, events.OutcomeBlocked) == nil {
			t.Fatalf("want blocked: %s", outcomes(acts))
		}
		clk.Add(11 * time.Minute) // past the rule's 10m
		acts, left = drive(t, h, clk, time.Second, 40, left)
		res := find(acts, events.OutcomeSucceeded)
		if left != nil || res == nil || res.Details[events.DetailDeleted] != "1" {
			t.Fatalf("want succeeded with 1 deleted: %s", outcomes(acts))
		}
		if len(podsOn(t, k, node)) != 0 {
			t.Fatal("pod still there")
		}
	})

	t.Run("ImmediateGivesUp", func(t *testing.T) {
		node := "gu-1"
		quarantined(t, k, node)
		createPod(t, k, "guard", "g-0", node, withLabels("app", "g"))
		waitRunning(t, k, node, 1)
		pdb(t, k, "guard", "g-pdb", 1, "g")
		waitPDB(t, k, "guard", "g-pdb", 0)
		h := newHandler(t, testConfig(), k, clk, false)
		_, left := drive(t, h, clk, time.Second, 2, quarantineAction(node, "e-gu", "RESTART_VM", nil))
		clk.Add(11 * time.Minute) // past eviction_timeout
		acts, left := drive(t, h, clk, time.Second, 5, left)
		res := find(acts, events.OutcomeGaveUp)
		if left != nil || res == nil || !strings.Contains(res.Reason, "blocked by PDB g-pdb") {
			t.Fatalf("want gave_up blocked by PDB g-pdb: %s", outcomes(acts))
		}
		if len(podsOn(t, k, node)) != 1 {
			t.Fatal("Immediate must never delete through a PDB")
		}
	})

	t.Run("StuckTerminatingSkipWait", func(t *testing.T) {
		// A node whose kubelet never finishes its pods: a finalizer keeps
		// the evicted pod Terminating (deletionTimestamp set, the object
		// stays), as a dead kubelet does. DeletionTimestamp is the
		// apiserver's clock, so this subtest's clock starts at the real time.
		const hold = "faultline.io/test-hold"
		withHold := func(p *corev1.Pod) { p.Finalizers = []string{hold} }
		release := func(name string) {
			_, err := k.CoreV1().Pods("hold").Patch(context.Background(), name, types.MergePatchType,
				[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("release %s: %v", name, err)
			}
		}
		t.Cleanup(func() { release("h-1"); release("h-0") })
		stuck := func(name string) *corev1.Pod {
			t.Helper()
			p, err := k.CoreV1().Pods("hold").Get(context.Background(), name, metav1.GetOptions{})
			if err != nil || p.DeletionTimestamp == nil {
				t.Fatalf("pod hold/%s not left terminating: %v %v", name, err, p)
			}
			return p
		}

		// skip_wait_for_delete_timeout 1s: the drain stops waiting for
		// the stuck pod, succeeds and names it.
		node := "stuck-1"
		quarantined(t, k, node)
		createPod(t, k, "hold", "h-1", node, withHold)
		createPod(t, k, "hold", "w-1", node)
		waitRunning(t, k, node, 2)
		cfg := testConfig()
		cfg.SkipWaitForDeleteTimeout = time.Second
		rclk := &clock{t: time.Now()}
		h := newHandler(t, cfg, k, rclk, false)
		var logs bytes.Buffer
		h.log = slog.New(slog.NewTextHandler(&logs, nil))
		acts, left := drive(t, h, rclk, time.Second, 20, quarantineAction(node, "e-stuck1", "RESTART_VM", nil))
		res := find(acts, events.OutcomeSucceeded)
		if left != nil || res == nil {
			t.Fatalf("want succeeded: %s", outcomes(acts))
		}
		key := podKey(stuck("h-1"))
		if res.Details[events.DetailSkippedTerminating] != key || res.Details[events.DetailEvicted] != "2" ||
			!strings.Contains(res.Reason, "1 stuck terminating, not waited for: "+key) {
			t.Fatalf("result does not name the skipped pod %s: %s %v", key, res.Reason, res.Details)
		}
		if names := podNames(podsOn(t, k, node)); strings.Join(names, ",") != "hold/h-1" {
			t.Fatalf("pods left: %v", names)
		}
		// Said once: a replayed trigger repeats the start and the result,
		// not the warning.
		if again, _ := handle(t, h, quarantineAction(node, "e-stuck1", "RESTART_VM", nil)); !sameActions(again, find(acts, events.OutcomeInProgress), res) {
			t.Fatalf("replay: %s", outcomes(again))
		}
		if n := strings.Count(logs.String(), "pod stuck terminating"); n != 1 {
			t.Fatalf("%d warnings, want 1:\n%s", n, logs.String())
		}
		var m dto.Metric
		if err := h.m.skippedTerminating.WithLabelValues(cluster).Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
			t.Fatalf("skipped metric %v %v", m.GetCounter().GetValue(), err)
		}

		// 0 (kubectl's default): the drain keeps waiting, even 9m on
		// (eviction_timeout is 10m), until the pod really goes.
		node = "stuck-0"
		quarantined(t, k, node)
		createPod(t, k, "hold", "h-0", node, withHold)
		waitRunning(t, k, node, 1)
		cfg.SkipWaitForDeleteTimeout = 0
		h = newHandler(t, cfg, k, rclk, false)
		acts, left = drive(t, h, rclk, time.Second, 5, quarantineAction(node, "e-stuck0", "RESTART_VM", nil))
		if left == nil {
			t.Fatalf("with 0 the drain must keep waiting: %s", outcomes(acts))
		}
		stuck("h-0")
		rclk.Add(9 * time.Minute)
		more, left := drive(t, h, rclk, time.Second, 3, left)
		acts = append(acts, more...)
		if left == nil || find(acts, events.OutcomeSucceeded) != nil || find(acts, events.OutcomeGaveUp) != nil {
			t.Fatalf("with 0 the drain must keep waiting: %s", outcomes(acts))
		}
		release("h-0")
		acts, left = drive(t, h, rclk, time.Second, 20, left)
		res = find(acts, events.OutcomeSucceeded)
		if left != nil || res == nil || res.Details[events.DetailSkippedTerminating] != "" {
			t.Fatalf("want succeeded with nothing skipped once the pod went: %s", outcomes(acts))
		}
	})

	t.Run("PartialDrainOnlyTheGPUsPods", func(t *testing.T) {
		node := "part-1"
		quarantined(t, k, node)
		createPod(t, k, "train", "on-gpu-a", node, withAnnotation(DefaultGPUAnnotation, "GPU-0000aaaa-0000-0000-0000-00000000aaaa"))
		createPod(t, k, "train", "on-gpu-b", node, withAnnotation(DefaultGPUAnnotation, "GPU-0000bbbb-0000-0000-0000-00000000bbbb,GPU-0000cccc-0000-0000-0000-00000000cccc"))
		createPod(t, k, "train", "cpu-only", node)
		waitRunning(t, k, node, 3)
		h := newHandler(t, testConfig(), k, clk, false)
		acts, left := drive(t, h, clk, time.Second, 40, quarantineAction(node, "e-part", "COMPONENT_RESET", map[string]string{events.DetailEntities: "GPU=GPU-0000aaaa-0000-0000-0000-00000000aaaa"}))
		res := find(acts, events.OutcomeSucceeded)
		if left != nil || res == nil || res.Details[events.DetailEvicted] != "1" || res.Details[events.DetailScope] != "gpu:GPU-0000aaaa-0000-0000-0000-00000000aaaa" {
			t.Fatalf("partial drain: %s %v", outcomes(acts), res)
		}
		if got := strings.Join(podNames(podsOn(t, k, node)), ","); got != "train/cpu-only,train/on-gpu-b" {
			t.Fatalf("pods left: %s", got)
		}
	})

	t.Run("PartialDrainByKubeletPodList", func(t *testing.T) {
		// GPU pods that name no GPU: without the agent's kubelet listing
		// both would go (a reset must not meet a process on its GPU);
		// with it, only the one the kubelet says holds the GPU (listed
		// after both started, listingSlack included).
		node := "part-2"
		quarantined(t, k, node)
		createPod(t, k, "train", "kl-holds-a", node, withGPULimit)
		createPod(t, k, "train", "kl-holds-b", node, withGPULimit)
		createPod(t, k, "train", "kl-cpu-only", node)
		waitRunning(t, k, node, 3)
		h := newHandler(t, testConfig(), k, clk, false)
		listed := time.Now().Add(listingSlack + time.Second).UTC().Format(time.RFC3339Nano)
		acts, left := drive(t, h, clk, time.Second, 40, quarantineAction(node, "e-part2", "COMPONENT_RESET", map[string]string{
			events.DetailEntities: "PCI=0000:17:00,GPU=GPU-0000aaaa-0000-0000-0000-00000000aaaa", events.MetaGPUPods: "train/kl-holds-a", events.MetaGPUPodsAt: listed}))
		res := find(acts, events.OutcomeSucceeded)
		if left != nil || res == nil || res.Details[events.DetailEvicted] != "1" {
			t.Fatalf("partial drain: %s %v", outcomes(acts), res)
		}
		if got := strings.Join(podNames(podsOn(t, k, node)), ","); got != "train/kl-cpu-only,train/kl-holds-b" {
			t.Fatalf("pods left: %s", got)
		}
	})

	// A processor killed after a step wrote the node's state and before
	// the step's actions were produced: the trigger is redelivered to a
	// fresh one, which cannot know whether they reached the topic. It says
	// them again with the same ids and times (the store keeps one of each,
	// as if said once), and the drain goes on where it stood: not started
	// over, no pod evicted twice, every pod counted once.
	t.Run("ResumeAfterRestartNeverDoubleCounts", func(t *testing.T) {
		node := "res-1"
		quarantined(t, k, node)
		createPod(t, k, "resume", "free-0", node)
		createPod(t, k, "resume", "free-1", node)
		createPod(t, k, "resume", "held-0", node, withLabels("app", "held"))
		waitRunning(t, k, node, 3)
		pdb(t, k, "resume", "held-pdb", 1, "held")
		waitPDB(t, k, "resume", "held-pdb", 0)
		trig := quarantineAction(node, "e-res", "RESTART_VM", nil)
		h1 := newHandler(t, testConfig(), k, clk, false)
		acts1, rq := handle(t, h1, trig)
		started, blocked := find(acts1, events.OutcomeInProgress), find(acts1, events.OutcomeBlocked)
		if len(rq) != 1 || started == nil || blocked == nil || testutilCount(h1, "evicted") != 2 {
			t.Fatalf("first step: %s", outcomes(acts1))
		}
		st1 := drainState(t, k, node)
		// The processor dies here: its actions and its requeue record may
		// or may not have been produced, and the trigger is redelivered to
		// a fresh one.
		h2 := newHandler(t, testConfig(), k, clk, false)
		acts2, rq2 := handle(t, h2, trig)
		if !sameActions(acts2, started, blocked) {
			t.Fatalf("the fresh processor did not say the drain's start and blocker again with acts1's ids %s, %s: %s",
				started.Id, blocked.Id, outcomes(acts2))
		}
		if st2 := drainState(t, k, node); st2.ID != st1.ID || !st2.StartedAt.Equal(st1.StartedAt) || st2.By != st1.By {
			t.Fatalf("the fresh processor started the drain over: %+v, was %+v", st2, st1)
		}
		if n := testutilCount(h2, "evicted"); n != 0 {
			t.Fatalf("the fresh processor evicted %v pods again", n)
		}
		if len(rq2) != 1 {
			t.Fatalf("fresh processor did not go on: %s", outcomes(acts2))
		}
		if err := k.PolicyV1().PodDisruptionBudgets("resume").Delete(context.Background(), "held-pdb", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// Both the old requeue record and the new one are handled: they
		// came after the step, so neither says it again.
		clk.Add(3 * time.Second)
		acts3, left := drive(t, h2, clk, 3*time.Second, 40, rq[0])
		res := find(acts3, events.OutcomeSucceeded)
		if left != nil || res == nil || find(acts3, events.OutcomeInProgress) != nil || find(acts3, events.OutcomeBlocked) != nil {
			t.Fatalf("resumed drain did not finish, or said its start or blocker again: %s", outcomes(acts3))
		}
		if res.Details[events.DetailEvicted] != "3" || res.Details[events.DetailInScope] != "3" || res.Details[events.DetailDrainID] != started.Details[events.DetailDrainID] {
			t.Fatalf("counts after resume: %v", res.Details)
		}
		if n := testutilCount(h1, "evicted") + testutilCount(h2, "evicted"); n != 3 {
			t.Fatalf("%v evictions of 3 pods", n)
		}
		acts4, left := drive(t, h2, clk, time.Second, 5, rq2[0])
		if left != nil || !sameActions(acts4, res) {
			t.Fatalf("the duplicate requeue must only repeat the result: %s", outcomes(acts4))
		}
	})

	// A processor killed after a later step (a requeue record's) wrote a
	// new blocker and before its blocked action was produced: the requeue
	// record is redelivered to a fresh one, which says that step's
	// blocked action again with its id, and not the drain's start (that
	// step's record was committed with its actions).
	t.Run("ResumeSaysALostBlockedAgain", func(t *testing.T) {
		node := "res-2"
		quarantined(t, k, node)
		createPod(t, k, "resume2", "free-0", node)
		waitRunning(t, k, node, 1)
		trig := quarantineAction(node, "e-res2", "RESTART_VM", nil)
		h1 := newHandler(t, testConfig(), k, clk, false)
		acts1, rq := handle(t, h1, trig)
		if len(rq) != 1 || find(acts1, events.OutcomeInProgress) == nil || find(acts1, events.OutcomeBlocked) != nil {
			t.Fatalf("first step: %s", outcomes(acts1))
		}
		// A pod under a PDB lands on the node while it drains.
		createPod(t, k, "resume2", "held-0", node, withLabels("app", "held2"))
		for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			p, err := k.CoreV1().Pods("resume2").Get(context.Background(), "held-0", metav1.GetOptions{})
			if err == nil && p.Status.Phase == corev1.PodRunning {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("held-0 not running: %v", err)
			}
		}
		pdb(t, k, "resume2", "held2-pdb", 1, "held2")
		waitPDB(t, k, "resume2", "held2-pdb", 0)
		clk.Add(2 * time.Second)
		acts2, rq2 := handle(t, h1, rq[0])
		blocked := find(acts2, events.OutcomeBlocked)
		if len(rq2) != 1 || blocked == nil || blocked.Details[events.DetailBlockedBy] != "held2-pdb" {
			t.Fatalf("second step: %s", outcomes(acts2))
		}
		// h1 dies here; rq[0] is redelivered to a fresh processor.
		h2 := newHandler(t, testConfig(), k, clk, false)
		acts3, rq3 := handle(t, h2, rq[0])
		if !sameActions(acts3, blocked) || len(rq3) != 1 {
			t.Fatalf("the fresh processor did not say the lost blocker again with its id %s: %s", blocked.Id, outcomes(acts3))
		}
		// The record the step produced comes after it: nothing said again.
		clk.Add(2 * time.Second)
		if acts4, _ := handle(t, h2, rq2[0]); len(acts4) != 0 {
			t.Fatalf("a record after the step said: %s", outcomes(acts4))
		}
		if err := k.PolicyV1().PodDisruptionBudgets("resume2").Delete(context.Background(), "held2-pdb", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		acts5, left := drive(t, h2, clk, 3*time.Second, 40, rq3[0])
		if res := find(acts5, events.OutcomeSucceeded); left != nil || res == nil || res.Details[events.DetailEvicted] != "2" {
			t.Fatalf("resumed drain did not finish: %s", outcomes(acts5))
		}
	})

	// drainOverrides.force deletes what a PDB protects: only when the
	// quarantine action says an operator sent the event. An agent's (or an
	// action that names no submitter) drains as the policy says.
	t.Run("ForceOnlyFromOperators", func(t *testing.T) {
		for _, tc := range []struct {
			node, role string
			forced     bool
		}{{"force-agent", "agent", false}, {"force-none", "", false}, {"force-op", "operator", true}} {
			quarantined(t, k, tc.node)
			ns := "db-" + tc.node
			createPod(t, k, ns, "db-0", tc.node, withLabels("app", "db"))
			waitRunning(t, k, tc.node, 1)
			pdb(t, k, ns, "db-pdb", 1, "db")
			waitPDB(t, k, ns, "db-pdb", 0)
			details := map[string]string{events.DetailDrainOverrides: "force", events.DetailSubmitter: "token:x#1"}
			if tc.role != "" {
				details[events.DetailSubmitterRole] = tc.role
			}
			h := newHandler(t, testConfig(), k, clk, false)
			acts, _ := drive(t, h, clk, time.Second, 3, quarantineAction(tc.node, "e-"+tc.node, "REPLACE_VM", details))
			left := len(podsOn(t, k, tc.node))
			started := acts[0]
			if tc.forced {
				if left != 0 || started.Details[events.DetailForce] != "true" || started.Details[events.DetailDrainOverrides] != "force" {
					t.Fatalf("%s: operator force: %d pods left, %s %v", tc.node, left, outcomes(acts), started.Details)
				}
				continue
			}
			if left != 1 || started.Details[events.DetailForce] == "true" || started.Details[events.DetailDrainOverrides] != "" {
				t.Fatalf("%s: force honoured for a non-operator: %d pods left, %s %v", tc.node, left, outcomes(acts), started.Details)
			}
			if want := "drainOverrides.force ignored: sent by agent credential token:x#1"; started.Details[events.DetailOverridesIgnored] != want ||
				!strings.Contains(started.Reason, want) || find(acts, events.OutcomeBlocked) == nil {
				t.Fatalf("%s: the decision does not say why: %s %v", tc.node, outcomes(acts), started.Details)
			}
		}
	})

	// The role as the ServiceAccount of deploy/rbac/drain.yaml: what it
	// grants is enough for a drain with a PDB refusal and an operator's
	// force delete, and no more than the role calls.
	t.Run("RBACIsEnough", func(t *testing.T) {
		const sa = "system:serviceaccount:faultline:faultline-drain"
		kube.ApplyRBAC(t, "../../deploy/rbac/drain.yaml")
		node := "rbac-1"
		quarantined(t, k, node)
		createPod(t, k, "rbac", "plain", node)
		createPod(t, k, "rbac", "db-0", node, withLabels("app", "db"))
		waitRunning(t, k, node, 2)
		pdb(t, k, "rbac", "db-pdb", 1, "db")
		waitPDB(t, k, "rbac", "db-pdb", 0)
		as, _ := kube.ClientAs(t, sa)
		h := newHandler(t, testConfig(), as, clk, false)
		acts, left := drive(t, h, clk, time.Second, 3, quarantineAction(node, "e-rbac", "REPLACE_VM", nil))
		if b := find(acts, events.OutcomeBlocked); left == nil || b == nil || b.Reason != "blocked by PDB db-pdb" || find(acts, events.OutcomeFailed) != nil {
			t.Fatalf("drain as the ServiceAccount: %s", outcomes(acts))
		}
		// The force joins the drain (one step, no chain of its own); the
		// drain's chain, its first fault's, ends it.
		joined, more := drive(t, h, clk, time.Second, 20, quarantineAction(node, "e-rbac-force", "REPLACE_VM", map[string]string{
			events.DetailDrainOverrides: "force", events.DetailSubmitterRole: "operator"}))
		if more != nil || find(joined, events.OutcomeFailed) != nil {
			t.Fatalf("force joining as the ServiceAccount: %s", outcomes(joined))
		}
		acts, left = drive(t, h, clk, time.Second, 20, left)
		acts = append(joined, acts...)
		if left != nil || find(acts, events.OutcomeSucceeded) == nil || len(podsOn(t, k, node)) != 0 {
			t.Fatalf("forced drain as the ServiceAccount: %s", outcomes(acts))
		}
		for _, tc := range []struct {
			a    testenv.Access
			want bool
		}{
			{testenv.Access{Verb: "patch", Resource: "nodes"}, true},
			{testenv.Access{Verb: "update", Resource: "nodes"}, false},
			{testenv.Access{Verb: "list", Resource: "nodes"}, true},
			{testenv.Access{Verb: "watch", Resource: "nodes"}, true},
			{testenv.Access{Verb: "create", Resource: "pods/eviction", Namespace: "work"}, true},
			{testenv.Access{Verb: "delete", Resource: "pods", Namespace: "work"}, true},
			{testenv.Access{Verb: "watch", Resource: "pods"}, false},
			{testenv.Access{Verb: "create", Resource: "pods", Namespace: "work"}, false},
			{testenv.Access{Verb: "update", Resource: "pods", Namespace: "work"}, false},
			{testenv.Access{Verb: "list", Group: "policy", Resource: "poddisruptionbudgets", Namespace: "work"}, true},
			{testenv.Access{Verb: "delete", Group: "policy", Resource: "poddisruptionbudgets", Namespace: "work"}, false},
			{testenv.Access{Verb: "get", Resource: "secrets", Namespace: "work"}, false},
		} {
			if got := kube.Allowed(t, sa, tc.a); got != tc.want {
				t.Errorf("%+v: allowed %v, want %v", tc.a, got, tc.want)
			}
		}
	})

	t.Run("OverridesAndDryRun", func(t *testing.T) {
		node := "ovr-1"
		quarantined(t, k, node)
		createPod(t, k, "work", "o-0", node)
		waitRunning(t, k, node, 1)
		h := newHandler(t, testConfig(), k, clk, false)
		acts, _ := handle(t, h, quarantineAction(node, "e-skip", "RESTART_VM", map[string]string{
			events.DetailDrainOverrides: "skip", events.DetailSubmitterRole: "operator"}))
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeSkipped {
			t.Fatalf("skip: %s", outcomes(acts))
		}
		dry := newHandler(t, testConfig(), k, clk, true)
		acts, rq := handle(t, dry, quarantineAction(node, "e-dry", "RESTART_VM", nil))
		if len(rq) != 0 || len(acts) != 1 || acts[0].Outcome != events.OutcomeDryRun || acts[0].Details[events.DetailWouldDrain] != "work/o-0(Immediate)" {
			t.Fatalf("dry-run: %s %v", outcomes(acts), acts)
		}
		if len(podsOn(t, k, node)) != 1 {
			t.Fatal("skip or dry-run evicted a pod")
		}
		// Held by the breaker: not a trigger.
		held := &faultlinev1.Action{Role: events.RoleQuarantine, Kind: events.KindQuarantine, Outcome: events.OutcomeHeld}
		if IsTrigger(held) {
			t.Fatal("held_by_breaker started a drain")
		}
	})

	// A cluster whose API server answers every request 1.5 s late holds
	// only its own drains. Alone, it is stepped in the batch (there is no
	// one to hold). Beside a fast cluster, a batch hands its drain to the
	// slow lane (TopicSlow) without a request, so the fast cluster's
	// drain beside it goes on at once rather than after the slow one's
	// requests in turn; the lane steps it.
	t.Run("SlowClusterGoesToTheLane", func(t *testing.T) {
		for _, n := range []string{"lane-slow-0", "lane-slow-1", "lane-fast-1"} {
			quarantined(t, k, n)
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
		trigger := func(c, node string) *kgo.Record { return triggerOn(t, c, node) }
		// run hands recs to handler and returns the nodes it produced
		// actions for and the records it handed to the lane.
		run := func(handler func(context.Context, []*kgo.Record) (pipeline.Result, error), recs ...*kgo.Record) (acted []string, lane []*kgo.Record) {
			t.Helper()
			acts, _, lane := handleWith(t, handler, recs...)
			for _, a := range acts {
				if !slices.Contains(acted, a.Node) {
					acted = append(acted, a.Node)
				}
			}
			return acted, lane
		}
		if acted, lane := run(h.Handle, trigger("slow", "lane-slow-0")); len(lane) != 0 || !slices.Equal(acted, []string{"lane-slow-0"}) {
			t.Fatalf("the only cluster: actions for %v, %d records to the lane", acted, len(lane))
		}
		reg.SetClient("fast", k, false)
		start := time.Now()
		acted, lane := run(h.Handle, trigger("slow", "lane-slow-1"), trigger("fast", "lane-fast-1"))
		took := time.Since(start)
		if !slices.Equal(acted, []string{"lane-fast-1"}) || len(lane) != 1 || string(lane[0].Key) != string(events.Key("slow", "lane-slow-1")) {
			t.Fatalf("beside the slow cluster: actions for %v, %d records to the lane", acted, len(lane))
		}
		if took >= delay {
			t.Fatalf("the batch took %v: the slow cluster held the other's drain", took.Round(time.Millisecond))
		}
		var m dto.Metric
		if _ = h.m.slowLane.WithLabelValues("slow").Write(&m); m.GetCounter().GetValue() != 1 {
			t.Fatalf("faultline_drain_slow_lane_handovers_total{cluster=slow} = %v, want 1", m.GetCounter().GetValue())
		}
		if acted, again := run(h.SlowHandler().Handle, lane...); len(again) != 0 || !slices.Equal(acted, []string{"lane-slow-1"}) {
			t.Fatalf("the slow lane: actions for %v, %d records to the lane again", acted, len(again))
		}
		t.Logf("the batch beside the slow cluster took %v", took.Round(time.Millisecond))
	})

	// A cluster that turns slow while the batch steps its drain (the first
	// batch to meet it, before any slow write is answered): once a write
	// has been in flight for twice slow_cluster the step is abandoned and
	// the drain handed to the lane unchanged, the batch not held by the
	// drain's requests one after another (a list, a state write, an
	// eviction, a state write: 6 s at 1.5 s each; the list, a read, is
	// waited for: ≈ 2.75 s); the lane then drains the node.
	t.Run("TurningSlowGoesToTheLane", func(t *testing.T) {
		for _, n := range []string{"turn-0", "turn-1", "turn-fast"} {
			quarantined(t, k, n)
		}
		createPod(t, k, "turn", "p-1", "turn-1")
		const delay = 1500 * time.Millisecond
		var slowBy atomic.Int64
		reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
		cl, err := reg.SetConfig("turning", testenv.Delayed(kube.RESTConfig(), &slowBy))
		if err != nil {
			t.Fatal(err)
		}
		reg.SetClient("fast", k, false)
		h, err := New(testConfig(), reg, Options{Log: testLog, Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		trigger := func(c, node string) *kgo.Record { return triggerOn(t, c, node) }
		if _, _, lane := handleWith(t, h.Handle, trigger("turning", "turn-0")); len(lane) != 0 || cl.Gate.Slow(testConfig().SlowCluster) {
			t.Fatalf("while fast: %d records to the lane, write latency %v", len(lane), cl.Gate.Latency())
		}
		slowBy.Store(int64(delay))
		start := time.Now()
		acts, _, lane := handleWith(t, h.Handle, trigger("turning", "turn-1"), trigger("fast", "turn-fast"))
		took := time.Since(start)
		for _, a := range acts {
			if a.Node != "turn-fast" {
				t.Fatalf("an action for %s in the batch: %s/%s %s", a.Node, a.Kind, a.Outcome, a.Reason)
			}
		}
		if len(acts) == 0 || len(lane) != 1 || string(lane[0].Key) != string(events.Key("turning", "turn-1")) {
			t.Fatalf("the batch that met the cluster turning slow: %d actions, %d records to the lane", len(acts), len(lane))
		}
		if took >= 3*delay {
			t.Fatalf("the batch took %v: it waited for the cluster turning slow", took.Round(time.Millisecond))
		}
		slowBy.Store(0)
		lacts, _, again := handleWith(t, h.SlowHandler().Handle, lane...)
		if len(again) != 0 || len(lacts) == 0 || lacts[0].Node != "turn-1" || find(lacts, events.OutcomeInProgress) == nil {
			t.Fatalf("the slow lane: %s, %d records to the lane again", outcomes(lacts), len(again))
		}
		t.Logf("the batch that met the cluster turning slow took %v", took.Round(time.Millisecond))
	})

	if os.Getenv("FAULTLINE_MEASURE") != "" {
		t.Run("Measure", func(t *testing.T) { measure(t, kube, clk) })
	}
}

// measure drains nodes×pods with the given client QPS and reports
// evictions/s (accepted Eviction calls) and pods gone/s.
func measure(t *testing.T, kube *testenv.Kube, clk *clock) {
	nodes, _ := strconv.Atoi(envOr("FAULTLINE_MEASURE_NODES", "100"))
	perNode, _ := strconv.Atoi(envOr("FAULTLINE_MEASURE_PODS", "15"))
	for _, qps := range strings.Split(envOr("FAULTLINE_MEASURE_QPS", "5,50,200"), ",") {
		q, _ := strconv.ParseFloat(qps, 32)
		setup := kube.Client()
		prefix := "m" + qps + "-"
		ns := "measure-" + qps
		ensureNS(t, setup, ns)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		for i := range nodes {
			node := fmt.Sprintf("%s%03d", prefix, i)
			quarantined(t, setup, node)
			for j := range perNode {
				sem <- struct{}{}
				wg.Add(1)
				go func() {
					defer func() { <-sem; wg.Done() }()
					createPod(t, setup, ns, fmt.Sprintf("%s-p%02d", node, j), node)
				}()
			}
		}
		wg.Wait()
		for i := range nodes {
			waitRunning(t, setup, fmt.Sprintf("%s%03d", prefix, i), perNode)
		}
		rc := kube.RESTConfig()
		rc.QPS, rc.Burst = float32(q), int(q*2)
		kc, err := kubernetes.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		cfg := testConfig()
		cfg.PollInterval = 500 * time.Millisecond
		h := newHandler(t, cfg, kc, &clock{t: time.Now()}, false)
		h.now = time.Now
		var recs []*kgo.Record
		for i := range nodes {
			recs = append(recs, quarantineAction(fmt.Sprintf("%s%03d", prefix, i), "e-"+prefix+strconv.Itoa(i), "RESTART_VM", nil))
		}
		start := time.Now()
		var evictedAt time.Duration
		done := 0
		for round := 0; len(recs) > 0 && round < 2000; round++ {
			acts, rq := handle(t, h, recs...)
			for _, a := range acts {
				if a.Outcome == events.OutcomeSucceeded {
					done++
				}
			}
			if evictedAt == 0 && testutilCount(h, "evicted") >= float64(nodes*perNode) {
				evictedAt = time.Since(start)
			}
			recs = rq
		}
		total := time.Since(start)
		n := float64(nodes * perNode)
		t.Logf("MEASURE qps=%s nodes=%d pods=%d: all evictions accepted in %s (%.1f evictions/s); all %d drains succeeded in %s (%.1f pods gone/s)",
			qps, nodes, nodes*perNode, evictedAt.Round(time.Millisecond), n/evictedAt.Seconds(), done, total.Round(time.Millisecond), n/total.Seconds())
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func testutilCount(h *Handler, result string) float64 {
	var m dto.Metric
	if err := h.m.evictions.WithLabelValues(cluster, result).Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// TestPDBRefusalWithoutDisruptionController: with no disruption controller,
// the apiserver refuses the eviction of a PDB-covered pod with 429 and
// Retry-After: 10 (the PDB is "still being processed"). The drain sees the
// refusal at once — blocked by the PDB, the pod backed off with
// pdb_backoff — instead of client-go sleeping on the Retry-After inside
// the call until kube.timeout, which made it a cluster API error that
// backed the whole cluster off.
func TestPDBRefusalWithoutDisruptionController(t *testing.T) {
	kube := testenv.StartKube(t, testenv.KubeOptions{KWOK: true}) // no kube-controller-manager
	k := kube.Client()
	node := "unprocessed-1"
	quarantined(t, k, node)
	createPod(t, k, "guarded", "g0", node, withLabels("app", "g"))
	waitRunning(t, k, node, 1)
	pdb(t, k, "guarded", "guard", 1, "g")

	// The cluster as production reaches it: its kubeconfig and the
	// default kube.timeout (10s).
	kc := clusters.DefaultConfig()
	kc.Clusters = []clusters.Cluster{{Name: cluster, Kubeconfig: kube.Kubeconfig()}}
	reg := clusters.NewRegistry(kc, nil)
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	h, err := New(testConfig(), reg, Options{Log: testLog, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	acts, rq := handle(t, h, quarantineAction(node, "e-unprocessed", "RESTART_VM", nil))
	if took := time.Since(start); took > 9*time.Second { // a wait on the refusal costs its Retry-After, 10 s
		t.Fatalf("the step took %v: the refusal was waited on", took)
	}
	b := find(acts, events.OutcomeBlocked)
	if b == nil || b.Reason != "blocked by PDB guard" || b.Details[events.DetailBlockedBy] != "guard" {
		t.Fatalf("no blocked action naming the PDB: %s", outcomes(acts))
	}
	cl, err := reg.Get(cluster)
	if err != nil {
		t.Fatal(err)
	}
	if f := cl.Gate.Failures(); f != 0 {
		t.Fatalf("the refusal counted as %d cluster failures (%v)", f, cl.Gate.LastError())
	}
	if len(rq) != 1 {
		t.Fatalf("%d requeue records, want the drain back after poll_interval", len(rq))
	}
	if got := podsOn(t, k, node); len(got) != 1 || got[0].DeletionTimestamp != nil {
		t.Fatalf("pods %v: the PDB-covered pod must stay", podNames(got))
	}

	// A pod two PDBs select: the apiserver answers its eviction 500 "This
	// pod has more than one PodDisruptionBudget". The pod's refusal, noted
	// on it, not the cluster's trouble (podRefusal).
	twice := "unprocessed-2"
	quarantined(t, k, twice)
	createPod(t, k, "twice", "t0", twice, withLabels("app", "t"))
	waitRunning(t, k, twice, 1)
	pdb(t, k, "twice", "one", 0, "t")
	pdb(t, k, "twice", "two", 0, "t")
	acts, rq = handle(t, h, quarantineAction(twice, "e-twice", "RESTART_VM", nil))
	if f := cl.Gate.Failures(); f != 0 || len(rq) != 1 || requeue.AfterTrouble(rq[0]) || find(acts, events.OutcomeFailed) != nil {
		t.Fatalf("two PDBs: %s, %d requeues, %d cluster failures (%v): want the pod's refusal", outcomes(acts), len(rq), f, cl.Gate.LastError())
	}
	st := drainState(t, k, twice)
	if ps := st.Pods[podKey(&podsOn(t, k, twice)[0])]; ps == nil || ps.Attempts != 1 || !strings.Contains(ps.Reason, "more than one PodDisruptionBudget") {
		t.Fatalf("two PDBs: pods %v, want the refusal noted on the pod", st.Pods)
	}
}

// TestDrainResumedWhenClusterAnswers: a drain that met its cluster's API
// server down waits for the cluster, not for the backoff it met — an
// outage of minutes backs the cluster off by up to 30s, and the drain's
// follow-up is due once the API server answers.
func TestDrainResumedWhenClusterAnswers(t *testing.T) {
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	node := "back-1"
	quarantined(t, kube.Client(), node)
	kc := clusters.DefaultConfig()
	kc.Clusters = []clusters.Cluster{{Name: cluster, Kubeconfig: kube.Kubeconfig()}}
	reg := clusters.NewRegistry(kc, nil)
	clk := &clock{t: time.Now()}
	h, err := New(testConfig(), reg, Options{Log: testLog, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := reg.Get(cluster)
	if err != nil {
		t.Fatal(err)
	}

	kube.Kill()
	acts, rq := handle(t, h, quarantineAction(node, "e-back", "RESTART_VM", nil))
	if len(acts) != 0 || len(rq) != 1 {
		t.Fatalf("with the apiserver down: %s and %d requeue records, want nothing but the drain requeued", outcomes(acts), len(rq))
	}
	down := cl.Gate.LastError()
	for cl.Gate.Failures() < 12 { // an outage of minutes
		cl.Gate.Fail(down)
	}
	if _, next := cl.Gate.Ready(context.Background()); next.Sub(clk.Now()) < 14*time.Second {
		t.Fatalf("gate backed off only until %v", next)
	}

	kube.Start()
	back := time.Now()
	for acts == nil && time.Since(back) < 10*time.Second {
		time.Sleep(200 * time.Millisecond)
		acts, rq = handle(t, h, rq...)
	}
	t.Logf("drain stepped %v after the apiserver was back", time.Since(back))
	if find(acts, events.OutcomeSucceeded) == nil {
		t.Fatalf("after the apiserver is back: %s", outcomes(acts))
	}
}
