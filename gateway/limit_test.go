package gateway

import (
	"testing"
	"time"
)

// TestLimiterDropsIdleBuckets: a caller idle long enough to refill its
// bucket is forgotten at the next sweep; a caller still short of tokens
// keeps its bucket, so a sweep never lifts a limit.
func TestLimiterDropsIdleBuckets(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := newLimiter(1, 10) // refills in 10 s
	for _, c := range []string{"idle", "busy"} {
		if !l.allow(c, 10, t0) || l.allow(c, 1, t0) {
			t.Fatalf("%s: the burst of 10 not allowed exactly", c)
		}
	}
	// busy keeps sending; after a minute idle has refilled, busy has not.
	at := t0
	for at.Before(t0.Add(sweepEvery)) {
		at = at.Add(time.Second)
		if !l.allow("busy", 1, at) {
			t.Fatalf("busy refused at %v within its rate", at.Sub(t0))
		}
	}
	if l.allow("busy", 1, at) {
		t.Fatal("busy's second token within one second allowed")
	}
	if _, ok := l.buckets["idle"]; ok {
		t.Fatal("the idle caller's full bucket was not dropped")
	}
	if _, ok := l.buckets["busy"]; !ok {
		t.Fatal("the busy caller's bucket was dropped")
	}
	// A dropped caller comes back to a full bucket, as it would have had.
	if !l.allow("idle", 10, at) || l.allow("idle", 1, at) {
		t.Fatal("the returning caller did not get exactly a full burst")
	}
}
