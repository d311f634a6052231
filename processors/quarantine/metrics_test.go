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
