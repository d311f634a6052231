package checks

import (
	"net/http"
	"net/http/httptest"
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
	err := NewMetrics().Publish(MetricsConfig{Pushgateway: silent.URL}, "gpu-node-1", "trainer-0")
	if took := time.Since(start); err == nil || !strings.Contains(err.Error(), "metrics.pushgateway") || took > 5*time.Second {
		t.Fatalf("push to a silent Pushgateway: %v after %v; want a metrics.pushgateway error after about %v", err, took, pushTimeout)
	}
}
