package processors_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/faultline/faultline/internal/clickhouse/chtest"
	"github.com/faultline/faultline/internal/history"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

var rebootGVR = schema.GroupVersionResource{Group: "janitor.dgxc.nvidia.com", Version: "v1alpha1", Resource: "rebootnodes"}

// TestNoHostileEventChangesANode runs the real pipeline roles (store,
// quarantine, drain, remediate, as `faultline process` runs them) over a
// real Kafka broker, ClickHouse and kube-apiserver, and sends what a
// hostile agent credential can: an event for a healthy node that no rule
// matches, asking to force the quarantine and the drain. The node, its
// PDB-protected pod and the remediation resources stay untouched, and the
// decision is recorded (actions topic and history) saying why. The same
// event from an operator credential cordons the node, deletes the
// PDB-protected pod and creates a RebootNode; with the circuit breaker
// full, an operator's force is held like any quarantine.
func TestNoHostileEventChangesANode(t *testing.T) {
	if testing.Short() {
		t.Skip("real Kafka, ClickHouse and kube-apiserver")
	}
	kube := testenv.StartKube(t, testenv.KubeOptions{ControllerManager: true}) // PDB status
	kube.ApplyCRDs(t, "../deploy/crds/*.yaml")
	k := kube.Client()
	kf := testenv.StartKafka(t)
	ch := chtest.Start(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("E2E_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// Ten GPU nodes: the breaker allows one new quarantine (10%).
	nodes := []string{"e2e-agent", "e2e-none", "e2e-op", "e2e-held"}
	for i := len(nodes); i < 10; i++ {
		nodes = append(nodes, "e2e-spare-"+string(rune('a'+i)))
	}
	for _, n := range nodes {
		if _, err := k.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"gpu": "true"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := k.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "work"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"e2e-agent", "e2e-none", "e2e-op"} {
		runningPod(t, k, "db-"+n, n)
	}
	// The budget allows no disruption: the Eviction API refuses (429).
	all := intstr.FromInt32(3)
	if _, err := k.PolicyV1().PodDisruptionBudgets("work").Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &all, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		b, err := k.PolicyV1().PodDisruptionBudgets("work").Get(ctx, "db", metav1.GetOptions{})
		if err == nil && b.Status.ObservedGeneration == b.Generation && b.Status.ExpectedPods == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("PDB status not observed: %v %v", b.Status, err)
		}
	}

	cfg := processors.DefaultConfig()
	cfg.Roles = "store,quarantine,drain,remediate"
	cfg.ClickHouse = ch.Config
	cfg.Store.BatchLinger = 100 * time.Millisecond
	cfg.Kube.Clusters = []clusters.Cluster{{Name: "prod", Kubeconfig: kube.Kubeconfig()}}
	cfg.Quarantine.Identity = "faultline-quarantine/e2e"
	cfg.Quarantine.Breaker.GPUNodeSelector = "gpu=true"
	cfg.Quarantine.Breaker.AutoClose = false
	cfg.Drain.GracePeriod = 0
	cfg.Drain.PollInterval = time.Second
	runProcessors(ctx, t, cfg, kf.Addr(), log)

	cl := kf.Client(t, kgo.ConsumeTopics(events.TopicActions), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var acts []*faultlinev1.Action
	// waitAction returns the first action of node matching role/kind/outcome.
	waitAction := func(node, role, kind, outcome string) *faultlinev1.Action {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			for _, a := range acts {
				if a.Node == node && a.Role == role && a.Kind == kind && a.Outcome == outcome {
					return a
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s %s/%s action for %s; actions: %s", role, kind, outcome, node, describe(acts))
			}
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) {
				if a, err := events.UnmarshalAction(r.Value); err == nil {
					acts = append(acts, a)
				}
			})
			pcancel()
		}
	}
	send := func(ev *datamodels.HealthEvent) {
		t.Helper()
		// What the gateway produces: cluster from the credential, an id,
		// the received time, the submitter it authenticated.
		ev.Cluster, ev.Id, ev.ReceivedTimestamp = "prod", events.NewID(), timestamppb.Now()
		b, err := events.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: events.TopicEvents, Key: events.Key("prod", ev.NodeName), Value: b}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	hostile := func(node string, sub *datamodels.Submitter) *datamodels.HealthEvent {
		return &datamodels.HealthEvent{
			Version: 1, Agent: "not-a-monitor", ComponentClass: "GPU", CheckName: "PleaseReboot", IsFatal: true,
			Message: "nothing is wrong", RecommendedAction: datamodels.RecommendedAction_RESTART_VM, NodeName: node,
			GeneratedTimestamp: timestamppb.Now(), Submitter: sub,
			QuarantineOverrides: &datamodels.BehaviourOverrides{Force: true},
			DrainOverrides:      &datamodels.BehaviourOverrides{Force: true},
		}
	}
	before := map[string]string{}
	for _, n := range []string{"e2e-agent", "e2e-none", "e2e-held"} {
		nd, _ := k.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		before[n] = nd.ResourceVersion
	}

	// An agent credential, and an event no gateway stamped: ignored, said so.
	send(hostile("e2e-agent", &datamodels.Submitter{Name: "token:prod#3", Role: datamodels.SubmitterRole_SUBMITTER_ROLE_AGENT}))
	send(hostile("e2e-none", nil))
	for n, who := range map[string]string{"e2e-agent": "agent credential token:prod#3", "e2e-none": "agent credential (none recorded)"} {
		a := waitAction(n, "quarantine", "skip", "skipped")
		want := "no rule set matched (quarantineOverrides.force, drainOverrides.force ignored: sent by " + who + ")"
		if a.Reason != want || a.Details["overridesIgnored"] == "" || a.Details["drainOverrides"] != "" {
			t.Fatalf("%s: decision %q %v, want %q", n, a.Reason, a.Details, want)
		}
	}

	// An operator: cordoned without a rule, the PDB-protected pod deleted,
	// a RebootNode created.
	op := &datamodels.Submitter{Name: "token:ops#1", Role: datamodels.SubmitterRole_SUBMITTER_ROLE_OPERATOR}
	send(hostile("e2e-op", op))
	q := waitAction("e2e-op", "quarantine", "quarantine", "applied")
	if q.Rule != "override-force" || q.Details["submitterRole"] != "operator" {
		t.Fatalf("operator quarantine %v", q)
	}
	d := waitAction("e2e-op", "drain", "drain", "succeeded")
	if d.Details["deleted"] != "1" || d.Details["force"] != "true" {
		t.Fatalf("operator drain %v", d.Details)
	}
	waitAction("e2e-op", "remediate", "remediate", "applied")
	if n, _ := k.CoreV1().Nodes().Get(ctx, "e2e-op", metav1.GetOptions{}); !n.Spec.Unschedulable {
		t.Fatal("e2e-op not cordoned")
	}
	dyn, err := dynamic.NewForConfig(kube.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	rns, err := dyn.Resource(rebootGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rns.Items) != 1 {
		t.Fatalf("%d RebootNodes, want the operator's one", len(rns.Items))
	}
	if n, _, _ := unstructured.NestedString(rns.Items[0].Object, "spec", "nodeName"); n != "e2e-op" {
		t.Fatalf("RebootNode for %q", n)
	}

	// The breaker's one slot is taken: an operator's force is held.
	send(hostile("e2e-held", op))
	held := waitAction("e2e-held", "quarantine", "quarantine", "held_by_breaker")
	if held.Rule != "override-force" || !strings.Contains(held.Reason, "circuit breaker open") {
		t.Fatalf("held %v", held)
	}

	// Nothing changed what the agent and the unstamped event asked about.
	for n, rv := range before {
		nd, _ := k.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if nd.ResourceVersion != rv || nd.Spec.Unschedulable {
			t.Errorf("node %s changed (resourceVersion %s -> %s, unschedulable %v)", n, rv, nd.ResourceVersion, nd.Spec.Unschedulable)
		}
	}
	for _, n := range []string{"e2e-agent", "e2e-none"} {
		if _, err := k.CoreV1().Pods("work").Get(ctx, "db-"+n, metav1.GetOptions{}); err != nil {
			t.Errorf("pod of %s: %v", n, err)
		}
		for _, a := range acts {
			if a.Node == n && a.Role != "quarantine" {
				t.Errorf("%s: %s %s/%s", n, a.Role, a.Kind, a.Outcome)
			}
		}
	}

	// The decision and who sent the event are in the history.
	h := history.New(ch.Conn, log)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ev, _ := h.ListEvents(ctx, "prod", &faultlinev1.ListEventsRequest{Node: "e2e-agent"})
		ac, _ := h.ListActions(ctx, "prod", &faultlinev1.ListActionsRequest{Node: "e2e-agent"})
		if len(ev.GetEvents()) == 1 && len(ac.GetActions()) == 1 {
			if s := ev.Events[0].GetSubmitter(); s.GetName() != "token:prod#3" || s.GetRole() != datamodels.SubmitterRole_SUBMITTER_ROLE_AGENT {
				t.Fatalf("stored submitter %v", s)
			}
			if !strings.Contains(ac.Actions[0].Reason, "ignored: sent by agent credential token:prod#3") {
				t.Fatalf("stored decision %q", ac.Actions[0].Reason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("history: %d events, %d actions of e2e-agent", len(ev.GetEvents()), len(ac.GetActions()))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// runProcessors runs the roles of cfg on the broker at brokers (the
// pipeline's topics created, 3 partitions each) until the test ends.
func runProcessors(ctx context.Context, t *testing.T, cfg processors.Config, brokers string, log *slog.Logger) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers, kcfg.Partitions, kcfg.ReplicationFactor = brokers, 3, 1
	if err := kafka.CreatePipelineTopics(ctx, kcfg, log); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		reg := prometheus.NewRegistry()
		if err := processors.Run(runCtx, cfg, processors.Deps{Log: log, Registry: reg, Kafka: kcfg, Metrics: pipeline.NewMetrics(reg)}); err != nil {
			t.Errorf("processors: %v", err)
		}
	}()
	t.Cleanup(func() { stop(); <-done })
}

// runningPod creates a pod of the PDB on node and marks it Running (no
// kubelet runs: the Eviction API honours PDBs only for running pods).
func runningPod(t *testing.T, k kubernetes.Interface, name, node string) {
	t.Helper()
	ctx := context.Background()
	p, err := k.CoreV1().Pods("work").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "db"}},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = corev1.PodRunning
	if _, err := k.CoreV1().Pods("work").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func describe(acts []*faultlinev1.Action) string {
	var s []string
	for _, a := range acts {
		s = append(s, a.Node+":"+a.Role+":"+a.Kind+"/"+a.Outcome+" "+a.Reason)
	}
	return strings.Join(s, "\n")
}
