package clusters

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
)

// Gate tracks one cluster's API health: after a failure the cluster is
// backed off exponentially (MinBackoff doubling to MaxBackoff, with jitter);
// a success resets it. Callers ask Ready (or Wait) before talking to the
// cluster and report the outcome with Fail or OK. A cluster that cannot be
// reached at all (Unreachable) is not tried again until it answers a
// probe (Probe, at most once per ProbeInterval, made by whoever asks): the
// work resumes as soon as the API server answers, not at the end of a
// backoff of up to MaxBackoff. A cluster whose request got no answer in
// time (TimedOut: its network dropping packets, its API server frozen or
// overloaded) is not tried again until it answers a probe either, and its
// backoff stands then (an overloaded server is not pressed harder): each
// try in between costs a probe of at most ProbeInterval, not another
// request's whole timeout — the batch that holds its work beside other
// clusters' is not held that long at every end of its backoff.
type Gate struct {
	now func() time.Time
	// MinBackoff is the first backoff. Default 200ms.
	MinBackoff time.Duration
	// MaxBackoff caps the backoff. Default 30s.
	MaxBackoff time.Duration
	// Probe asks the API server whether it answers at all (GET /readyz:
	// any answer counts); nil: the backoff alone decides. Set before the
	// gate is shared.
	Probe func(context.Context) error
	// ProbeInterval is the least time between two probes, and the longest
	// a caller waits for one. Default 500ms.
	ProbeInterval time.Duration
	// ProbeTimeout is the longest a probe may take: one that has not
	// answered within ProbeInterval goes on in the background (no caller
	// waits for it, none starts another) and opens the gate if it answers
	// by then — an API server that answers, but slowly (its /readyz
	// waiting on a slow etcd), is not taken for a silent one for good.
	// Default 10s; a Registry's gates use kube.timeout.
	ProbeTimeout time.Duration

	mu       sync.Mutex
	failures int
	next     time.Time
	lastErr  error
	probing  bool
	probed   time.Time // when the last probe ended
	answered bool      // a probe answered since the last failure

	latency time.Duration // of the writes, each weighing as much as all before it (Observe); 0: none yet
	// inflight: when each write in flight was sent (Sent), by number.
	inflight map[uint64]time.Time
	sent     uint64
}

// NewGate returns a healthy gate.
func NewGate(now func() time.Time) *Gate {
	if now == nil {
		now = time.Now
	}
	return &Gate{now: now, MinBackoff: 200 * time.Millisecond, MaxBackoff: 30 * time.Second,
		ProbeInterval: 500 * time.Millisecond, ProbeTimeout: 10 * time.Second}
}

// Ready reports whether the cluster may be tried now, and if not, when to
// ask again: the end of its backoff, or, for an unreachable cluster past
// it (its probe still going on in the background, or just made), a
// ProbeInterval from now — never a time already past, which a caller
// would take as due at once. An unreachable cluster is probed first, when
// a probe is due.
func (g *Gate) Ready(ctx context.Context) (bool, time.Time) {
	ready, next, _ := g.state(ctx)
	return ready, next
}

// state probes an unreachable cluster when due and reports whether it may
// be tried, when to ask again (Ready), and whether it is still unreachable.
func (g *Gate) state(ctx context.Context) (ready bool, next time.Time, unreachable bool) {
	g.probe(ctx)
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	unreachable, next = g.unreachable(), g.next
	if unreachable && !next.After(now) {
		next = now.Add(g.ProbeInterval)
	}
	return !unreachable && !now.Before(g.next), next, unreachable
}

// Failures is the number of consecutive failures.
func (g *Gate) Failures() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.failures
}

// LastError is the error of the last failure (nil when healthy).
func (g *Gate) LastError() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lastErr
}

// Fail records a failure and pushes the next try out.
func (g *Gate) Fail(err error) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lastErr, g.answered = err, false
	g.backOff()
	return g.next
}

// backOff counts a failure and pushes next out; g.mu held.
func (g *Gate) backOff() {
	g.failures++
	d := g.MinBackoff << min(g.failures-1, 20)
	if d > g.MaxBackoff || d <= 0 {
		d = g.MaxBackoff
	}
	d = d/2 + rand.N(d/2+1)
	if n := g.now().Add(d); n.After(g.next) {
		g.next = n
	}
}

// OK records a success.
func (g *Gate) OK() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.failures, g.lastErr, g.next, g.answered = 0, nil, time.Time{}, false
}

// Observe records how long one of the cluster's writes took to answer (or
// fail). The latency Slow judges is their moving average, each write
// weighing as much as all before it: one write turns a fast cluster slow
// when it takes more than twice the limit, and two answered at less than
// half the limit make a slow one fast again.
func (g *Gate) Observe(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.latency > 0 {
		d = (g.latency + d) / 2
	}
	g.latency = d
}

// Sent notes a write sent now, in flight until done is called, which
// observes how long it took (Observe). While in flight it counts for Slow
// once its answer could only make the cluster slow.
func (g *Gate) Sent() (done func()) {
	start := time.Now()
	g.mu.Lock()
	if g.inflight == nil {
		g.inflight = map[uint64]time.Time{}
	}
	g.sent++
	n := g.sent
	g.inflight[n] = start
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		delete(g.inflight, n)
		g.mu.Unlock()
		g.Observe(time.Since(start))
	}
}

// Latency is the moving average of the cluster's writes (Observe); zero
// before the first.
func (g *Gate) Latency() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.latency
}

// Slow reports whether the cluster's writes take longer than limit on
// average (Observe; never with limit 0), or a write is in flight for
// longer than twice limit (Sent): its answer, whenever it comes, makes the
// average slow (Observe), so a newly slow cluster is known as such within
// twice limit, not only after its first slow answer. The average moves
// only with the cluster's own writes — no probe stands in for them: an API
// server slow at writes alone (a slow admission webhook, etcd slow to
// commit) answers /readyz at once — so work deferred for being slow must
// be tried somewhere (a retry consumer) for it to turn fast again.
func (g *Gate) Slow(limit time.Duration) bool {
	if limit <= 0 {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.latency > limit {
		return true
	}
	for _, at := range g.inflight {
		if time.Since(at) > 2*limit {
			return true
		}
	}
	return false
}

// FastContexts are a batch's contexts by cluster, each ending once its
// cluster turns slow (Gate.WhileFast at Limit), made as the batch first
// works for the cluster; with Limit 0, the batch's context.
type FastContexts struct {
	ctx   context.Context
	limit time.Duration

	mu     sync.Mutex
	byName map[string]context.Context
	stops  []func()
}

// NewFastContexts returns the contexts of a batch run under ctx.
func NewFastContexts(ctx context.Context, limit time.Duration) *FastContexts {
	return &FastContexts{ctx: ctx, limit: limit, byName: map[string]context.Context{}}
}

// Get returns the batch's context for cl.
func (f *FastContexts) Get(cl *Client) context.Context {
	if f.limit <= 0 || cl == nil {
		return f.ctx
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ctx, ok := f.byName[cl.Name]
	if !ok {
		var stop func()
		ctx, stop = cl.Gate.WhileFast(f.ctx, f.limit)
		f.byName[cl.Name] = ctx
		f.stops = append(f.stops, stop)
	}
	return ctx
}

// Stop ends the batch's contexts.
func (f *FastContexts) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, stop := range f.stops {
		stop()
	}
}

// TurnedSlow reports whether ctx (from FastContexts or WhileFast) ended
// because its cluster turned slow.
func TurnedSlow(ctx context.Context) bool { return errors.Is(context.Cause(ctx), ErrSlow) }

// ErrSlow is the cause of a context WhileFast cancelled.
var ErrSlow = errors.New("cluster turned slow")

// WhileFast returns a context cancelled (cause ErrSlow) once the cluster
// is Slow by limit, checked every limit/2 (no more often than every
// millisecond), and its stop. Work for a cluster served beside others is
// done under it so that the work of a cluster turning slow is handed on, not waited for: its requests in
// flight are abandoned, and the work they were for is to be redone where
// the cluster's pace holds no one (every step faultline makes is
// idempotent: redone, it finds what landed). With limit 0, ctx itself.
func (g *Gate) WhileFast(ctx context.Context, limit time.Duration) (context.Context, func()) {
	if limit <= 0 {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		t := time.NewTicker(max(limit/2, time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if g.Slow(limit) {
					cancel(ErrSlow)
					return
				}
			}
		}
	}()
	return ctx, func() { cancel(nil) }
}

// Wait reports whether the cluster may be tried, waiting out a backoff
// that ends by until (false when ctx ends first). It does not wait for one
// ending later, nor for an unreachable cluster: that one's probe (Ready)
// decides at once.
func (g *Gate) Wait(ctx context.Context, until time.Time) bool {
	ready, next, unreachable := g.state(ctx)
	switch {
	case ready:
		return true
	case unreachable || next.After(until):
		return false
	}
	t := time.NewTimer(time.Until(next))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// unreachable reports whether the cluster's last failure was not being
// able to reach it, or getting no answer in time, with no probe answered
// since; g.mu held.
func (g *Gate) unreachable() bool {
	return g.Probe != nil && (Unreachable(g.lastErr) || TimedOut(g.lastErr)) && !g.answered
}

// probe asks an unreachable cluster once, unless another caller does or
// one did in the last ProbeInterval, and waits for the answer at most
// ProbeInterval (or until ctx ends): a probe still unanswered then goes on
// in the background, up to ProbeTimeout, and its answer counts when it
// comes. Any answer (even "not ready": an API server restarting says so
// for seconds while it serves) opens the gate — for one that could not be
// reached, with its backoff begun afresh: the cluster is back, its work is
// tried and a failure of it backs off from MinBackoff again; for one that
// timed out, at the end of its backoff; silence keeps the gate shut, its
// backoff grown once over.
func (g *Gate) probe(ctx context.Context) {
	g.mu.Lock()
	if !g.unreachable() || g.probing || g.now().Sub(g.probed) < g.ProbeInterval {
		g.mu.Unlock()
		return
	}
	g.probing = true
	g.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The caller's values, not its end: a batch that ends does not
		// cut the probe it started.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(g.ProbeTimeout, g.ProbeInterval))
		err := g.Probe(pctx)
		cancel()
		var st apierrors.APIStatus
		answered := err == nil || errors.As(err, &st)
		g.mu.Lock()
		defer g.mu.Unlock()
		g.probing, g.probed = false, g.now()
		switch {
		case answered && TimedOut(g.lastErr):
			g.answered = true
		case answered:
			g.answered, g.failures, g.next = true, 0, g.probed
		case !g.probed.Before(g.next):
			g.backOff() // so that callers that come back at the backoff's end are spaced too
		}
	}()
	t := time.NewTimer(g.ProbeInterval)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
	}
}

// Unreachable reports whether err means the API server could not be
// reached at all — a connection refused or cut, a name that does not
// resolve — rather than an answer (an API status, however bad) or a slow
// one (a timeout): a cluster worth probing cheaply until it answers.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err)
}

// TimedOut reports whether err is a request that got no answer in time
// (kube.timeout, a dial or TLS handshake that timed out) — not an API
// status (a 504 is an answer).
func TimedOut(err error) bool {
	var st apierrors.APIStatus
	if err == nil || errors.As(err, &st) {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded)
}

// readyz returns a probe of kube's API server (GET /readyz), or nil for a
// client without a REST client (a fake).
func readyz(kube kubernetes.Interface) func(context.Context) error {
	rc := kube.Discovery().RESTClient()
	if rc == nil {
		return nil
	}
	return func(ctx context.Context) error {
		return rc.Get().AbsPath("/readyz").Do(ctx).Error()
	}
}

// Retriable reports whether an API error means the cluster (not the
// request) is in trouble, so the work must be retried later: transport
// errors, timeouts, 5xx, 429, and a context deadline. Conflicts are not
// (callers re-read and retry them at once); NotFound, Invalid and the like
// are permanent for the request.
func Retriable(err error) bool {
	if err == nil {
		return false
	}
	switch {
	case apierrors.IsConflict(err), apierrors.IsNotFound(err), apierrors.IsInvalid(err),
		apierrors.IsBadRequest(err), apierrors.IsAlreadyExists(err):
		return false
	case apierrors.IsTooManyRequests(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err), apierrors.IsUnexpectedServerError(err),
		apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		// Forbidden/Unauthorized are configuration errors an operator fixes;
		// the work waits for them rather than being lost.
		return true
	case errors.Is(err, context.DeadlineExceeded):
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		return se.Status().Code >= 500
	}
	// Unknown transport-level errors (connection refused wrapped by url.Error
	// is a net.Error; others like EOF) are treated as the cluster's trouble.
	return true
}
