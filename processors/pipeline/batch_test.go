package pipeline

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestByKey: each key's items in their order, results in the order the
// keys first appear, at most workers keys at once.
func TestByKey(t *testing.T) {
	items := []string{"a1", "b1", "a2", "c1", "b2", "a3", "d1", "e1"}
	var running, most atomic.Int32
	var mu sync.Mutex
	met := make(chan struct{})
	meet := sync.OnceFunc(func() { close(met) })
	results := ByKey(items, func(s string) string { return s[:1] }, 2, func(group []string) string {
		n := running.Add(1)
		mu.Lock()
		if n > most.Load() {
			most.Store(n)
		}
		mu.Unlock()
		if n == 2 {
			meet()
		}
		// Until two keys have run at once, wait for the other worker
		// (a starved machine may start it late); a bound, not a sleep,
		// so one worker alone still shows as most == 1.
		select {
		case <-met:
		case <-time.After(2 * time.Second):
		}
		time.Sleep(20 * time.Millisecond)
		running.Add(-1)
		return strings.Join(group, "+")
	})
	if want := []string{"a1+a2+a3", "b1+b2", "c1", "d1", "e1"}; !slices.Equal(results, want) {
		t.Fatalf("results %v, want %v", results, want)
	}
	if m := most.Load(); m != 2 {
		t.Fatalf("%d keys at once, want at most (and, here, exactly) 2", m)
	}
	if got := ByKey([]int{}, func(int) string { return "" }, 0, func([]int) int { return 1 }); len(got) != 0 {
		t.Fatalf("no items: %v", got)
	}
}
