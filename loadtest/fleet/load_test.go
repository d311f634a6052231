package fleet

import (
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
