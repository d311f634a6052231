package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc/stats"

	"github.com/faultline/faultline/internal/connlimit"
	"github.com/faultline/faultline/internal/protoshape"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// inflight bounds the request bytes the gateway holds at once, in total
// and per connection, so that memory stays bounded whoever connects: a
// request that does not fit is refused at once (RESOURCE_EXHAUSTED, 429)
// rather than queued. A gRPC call reserves its stream's flow-control
// window (grpcStreamWindow, all a client can send before the call's
// message is read) when its headers arrive, grows the reservation to
// gateway.max_body_bytes just before its message is read (its size is not
// known yet), and shrinks it to the message's size once it is decoded; a
// REST request reserves its body as it is read. A SubmitEvents or
// HealthEventOccurredV1 request then holds, besides, what its decoded
// events cost (decodedCost, up to 15 times its wire size) in a budget of
// its own (gateway.max_decoded_bytes), without waiting, or is refused like
// a request that does not fit. Each holds its reservation until it is
// answered.
//
// The growth to max_body_bytes is held until the message arrives, however
// long the client takes to send it, so one credential's calls may hold at
// most perCaller bytes of it at once (readShare): a caller whose messages
// never come refuses its own calls, not everyone else's. A REST body
// holds the share for the length it declares while it is read.
//
// The connection's and the gateway's bounds are counters under one lock,
// so a reservation grows in both or in neither: no other request sees
// bytes held for a moment and given back.
type inflight struct {
	total, perConn, perCaller, decodedTotal int64

	mu   sync.Mutex
	held int64 // what the reservations hold
	// decodedHeld is what the reservations hold for decoded events
	// (holdDecoded), bounded by decodedTotal.
	decodedHeld int64
	// reading is the part of held grown for messages being read: given
	// back in microseconds, once each is decoded.
	reading int64
	// freed, when not nil, is closed the next time bytes are given back:
	// growWait's waiters wake on it.
	freed chan struct{}
	// reads are the read shares of the credentials with a call reading
	// or waiting to read its message (readShareKeyOf).
	reads map[readShareKey]*readShare
}

// connBudget is what one connection's reservations hold, and the part of
// it grown for messages being read (under inflight.mu).
type connBudget struct{ held, reading int64 }

// readShare is one credential's share of the bytes held for messages being
// read: calls wait for it in turn (a FIFO semaphore: every call asks for
// about max_body_bytes, so none is passed over). It is dropped when no
// call holds or waits for it.
type readShare struct {
	key   readShareKey
	sem   *semaphore.Weighted
	calls int // under inflight.mu
}

// readShareKey names a read share: a credential (Caller.Name), and for
// one not bound to a node the client's address (clientAddr).
type readShareKey struct{ caller, addr string }

// readShareKeyOf is the read share a call from addr takes. A credential
// not bound to a node is often shared (a cluster's preflight token in
// every opted-in namespace, the chart's agent token on every node): its
// share is per client address (an IP, an IPv6 /64), so one holder whose
// messages never come refuses the calls from its own address, not every
// holder's. A node-bound credential has one share wherever its calls come
// from.
func readShareKeyOf(c Caller, addr net.Addr) readShareKey {
	if c.Node != "" {
		return readShareKey{caller: c.Name}
	}
	return readShareKey{caller: c.Name, addr: connlimit.ClientAddr(addr)}
}

// Why a reservation could not grow. errConnBusy is an errBusy.
var (
	errBusy       = errors.New("in-flight budget full")
	errConnBusy   = fmt.Errorf("connection's %w", errBusy)
	errDecoded    = fmt.Errorf("decoded events' %w", errBusy)
	errCallerBusy = errors.New("the credential's share of message reads is full")
	errReleased   = errors.New("reservation released")
)

// busyRefusal is the metrics reason and the message of an answer to a
// request the in-flight budget refused with err; the message names the
// bound that refused it.
func busyRefusal(err error) (reason, msg string) {
	switch {
	case errors.Is(err, errCallerBusy):
		return "caller_busy", "this credential's requests hold as many bytes for messages being read as one credential may (gateway.max_read_bytes_per_caller); retry later"
	case errors.Is(err, errConnBusy):
		return "busy", "this connection holds as many request bytes as one connection may (gateway.max_inflight_bytes_per_conn); retry later"
	case errors.Is(err, errDecoded):
		return "busy", "the gateway holds as many decoded events as it may (gateway.max_decoded_bytes); retry later"
	}
	return "busy", "the gateway holds as many request bytes as it may (gateway.max_inflight_bytes); retry later"
}

func newInflight(total, perConn, perCaller, decoded int64) *inflight {
	return &inflight{total: total, perConn: perConn, perCaller: perCaller, decodedTotal: decoded, reads: map[readShareKey]*readShare{}}
}

// inUse is what the reservations hold now.
func (f *inflight) inUse() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held
}

// decodedInUse is what the reservations hold now of the decoded events'
// budget.
func (f *inflight) decodedInUse() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.decodedHeld
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

// reservation is bytes held on a connection and in total, and, while its
// call's message is read, in its credential's read share. Once released
// it holds nothing for good: a call's goroutine growing it after its
// context ended (and the tap's release ran) would otherwise hold bytes
// nothing gives back.
type reservation struct {
	f        *inflight
	conn     *connBudget
	mu       sync.Mutex // guards the fields below; taken before inflight.mu
	n        int64
	released bool
	// reading is the read share a call holds (readN bytes of it) while
	// its message is read; readGrown is what the reservation grew by
	// meanwhile.
	reading   *readShare
	readN     int64
	readGrown int64
	// decoded is what the reservation holds of the decoded events'
	// budget (holdDecoded).
	decoded int64
}

// reserve holds n bytes for a request on ctx's connection, leaving at
// least keep bytes of the connection's and the gateway's budgets free, or
// returns errBusy (errConnBusy when it is the connection's that is full).
// A gRPC call keeps free what a call needs to read its message: were the
// budget all stream windows of calls waiting to read, none could grow to
// read, and every call would wait and be refused. The bytes held for
// messages being read do not count against keep (they are that room, in
// use for microseconds): counted, every call a client opened on a
// connection while another of its calls was read was refused.
func (f *inflight) reserve(ctx context.Context, n, keep int64) (*reservation, error) {
	r := &reservation{f: f}
	r.conn, _ = ctx.Value(connBudgetKey{}).(*connBudget)
	if err := r.growKeeping(n, keep); err != nil {
		return nil, err
	}
	return r, nil
}

// grow adds n bytes to the reservation, or nothing when a budget is full
// (errBusy, errConnBusy) or the reservation was released (errReleased).
func (r *reservation) grow(n int64) error { return r.growKeeping(n, 0) }

// growKeeping is grow leaving at least keep bytes of each budget free of
// what is not held for messages being read. What it grows while the
// reservation holds a read share is held for its message being read.
func (r *reservation) growKeeping(n, keep int64) error {
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
	if f.held+n > f.total || f.held-f.reading+n > f.total-keep {
		return errBusy
	}
	if c := r.conn; c != nil && (c.held+n > f.perConn || c.held-c.reading+n > f.perConn-keep) {
		return errConnBusy
	}
	var reading int64
	if r.reading != nil {
		reading = n
	}
	if r.conn != nil {
		r.conn.held += n
		r.conn.reading += reading
	}
	f.held += n
	f.reading += reading
	r.n += n
	r.readGrown += reading
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

// readWait is how long a gRPC call or a REST body waits for its
// credential's read share (and a gRPC call then for room in the in-flight
// budgets) before it is refused: the other reads are usually over in
// microseconds (their messages have arrived), and a refusal costs the
// client a backoff and a resend.
const readWait = time.Second

// takeRead holds n bytes of the read share key names until the
// reservation shrinks (its message decoded) or is released, waiting in
// turn up to wait or until ctx is done (errCallerBusy).
func (r *reservation) takeRead(ctx context.Context, key readShareKey, n int64, wait time.Duration) error {
	f := r.f
	f.mu.Lock()
	share := f.reads[key]
	if share == nil {
		share = &readShare{key: key, sem: semaphore.NewWeighted(f.perCaller)}
		f.reads[key] = share
	}
	share.calls++
	f.mu.Unlock()
	n = min(n, f.perCaller)
	var err error
	if !share.sem.TryAcquire(n) {
		wctx, cancel := context.WithTimeout(ctx, wait)
		err = share.sem.Acquire(wctx, n)
		cancel()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err != nil:
		err = errCallerBusy
	case r.released: // released while it waited
		share.sem.Release(n)
		err = errReleased
	default:
		r.reading, r.readN = share, n
		return nil
	}
	f.leaveRead(share)
	return err
}

// leaveRead drops a call from a read share it no longer holds or waits for.
func (f *inflight) leaveRead(share *readShare) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if share.calls--; share.calls == 0 {
		delete(f.reads, share.key)
	}
}

// held is what the reservation holds.
func (r *reservation) held() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// shrink gives back what the reservation holds beyond n bytes, and its
// read share: its message has been read.
func (r *reservation) shrink(n int64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.shrinkLocked(max(n, 0))
}

func (r *reservation) shrinkLocked(n int64) {
	if r.reading != nil {
		r.reading.sem.Release(r.readN)
		r.f.leaveRead(r.reading)
		r.reading = nil
	}
	extra := max(r.n-n, 0)
	if extra == 0 && r.readGrown == 0 {
		return
	}
	f := r.f
	f.mu.Lock()
	defer f.mu.Unlock()
	r.n -= extra
	if r.conn != nil {
		r.conn.held -= extra
		r.conn.reading -= r.readGrown
	}
	f.held -= extra
	f.reading -= r.readGrown
	r.readGrown = 0
	if extra == 0 {
		return
	}
	if f.freed != nil {
		close(f.freed)
		f.freed = nil
	}
}

// holdDecoded makes the reservation hold n bytes of the decoded events'
// budget until it is released (what the request's decoded events cost),
// without waiting; it returns errDecoded when the budget cannot take
// them (holding what it held), or errReleased.
func (r *reservation) holdDecoded(n int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.released {
		return errReleased
	}
	n -= r.decoded
	if n <= 0 {
		return nil
	}
	f := r.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.decodedHeld+n > f.decodedTotal {
		return errDecoded
	}
	f.decodedHeld += n
	r.decoded += n
	return nil
}

// release gives everything back for good; it may be called more than once.
func (r *reservation) release() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.shrinkLocked(0)
	r.released = true
	if r.decoded > 0 {
		r.f.mu.Lock()
		r.f.decodedHeld -= r.decoded
		r.f.mu.Unlock()
		r.decoded = 0
	}
}

// What decoded events cost in memory, beyond their strings' bytes,
// measured as the bytes vtprotobuf's UnmarshalVT allocates (slices' and
// maps' growth included) for 1,000 events of each shape (go1.26, amd64;
// TestDecodedCostCoversDecoding):
//   - an event: 370 B (its 352 B struct and its slot in the batch), to
//     which stamp adds an id, a submitter and their bytes in the event's
//     Kafka record;
//   - a timestamp, a submitter or overrides: at most 80 B;
//   - an entity: 96 B (its 80 B struct, its slot);
//   - an errorCode or causeIds element: 32 B (its 16 B header, the slice's
//     growth);
//   - metadata: 336 B for a map of up to 8 entries, 148 B an entry for 64
//     (the map's groups as it grows).
//
// Strings count twice: their decoded copy and their copy in the Kafka
// record the producer holds until the write is over.
const (
	decodedEvent    = 512
	decodedMessage  = 80
	decodedEntity   = 96
	decodedString   = 32
	decodedMap      = 336
	decodedMapEntry = 152
	decodedCopies   = 2
)

// decodedCost estimates the bytes a request's decoded events hold, from
// the events (one pass, no allocation): at least what decoding them
// allocated for the shapes measured, and within about 1.5 times it for
// the usual events. A message's wire size is no bound on it: an entity of
// 4 wire bytes decodes into 80, an empty causeIds element of 3 into 16.
func decodedCost(evs []*datamodels.HealthEvent) int64 {
	var n, strs int64
	for _, ev := range evs {
		if ev == nil {
			continue
		}
		n += decodedEvent + int64(len(ev.ProtoReflect().GetUnknown())) // dropped by stamp
		strs += int64(len(ev.Agent) + len(ev.ComponentClass) + len(ev.CheckName) + len(ev.Message) +
			len(ev.NodeName) + len(ev.Id) + len(ev.CustomRecommendedAction) + len(ev.Cluster) + len(ev.DerivedBy))
		for _, m := range [...]bool{ev.GeneratedTimestamp != nil, ev.ReceivedTimestamp != nil,
			ev.QuarantineOverrides != nil, ev.DrainOverrides != nil, ev.Submitter != nil} {
			if m {
				n += decodedMessage
			}
		}
		if s := ev.Submitter; s != nil {
			strs += int64(len(s.Name) + len(s.Node))
		}
		for _, e := range ev.EntitiesImpacted {
			n += decodedEntity
			if e != nil {
				n += int64(len(e.ProtoReflect().GetUnknown()))
				strs += int64(len(e.EntityType) + len(e.EntityValue))
			}
		}
		for _, c := range ev.ErrorCode {
			n += decodedString
			strs += int64(len(c))
		}
		for _, c := range ev.CauseIds {
			n += decodedString
			strs += int64(len(c))
		}
		if len(ev.Metadata) > 0 {
			n += decodedMap
		}
		for k, v := range ev.Metadata {
			n += decodedMapEntry
			strs += int64(len(k) + len(v))
		}
	}
	return n + decodedCopies*strs
}

// decodedCeiling is the most decodedCost can be for one request of at most
// maxBatch events and maxBody bytes: each event with every element the
// shape check lets through, the strings at most the body.
func decodedCeiling(maxBatch, maxBody int) int64 {
	perEvent := decodedEvent + 5*decodedMessage + maxEntities*decodedEntity +
		(maxErrorCodes+protoshape.MaxRepeated)*decodedString + decodedMap + maxMetadata*decodedMapEntry
	return int64(maxBatch)*int64(perEvent) + decodedCopies*int64(maxBody)
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
