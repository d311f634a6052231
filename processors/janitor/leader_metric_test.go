package janitor

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/faultline/faultline/processors/clusters"
)

// TestLeaderGaugeOfAClusterWithoutClient: a dry-run cluster without a
// kubeconfig has nothing to watch, so no janitor works it: each replica
// exports faultline_janitor_leader 0 for it (not 1: two replicas would
// read as two janitors working it) and faultline_janitor_cluster_watchable
// 0, by which FaultlineJanitorNotOneWorking leaves it out.
func TestLeaderGaugeOfAClusterWithoutClient(t *testing.T) {
	t.Parallel()
	kube := clusters.DefaultConfig()
	kube.DryRunClusters = []string{"dry"}
	cfg := DefaultConfig()
	cfg.Identity = "test"
	j, err := New(cfg, kube, nil, Options{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- j.lead(ctx, "dry") }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("lead: %v", err)
		}
	}()
	for deadline := time.Now().Add(5 * time.Second); testutil.CollectAndCount(j.m.watchable) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("faultline_janitor_cluster_watchable not exported for the cluster")
		}
	}
	if got := testutil.ToFloat64(j.m.leader.WithLabelValues("dry")); got != 0 {
		t.Errorf("faultline_janitor_leader{cluster=\"dry\"} = %v, want 0 (nothing to work)", got)
	}
	if got := testutil.ToFloat64(j.m.watchable.WithLabelValues("dry")); got != 0 {
		t.Errorf("faultline_janitor_cluster_watchable{cluster=\"dry\"} = %v, want 0", got)
	}
}
