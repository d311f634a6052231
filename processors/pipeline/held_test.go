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
