package quarantine

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
)

// testBreaker returns a breaker over fakeKube with nodes n0…n(nodes-1),
// reading the ConfigMap and the node count from the API, and the function
// that moves its clock on.
func testBreaker(t *testing.T, cfg BreakerConfig, nodes int) (*breaker, kubernetes.Interface, func(time.Duration)) {
	t.Helper()
	k := fakeKube()
	var names []string
	for i := range nodes {
		names = append(names, fmt.Sprint("n", i))
	}
	createNodes(t, k, "breaker", names...)
	var mu sync.Mutex
	now := time.Now()
	b := newBreaker(cfg, k, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	return b, k, func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
}

// A node that holds a slot asks again (its patch met a conflict and the
// decision was redone, or the patch was deferred to the retry topic) after
// the breaker opened: it is let through, as while the breaker is closed;
// the breaker stays open, and shows so.
func TestBreakerOpenLetsATakenSlotThrough(t *testing.T) {
	cfg := testConfig("breaker").Breaker
	cfg.MaxPercent = 20 // of 10 nodes: 2
	b, _, _ := testBreaker(t, cfg, 10)
	ctx := context.Background()
	for i, want := range []bool{true, true, false} {
		v, err := b.reserve(ctx, fmt.Sprint("n", i), fmt.Sprint("r", i), true)
		if err != nil || v.Allowed != want || v.Opened != !want {
			t.Fatalf("reserve n%d: %+v, %v; want allowed %v", i, v, err, want)
		}
	}
	v, err := b.reserve(ctx, "n0", "r0-again", true)
	if err != nil || !v.Allowed || !v.Open || v.Opened {
		t.Fatalf("n0 asking again while open: %+v, %v; want allowed, open", v, err)
	}
	if v, err := b.reserve(ctx, "n3", "r3", true); err != nil || v.Allowed || !v.Open {
		t.Fatalf("a new node while open: %+v, %v; want held", v, err)
	}
}
