package quarantine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
)

// TestRoleThroughKafka runs the role as `faultline process` does: events
// from the events topic (kfake broker), the cluster reached through its
// kubeconfig file, decisions on the actions topic; with the apiserver
// stopped, the record goes through the retry topic and is applied once the
// apiserver is back.
func TestRoleThroughKafka(t *testing.T) {
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	createNodes(t, kube.Client(), "role", "role-1", "role-2")
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, kafka.PipelineTopics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers, kcfg.Partitions, kcfg.ReplicationFactor = strings.Join(kc.ListenAddrs(), ","), 3, 1

	cfg := testConfig("role")
	cfg.ClusterWait = 300 * time.Millisecond
	kcl := clusters.DefaultConfig()
	kcl.Clusters = []clusters.Cluster{{Name: "prod", Kubeconfig: kube.Kubeconfig()}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := pipeline.NewMetrics(prometheus.NewRegistry())
	h, closer, err := Start(ctx, cfg, kcl, Deps{Log: testLog, Kafka: kcfg, Metrics: m, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	runner := pipeline.NewRunner(pipeline.Config{Role: Role, Topics: []string{events.TopicEvents}, MaxBackoff: 500 * time.Millisecond}, kcfg, h, testLog, m)
	done := make(chan error, 1)
	go func() { done <- runner.Run(ctx) }()

	cl, err := kafka.NewClient(kcfg, testLog, kgo.ConsumeTopics(events.TopicActions), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	produce := func(r *kgo.Record) {
		t.Helper()
		r.Offset = 0
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		defer pcancel()
		if err := cl.ProduceSync(pctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	waitAction := func(node, kind, outcome string) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			fs := cl.PollFetches(pctx)
			pcancel()
			for _, r := range fs.Records() {
				a, err := events.UnmarshalAction(r.Value)
				if err == nil && a.Node == node && a.Kind == kind && a.Outcome == outcome && a.Cluster == "prod" {
					return
				}
			}
		}
		t.Fatalf("no %s/%s action for %s", kind, outcome, node)
	}

	produce(record("prod", fatal("role-1", "XID_ERROR_48", "GPU-1")))
	waitAction("role-1", events.KindQuarantine, events.OutcomeApplied)
	if !getNode(t, kube.Client(), "role-1").Spec.Unschedulable {
		t.Fatal("role-1 not cordoned")
	}

	kube.Stop()
	produce(record("prod", fatal("role-2", "XID_ERROR_48", "GPU-1")))
	time.Sleep(2 * time.Second) // deferred to the retry topic; its consumer waits
	kube.Start()
	waitAction("role-2", events.KindQuarantine, events.OutcomeApplied)
	if !getNode(t, kube.Client(), "role-2").Spec.Unschedulable {
		t.Fatal("role-2 not cordoned after the outage")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
