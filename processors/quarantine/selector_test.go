package quarantine

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
)

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestBreakerSelectorMatchesNothing: a gpu_node_selector that matches no
// node of a cluster (a typo, GPU nodes labelled otherwise) counted 0 GPU
// nodes, the limit clamped to 1: the second fault of the window opened the
// breaker and every later one was held, never replayed. Now the breaker
// counts every node of that cluster, says so at start-up and while it
// lasts (a warning naming the key, the selector and the cluster), in the
// gauge faultline_quarantine_breaker_selector_unmatched and in the reason
// of a breaker it opens.
func TestBreakerSelectorMatchesNothing(t *testing.T) {
	cfg := testConfig("selnone")
	cfg.Breaker.MaxPercent = 10
	cfg.Breaker.GPUNodeSelector = "nvidia.com/gpu.present=true" // the nodes carry test=selnone only
	var names []string
	for i := range 20 {
		names = append(names, "selnone-"+strconv.Itoa(i))
	}
	k := fakeKube()
	createNodes(t, k, "selnone", names...)
	reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	reg.SetClient("c1", k, false)
	var logs syncBuffer
	h, err := New(cfg, reg, Options{Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)

	if unread := h.ReadBreakers(context.Background(), []string{"c1"}); len(unread) != 0 {
		t.Fatalf("unread %v", unread)
	}
	for _, want := range []string{"quarantine.breaker.gpu_node_selector", "nvidia.com/gpu.present=true", "cluster=c1", "nodes=20"} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("no start-up warning with %q: %s", want, logs.String())
		}
	}
	if g := gaugeValue(h.m.selectorUnmatched.WithLabelValues("c1")); g != 1 {
		t.Fatalf("faultline_quarantine_breaker_selector_unmatched = %v, want 1", g)
	}
	// 10 % of 20 nodes: 2 quarantines, the third opens the breaker.
	for i, want := range []string{"quarantine/applied", "quarantine/applied"} {
		if acts, _ := handle(t, h, record("c1", fatal(names[i], "XID_ERROR_48", "GPU-1"))); kinds(acts) != want {
			t.Fatalf("fault %d: %s, want %s", i, kinds(acts), want)
		}
	}
	acts, _ := handle(t, h, record("c1", fatal(names[2], "XID_ERROR_48", "GPU-1")))
	var open string
	for _, a := range acts {
		if a.GetKind() == events.KindBreakerOpen {
			open = a.GetReason()
		}
	}
	if !strings.Contains(open, "2 of 20 nodes") || !strings.Contains(open, "quarantine.breaker.gpu_node_selector") || !strings.Contains(open, "matched no node; counting all 20 nodes") {
		t.Fatalf("third fault: %s; breaker_open reason %q", kinds(acts), open)
	}
	if n := strings.Count(logs.String(), "matched no node of the cluster"); n != 1 {
		t.Fatalf("warned %d times, want once (rate-limited):\n%s", n, logs.String())
	}
}

// A selector that matches nodes counts those only, and says nothing.
func TestBreakerSelectorMatches(t *testing.T) {
	cfg := testConfig("selsome").Breaker
	b, _, _ := testBreaker(t, cfg, 3)
	b.cfg.GPUNodeSelector = "test=breaker"
	var logs syncBuffer
	b.log = slog.New(slog.NewTextHandler(&logs, nil))
	c, err := b.counts(context.Background(), time.Now())
	if err != nil || c.total != 3 || c.all {
		t.Fatalf("counts %+v, %v", c, err)
	}
	if logs.String() != "" {
		t.Fatalf("logged: %s", logs.String())
	}
}
