package checks

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestPublishBoundsThePush: a Pushgateway that accepts and never answers
// fails the push after pushTimeout — Publish runs before every exit, and
// it held the init container, its check done, for ever.
func TestPublishBoundsThePush(t *testing.T) {
	release := make(chan struct{})
	silent := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	defer silent.Close()
	defer close(release)
	defer func(d time.Duration) { pushTimeout = d }(pushTimeout)
	pushTimeout = 300 * time.Millisecond

	start := time.Now()
	err := NewMetrics().Publish(MetricsConfig{Pushgateway: silent.URL}, "gpu-node-1", DCGMDiag)
	if took := time.Since(start); err == nil || !strings.Contains(err.Error(), "metrics.pushgateway") || took > 5*time.Second {
		t.Fatalf("push to a silent Pushgateway: %v after %v; want a metrics.pushgateway error after about %v", err, took, pushTimeout)
	}
}

// TestPublishGroupsByNodeAndCheck: the push replaces (PUT) the group of
// the node and check, not one per pod: the Pushgateway never expires a
// group, and one per GPU pod grew without bound, the failures of pods long
// gone scraped for ever.
func TestPublishGroupsByNodeAndCheck(t *testing.T) {
	type req struct{ method, path string }
	got := make(chan req, 4)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- req{r.Method, r.URL.Path}
		w.WriteHeader(http.StatusOK)
	}))
	defer gw.Close()
	m := NewMetrics()
	m.total.WithLabelValues(DCGMDiag, "fail").Inc()
	// Its node and check labels are the group's: a failed run's push was
	// refused ("already contains grouping label").
	m.failures.WithLabelValues(DCGMDiag, "gpu-node-1", "DCGM_DIAG_MEMORY_FAIL").Inc()
	tf := filepath.Join(t.TempDir(), "preflight.prom")
	if err := m.Publish(MetricsConfig{Pushgateway: gw.URL, Textfile: tf}, "gpu-node-1", DCGMDiag); err != nil {
		t.Fatal(err)
	}
	// The textfile has no group: it keeps every label.
	if b, err := os.ReadFile(tf); err != nil || !strings.Contains(string(b), `preflight_check_failures_total{check="dcgm-diag",error_code="DCGM_DIAG_MEMORY_FAIL",node="gpu-node-1"} 1`) {
		t.Errorf("textfile %s %v", b, err)
	}
	r := <-got
	// The grouping key is a set: the push client writes its labels in
	// either order (the test failed one run in a few on the order).
	want := []string{"/metrics/job/faultline_preflight/node/gpu-node-1/check/" + DCGMDiag,
		"/metrics/job/faultline_preflight/check/" + DCGMDiag + "/node/gpu-node-1"}
	if r.method != http.MethodPut || !slices.Contains(want, r.path) {
		t.Fatalf("pushed %s %s, want PUT one of %q", r.method, r.path, want)
	}
}
