package gateway

import (
	"context"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc/stats"
)

// inflight bounds the request bytes the gateway holds at once, per
// connection and in total, so that memory stays bounded whoever connects:
// a request that does not fit is refused at once (RESOURCE_EXHAUSTED, 429)
// rather than queued. A gRPC call reserves its stream's flow-control
// window (grpcStreamWindow, all a client can send before the call's
// message is read) when its headers arrive, grows the reservation to
// gateway.max_body_bytes just before its message is read (its size is not
// known yet), and shrinks it to the message's size once it is decoded; a
// REST request reserves its body as it is read. Each holds its reservation
// until it is answered.
type inflight struct {
	total   *semaphore.Weighted
	perConn int64
	held    atomic.Int64 // what the reservations hold, for the gauge

	// freed, when not nil, is closed the next time bytes are given back:
	// growWait's waiters wake on it.
	mu    sync.Mutex
	freed chan struct{}
}

// changed returns a channel closed the next time bytes are given back.
func (f *inflight) changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.freed == nil {
		f.freed = make(chan struct{})
	}
	return f.freed
}

// wake wakes growWait's waiters, if any.
func (f *inflight) wake() {
	f.mu.Lock()
	if f.freed != nil {
		close(f.freed)
		f.freed = nil
	}
	f.mu.Unlock()
}

func newInflight(total, perConn int64) *inflight {
	return &inflight{total: semaphore.NewWeighted(total), perConn: perConn}
}

type connBudgetKey struct{}

// connContext gives a connection its own budget; requests on it find it in
// their context (gRPC: through the stats handler's TagConn; REST: through
// http.Server.ConnContext).
func (f *inflight) connContext(ctx context.Context) context.Context {
	return context.WithValue(ctx, connBudgetKey{}, semaphore.NewWeighted(f.perConn))
}

// reservation is bytes held on a connection and in total. Once released
// it holds nothing for good: a call's goroutine growing it after its
// context ended (and the tap's release ran) would otherwise hold bytes
// nothing gives back.
type reservation struct {
	f        *inflight
	conn     *semaphore.Weighted
	mu       sync.Mutex
	n        int64
	released bool
}

// reserve holds n bytes for a request on ctx's connection, or returns nil
// when the connection's or the gateway's budget cannot take them now.
func (f *inflight) reserve(ctx context.Context, n int64) *reservation {
	r := &reservation{f: f}
	r.conn, _ = ctx.Value(connBudgetKey{}).(*semaphore.Weighted)
	if !r.grow(n) {
		return nil
	}
	return r
}

// grow adds n bytes to the reservation, or nothing when a budget is full
// or the reservation was released.
func (r *reservation) grow(n int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.released {
		return false
	}
	if n <= 0 {
		return true
	}
	if r.conn != nil && !r.conn.TryAcquire(n) {
		return false
	}
	if !r.f.total.TryAcquire(n) {
		if r.conn != nil {
			r.conn.Release(n)
			r.f.wake() // a waiter may have failed on these bytes meanwhile
		}
		return false
	}
	r.f.held.Add(n)
	r.n += n
	return true
}

// growWait is grow, retried each time bytes are given back until it
// succeeds, the reservation is released or ctx is done. It does not queue
// on the semaphores: a queued waiter would make every TryAcquire on the
// same budget fail (golang.org/x/sync/semaphore is FIFO), refusing the
// calls and bodies that would fit. Only a call's own goroutine may wait
// (never a connection's reader).
func (r *reservation) growWait(ctx context.Context, n int64) bool {
	for {
		freed := r.f.changed() // before trying: a release in between wakes us
		if r.grow(n) {
			return true
		}
		r.mu.Lock()
		released := r.released
		r.mu.Unlock()
		if released {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-freed:
		}
	}
}

// held is what the reservation holds.
func (r *reservation) held() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// shrink gives back what the reservation holds beyond n bytes.
func (r *reservation) shrink(n int64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n < 0 {
		n = 0
	}
	if extra := r.n - n; extra > 0 {
		r.n = n
		r.f.held.Add(-extra)
		r.f.total.Release(extra)
		if r.conn != nil {
			r.conn.Release(extra)
		}
		r.f.wake()
	}
}

// release gives everything back for good; it may be called more than once.
func (r *reservation) release() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.released = true
	r.mu.Unlock()
	r.shrink(0)
}

type reservationKey struct{}

func withReservation(ctx context.Context, r *reservation) context.Context {
	return context.WithValue(ctx, reservationKey{}, r)
}

func reservationFrom(ctx context.Context) *reservation {
	r, _ := ctx.Value(reservationKey{}).(*reservation)
	return r
}

// connStats is the gRPC stats handler that gives every connection its
// budget; it observes nothing else.
type connStats struct{ f *inflight }

func (c connStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return c.f.connContext(ctx)
}
func (connStats) HandleConn(context.Context, stats.ConnStats) {}
func (connStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return ctx
}
func (connStats) HandleRPC(context.Context, stats.RPCStats) {}
