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

// TestHoldingAbsorbsWhatFollows: records handled in a round that was
// polled behind a held batch (Config.Overlap) join that batch in offset
// order, each partition's records together, instead of being marked; a
// failed batch of a held partition joins it too, so one batch holds each
// partition; records of a partition revoked since the round began are
// dropped; the rest are returned to be marked.
func TestHoldingAbsorbsWhatFollows(t *testing.T) {
	rec := func(p int32, off int64) *kgo.Record { return &kgo.Record{Topic: "t", Partition: p, Offset: off} }
	offsets := func(recs []*kgo.Record) [][2]int64 {
		var out [][2]int64
		for _, r := range recs {
			out = append(out, [2]int64{int64(r.Partition), r.Offset})
		}
		return out
	}
	var paused []map[string][]int32
	h := holding{pause: func(m map[string][]int32) { paused = append(paused, m) }, wake: func(map[string][]int32) {}}
	round := h.round()
	held := &batch{recs: []*kgo.Record{rec(0, 1), rec(0, 2), rec(1, 4)}} // merged: partitions 0 and 1
	h.failed(held, round, time.Second)

	// The next round, polled before partitions 0 and 1 were paused.
	h.revoked(map[string][]int32{"t": {3}}) // lost while it was handled
	kept := h.absorb([]*kgo.Record{rec(0, 3), rec(1, 5), rec(2, 7), rec(3, 9), rec(2, 8)}, round)
	if got, want := offsets(kept), [][2]int64{{2, 7}, {2, 8}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("kept %v, want %v", got, want)
	}
	if got, want := offsets(held.recs), [][2]int64{{0, 1}, {0, 2}, {0, 3}, {1, 4}, {1, 5}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("held %v, want %v", got, want)
	}
	failed := &batch{recs: []*kgo.Record{rec(1, 6), rec(4, 1)}}
	h.failed(failed, round, time.Second)
	if len(h.held) != 2 || len(failed.recs) != 1 || failed.recs[0].Partition != 4 {
		t.Fatalf("held %d batches, the failed one with %v; want partition 1's record joined the first", len(h.held), offsets(failed.recs))
	}
	if got := offsets(held.recs); got[len(got)-1] != [2]int64{1, 6} {
		t.Fatalf("held %v, want it to end at partition 1's offset 6", got)
	}
	if want := []map[string][]int32{{"t": {0, 1}}, {"t": {4}}}; !reflect.DeepEqual(paused, want) {
		t.Fatalf("paused %v, want %v", paused, want)
	}
	// Nothing held, nothing revoked since: the records come back as they are.
	var empty holding
	in := []*kgo.Record{rec(0, 1)}
	if out := empty.absorb(in, empty.round()); len(out) != 1 || out[0] != in[0] {
		t.Fatalf("absorb with nothing held returned %v", offsets(out))
	}
}

// TestHoldingOldest: the held-batch age counts from a batch's first
// failure, through its later failed tries, and is 0 once nothing is held.
func TestHoldingOldest(t *testing.T) {
	h := holding{pause: func(map[string][]int32) {}, wake: func(map[string][]int32) {}}
	if d := h.oldest(time.Now()); d != 0 {
		t.Fatalf("nothing held: %v", d)
	}
	b := &batch{recs: []*kgo.Record{{Topic: "t", Partition: 0}}}
	h.failed(b, h.round(), time.Second)
	first := b.since
	for range 3 {
		h.take(b.due)
		h.failed(b, h.round(), time.Second)
	}
	if b.since != first {
		t.Fatalf("a later failure moved the first failure from %v to %v", first, b.since)
	}
	if d := h.oldest(first.Add(time.Minute)); d != time.Minute {
		t.Fatalf("held for %v, want 1m", d)
	}
	h.take(b.due)
	if d := h.oldest(first.Add(time.Minute)); d != 0 {
		t.Fatalf("nothing held after take: %v", d)
	}
}
