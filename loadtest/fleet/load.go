package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/faultline/faultline/internal/fleetsim"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// Transport is the gateway door a load uses.
type Transport string

const (
	GRPC Transport = "grpc" // SubmitEvents, a batch per call
	REST Transport = "rest" // POST /v1/events, HTTP keep-alive
)

// AuthContext is ctx with the cluster's agent token.
func (e *Env) AuthContext(ctx context.Context, cluster string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+e.GW.Token(cluster))
}

var restClient = &http.Client{Transport: &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: time.Minute}}

// Send submits the events of one cluster and returns once the gateway
// answered (for both doors: after the broker acknowledged them).
func (e *Env) Send(ctx context.Context, t Transport, cluster string, evs []*datamodels.HealthEvent) error {
	req := &faultlinev1.SubmitEventsRequest{Events: evs}
	if t == GRPC {
		_, err := e.Events().SubmitEvents(e.AuthContext(ctx, cluster), req)
		return err
	}
	body, err := protojson.Marshal(req)
	if err != nil {
		return err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, e.GW.URL()+"/v1/events", bytes.NewReader(body))
	if err != nil {
		return err
	}
	hr.Header.Set("Authorization", "Bearer "+e.GW.Token(cluster))
	hr.Header.Set("Content-Type", "application/json")
	resp, err := restClient.Do(hr)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return &httpError{code: resp.StatusCode, msg: fmt.Sprintf("POST /v1/events: %s: %s", resp.Status, b)}
	}
	return nil
}

// Load is a sustained stream of events. Each worker owns an equal share
// of Rate and one cluster (worker i sends for cluster i mod clusters);
// it keeps to an absolute schedule — a worker behind it sends its next
// batch at once, so no tick is silently dropped — and counts what the
// gateway acknowledged, so the delivered rate is measured, not assumed.
type Load struct {
	Rate      float64 // events/s in all; 0: as fast as the workers go
	Batch     int     // events per call; default 1
	Workers   int     // concurrent callers; default 8
	Transport Transport
	// Gen makes event seq of a cluster.
	Gen func(cluster string, seq int64) *datamodels.HealthEvent
}

// LoadResult is what a Load delivered.
type LoadResult struct {
	Target float64 // events/s asked for (0: unpaced)
	Sent   int64   // events acknowledged by the gateway
	Failed int64   // events in calls that failed
	// PushedBack counts calls the gateway refused for backpressure (429,
	// RESOURCE_EXHAUSTED), sent again after a backoff.
	PushedBack int64
	Elapsed    time.Duration
	Delivered  float64       // Sent / Elapsed
	MaxBehind  time.Duration // the furthest a worker fell behind its schedule
	// Due is how many events the schedule had called for when the load was
	// stopped, less each worker's last batch (0: unpaced): a worker sends
	// each batch once its events have accrued, so a short run is not judged
	// by a rate it could not reach, nor by a batch that came due while the
	// stop was being called (its worker may not have woken yet).
	Due int64
	// Window is the span Running.Window marked (0: none), the one a
	// scenario measures in; the load is verified over it too, since a
	// worker that stalled there and caught up later by bursting still
	// delivers its whole-run schedule.
	Window       time.Duration
	WindowSent   int64         // events in calls started within Window and acknowledged
	WindowDue    int64         // events the schedule called for within Window, less each worker's last batch
	WindowBehind time.Duration // the furthest a worker fell behind its schedule within Window
}

// Verified reports an error when the load delivered less than share of
// its target rate, over the whole run or within its Window, or any call
// failed.
func (r LoadResult) Verified(share float64) error {
	if r.Failed > 0 {
		return fmt.Errorf("load: %d events in failed calls", r.Failed)
	}
	if r.Target > 0 && r.Window > 0 && float64(r.WindowSent) < share*float64(r.WindowDue) {
		return fmt.Errorf("load: a worker fell %s behind its schedule within the %s the faults were sent in: %d events sent of %d due there (%.0f%%)",
			r.WindowBehind.Round(100*time.Millisecond), r.Window.Round(100*time.Millisecond), r.WindowSent, r.WindowDue, pct(r.WindowSent, r.WindowDue))
	}
	if r.Target > 0 && float64(r.Sent) < share*float64(r.Due) {
		return fmt.Errorf("load: delivered %.0f events/s of the %.0f/s asked: %d events acknowledged, %.0f%% of the %d the schedule called for (%s behind schedule at worst)",
			r.Delivered, r.Target, r.Sent, pct(r.Sent, r.Due), r.Due, r.MaxBehind.Round(time.Millisecond))
	}
	return nil
}

// Verdict is Verified(share) for a figure: "background verified over
// ..." or "background NOT verified: <why>".
func (r LoadResult) Verdict(share float64) string {
	if err := r.Verified(share); err != nil {
		return "background NOT verified: " + strings.TrimPrefix(err.Error(), "load: ")
	}
	if r.Target <= 0 {
		return "background unpaced: nothing to verify"
	}
	if r.Window <= 0 {
		return fmt.Sprintf("background verified over the run: %d events sent of %d due (%.0f%%)", r.Sent, r.Due, pct(r.Sent, r.Due))
	}
	return fmt.Sprintf("background verified over the %s the faults were sent in: %d events sent of %d due (%.0f%%), a worker at worst %s behind",
		r.Window.Round(100*time.Millisecond), r.WindowSent, r.WindowDue, pct(r.WindowSent, r.WindowDue), r.WindowBehind.Round(time.Millisecond))
}

// pct is a as a percentage of b (100 when b is 0: nothing was due).
func pct(a, b int64) float64 {
	if b == 0 {
		return 100
	}
	return 100 * float64(a) / float64(b)
}

// windowDue is how many events a schedule that began at start, per
// events/s per worker in batches of batch, called for in (from, to],
// less each worker's last batch (as LoadResult.Due).
func windowDue(start, from, to time.Time, per float64, batch, workers int) int64 {
	if per <= 0 {
		return 0
	}
	accrued := func(t time.Time) int64 { return int64(t.Sub(start).Seconds() * per / float64(batch)) }
	return int64(workers) * max(0, accrued(to)-accrued(from)-1) * int64(batch)
}

func (r LoadResult) String() string {
	target := "unpaced"
	if r.Target > 0 {
		target = fmt.Sprintf("target %.0f/s, %d due by the schedule, at worst %s behind it", r.Target, r.Due, r.MaxBehind.Round(time.Millisecond))
	}
	return fmt.Sprintf("%d events acknowledged in %s: %.0f events/s delivered (%s), %d failed, %d calls pushed back and resent",
		r.Sent, r.Elapsed.Round(time.Millisecond), r.Delivered, target, r.Failed, r.PushedBack)
}

// Running is a load that StartLoad started.
type Running struct {
	stop   func() LoadResult
	behind func(now time.Time) time.Duration
	window func() func()
}

// Window marks the start of the span a scenario measures in (its faults
// being sent); the func it returns marks the end. The result of Stop
// verifies the load over that span too (LoadResult.Window). Once per
// load.
func (r *Running) Window() (end func()) { return r.window() }

// Stop stops the load, waits for its workers and returns the result.
func (r *Running) Stop() LoadResult { return r.stop() }

// Behind is how far the furthest worker is behind its schedule now: how
// long ago its first batch not yet started came due (0: none is due).
func (r *Running) Behind() time.Duration { return r.behind(time.Now()) }

// StartLoad runs l until stopped (or n events are sent when n > 0).
func (e *Env) StartLoad(ctx context.Context, l Load, n int64) *Running {
	if l.Batch <= 0 {
		l.Batch = 1
	}
	if l.Workers <= 0 {
		l.Workers = 8
	}
	if l.Transport == "" {
		l.Transport = GRPC
	}
	// stopping ends the workers between calls: a call in progress
	// completes, so every event the gateway took is counted.
	stopping := make(chan struct{})
	var (
		seq, sent, failed, pushed atomic.Int64
		behind                    atomic.Int64
		wg                        sync.WaitGroup
		// the window: open while marked; its sends and lag counted apart
		winOpen            atomic.Bool
		winSent, winBehind atomic.Int64
		winFrom, winTo     time.Time // set before winOpen is, read after the workers end
	)
	start := time.Now()
	per := l.Rate / float64(l.Workers) // events/s per worker
	dueAt := func(k int) time.Time {   // batch k is due once its events have accrued
		return start.Add(time.Duration(float64((k+1)*l.Batch) / per * float64(time.Second)))
	}
	next := make([]atomic.Int64, l.Workers)        // each worker's first batch not yet started
	lag := func(now time.Time) (d time.Duration) { // how far the furthest worker is behind
		if per <= 0 {
			return 0 // unpaced
		}
		for w := range next {
			d = max(d, now.Sub(dueAt(int(next[w].Load()))))
		}
		return d
	}
	for w := range l.Workers {
		cluster := e.Clusters[w%len(e.Clusters)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ctx.Err() == nil; k++ {
				select {
				case <-stopping:
					return
				default:
				}
				var late time.Duration
				if per > 0 {
					if d := time.Until(dueAt(k)); d > 0 {
						select {
						case <-stopping:
							return
						case <-time.After(d):
						}
					} else {
						late = -d
						storeMax(&behind, late)
					}
				}
				inWin := winOpen.Load()
				if inWin {
					storeMax(&winBehind, late)
				}
				next[w].Store(int64(k + 1))
				first := seq.Add(int64(l.Batch)) - int64(l.Batch)
				if n > 0 && first >= n {
					return
				}
				cnt := int64(l.Batch)
				if n > 0 && first+cnt > n {
					cnt = n - first
				}
				evs := make([]*datamodels.HealthEvent, cnt)
				for j := range evs {
					evs[j] = l.Gen(cluster, first+int64(j))
				}
				_, pb, err := e.sendAccepted(ctx, l.Transport, cluster, evs, agentResend)
				pushed.Add(pb)
				switch {
				case err == nil:
					sent.Add(cnt)
					if inWin {
						winSent.Add(cnt)
					}
				case ctx.Err() == nil: // a call cut short by the end of the run is not a failure
					failed.Add(cnt)
					e.TB.Logf("fleet: load: %v", err)
				}
			}
		}()
	}
	var once sync.Once
	var res LoadResult
	stop := func() LoadResult {
		once.Do(func() {
			if n > 0 {
				wg.Wait()
			}
			var due int64
			if per > 0 {
				now := time.Now()
				due = int64(l.Workers) * max(0, int64(now.Sub(start).Seconds()*per/float64(l.Batch))-1) * int64(l.Batch)
				if n > 0 {
					due = min(due, n)
				}
				// a worker that has not started a batch already due is behind by now
				if d := lag(now); d > time.Duration(behind.Load()) {
					behind.Store(int64(d))
				}
			}
			close(stopping)
			wg.Wait()
			el := time.Since(start)
			res = LoadResult{Target: l.Rate, Sent: sent.Load(), Failed: failed.Load(), PushedBack: pushed.Load(), Elapsed: el, MaxBehind: time.Duration(behind.Load()), Due: due}
			res.Delivered = float64(res.Sent) / el.Seconds()
			if !winFrom.IsZero() {
				if winTo.IsZero() { // stopped with the window open: it ends at the stop
					winTo = time.Now()
					storeMax(&winBehind, lag(winTo))
				}
				res.Window, res.WindowSent, res.WindowBehind = winTo.Sub(winFrom), winSent.Load(), time.Duration(winBehind.Load())
				res.WindowDue = windowDue(start, winFrom, winTo, per, l.Batch, l.Workers)
			}
		})
		return res
	}
	window := func() func() {
		winFrom = time.Now()
		winOpen.Store(true)
		return func() {
			now := time.Now()
			winOpen.Store(false)
			winTo = now
			// a worker that has not started a batch due within the window
			storeMax(&winBehind, lag(now))
		}
	}
	return &Running{stop: stop, behind: lag, window: window}
}

// storeMax stores d in a if it is more than a holds.
func storeMax(a *atomic.Int64, d time.Duration) {
	for {
		old := a.Load()
		if int64(d) <= old || a.CompareAndSwap(old, int64(d)) {
			return
		}
	}
}

// BackgroundMix is a fleet's everyday stream over nodes [from, from+n):
// half healthy all-clears (GPU thermal, ports up), link_downed counter
// increases, non-fatal Xids 13 and 31, and — one in fatalEvery (0: never)
// — a fatal Xid 79 on one of the first fatalNodes nodes of the range.
func BackgroundMix(from, n, fatalEvery, fatalNodes int) func(cluster string, seq int64) *datamodels.HealthEvent {
	return func(_ string, seq int64) *datamodels.HealthEvent {
		i := int(seq)
		node := NodeName(from + (i*7919)%n)
		if fatalEvery > 0 && i%fatalEvery == fatalEvery-1 {
			return fleetsim.Xid(NodeName(from+(i/fatalEvery)%max(1, fatalNodes)), i%8, 79)
		}
		switch i % 10 {
		case 0, 1, 2:
			return fleetsim.Healthy(node, i%8)
		case 3, 4:
			return fleetsim.PortUp(node, i%8)
		case 5, 6:
			return fleetsim.LinkDowned(node, i%8)
		case 7, 8:
			return fleetsim.Xid(node, i%8, 31)
		default:
			return fleetsim.Xid(node, i%8, 13)
		}
	}
}

// History calls the history API (GET /v1/events?node=, the cluster's
// operator token) and returns the events on its first page.
func (e *Env) History(ctx context.Context, cluster, node string) (int, error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodGet, e.GW.URL()+"/v1/events?node="+node, nil)
	if err != nil {
		return 0, err
	}
	hr.Header.Set("Authorization", "Bearer "+e.GW.OperatorToken(cluster))
	resp, err := restClient.Do(hr)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /v1/events: %s: %s", resp.Status, b)
	}
	var out faultlinev1.ListEventsResponse
	if err := protojson.Unmarshal(b, &out); err != nil {
		return 0, fmt.Errorf("GET /v1/events: %w", err)
	}
	return len(out.Events), nil
}

// backpressure reports whether err is the gateway asking the client to
// slow down (gRPC RESOURCE_EXHAUSTED or UNAVAILABLE, HTTP 429 or 503).
func backpressure(err error) bool {
	switch status.Code(err) {
	case codes.ResourceExhausted, codes.Unavailable:
		return true
	}
	var he *httpError
	return errors.As(err, &he) && (he.code == http.StatusTooManyRequests || he.code == http.StatusServiceUnavailable)
}

// resend is how a sender answers the gateway's pushback: it waits
// wait(try) and sends the same events again (same ids: stored once), at
// most tries times.
type resend struct {
	tries int
	wait  func(try int) time.Duration
}

// agentResend waits 5 ms longer after each pushback, up to 100 of them
// (≈ 25 s in all), as the agents' senders do.
var agentResend = resend{tries: 100, wait: func(try int) time.Duration { return time.Duration(5+5*try) * time.Millisecond }}

// sendAccepted sends evs until the gateway accepts them, sending again
// after each pushback as r says. It returns when the accepted call was
// sent, how many calls were pushed back, and the last call's error when
// none was accepted (any other error, r's tries spent or ctx ended). The
// first pushback of the run is logged.
func (e *Env) sendAccepted(ctx context.Context, t Transport, cluster string, evs []*datamodels.HealthEvent, r resend) (at time.Time, pushbacks int64, err error) {
	for try := 0; ; try++ {
		at = time.Now()
		if err = e.Send(ctx, t, cluster, evs); err == nil {
			return at, pushbacks, nil
		}
		if !backpressure(err) || try >= r.tries || ctx.Err() != nil {
			return at, pushbacks, err
		}
		e.firstPushback.Do(func() { e.TB.Logf("fleet: first pushback: %v", err) })
		pushbacks++
		time.Sleep(r.wait(try))
	}
}

type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

// Blast sends, for every cluster at once, the events of perNode for each
// of its nodes [0, nodes) — every (cluster, node) exactly once — in
// batches of batch from workers callers per cluster, as fast as the
// gateway takes them (backpressure is retried). It returns the result.
func (e *Env) Blast(ctx context.Context, t Transport, nodes, batch, workers int, perNode func(node string) *datamodels.HealthEvent) LoadResult {
	var sent, failed, pushed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for _, c := range e.Clusters {
		next := atomic.Int64{}
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					first := int(next.Add(int64(batch))) - batch
					if first >= nodes {
						return
					}
					evs := make([]*datamodels.HealthEvent, 0, batch)
					for i := first; i < min(nodes, first+batch); i++ {
						evs = append(evs, perNode(NodeName(i)))
					}
					_, pb, err := e.sendAccepted(ctx, t, c, evs, agentResend)
					pushed.Add(pb)
					if err != nil {
						failed.Add(int64(len(evs)))
						e.TB.Logf("fleet: blast: %v", err)
						continue
					}
					sent.Add(int64(len(evs)))
				}
			}()
		}
	}
	wg.Wait()
	el := time.Since(start)
	return LoadResult{Sent: sent.Load(), Failed: failed.Load(), PushedBack: pushed.Load(), Elapsed: el, Delivered: float64(sent.Load()) / el.Seconds()}
}
