package fleet

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// A worker that stalls while the faults are sent and bursts afterwards
// delivers its whole-run schedule: the window the faults were sent in
// must still fail the load, and the figure must say so.
func TestVerifiedWindow(t *testing.T) {
	caughtUp := LoadResult{Target: 1000, Sent: 10_000, Due: 10_000, Elapsed: 10 * time.Second, Delivered: 1000,
		MaxBehind: 3700 * time.Millisecond,
		Window:    4 * time.Second, WindowSent: 400, WindowDue: 3952, WindowBehind: 3700 * time.Millisecond}
	err := caughtUp.Verified(0.95)
	if err == nil {
		t.Fatal("a load 3.7 s behind while the faults were sent, caught up after, verified")
	}
	v := caughtUp.Verdict(0.95)
	if !strings.HasPrefix(v, "background NOT verified: a worker fell 3.7s behind") {
		t.Errorf("verdict %q", v)
	}
	steady := caughtUp
	steady.MaxBehind, steady.WindowSent, steady.WindowBehind = 20*time.Millisecond, 3990, 20*time.Millisecond
	if err := steady.Verified(0.95); err != nil {
		t.Errorf("a load on its schedule through the window: %v", err)
	}
	if v := steady.Verdict(0.95); !strings.HasPrefix(v, "background verified over the 4s the faults were sent in: 3990 events sent of 3952 due (101%)") {
		t.Errorf("verdict %q", v)
	}
}

func TestWindowDue(t *testing.T) {
	start := time.Unix(0, 0)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	// 8 workers of 125 events/s in batches of 6: a batch every 48 ms each.
	for _, c := range []struct {
		from, to int
		want     int64
	}{
		{3000, 7000, 8 * 6 * (145 - 62 - 1)}, // batches due in (3 s, 7 s], less each worker's last
		{3000, 3040, 0},                      // shorter than a batch: none
		{3000, 3100, 8 * 6 * 1},
	} {
		if got := windowDue(start, at(c.from), at(c.to), 125, 6, 8); got != c.want {
			t.Errorf("windowDue(%d ms, %d ms) = %d, want %d", c.from, c.to, got, c.want)
		}
	}
}

// The apiserver's own count of requests for Node objects, by verb: the
// refused ones too (a 409 is a call), the status subresource apart, not
// other resources; LIST and WATCH apart (informers, not per node).
func TestNodeCalls(t *testing.T) {
	f, err := os.Open("testdata/apiserver-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := parseNodeCalls(f)
	if err != nil {
		t.Fatal(err)
	}
	want := NodeCalls{Verbs: map[string]int64{"GET": 7, "PATCH": 2013, "UPDATE": 3, "LIST": 4, "WATCH": 2, "PATCH status": 500}, Conflicts: 13}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	before := NodeCalls{Verbs: map[string]int64{"GET": 2, "PATCH": 13, "LIST": 1}, Conflicts: 3}
	d := got.Since(before)
	if d.PerNodeCalls() != 5+2000+500+3 || d.Conflicts != 10 {
		t.Errorf("since: %+v (per-node calls %d)", d, d.PerNodeCalls())
	}
	if s := d.String(); s != "GET 5, PATCH 2000, PATCH status 500, UPDATE 3 (10 of them refused 409); LIST 3, WATCH 2 not per node" {
		t.Errorf("String() = %q", s)
	}
}
