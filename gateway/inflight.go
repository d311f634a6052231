package gateway

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/grpc/stats"
)

// inflight bounds the request bytes the gateway holds at once, in total,
// per connection and per credential, so that memory stays bounded whoever
// connects: a request that does not fit is refused at once
// (RESOURCE_EXHAUSTED, 429) rather than queued. A gRPC call reserves its
// stream's flow-control window (grpcStreamWindow, all a client can send
// before the call's message is read) when its headers arrive, grows the
// reservation to gateway.max_body_bytes just before its message is read
// (its size is not known yet), and shrinks it to the message's size once
// it is decoded; a REST request reserves its body as it is read. Each
// holds its reservation until it is answered.
//
// One credential's reservations together hold at most perCaller bytes: a
// gRPC call grown to max_body_bytes holds it until its message arrives, so
// a caller whose messages never come can refuse its own calls, not
// everyone else's.
//
// The three bounds are counters under one lock, so a reservation grows in
// all of them or in none: no other request sees bytes held for a moment
// and given back.
type inflight struct {
	total, perConn, perCaller int64

	mu   sync.Mutex
	held int64 // what the reservations hold
	// freed, when not nil, is closed the next time bytes are given back:
	// growWait's waiters wake on it.
	freed chan struct{}
	// callers are the credentials with a reservation, by Caller.Name.
	callers map[string]*callerShare
}

// connBudget is what one connection's reservations hold (under
// inflight.mu).
type connBudget struct{ held int64 }

// callerShare is what one credential's reservations hold (under
// inflight.mu); it is dropped with the credential's last reservation.
type callerShare struct{ held, reservations int64 }

// Why a reservation could not grow.
var (
	errBusy       = errors.New("in-flight budget full")
	errCallerBusy = errors.New("the credential's in-flight share is full")
	errReleased   = errors.New("reservation released")
)

// busyRefusal is the metrics reason and the message of an answer to a
// request the in-flight budget refused with err (errBusy or errCallerBusy).
func busyRefusal(err error) (reason, msg string) {
	if errors.Is(err, errCallerBusy) {
		return "caller_busy", "this credential's requests hold as many bytes as one credential may (gateway.max_inflight_bytes_per_caller); retry later"
	}
	return "busy", "the gateway holds as many request bytes as it may; retry later"
}

func newInflight(total, perConn, perCaller int64) *inflight {
	return &inflight{total: total, perConn: perConn, perCaller: perCaller, callers: map[string]*callerShare{}}
}

// inUse is what the reservations hold now.
func (f *inflight) inUse() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held
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

type connBudgetKey struct{}

// connContext gives a connection its own budget; requests on it find it in
// their context (gRPC: through the stats handler's TagConn; REST: through
// http.Server.ConnContext).
func (f *inflight) connContext(ctx context.Context) context.Context {
	return context.WithValue(ctx, connBudgetKey{}, &connBudget{})
}

// reservation is bytes held on a connection, in its credential's share
// and in total. Once released it holds nothing for good: a call's
// goroutine growing it after its context ended (and the tap's release ran)
// would otherwise hold bytes nothing gives back.
type reservation struct {
	f        *inflight
	conn     *connBudget
	caller   string
	share    *callerShare
	mu       sync.Mutex // guards n and released; taken before inflight.mu
	n        int64
	released bool
}

// reserve holds n bytes for a request of caller (its Caller.Name) on
// ctx's connection, or returns errBusy or errCallerBusy when the
// connection's, the gateway's or the credential's budget cannot take them
// now.
func (f *inflight) reserve(ctx context.Context, caller string, n int64) (*reservation, error) {
	r := &reservation{f: f, caller: caller}
	r.conn, _ = ctx.Value(connBudgetKey{}).(*connBudget)
	f.mu.Lock()
	if r.share = f.callers[caller]; r.share == nil {
		r.share = &callerShare{}
		f.callers[caller] = r.share
	}
	r.share.reservations++
	f.mu.Unlock()
	if err := r.grow(n); err != nil {
		r.release()
		return nil, err
	}
	return r, nil
}

// grow adds n bytes to the reservation, or nothing when a budget is full
// (errBusy; errCallerBusy when only the credential's share is) or the
// reservation was released (errReleased).
func (r *reservation) grow(n int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.released {
		return errReleased
	}
	if n <= 0 {
		return nil
	}
	f := r.f
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.conn != nil && r.conn.held+n > f.perConn, f.held+n > f.total:
		return errBusy
	case r.share.held+n > f.perCaller:
		return errCallerBusy
	}
	r.share.held += n
	if r.conn != nil {
		r.conn.held += n
	}
	f.held += n
	r.n += n
	return nil
}

// growWait is grow, retried each time bytes are given back until it
// succeeds, the reservation is released or ctx is done (then it returns
// the last refusal). It does not queue: a queued waiter would make the
// calls and bodies that fit wait behind it. Only a call's own goroutine
// may wait (never a connection's reader).
func (r *reservation) growWait(ctx context.Context, n int64) error {
	for {
		freed := r.f.changed() // before trying: a release in between wakes us
		err := r.grow(n)
		if err == nil || errors.Is(err, errReleased) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
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
	r.shrinkLocked(max(n, 0))
}

func (r *reservation) shrinkLocked(n int64) {
	extra := r.n - n
	if extra <= 0 {
		return
	}
	f := r.f
	f.mu.Lock()
	defer f.mu.Unlock()
	r.n = n
	r.share.held -= extra
	if r.conn != nil {
		r.conn.held -= extra
	}
	f.held -= extra
	if f.freed != nil {
		close(f.freed)
		f.freed = nil
	}
}

// release gives everything back for good; it may be called more than once.
func (r *reservation) release() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.released {
		return
	}
	r.shrinkLocked(0)
	r.released = true
	f := r.f
	f.mu.Lock()
	if r.share.reservations--; r.share.reservations == 0 {
		delete(f.callers, r.caller)
	}
	f.mu.Unlock()
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
