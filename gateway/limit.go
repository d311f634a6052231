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
}

func newLimiter(perSecond float64, burst int) *limiter {
	return &limiter{perSecond: perSecond, burst: burst, buckets: map[string]*rate.Limiter{}}
}

// allow takes n tokens from the caller's bucket, or none.
func (l *limiter) allow(caller string, n int, now time.Time) bool {
	if l == nil || l.perSecond == 0 {
		return true
	}
	l.mu.Lock()
	b, ok := l.buckets[caller]
	if !ok {
		b = rate.NewLimiter(rate.Limit(l.perSecond), l.burst)
		l.buckets[caller] = b
	}
	l.mu.Unlock()
	return b.AllowN(now, n)
}
