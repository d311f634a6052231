package quarantine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/role"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// TestRoleThroughKafka runs the role as `faultline process` does (Open,
// then role.Role.Run: the events consumer, the retry consumer and the
// uncordon loop) over a real Kafka broker: events from the events topic,
// the cluster reached through its kubeconfig file, decisions on the
// actions topic. With the apiserver stopped, the record is deferred to the
// retry topic (the test reads it there), and the retry consumer applies
// it once the apiserver is back.
func TestRoleThroughKafka(t *testing.T) {
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	k := testenv.StartKafka(t)
	createNodes(t, kube.Client(), "role", "role-1", "role-2")
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers, kcfg.Partitions, kcfg.ReplicationFactor = k.Addr(), 3, 1

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := kafka.CreatePipelineTopics(ctx, kcfg, testLog); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("role")
	cfg.ClusterWait = 300 * time.Millisecond
	deps := role.Deps{Log: testLog, Kafka: kcfg, Kube: clusters.DefaultConfig()}
	deps.Kube.Clusters = []clusters.Cluster{{Name: "prod", Kubeconfig: kube.Kubeconfig()}}
	r, err := Open(ctx, cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	for i := range r.Consumers {
		r.Consumers[i].Pipeline.MaxBackoff = 500 * time.Millisecond
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, deps) }()

	// Everything on the actions and retry topics, read as it comes.
	cl := k.Client(t, kgo.ConsumeTopics(events.TopicActions, TopicRetry), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var (
		mu      sync.Mutex
		actions []*faultlinev1.Action
		retried []*kgo.Record
	)
	go func() {
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			mu.Lock()
			fs.EachRecord(func(r *kgo.Record) {
				if r.Topic == TopicRetry {
					retried = append(retried, r)
					return
				}
				if a, err := events.UnmarshalAction(r.Value); err == nil {
					actions = append(actions, a)
				}
			})
			mu.Unlock()
		}
	}()
	produce := func(r *kgo.Record) {
		t.Helper()
		r.Offset = 0
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		defer pcancel()
		if err := cl.ProduceSync(pctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor := func(what string, within time.Duration, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(within)
		for time.Now().Before(deadline) {
			mu.Lock()
			done := ok()
			mu.Unlock()
			if done {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("no %s within %v", what, within)
	}
	applied := func(node string) func() bool {
		return func() bool {
			for _, a := range actions {
				if a.Node == node && a.Cluster == "prod" && a.Kind == events.KindQuarantine && a.Outcome == events.OutcomeApplied {
					return true
				}
			}
			return false
		}
	}

	produce(record("prod", fatal("role-1", "XID_ERROR_48", "GPU-1")))
	waitFor("quarantine/applied action for role-1", 60*time.Second, applied("role-1"))
	if !getNode(t, kube.Client(), "role-1").Spec.Unschedulable {
		t.Fatal("role-1 not cordoned")
	}
	mu.Lock()
	if len(retried) != 0 {
		t.Fatalf("%d records deferred while the cluster was up", len(retried))
	}
	mu.Unlock()

	kube.Stop()
	produce(record("prod", fatal("role-2", "XID_ERROR_48", "GPU-1")))
	// The record goes to the retry topic, with its key and an attempt
	// count; nothing is decided while the apiserver is down.
	waitFor("record for role-2 on the retry topic", 60*time.Second, func() bool {
		for _, r := range retried {
			if string(r.Key) == "prod/role-2" {
				return true
			}
		}
		return false
	})
	mu.Lock()
	for _, r := range retried {
		if got := header(r, HeaderRetryAttempt); got != "1" {
			t.Errorf("retry record %s: attempt header %q, want 1", r.Key, got)
		}
	}
	if applied("role-2")() {
		t.Fatal("role-2 decided while its apiserver was down")
	}
	mu.Unlock()
	kube.Start()
	waitFor("quarantine/applied action for role-2 after the outage", 90*time.Second, applied("role-2"))
	if !getNode(t, kube.Client(), "role-2").Spec.Unschedulable {
		t.Fatal("role-2 not cordoned after the outage")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
