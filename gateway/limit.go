package gateway

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// limiter is a token bucket of events per caller.
type limiter struct {
	perSecond float64
	burst     int
	mu        sync.Mutex
	buckets   map[string]*rate.Limiter
	swept     time.Time
}

// sweepEvery is how often allow drops the buckets of idle callers.
const sweepEvery = time.Minute

func newLimiter(perSecond float64, burst int) *limiter {
	return &limiter{perSecond: perSecond, burst: burst, buckets: map[string]*rate.Limiter{}}
}

// allow takes n tokens from the caller's bucket, or none. At most every
// sweepEvery it drops the full buckets: a caller idle long enough to
// refill gets the same fresh bucket again, so callers that come and go
// (a node's certificate per node, nodes replaced) do not pile up.
func (l *limiter) allow(caller string, n int, now time.Time) bool {
	if l == nil || l.perSecond == 0 {
		return true
	}
	l.mu.Lock()
	if now.Sub(l.swept) >= sweepEvery {
		for c, b := range l.buckets {
			if b.TokensAt(now) >= float64(l.burst) {
				delete(l.buckets, c)
			}
		}
		l.swept = now
	}
	b, ok := l.buckets[caller]
	if !ok {
		b = rate.NewLimiter(rate.Limit(l.perSecond), l.burst)
		l.buckets[caller] = b
	}
	l.mu.Unlock()
	return b.AllowN(now, n)
}
