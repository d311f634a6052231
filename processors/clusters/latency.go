package clusters

import (
	"net/http"
	"sync"
	"time"
)

// SlowRequest is how long an API request of a cluster takes, measured
// around its HTTP round trip, before the cluster counts as slow
// (Latency.Slow): a healthy API server answers a request in milliseconds,
// a loaded one in tens to hundreds; one that takes seconds is in trouble
// (its etcd slow, overloaded, far away). The client's own rate limiter
// (kube.qps, kube.burst) waits before the round trip, so a cluster that is
// merely busy — much work, every request answered promptly — is never
// slow.
const SlowRequest = time.Second

// latencyWindow is how many of a cluster's last answered requests
// Latency.Slow weighs, and latencyFor how long one counts.
const (
	latencyWindow = 8
	latencyFor    = 30 * time.Second
)

// Latency measures a cluster's API requests around their HTTP round trip
// (WrapTransport): after the client's rate limiter, so its waits are not
// counted. The zero value is ready; a nil *Latency is never slow.
type Latency struct {
	mu       sync.Mutex
	recent   [latencyWindow]sample // a ring of the last answered requests
	next     int
	seq      uint64
	inflight map[uint64]time.Time // requests sent, not answered yet, by when sent
}

type sample struct {
	at   time.Time // when answered
	took time.Duration
}

// WrapTransport returns rt measured (a rest.Config's WrapTransport).
func (l *Latency) WrapTransport(rt http.RoundTripper) http.RoundTripper {
	return latencyRT{rt: rt, l: l}
}

type latencyRT struct {
	rt http.RoundTripper
	l  *Latency
}

func (t latencyRT) RoundTrip(req *http.Request) (*http.Response, error) {
	done := t.l.start()
	resp, err := t.rt.RoundTrip(req)
	done()
	return resp, err
}

// WrappedRoundTripper lets client-go reach the wrapped transport
// (utilnet.CloseIdleConnectionsFor).
func (t latencyRT) WrappedRoundTripper() http.RoundTripper { return t.rt }

// start records a request sent; the function returned records its answer
// (or failure).
func (l *Latency) start() func() {
	sent := time.Now()
	l.mu.Lock()
	if l.inflight == nil {
		l.inflight = map[uint64]time.Time{}
	}
	l.seq++
	id := l.seq
	l.inflight[id] = sent
	l.mu.Unlock()
	return func() {
		now := time.Now()
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.inflight, id)
		l.recent[l.next] = sample{at: now, took: now.Sub(sent)}
		l.next = (l.next + 1) % latencyWindow
	}
}

// Slow reports whether the cluster's requests themselves take longer than
// over: at least half of its last answered requests (up to 8, of the last
// 30s) and of its requests unanswered for longer than over are. A request
// still unanswered counts as soon as it is over, so a cluster whose every
// request takes seconds is slow before the first answers; one slow
// request among prompt ones is not.
func (l *Latency) Slow(over time.Duration) bool {
	if l == nil {
		return false
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var n, slow int
	for _, s := range l.recent {
		if s.at.IsZero() || now.Sub(s.at) > latencyFor {
			continue
		}
		n++
		if s.took > over {
			slow++
		}
	}
	for _, sent := range l.inflight {
		if now.Sub(sent) > over {
			n++
			slow++
		}
	}
	return slow > 0 && 2*slow >= n
}

// Slow reports whether the cluster's API requests are slow (Latency,
// SlowRequest); a client whose requests are not measured (a prebuilt one,
// SetClient) never is.
func (c *Client) Slow() bool { return c.Latency.Slow(SlowRequest) }
