package quarantine

import (
	"testing"
)

// TestRetryWaitingConsumed: records are waiting from when they are read
// until the group's committed offset of their partition passes them.
func TestRetryWaitingConsumed(t *testing.T) {
	w := &retryWaiting{keys: map[string]int{}, queued: map[int32][]waitingRecord{}, next: map[int32]int64{}}
	read := func(p int32, off int64, key string) {
		w.keys[key]++
		w.queued[p] = append(w.queued[p], waitingRecord{offset: off, key: key})
	}
	read(0, 10, "c/a")
	read(0, 11, "c/b")
	read(0, 12, "c/a")
	read(1, 3, "c/a")
	for _, step := range []struct {
		committed map[int32]int64
		waits     map[string]bool
	}{
		{nil, map[string]bool{"c/a": true, "c/b": true, "c/c": false}},
		{map[int32]int64{0: 10}, map[string]bool{"c/a": true, "c/b": true}},         // nothing before 10
		{map[int32]int64{0: 12}, map[string]bool{"c/a": true, "c/b": false}},        // a's second and p1's wait
		{map[int32]int64{0: 13}, map[string]bool{"c/a": true}},                      // p1 not committed
		{map[int32]int64{0: 13, 1: 4}, map[string]bool{"c/a": false, "c/b": false}}, // all consumed
	} {
		w.consumed(step.committed)
		for key, want := range step.waits {
			if got := w.waits([]byte(key)); got != want {
				t.Errorf("committed %v: waits(%s) = %v, want %v", step.committed, key, got, want)
			}
		}
	}
	if len(w.keys) != 0 {
		t.Errorf("keys left: %v", w.keys)
	}
}
