package clusters

import (
	"net/http"
	"testing"
	"time"
)

// TestLatencySlow: a cluster is slow when its requests themselves are —
// about half of its recent answered ones, and those unanswered for long,
// over the bound — not when one request among prompt ones is, nor when
// they are old.
func TestLatencySlow(t *testing.T) {
	const over = 100 * time.Millisecond
	now := time.Now()
	for _, tc := range []struct {
		name     string
		answered []time.Duration // recent answered requests' latencies
		old      bool            // answered a minute ago
		inflight []time.Duration // unanswered requests' ages
		slow     bool
	}{
		{name: "nothing measured"},
		{name: "prompt", answered: []time.Duration{time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond}},
		{name: "prompt, many in flight for a moment", answered: []time.Duration{time.Millisecond},
			inflight: []time.Duration{time.Millisecond, 10 * time.Millisecond, 50 * time.Millisecond}},
		{name: "every request slow", answered: []time.Duration{2 * over, 3 * over}, slow: true},
		{name: "none answered yet, in flight too long", inflight: []time.Duration{2 * over}, slow: true},
		{name: "one slow among prompt ones", answered: []time.Duration{time.Millisecond, time.Millisecond, 2 * over, time.Millisecond}},
		{name: "half slow", answered: []time.Duration{time.Millisecond, 2 * over}, slow: true},
		{name: "prompt answers, the rest stuck", answered: []time.Duration{time.Millisecond, time.Millisecond},
			inflight: []time.Duration{2 * over, 3 * over, 4 * over}, slow: true},
		{name: "slow a minute ago", answered: []time.Duration{2 * over, 2 * over}, old: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l Latency
			for _, d := range tc.answered {
				at := now
				if tc.old {
					at = now.Add(-time.Minute)
				}
				l.recent[l.next] = sample{at: at, took: d}
				l.next = (l.next + 1) % latencyWindow
			}
			l.inflight = map[uint64]time.Time{}
			for i, age := range tc.inflight {
				l.inflight[uint64(i)] = now.Add(-age)
			}
			if got := l.Slow(over); got != tc.slow {
				t.Fatalf("Slow: %v, want %v", got, tc.slow)
			}
		})
	}
	if (*Latency)(nil).Slow(over) || (&Client{}).Slow() {
		t.Fatal("an unmeasured client is slow")
	}
}

// TestLatencyMeasuresRoundTrip: the wrapped transport's requests are
// measured from when they are sent (past the client's rate limiter) to
// their answer.
func TestLatencyMeasuresRoundTrip(t *testing.T) {
	var l Latency
	rt := l.WrapTransport(roundTrip(func(*http.Request) (*http.Response, error) {
		time.Sleep(30 * time.Millisecond)
		return &http.Response{StatusCode: http.StatusOK}, nil
	}))
	req, _ := http.NewRequest(http.MethodGet, "http://x/", nil)
	if _, err := rt.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if !l.Slow(10*time.Millisecond) || l.Slow(time.Second) || len(l.inflight) != 0 {
		t.Fatalf("a 30ms request: slow over 10ms %v, over 1s %v, %d in flight; want true, false, 0",
			l.Slow(10*time.Millisecond), l.Slow(time.Second), len(l.inflight))
	}
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
