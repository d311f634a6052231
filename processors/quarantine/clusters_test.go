package quarantine

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
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

// delayed returns a client of k whose every request waits delay before it
// is sent: an API server that answers, but slowly (overloaded, its etcd
// slow, far away); its requests are measured as a Registry's are
// (clusters.Latency).
func delayed(t *testing.T, k *testenv.Kube, delay time.Duration) kubernetes.Interface {
	t.Helper()
	return limited(t, k, delay, 0)
}

// measured is a client whose requests are measured (newTestHandler sets
// its cluster's Client.Latency).
type measured struct {
	*kubernetes.Clientset
	lat *clusters.Latency
}

// limited is delayed with the client's own rate limit set to qps (burst 1;
// 0: the test config's).
func limited(t *testing.T, k *testenv.Kube, delay time.Duration, qps float32) kubernetes.Interface {
	t.Helper()
	rc := k.RESTConfig()
	if qps > 0 {
		rc.QPS, rc.Burst = qps, 1
	}
	lat := &clusters.Latency{}
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return lat.WrapTransport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
			select {
			case <-time.After(delay):
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
			return rt.RoundTrip(r)
		}))
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return measured{Clientset: kube, lat: lat}
}

// TestSlowClusterHoldsNoBatch: one batch mixes a prompt cluster's records
// with those of a cluster whose API server answers, but each request in
// 2 s (not a failure, nor a timeout). The batch is done within about
// quarantine.cluster_wait: the prompt cluster's fault is applied, the slow
// one's records are deferred to its retry topic, and its retry consumer
// applies them at the cluster's own pace. Before, the batch — and with it
// the other clusters' records of the partition and the replica's next
// poll — waited for the slow cluster's requests, up to the batch timeout
// (2 min). A cluster that is merely busy — more work than its client's
// rate limit (kube.qps) gets through in cluster_wait, every request
// answered promptly — is not cut: its records are all applied in the
// batch, none deferred (a mass failure in one cluster is cordoned at the
// client's pace, not through the retry topic and its grace period).
func TestSlowClusterHoldsNoBatch(t *testing.T) {
	k := testenv.StartKube(t, testenv.KubeOptions{})
	for _, tc := range []struct {
		name    string
		delay   time.Duration
		qps     float32 // the second cluster's client rate limit (0: default)
		nodes   int     // the second cluster's nodes (0: 2)
		workers int
		// deferred: the second cluster's records deferred; within: the
		// batch's bound beyond cluster_wait (0: a second).
		deferred int
		within   time.Duration
	}{
		{name: "answers promptly", workers: 64},
		{name: "answers slowly", delay: 2 * time.Second, workers: 64, deferred: 2},
		// The slow cluster's nodes first in the batch take no worker of
		// the prompt one (nor its cluster_wait).
		{name: "answers slowly, one worker", delay: 2 * time.Second, workers: 1, deferred: 2},
		// 8 nodes at 4 requests/s: about 7 s of requests, each prompt.
		{name: "busy, requests prompt", qps: 4, nodes: 8, workers: 64, within: 20 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			group := strings.NewReplacer(" ", "-", ",", "").Replace(tc.name)
			fast := group + "-fast"
			var others []string
			for i := range max(tc.nodes, 2) {
				others = append(others, fmt.Sprintf("%s-slow-%d", group, i+1))
			}
			createNodes(t, k.Client(), group, append([]string{fast}, others...)...)
			cfg := testConfig(group)
			cfg.ClusterWait = 1500 * time.Millisecond // a loaded test machine's prompt batch fits
			cfg.Workers = tc.workers
			h := newTestHandler(t, cfg, map[string]kubernetes.Interface{"prompt": k.Client(), "slow": limited(t, k, tc.delay, tc.qps)})
			recs := []*kgo.Record{record("slow", fatal(others[0], "XID_ERROR_48", "GPU-1")),
				record("prompt", fatal(fast, "XID_ERROR_48", "GPU-1"))}
			for _, n := range others[1:] {
				recs = append(recs, record("slow", fatal(n, "XID_ERROR_48", "GPU-1")))
			}
			start := time.Now()
			acts, deferred := handle(t, h, recs...)
			took := time.Since(start)
			if want := cfg.ClusterWait + max(tc.within, time.Second); took > want || len(deferred) != tc.deferred {
				t.Fatalf("the batch took %v (want at most %v), %d records deferred (want %d); actions %s",
					took.Round(time.Millisecond), want, len(deferred), tc.deferred, kinds(acts))
			}
			// Counted as slow, not as unreachable (FaultlineClusterSlow,
			// not FaultlineClusterUnreachable).
			if slow, down := counted(t, h.m.deferredSlow, "slow"), counted(t, h.m.deferred, "slow"); int(slow) != tc.deferred || down != 0 {
				t.Fatalf("deferred as slow %v, as unreachable %v; want %d, 0", slow, down, tc.deferred)
			}
			if got := kinds(onNode(acts, fast)); got != "quarantine/applied" || !getNode(t, k.Client(), fast).Spec.Unschedulable {
				t.Fatalf("the prompt cluster's fault: %s, want quarantine/applied", got)
			}
			if len(deferred) > 0 {
				acts = append(acts, retryUntil(t, h, deferred, time.Minute)...)
			}
			for _, n := range others {
				if got := kinds(onNode(acts, n)); got != "quarantine/applied" || !getNode(t, k.Client(), n).Spec.Unschedulable {
					t.Fatalf("%s: %s, want one applied quarantine", n, got)
				}
			}
		})
	}
}

// counted is a cluster's count of a counter.
func counted(t *testing.T, c *prometheus.CounterVec, cluster string) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.WithLabelValues(cluster).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
