package quarantine

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/faultline/faultline/processors/clusters"
)

// TestRetryTopicSeriesNameTheCluster: each configured cluster's retry
// topic is exported with the cluster's own name, so an alert on the retry
// consumer's lag (by topic) names a cluster whose topic is hashed
// ("prod.east", not a DNS label) too. Before, the alert took the cluster
// from the topic's name and matched no cluster of that hash.
func TestRetryTopicSeriesNameTheCluster(t *testing.T) {
	reg := prometheus.NewRegistry()
	h, err := New(testConfig("rt"), clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	h.exportClusters([]string{"prod-west", "prod.east"})
	want := `
# HELP faultline_quarantine_retry_topic 1 for each configured cluster, with the retry topic its deferred records wait on (a name that is not a DNS label has a hashed topic).
# TYPE faultline_quarantine_retry_topic gauge
faultline_quarantine_retry_topic{cluster="prod-west",topic="faultline.quarantine.retry.prod-west"} 1
faultline_quarantine_retry_topic{cluster="prod.east",topic="faultline.quarantine.retry.hd87d855fc17fd1dc"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "faultline_quarantine_retry_topic"); err != nil {
		t.Fatal(err)
	}
}

// TestFailureCountersExportedFromStart: the counters alerts read with
// increase() are exported at 0 from the start — faults dropped per
// configured cluster, rule errors per rule set — so that the first drop
// or rule error is an increase, not a new series' first sample.
func TestFailureCountersExportedFromStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	h, err := New(testConfig("fs"), clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	h.exportClusters([]string{"prod-west"})
	if n := testutil.CollectAndCount(h.m.faultsDropped); n != 1 {
		t.Errorf("faultline_quarantine_faults_dropped_total: %d series, want 1 (prod-west)", n)
	}
	names := h.policy.Names()
	if len(names) == 0 {
		t.Fatal("no rule sets")
	}
	if n := testutil.CollectAndCount(h.m.ruleErrors); n != len(names) {
		t.Errorf("faultline_quarantine_rule_errors_total: %d series, want one per rule set %v", n, names)
	}
	for _, name := range names {
		if v := testutil.ToFloat64(h.m.ruleErrors.WithLabelValues(name)); v != 0 {
			t.Errorf("faultline_quarantine_rule_errors_total{rule=%q} = %v, want 0", name, v)
		}
	}
}
