package conformance

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	agentconf "github.com/faultline/faultline/agents/conformance"
	"github.com/faultline/faultline/internal/clickhouse/chtest"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/role"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// TestRoleThroughKafka runs the role as `faultline process
// --role=conformance` does (Open, Run) on a real Kafka broker, ClickHouse
// and kube-apiserver: reports produced to faultline.events are stored, the
// sweep taints the drifted node, the SMD-like notifier (failing once, then
// accepting) is told with both hashes, and every step is an Action on
// faultline.actions; a conforming report lifts the taint.
func TestRoleThroughKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("needs real Kafka, ClickHouse and kube-apiserver")
	}
	s := chtest.Start(t)
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	k := testenv.StartKafka(t)
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers, kcfg.Partitions, kcfg.ReplicationFactor = k.Addr(), 3, 1
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := kafka.CreatePipelineTopics(ctx, kcfg, testLog); err != nil {
		t.Fatal(err)
	}
	e := &kubeEnv{kube: kube.Client()}
	pool := map[string]string{"faultline.io/node-pool": "h100"}
	for _, n := range []string{"r1", "r2"} {
		e.node(t, n, pool)
	}
	e.node(t, "r3", map[string]string{"faultline.io/node-pool": "h100", "openchami.io/xname": "x1000c0s0b0n3"})

	var (
		calls atomic.Int32
		mu    sync.Mutex
		got   []string
	)
	smd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+" "+string(b))
		mu.Unlock()
		if calls.Add(1) == 1 {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer smd.Close()

	cfg := DefaultConfig()
	cfg.SweepInterval = 300 * time.Millisecond
	cfg.Notifier.URL = smd.URL + "/hsm/v2/State/Components/{xname}"
	cfg.Notifier.MinBackoff, cfg.Notifier.MaxBackoff = 50*time.Millisecond, 200*time.Millisecond
	deps := role.Deps{Log: testLog, Kafka: kcfg, ClickHouse: s.Config, Kube: clusters.DefaultConfig()}
	deps.Kube.Clusters = []clusters.Cluster{{Name: "prod", Kubeconfig: kube.Kubeconfig()}}
	r, err := Open(ctx, cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, deps) }()

	cl := k.Client(t, kgo.ConsumeTopics(events.TopicActions), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var actions []*faultlinev1.Action
	go func() {
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			mu.Lock()
			fs.EachRecord(func(r *kgo.Record) {
				if a, err := events.UnmarshalAction(r.Value); err == nil && a.Role == Role {
					actions = append(actions, a)
				}
			})
			mu.Unlock()
		}
	}()
	prod := k.Client(t)
	now := time.Now().UTC()
	produce := func(recs ...*kgo.Record) {
		t.Helper()
		if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produce(record(t, "prod", "r1", comps(""), now), record(t, "prod", "r2", comps(""), now), record(t, "prod", "r3", comps("28.41.1000"), now))
	has := func(kind, outcome string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, a := range actions {
			if a.Kind == kind && a.Outcome == outcome && a.Node == "r3" {
				return true
			}
		}
		return false
	}
	wait := func(what string, f func() bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !f() {
			if time.Now().After(deadline) {
				mu.Lock()
				t.Fatalf("timed out waiting for %s; actions %v; smd %v", what, actions, got)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// A step's action is produced before the state that records it, so
	// the taint follows the action.
	wait("drift action", func() bool { return has(events.KindConformanceDrift, events.OutcomeApplied) })
	wait("r3 tainted", func() bool { return hasTaint(e.get(t, "r3")) != nil })
	wait("notify action", func() bool { return has(events.KindConformanceNotify, events.OutcomeApplied) })
	mu.Lock()
	want := "PATCH /hsm/v2/State/Components/x1000c0s0b0n3 " + `{"Flag":"Warning","FlagMsg":"conformance_drift: expected=` +
		agentconf.Fingerprint(comps("")) + ", actual=" + agentconf.Fingerprint(comps("28.41.1000")) + `"}`
	if len(got) < 2 || got[1] != want {
		t.Errorf("smd got %q\nwant %q", got, want)
	}
	mu.Unlock()

	produce(record(t, "prod", "r3", comps(""), now.Add(time.Second)))
	wait("restored action", func() bool { return has(events.KindConformanceRestored, events.OutcomeApplied) })
	wait("r3's taint and label removed", func() bool {
		n := e.get(t, "r3")
		return hasTaint(n) == nil && n.Labels[LabelGroup] == ""
	})
	if n := chtest.Count(t, s.Conn, "SELECT count() FROM conformance WHERE cluster = 'prod'"); n < 4 {
		t.Fatalf("%d reports stored, want 4", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
