package quarantine

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// The healthy floor holds across a refresh of the node count: a node
// reserved before the count whose cordon the count does not show yet (its
// patch in flight, deferred, or refused) is subtracted, as one reserved
// after it; a node whose cordon a count showed, lifted since, is not.
func TestBreakerFloorAcrossCountRefresh(t *testing.T) {
	reserve := func(t *testing.T, b *breaker, node string, want bool) {
		t.Helper()
		v, err := b.reserve(context.Background(), node, "r-"+node, true)
		if err != nil || v.Allowed != want {
			t.Fatalf("reserve %s: %+v, %v; want allowed %v", node, v, err, want)
		}
	}
	cordon := func(t *testing.T, k kubernetes.Interface, node string, on bool) {
		t.Helper()
		n := getNode(t, k, node)
		n.Spec.Unschedulable = on
		if _, err := k.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testConfig("breaker").Breaker
	cfg.MaxPercent = 100
	t.Run("cordons not applied yet", func(t *testing.T) {
		cfg.MinHealthy = 8
		b, _, advance := testBreaker(t, cfg, 10)
		reserve(t, b, "n0", true)
		reserve(t, b, "n1", true) // 8 left
		advance(cfg.NodeCountTTL + time.Second)
		reserve(t, b, "n2", false) // would leave 7
	})
	t.Run("a cordon seen, then lifted", func(t *testing.T) {
		cfg.MinHealthy = 7
		b, k, advance := testBreaker(t, cfg, 10)
		reserve(t, b, "n0", true)
		cordon(t, k, "n0", true)
		advance(cfg.NodeCountTTL + time.Second)
		reserve(t, b, "n1", true) // the count shows n0 cordoned: 8 left
		cordon(t, k, "n0", false) // n0's fault recovered
		advance(cfg.NodeCountTTL + time.Second)
		reserve(t, b, "n2", true)  // 10 counted, n1 not cordoned yet: 8 left
		reserve(t, b, "n3", true)  // 7 left
		reserve(t, b, "n4", false) // would leave 6
	})
}
