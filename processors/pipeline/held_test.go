package pipeline

import (
	"reflect"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestHoldingLostDuringTry: a partition revoked or lost while its batch
// is being tried is not held by the failed try — it is no longer this
// replica's — while one revoked before the round began (and assigned
// again, its records polled since) is.
func TestHoldingLostDuringTry(t *testing.T) {
	rec := func(p int32, off int64) *kgo.Record { return &kgo.Record{Topic: "t", Partition: p, Offset: off} }
	var paused []map[string][]int32
	h := holding{pause: func(m map[string][]int32) { paused = append(paused, m) }, wake: func(map[string][]int32) {}}

	h.revoked(map[string][]int32{"t": {0}}) // before the round: partition 0 came back since
	round := h.round()
	mixed := &batch{recs: []*kgo.Record{rec(0, 5), rec(1, 7), rec(2, 9)}}
	gone := &batch{recs: []*kgo.Record{rec(1, 8)}}
	h.revoked(map[string][]int32{"t": {1}}) // lost during the round's tries
	h.failed(mixed, round, time.Second)
	h.failed(gone, round, time.Second)

	if len(h.held) != 1 || h.held[0] != mixed {
		t.Fatalf("held %d batches, want the mixed one only", len(h.held))
	}
	var kept []int32
	for _, r := range mixed.recs {
		kept = append(kept, r.Partition)
	}
	if !reflect.DeepEqual(kept, []int32{0, 2}) {
		t.Fatalf("held partitions %v, want [0 2]", kept)
	}
	if want := []map[string][]int32{{"t": {0, 2}}}; !reflect.DeepEqual(paused, want) {
		t.Fatalf("paused %v, want %v", paused, want)
	}
	// A later round holds partition 1 again (assigned back, polled anew).
	again := &batch{recs: []*kgo.Record{rec(1, 8)}}
	h.failed(again, h.round(), time.Second)
	if len(h.held) != 2 {
		t.Fatalf("a batch of a partition assigned back was not held")
	}
}

// TestHoldingSuccessBringsOthersForward: a held batch that succeeds brings
// the other held batches' next tries forward to now (whatever held it may
// have held them); a batch that never failed does not, and a batch that
// fails again backs off from where it was.
func TestHoldingSuccessBringsOthersForward(t *testing.T) {
	rec := func(p int32) *kgo.Record { return &kgo.Record{Topic: "t", Partition: p} }
	var woken []map[string][]int32
	h := holding{pause: func(map[string][]int32) {}, wake: func(m map[string][]int32) { woken = append(woken, m) }}
	a, b, c := &batch{recs: []*kgo.Record{rec(0)}}, &batch{recs: []*kgo.Record{rec(1)}}, &batch{recs: []*kgo.Record{rec(2)}}
	for range 4 { // backoffs 100 ms, 200 ms, 400 ms, 800 ms: due ≈ 800 ms on
		for _, x := range []*batch{a, b, c} {
			h.failed(x, h.round(), time.Second)
			h.take(time.Now().Add(time.Hour))
		}
	}
	h.failed(b, h.round(), time.Second)
	h.failed(c, h.round(), time.Second)
	start := time.Now()
	if due := h.next(); due.Sub(start) < 500*time.Millisecond {
		t.Fatalf("the held batches are due in %s, want their backoff (≈ 800 ms)", due.Sub(start))
	}

	h.succeeded(&batch{recs: []*kgo.Record{rec(3)}}) // never held: nothing changes
	if due := h.next(); due.Sub(start) < 500*time.Millisecond || len(woken) != 0 {
		t.Fatalf("a batch that never failed brought the held ones forward (due in %s) or woke %v", due.Sub(start), woken)
	}

	h.succeeded(a)
	if want := []map[string][]int32{{"t": {0}}}; !reflect.DeepEqual(woken, want) {
		t.Fatalf("woke %v, want %v", woken, want)
	}
	due := h.take(time.Now())
	if len(due) != 2 || len(h.held) != 0 {
		t.Fatalf("%d held batches due now after another succeeded, want 2 (%d still held)", len(due), len(h.held))
	}
	h.failed(b, h.round(), time.Second) // fails again: its backoff grown, not begun afresh
	if d := time.Until(b.due); d < 900*time.Millisecond || b.backoff != time.Second {
		t.Fatalf("failed again: due in %s, backoff %s; want ≈ 1 s (capped), 1 s", d, b.backoff)
	}
}
