package testenv_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"

	"github.com/faultline/faultline/internal/testenv"
)

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// produce writes n records with keys k0..k{n-1} to topic, synchronously.
func produce(t *testing.T, cl *kgo.Client, topic string, from, n int) {
	t.Helper()
	ctx := ctxTimeout(t, 60*time.Second)
	for i := from; i < from+n; i++ {
		r := &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprintf("v%d", i))}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce %d: %v", i, err)
		}
	}
}

// consumeAll reads topic from the start until it has want records.
func consumeAll(t *testing.T, k *testenv.Kafka, topic string, want int) map[string]string {
	t.Helper()
	cl := k.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx := ctxTimeout(t, 60*time.Second)
	got := map[string]string{}
	for len(got) < want {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d records: %v", len(got), want, err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Logf("fetch %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) { got[string(r.Key)] = string(r.Value) })
	}
	return got
}

func TestKafka(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t)
	const topic = "testenv-roundtrip"
	prod := k.Client(t, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.AllowAutoTopicCreation())
	produce(t, prod, topic, 0, 10) // auto-created

	// The auto-created topic has the default 6 partitions.
	ctx := ctxTimeout(t, 30*time.Second)
	td, err := k.Admin(t).ListTopics(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(td[topic].Partitions); n != 6 {
		t.Errorf("auto-created topic has %d partitions, want 6", n)
	}
	if got := consumeAll(t, k, topic, 10); got["k3"] != "v3" {
		t.Fatalf("consumed %v", got)
	}

	// Graceful stop, restart on the same port: the records survive.
	k.Stop()
	k.Start()
	produce(t, k.Client(t), topic, 10, 5)
	if got := consumeAll(t, k, topic, 15); got["k0"] != "v0" || got["k14"] != "v14" {
		t.Fatalf("after restart consumed %v", got)
	}

	// A crash loses nothing that was acknowledged either.
	k.Kill()
	k.Start()
	if got := consumeAll(t, k, topic, 15); len(got) != 15 {
		t.Fatalf("after kill consumed %d records", len(got))
	}
}

func TestKafkaNoAutoCreate(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, testenv.KafkaAutoCreateTopics(false))
	// The client asks for auto-creation; the broker must refuse it.
	cl := k.Client(t, kgo.AllowAutoTopicCreation(), kgo.RecordDeliveryTimeout(3*time.Second))
	err := cl.ProduceSync(ctxTimeout(t, 30*time.Second), &kgo.Record{Topic: "absent", Value: []byte("x")}).FirstErr()
	if err == nil {
		t.Fatal("produce to a missing topic succeeded with auto-create off")
	}
	k.CreateTopic(t, "present", 2)
	produce(t, cl, "present", 0, 1)
}

func TestClickHouse(t *testing.T) {
	t.Parallel()
	ch := testenv.StartClickHouse(t)
	db := ch.DB(t)
	ctx := ctxTimeout(t, 60*time.Second)

	var version string
	if err := db.QueryRow(ctx, "SELECT version()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	t.Logf("clickhouse server version %s", version)

	if err := db.Exec(ctx, `CREATE TABLE events (
		cluster String, node String, ts DateTime, ms UInt16, n UInt64, tags Array(String)
	) ENGINE = MergeTree() PARTITION BY toYYYYMMDD(ts) ORDER BY (cluster, node, ts)`); err != nil {
		t.Fatal(err)
	}
	batch, err := db.PrepareBatch(ctx, "INSERT INTO events (cluster, node, ts, ms, n, tags)")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	for i := 0; i < 1000; i++ {
		if err := batch.Append("c1", fmt.Sprintf("node-%d", i%10), now, uint16(i%1000), uint64(i), []string{"a", "b"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		var count, sum uint64
		var nodes uint64
		row := db.QueryRow(ctx, "SELECT count(), sum(n), uniqExact(node) FROM events WHERE cluster = ?", "c1")
		if err := row.Scan(&count, &sum, &nodes); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if count != 1000 || sum != 999*1000/2 || nodes != 10 {
			t.Fatalf("%s: count=%d sum=%d nodes=%d", when, count, sum, nodes)
		}
	}
	check("after insert")

	rows, err := db.Query(ctx, "SELECT node, ts, tags FROM events WHERE n < 3 ORDER BY n")
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for rows.Next() {
		var node string
		var ts time.Time
		var tags []string
		if err := rows.Scan(&node, &ts, &tags); err != nil {
			t.Fatal(err)
		}
		if !ts.Equal(now) || len(tags) != 2 {
			t.Errorf("row %d: ts=%v tags=%v", n, ts, tags)
		}
		n++
	}
	if err := rows.Err(); err != nil || n != 3 {
		t.Fatalf("read %d rows: %v", n, err)
	}

	ch.Stop()
	ch.Start()
	db = ch.DB(t)
	check("after restart")
}

func TestKube(t *testing.T) {
	t.Parallel()
	k := testenv.StartKube(t, testenv.KubeOptions{})
	cs := k.Client()
	ctx := ctxTimeout(t, 120*time.Second)

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1", Labels: map[string]string{"nvidia.com/gpu.present": "true"}}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"spec":{"unschedulable":true,"taints":[{"key":"faultline.dev/quarantine","value":"xid-79","effect":"NoSchedule"}]}}`)
	if _, err := cs.CoreV1().Nodes().Patch(ctx, "gpu-node-1", types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	// A CRD, and a custom resource of it.
	dyn, err := dynamic.NewForConfig(k.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": "rebootnodes.faultline.dev"},
		"spec": map[string]any{
			"group": "faultline.dev",
			"scope": "Cluster",
			"names": map[string]any{"plural": "rebootnodes", "singular": "rebootnode", "kind": "RebootNode"},
			"versions": []any{map[string]any{
				"name": "v1alpha1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type":                                 "object",
					"x-kubernetes-preserve-unknown-fields": true,
				}},
			}},
		},
	}}
	if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rbGVR := schema.GroupVersionResource{Group: "faultline.dev", Version: "v1alpha1", Resource: "rebootnodes"}
	rb := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "faultline.dev/v1alpha1",
		"kind":       "RebootNode",
		"metadata":   map[string]any{"name": "gpu-node-1-reboot"},
		"spec":       map[string]any{"nodeName": "gpu-node-1"},
	}}
	// The CRD's resource is served a moment after the CRD is created.
	for {
		_, err := dyn.Resource(rbGVR).Create(ctx, rb, metav1.CreateOptions{})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("create RebootNode: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// An API outage: the objects survive a restart of the apiserver.
	k.Stop()
	if _, err := cs.CoreV1().Nodes().Get(ctx, "gpu-node-1", metav1.GetOptions{}); err == nil {
		t.Fatal("apiserver answered while stopped")
	}
	k.Start()
	got, err := cs.CoreV1().Nodes().Get(ctx, "gpu-node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !got.Spec.Unschedulable || len(got.Spec.Taints) != 1 || got.Spec.Taints[0].Value != "xid-79" {
		t.Fatalf("node after restart: unschedulable=%v taints=%v", got.Spec.Unschedulable, got.Spec.Taints)
	}
	if _, err := dyn.Resource(rbGVR).Get(ctx, "gpu-node-1-reboot", metav1.GetOptions{}); err != nil {
		t.Fatalf("RebootNode after restart: %v", err)
	}

	// The kubeconfig file points at the same server.
	cfg, err := os.ReadFile(k.Kubeconfig())
	if err != nil || !strings.Contains(string(cfg), k.RESTConfig().Host) {
		t.Fatalf("kubeconfig %s: %v\n%s", k.Kubeconfig(), err, cfg)
	}
}

func TestKubeEviction(t *testing.T) {
	t.Parallel()
	k := testenv.StartKube(t, testenv.KubeOptions{ControllerManager: true, KWOK: true})
	cs := k.Client()
	ctx := ctxTimeout(t, 180*time.Second)

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "kwok-node-1"}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "node Ready", func() bool {
		n, err := cs.CoreV1().Nodes().Get(ctx, "kwok-node-1", metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return true
			}
		}
		return false
	})

	labels := map[string]string{"app": "trainer"}
	for i := 0; i < 2; i++ {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("trainer-%d", i), Namespace: "default", Labels: labels},
			Spec: corev1.PodSpec{
				NodeName:   "kwok-node-1",
				Containers: []corev1.Container{{Name: "c", Image: "trainer:1"}},
			},
		}
		if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, ctx, "pods Running", func() bool {
		pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=trainer"})
		if err != nil || len(pods.Items) != 2 {
			return false
		}
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodRunning {
				return false
			}
		}
		return true
	})

	minAvailable := intstr.FromInt32(2)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: "default"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: &minAvailable,
			Selector:     &metav1.LabelSelector{MatchLabels: labels},
		},
	}
	if _, err := cs.PolicyV1().PodDisruptionBudgets("default").Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The disruption controller computes the status.
	waitFor(t, ctx, "PDB status", func() bool {
		p, err := cs.PolicyV1().PodDisruptionBudgets("default").Get(ctx, "trainer", metav1.GetOptions{})
		return err == nil && p.Status.ObservedGeneration == p.Generation && p.Status.CurrentHealthy == 2
	})
	evict := func(name string) error {
		return cs.CoreV1().Pods("default").EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}})
	}
	if err := evict("trainer-0"); !apierrors.IsTooManyRequests(err) {
		t.Fatalf("eviction under a PDB with no disruptions allowed: got %v, want 429", err)
	}

	// Relax the budget: the eviction is accepted and kwok removes the pod.
	oneAvailable := intstr.FromInt32(1)
	pdb, err := cs.PolicyV1().PodDisruptionBudgets("default").Get(ctx, "trainer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pdb.Spec.MinAvailable = &oneAvailable
	if _, err := cs.PolicyV1().PodDisruptionBudgets("default").Update(ctx, pdb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "eviction accepted", func() bool {
		err := evict("trainer-0")
		if err != nil && !apierrors.IsTooManyRequests(err) {
			t.Fatalf("evict: %v", err)
		}
		return err == nil
	})
	waitFor(t, ctx, "evicted pod gone", func() bool {
		_, err := cs.CoreV1().Pods("default").Get(ctx, "trainer-0", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

// waitFor polls cond every 100 ms until it is true or ctx ends.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
