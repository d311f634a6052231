package quarantine

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"k8s.io/client-go/kubernetes"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// retryUntil feeds deferred records to HandleRetry the way the retry
// consumer's pipeline does: a failed batch is retried after a backoff.
func retryUntil(t *testing.T, h *Handler, recs []*kgo.Record, within time.Duration) []*faultlinev1.Action {
	t.Helper()
	deadline := time.Now().Add(within)
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := h.HandleRetry(ctx, recs)
		cancel()
		if err == nil {
			acts, again := splitOut(t, res.Out)
			if len(again) > 0 {
				t.Fatalf("retry consumer deferred %d records again", len(again))
			}
			return acts
		}
		if time.Now().After(deadline) {
			t.Fatalf("retry batch still failing after %d attempts: %v", attempt, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Two clusters, two apiservers, the same node names: events act only on
// their own cluster, and a dead apiserver (killed) does not hold up the other
// cluster's records of the same batch; its records are deferred and applied
// once it is back.
func TestTwoClustersIsolated(t *testing.T) {
	t.Parallel() // its own servers; mostly waiting
	ka := testenv.StartKube(t, testenv.KubeOptions{})
	kb := testenv.StartKube(t, testenv.KubeOptions{})
	for _, k := range []*testenv.Kube{ka, kb} {
		createNodes(t, k.Client(), "two", "node-1", "node-2", "node-3")
	}
	cfg := testConfig("two")
	// The shipped wait (a killed apiserver is probed, not waited for: a's
	// records are deferred at once either way).
	cfg.ClusterWait = 3 * time.Second
	// A failed cluster's records are deferred at once for 2×RetryWait:
	// long enough here that the second batch falls within it however
	// slowly the first one's checks run.
	cfg.RetryWait = 5 * time.Second
	h := newTestHandler(t, cfg, map[string]kubernetes.Interface{"a": ka.Client(), "b": kb.Client()})

	handle(t, h, record("a", fatal("node-1", "XID_ERROR_48", "GPU-1")))
	if !getNode(t, ka.Client(), "node-1").Spec.Unschedulable || getNode(t, kb.Client(), "node-1").Spec.Unschedulable {
		t.Fatal("an event of cluster a must cordon a's node-1 and only it")
	}

	ka.Kill()
	start := time.Now()
	acts, deferred := handle(t, h,
		record("a", fatal("node-2", "XID_ERROR_48", "GPU-1")),
		record("b", fatal("node-2", "XID_ERROR_48", "GPU-1")),
		record("b", fatal("node-3", "XID_ERROR_48", "GPU-1")))
	took := time.Since(start)
	if kinds(acts) != "quarantine/applied,quarantine/applied" || len(deferred) != 1 {
		t.Fatalf("with a down: actions %s, %d deferred", kinds(acts), len(deferred))
	}
	if took > h.cfg.ClusterWait+5*time.Second {
		t.Fatalf("batch took %v: cluster a held up cluster b", took)
	}
	for _, n := range []string{"node-2", "node-3"} {
		if !getNode(t, kb.Client(), n).Spec.Unschedulable {
			t.Fatalf("b/%s not cordoned while a is down", n)
		}
	}
	// The next batch defers a's record at once (keeping a's order) and
	// applies b's.
	start = time.Now()
	acts2, deferred2 := handle(t, h,
		record("a", healthy("node-1", "XID_ERROR_48", "GPU-1")),
		record("b", healthy("node-2", "XID_ERROR_48", "GPU-1")))
	if kinds(acts2) != "unquarantine/applied" || len(deferred2) != 1 || time.Since(start) >= h.cfg.ClusterWait {
		t.Fatalf("second batch: %s, %d deferred, %v", kinds(acts2), len(deferred2), time.Since(start))
	}
	// While a is down the retry consumer fails its batch (to be retried).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if _, err := h.HandleRetry(ctx, append(deferred, deferred2...)); err == nil {
		t.Fatal("retry batch succeeded with the apiserver down")
	}
	cancel()

	ka.Start()
	acts3 := retryUntil(t, h, append(deferred, deferred2...), 30*time.Second)
	if kinds(acts3) != "quarantine/applied,unquarantine/applied" {
		t.Fatalf("after a is back: %s", kinds(acts3))
	}
	if !getNode(t, ka.Client(), "node-2").Spec.Unschedulable || getNode(t, ka.Client(), "node-1").Spec.Unschedulable {
		t.Fatal("a's deferred records not applied in order")
	}

	// A retry batch fails for a down cluster after it released a node of
	// the other: the redo finds the node released and decides nothing, so
	// the release's action is the one kept from the failed try.
	kb.Kill()
	_, deferredB := handle(t, h, record("b", healthy("node-3", "XID_ERROR_48", "GPU-1")))
	kb.Start()
	ka.Kill()
	// As consumed from TopicRetry, where every cluster's records waited
	// before each had its own topic.
	batch := append(deferredB, retryRecord("a", record("a", fatal("node-3", "XID_ERROR_48", "GPU-1"))))
	for i, r := range batch {
		r.Topic, r.Partition, r.Offset = TopicRetry, 0, int64(100+i)
	}
	for deadline := time.Now().Add(30 * time.Second); getNode(t, kb.Client(), "node-3").Spec.Unschedulable; {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := h.HandleRetry(ctx, batch)
		cancel()
		if err == nil || time.Now().After(deadline) {
			t.Fatalf("retry batch with a down: %v", err)
		}
	}
	ka.Start()
	if acts := retryUntil(t, h, batch, 30*time.Second); kinds(acts) != "unquarantine/applied,quarantine/applied" {
		t.Fatalf("redo after a is back: %s", kinds(acts))
	}
}

// The apiserver is killed while a batch of 40 failing nodes is being
// handled: whatever was not applied is deferred, retried while the
// apiserver is down, and applied once it is back. No fault is lost.
func TestAPIServerStoppedMidRunRetriedWithoutLoss(t *testing.T) {
	t.Parallel() // its own servers; mostly waiting
	k := testenv.StartKube(t, testenv.KubeOptions{})
	const nodes = 40
	var names []string
	for i := range nodes {
		names = append(names, fmt.Sprintf("outage-%02d", i))
	}
	createNodes(t, k.Client(), "outage", names...)
	cfg := testConfig("outage")
	cfg.Workers = 4 // slow enough that the stop lands mid-batch
	h := newTestHandler(t, cfg, map[string]kubernetes.Interface{"c1": k.Client()})
	var recs []*kgo.Record
	for _, n := range names {
		recs = append(recs, record("c1", fatal(n, "XID_ERROR_48", "GPU-1")))
	}
	stopped := make(chan struct{})
	go func() {
		time.Sleep(150 * time.Millisecond)
		k.Kill()
		close(stopped)
	}()
	acts, deferred := handle(t, h, recs...)
	<-stopped
	t.Logf("before the stop: %d applied, %d deferred", len(acts), len(deferred))
	if len(acts)+len(deferred) != nodes {
		t.Fatalf("%d actions + %d deferred != %d records", len(acts), len(deferred), nodes)
	}
	if len(deferred) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := h.HandleRetry(ctx, deferred); err == nil {
			t.Fatal("retry batch succeeded with the apiserver down")
		}
		cancel()
	}
	// Started from the test goroutine: testenv's child processes die with
	// the OS thread that started them (Pdeathsig).
	k.Start()
	if len(deferred) > 0 {
		acts = append(acts, retryUntil(t, h, deferred, 60*time.Second)...)
	}
	for _, n := range names {
		if got := kinds(onNode(acts, n)); got != "quarantine/applied" {
			t.Fatalf("%s: %s, want one applied quarantine", n, got)
		}
		if !getNode(t, k.Client(), n).Spec.Unschedulable {
			t.Fatalf("%s not cordoned after the outage", n)
		}
	}
}

// An apiserver back after a long outage, its gate backed off to the
// shipped cap (15-30 s): the deferred fault is applied within seconds,
// because each try of the retry batch probes the cluster (GET /readyz)
// rather than waiting the backoff out.
func TestClusterBackRetriedWithinSeconds(t *testing.T) {
	t.Parallel() // its own servers; mostly waiting
	k := testenv.StartKube(t, testenv.KubeOptions{})
	createNodes(t, k.Client(), "back", "node-1")
	h := newTestHandler(t, testConfig("back"), map[string]kubernetes.Interface{"c1": k.Client()})
	cl, err := h.reg.Get("c1")
	if err != nil {
		t.Fatal(err)
	}
	shipped := clusters.NewGate(nil)
	cl.Gate.MinBackoff, cl.Gate.MaxBackoff = shipped.MinBackoff, shipped.MaxBackoff

	k.Kill()
	_, deferred := handle(t, h, record("c1", fatal("node-1", "XID_ERROR_48", "GPU-1")))
	if len(deferred) != 1 {
		t.Fatalf("%d records deferred with the apiserver down, want 1", len(deferred))
	}
	down := cl.Gate.LastError()
	if !clusters.Unreachable(down) {
		t.Fatalf("a killed apiserver's error is not Unreachable: %v", down)
	}
	for cl.Gate.Failures() < 12 { // an outage of minutes
		cl.Gate.Fail(down)
	}
	if _, next := cl.Gate.Ready(context.Background()); time.Until(next) < 14*time.Second {
		t.Fatalf("gate backed off only until %v", next)
	}

	k.Start()
	back := time.Now()
	acts := retryUntil(t, h, deferred, 10*time.Second)
	t.Logf("applied %v after the apiserver was back", time.Since(back))
	if kinds(acts) != "quarantine/applied" || !getNode(t, k.Client(), "node-1").Spec.Unschedulable {
		t.Fatalf("after the apiserver is back: %s", kinds(acts))
	}
}

// TestSlowClusterDeferred: a cluster whose API server answers every
// request, but in 1.5 s, holds only its own records. Alone, it is served
// in the batch however slow (there is no one to hold). Beside another
// cluster, a batch defers its records to its retry topic without a
// request, so the other cluster's fault beside it is cordoned at once
// rather than after the slow cluster's several requests in turn, and its
// retry consumer applies the deferred one. Fast again, it is found so by
// the retry consumer's requests.
func TestSlowClusterDeferred(t *testing.T) {
	t.Parallel() // its own servers; mostly waiting
	k := testenv.StartKube(t, testenv.KubeOptions{})
	createNodes(t, k.Client(), "slow", "slow-0", "slow-1", "slow-2", "slow-3", "fast-1")
	h := newTestHandler(t, testConfig("slow"), nil)
	const delay = 1500 * time.Millisecond
	var slowBy atomic.Int64
	slowBy.Store(int64(delay))
	cl, err := h.reg.SetConfig("slow", testenv.Delayed(k.RESTConfig(), &slowBy))
	if err != nil {
		t.Fatal(err)
	}
	slowGauge := h.m.clusterSlow.WithLabelValues("slow")

	for _, node := range []string{"slow-0", "slow-1"} {
		if _, deferred := handle(t, h, record("slow", fatal(node, "XID_ERROR_48", "GPU-1"))); len(deferred) != 0 {
			t.Fatalf("%s: the only cluster deferred for being slow", node)
		}
		if !getNode(t, k.Client(), node).Spec.Unschedulable {
			t.Fatalf("%s: the slow cluster's fault was not applied", node)
		}
	}
	if !cl.Gate.Slow(h.cfg.SlowCluster) || gaugeValue(slowGauge) != 0 {
		t.Fatalf("alone: the cluster's requests average %v (slow past %v), faultline_quarantine_cluster_slow %v",
			cl.Gate.Latency(), h.cfg.SlowCluster, gaugeValue(slowGauge))
	}
	h.reg.SetClient("fast", k.Client(), false)

	start := time.Now()
	acts, deferred := handle(t, h,
		record("slow", fatal("slow-2", "XID_ERROR_48", "GPU-1")),
		record("fast", fatal("fast-1", "XID_ERROR_48", "GPU-1")))
	took := time.Since(start)
	if kinds(acts) != "quarantine/applied" || len(deferred) != 1 || deferred[0].Topic != RetryTopic("slow") {
		t.Fatalf("beside the slow cluster: actions %s, %d deferred", kinds(acts), len(deferred))
	}
	if took >= delay {
		t.Fatalf("the batch took %v: the slow cluster held the other's cordon", took.Round(time.Millisecond))
	}
	if !getNode(t, k.Client(), "fast-1").Spec.Unschedulable || getNode(t, k.Client(), "slow-2").Spec.Unschedulable {
		t.Fatal("fast-1 must be cordoned by the batch, slow-2 left to the retry consumer")
	}
	if v := gaugeValue(slowGauge); v != 1 {
		t.Fatalf("faultline_quarantine_cluster_slow{cluster=slow} = %v while deferred for being slow", v)
	}
	if acts := retryUntil(t, h, deferred, 30*time.Second); kinds(acts) != "quarantine/applied" {
		t.Fatalf("the retry consumer: %s", kinds(acts))
	}
	if !getNode(t, k.Client(), "slow-2").Spec.Unschedulable {
		t.Fatal("slow-2 not cordoned by the retry consumer")
	}

	// Fast again: its next fault still goes by the retry consumer, whose
	// requests, answered at once, make it fast.
	slowBy.Store(0)
	_, deferred = handle(t, h, record("slow", fatal("slow-3", "XID_ERROR_48", "GPU-1")))
	if len(deferred) != 1 {
		t.Fatalf("%d of the slow cluster's records deferred before it answered fast", len(deferred))
	}
	if acts := retryUntil(t, h, deferred, 30*time.Second); kinds(acts) != "quarantine/applied" {
		t.Fatalf("the retry consumer: %s", kinds(acts))
	}
	if cl.Gate.Slow(h.cfg.SlowCluster) {
		t.Fatalf("answering at once, the cluster is still slow: its requests average %v", cl.Gate.Latency())
	}
	// Past the grace period of its last deferral, its records are applied
	// in the batch again.
	time.Sleep(2 * h.cfg.RetryWait)
	if acts, deferred := handle(t, h, record("slow", healthy("slow-3", "XID_ERROR_48", "GPU-1"))); kinds(acts) != "unquarantine/applied" || len(deferred) != 0 {
		t.Fatalf("fast again: actions %s, %d deferred", kinds(acts), len(deferred))
	}
	if v := gaugeValue(slowGauge); v != 0 {
		t.Fatalf("faultline_quarantine_cluster_slow{cluster=slow} = %v once fast", v)
	}
	t.Logf("the batch beside the slow cluster took %v", took.Round(time.Millisecond))
}

// TestClusterTurningSlowNotWaitedFor: a cluster that was fast turns slow
// while a batch works for it (the first batch to meet it, before any of
// its slow requests is answered). Once a request has been in flight for
// twice slow_cluster the batch abandons it and defers the cluster's
// records, instead of waiting for the cordon's requests one after another
// (3 × 1.5 s here); the retry consumer then applies them, once.
func TestClusterTurningSlowNotWaitedFor(t *testing.T) {
	t.Parallel() // its own servers; mostly waiting
	k := testenv.StartKube(t, testenv.KubeOptions{})
	createNodes(t, k.Client(), "turning", "turning-0", "turning-1", "fast-1")
	h := newTestHandler(t, testConfig("turning"), nil)
	const delay = 1500 * time.Millisecond
	var slowBy atomic.Int64
	cl, err := h.reg.SetConfig("turning", testenv.Delayed(k.RESTConfig(), &slowBy))
	if err != nil {
		t.Fatal(err)
	}
	h.reg.SetClient("fast", k.Client(), false)
	if _, deferred := handle(t, h, record("turning", fatal("turning-0", "XID_ERROR_48", "GPU-1"))); len(deferred) != 0 {
		t.Fatal("deferred while fast")
	}
	if cl.Gate.Slow(h.cfg.SlowCluster) {
		t.Fatalf("slow before the test: %v", cl.Gate.Latency())
	}

	slowBy.Store(int64(delay))
	start := time.Now()
	acts, deferred := handle(t, h,
		record("turning", fatal("turning-1", "XID_ERROR_48", "GPU-1")),
		record("fast", fatal("fast-1", "XID_ERROR_48", "GPU-1")))
	took := time.Since(start)
	if kinds(acts) != "quarantine/applied" || len(deferred) != 1 || deferred[0].Topic != RetryTopic("turning") {
		t.Fatalf("the batch that met the cluster turning slow: actions %s, %d deferred", kinds(acts), len(deferred))
	}
	if took >= delay+delay/2 { // ≈ 1.0–1.25 s; waiting for the cordon's writes, ≥ 3 s
		t.Fatalf("the batch took %v: it waited for the cluster turning slow", took.Round(time.Millisecond))
	}
	if !getNode(t, k.Client(), "fast-1").Spec.Unschedulable {
		t.Fatal("fast-1 not cordoned by the batch")
	}
	if v := gaugeValue(h.m.clusterSlow.WithLabelValues("turning")); v != 1 {
		t.Fatalf("faultline_quarantine_cluster_slow{cluster=turning} = %v", v)
	}
	if acts := retryUntil(t, h, deferred, 30*time.Second); kinds(acts) != "quarantine/applied" {
		t.Fatalf("the retry consumer: %s", kinds(acts))
	}
	if !getNode(t, k.Client(), "turning-1").Spec.Unschedulable {
		t.Fatal("turning-1 not cordoned by the retry consumer")
	}
	t.Logf("the batch that met the cluster turning slow took %v", took.Round(time.Millisecond))
}
