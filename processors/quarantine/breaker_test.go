package quarantine

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
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
	v, err := b.reserve(ctx, "n0", "r0", true) // the same record asking again
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

// A node quarantined, lifted and failing again within the window (a
// flapping link in a fabric incident) is a new quarantine: it goes through
// the healthy floor, and its slot is still one node toward the limit. Only
// the same record asking again (a conflict redone, a retry) skips the
// checks. Before, any node holding a slot was let through: 10 nodes, floor
// 8, n0 and n1 failing again after n2 and n3 left 6 schedulable.
func TestBreakerQuarantineAgainWithinWindow(t *testing.T) {
	ctx := context.Background()
	reserve := func(t *testing.T, b *breaker, node, record string, want bool) breakerVerdict {
		t.Helper()
		v, err := b.reserve(ctx, node, record, true)
		if err != nil || v.Allowed != want {
			t.Fatalf("reserve %s (%s): %+v, %v; want allowed %v", node, record, v, err, want)
		}
		return v
	}
	cordon := func(t *testing.T, k kubernetes.Interface, on bool, nodes ...string) {
		t.Helper()
		for _, node := range nodes {
			n := getNode(t, k, node)
			n.Spec.Unschedulable = on
			if _, err := k.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Run("floor", func(t *testing.T) {
		cfg := testConfig("breaker").Breaker
		cfg.MinHealthy = 8
		b, k, advance := testBreaker(t, cfg, 10)
		reserve(t, b, "n0", "r0", true)
		reserve(t, b, "n1", "r1", true)
		cordon(t, k, true, "n0", "n1")
		advance(cfg.NodeCountTTL + time.Second)
		b.mu.Lock()
		_, err := b.counts(ctx, b.now()) // a count sees them cordoned
		b.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		cordon(t, k, false, "n0", "n1") // both recovered
		advance(cfg.NodeCountTTL + time.Second)
		reserve(t, b, "n2", "r2", true)
		if v := reserve(t, b, "n3", "r3", true); v.Schedulable != 8 {
			t.Fatalf("n3: %+v; want 8 schedulable", v)
		}
		if v := reserve(t, b, "n0", "r0-again", false); !v.Opened || v.Schedulable != 8 {
			t.Fatalf("n0 failing again: %+v; want the breaker opened at 8 schedulable", v)
		}
		reserve(t, b, "n1", "r1-again", false)
		reserve(t, b, "n3", "r3", true) // r3 asking again: its own slot
	})
	t.Run("first cordon not counted yet", func(t *testing.T) {
		// n0's first reservation is still subtracted (the count does not
		// show its cordon): another record for n0 does not subtract it twice.
		cfg := testConfig("breaker").Breaker
		cfg.MinHealthy = 8
		b, _, _ := testBreaker(t, cfg, 10)
		reserve(t, b, "n0", "r0", true)
		reserve(t, b, "n1", "r1", true)
		if v := reserve(t, b, "n0", "r0-again", true); v.Schedulable != 8 || v.Count != 2 {
			t.Fatalf("n0 again: %+v; want 8 schedulable, 2 in the window", v)
		}
		reserve(t, b, "n2", "r2", false)
	})
	t.Run("limit counts nodes", func(t *testing.T) {
		cfg := testConfig("breaker").Breaker
		cfg.MaxPercent = 20 // of 10 nodes: 2
		b, _, _ := testBreaker(t, cfg, 10)
		reserve(t, b, "n0", "r0", true)
		reserve(t, b, "n0", "r0-again", true)
		if v := reserve(t, b, "n1", "r1", true); v.Count != 2 {
			t.Fatalf("n1: %+v; want 2 in the window", v)
		}
		reserve(t, b, "n2", "r2", false)
		// Open: the same record is let through, another for n0 held.
		reserve(t, b, "n0", "r0-again", true)
		reserve(t, b, "n1", "r1-second", false)
	})
	t.Run("entry without a record", func(t *testing.T) {
		// Written by an earlier faultline: any record is the same.
		cfg := testConfig("breaker").Breaker
		cfg.MinHealthy = 9
		b, k, _ := testBreaker(t, cfg, 10)
		cordon(t, k, true, "n0") // counted: 9 schedulable
		raw, _ := json.Marshal([]map[string]any{{"node": "n0", "at": b.now()}})
		cm := b.empty()
		cm.Data = map[string]string{breakerKeyState: breakerClosed, breakerKeyCordons: string(raw)}
		if _, err := k.CoreV1().ConfigMaps(cfg.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		reserve(t, b, "n0", "r-any", true)
	})
}

// An operator closes the breaker as FaultlineBreakerTripped's runbook
// says (data.state alone): the quarantines of the window that tripped it
// are dropped, so the next fault is let through. Before, they were kept:
// the next fault opened it again, its window starting anew.
func TestBreakerOperatorClose(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig("breaker").Breaker
	cfg.MaxPercent = 20 // of 10 nodes: 2
	b, k, advance := testBreaker(t, cfg, 10)
	for i, want := range []bool{true, true, false} {
		if v, err := b.reserve(ctx, fmt.Sprint("n", i), fmt.Sprint("r", i), true); err != nil || v.Allowed != want {
			t.Fatalf("reserve n%d: %+v, %v; want allowed %v", i, v, err, want)
		}
	}
	advance(time.Minute)
	cms := k.CoreV1().ConfigMaps(cfg.Namespace)
	if _, err := cms.Patch(ctx, cfg.Name, types.MergePatchType, []byte(`{"data":{"state":"closed"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	v, err := b.reserve(ctx, "n3", "r3", true)
	if err != nil || !v.Allowed || v.Open || v.Opened || !v.ManualClose || v.Dropped != 2 || v.Count != 1 {
		t.Fatalf("first fault after the close: %+v, %v; want allowed, closed by hand (2 dropped), 1 in the window", v, err)
	}
	cm, err := cms.Get(ctx, cfg.Name, metav1.GetOptions{})
	if err != nil || cm.Data[breakerKeyOpenedAt] != "" || cm.Data[breakerKeyOpenedBy] != "" || strings.Count(cm.Data[breakerKeyCordons], `"node"`) != 1 {
		t.Fatalf("configmap after the close: %v, %v", cm.Data, err)
	}
	advance(time.Minute)
	if v, err := b.reserve(ctx, "n4", "r4", true); err != nil || !v.Allowed || v.ManualClose {
		t.Fatalf("second fault: %+v, %v; want allowed", v, err)
	}
	if v, err := b.reserve(ctx, "n5", "r5", true); err != nil || v.Allowed || !v.Opened {
		t.Fatalf("third fault: %+v, %v; want the breaker opened (2 of 10)", v, err)
	}
}

// The breaker watch's copy says open while the ConfigMap was closed or
// deleted (the watch failing, in backoff): a held verdict writes nothing,
// so no conflict would correct the copy, and a held fault is never
// replayed. The reservation reads it live.
func TestBreakerHeldReadsLive(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig("breaker").Breaker
	open := func(b *breaker) *corev1.ConfigMap {
		cm := b.empty()
		cm.Data = map[string]string{breakerKeyState: breakerOpen, breakerKeyCordons: "[]",
			breakerKeyOpenedAt: b.now().UTC().Format(time.RFC3339Nano), breakerKeyReason: "too many"}
		return cm
	}
	for _, tc := range []struct {
		name string
		live func(cm *corev1.ConfigMap) // nil: deleted
		want bool
	}{
		{"deleted", nil, true},
		{"closed by an operator", func(cm *corev1.ConfigMap) { cm.Data[breakerKeyState] = breakerClosed }, true},
		{"still open", func(*corev1.ConfigMap) {}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, k, _ := testBreaker(t, cfg, 10)
			idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
			copied := open(b)
			copied.ResourceVersion = "1"
			if err := idx.Add(copied); err != nil {
				t.Fatal(err)
			}
			b.watch = &breakerWatch{name: cfg.Name, lister: corelisters.NewConfigMapLister(idx).ConfigMaps(cfg.Namespace), synced: func() bool { return true }}
			if tc.live != nil {
				cm := open(b)
				tc.live(cm)
				if _, err := k.CoreV1().ConfigMaps(cfg.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if v, err := b.reserve(ctx, "n0", "r0", true); err != nil || v.Allowed != tc.want || v.Open == tc.want {
				t.Fatalf("reserve: %+v, %v; want allowed %v", v, err, tc.want)
			}
		})
	}
}
