package fleet

import (
	"context"
	"fmt"
	"time"

	"github.com/faultline/faultline/internal/fleetsim"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// BrokerRestartResult is what BrokerRestart measured.
type BrokerRestartResult struct {
	Stopping, Down, Starting time.Duration // SIGTERM to exit; exit to start; start to ready
	Background               LoadResult
	// FromReady is each cordoned fault's time from the broker being ready
	// again to its cordon; FromSend from the send the gateway accepted.
	FromReady, FromSend []time.Duration
	Faults              int
	// Stored and Rows are the background's distinct event ids and rows
	// in ClickHouse (with the store role).
	Stored, Rows uint64
}

// catchUp is how long the background of BrokerRestart goes on after the
// faults are cordoned.
const catchUp = 5 * time.Second

// faultResend sends a fault again every 50 ms while the gateway pushes
// back, up to 100 times.
var faultResend = resend{tries: 100, wait: func(int) time.Duration { return 50 * time.Millisecond }}

// BrokerRestart runs p.Rate events/s of mixed background (BackgroundMix)
// sent as an agent does (a call refused while the broker is away is sent
// again), stops the broker gracefully, keeps it down for p.Duration and
// starts it again; once it is ready it sends p.Faults fatal events, one
// every 50ms, each for its own node and sent again until accepted. Each
// fault's time runs to its cordon seen on a watch of the apiserver: what
// it measures is how soon the gateway's producer and the quarantine
// role's consumer find the broker again. With the store role, every
// background event the gateway acknowledged must reach ClickHouse.
func BrokerRestart(ctx context.Context, e *Env, p Params) (BrokerRestartResult, error) {
	stop, err := faultBackground(ctx, e, p, "broker-restart")
	if err != nil {
		return BrokerRestartResult{}, err
	}
	time.Sleep(2 * time.Second) // the background flows
	res := BrokerRestartResult{Faults: p.Faults}
	t0 := time.Now()
	e.Kafka.Stop()
	t1 := time.Now()
	time.Sleep(p.Duration)
	t2 := time.Now()
	e.Kafka.Start()
	ready := time.Now()
	res.Stopping, res.Down, res.Starting = t1.Sub(t0), t2.Sub(t1), ready.Sub(t2)

	cluster := e.Clusters[0]
	sent := make([]time.Time, p.Faults)
	for i := range p.Faults {
		ev := []*datamodels.HealthEvent{fleetsim.Xid(NodeName(i), i%8, 79)}
		if sent[i], _, err = e.sendAccepted(ctx, GRPC, cluster, ev, faultResend); err != nil {
			stop()
			return res, fmt.Errorf("send fault %d after the restart: %w", i, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.waitCordoned(ctx, cluster, p.Faults)
	// The background's calls made while the broker was away are answered
	// after it (or refused and sent again), far behind their schedule; its
	// workers catch up one call at a time. catchUp lets them, so that the
	// delivered rate says whether they did.
	time.Sleep(catchUp)
	res.Background = stop()
	if e.storing() {
		res.Stored, res.Rows = e.storedMarked(ctx, backgroundMarker, res.Background.Sent)
	}
	res.FromReady = e.cordonedAfter(cluster, p.Faults, func(int) time.Time { return ready })
	res.FromSend = e.cordonedAfter(cluster, p.Faults, func(i int) time.Time { return sent[i] })
	return res, nil
}

func runBrokerRestart(ctx context.Context, e *Env, p Params, r *Report) error {
	res, err := BrokerRestart(ctx, e, p)
	if err != nil {
		return err
	}
	r.Figure("broker-restart over %s: broker stopped in %s, down %s, ready %s after its start; background %s",
		e.Describe(), res.Stopping.Round(time.Millisecond), res.Down.Round(time.Millisecond), res.Starting.Round(time.Millisecond), res.Background)
	// The first fault goes the moment the broker is ready: its cordon is
	// when the path was whole again. The later ones, 50 ms apart, add
	// their place in the queue to ready->cordon, not to send->cordon.
	var first time.Duration
	if len(res.FromReady) > 0 {
		first = res.FromReady[0]
	}
	rp50, rp99, rmx := percentiles(res.FromReady)
	sp50, sp99, smx := percentiles(res.FromSend)
	r.Figure("broker-restart: %d of %d faults sent after the broker was ready cordoned; ready->first fault's cordon %s; ready->cordon p50 %s p99 %s max %s; send->cordon p50 %s p99 %s max %s",
		len(res.FromReady), res.Faults, first.Round(time.Millisecond), rp50.Round(time.Millisecond), rp99.Round(time.Millisecond), rmx.Round(time.Millisecond),
		sp50.Round(time.Millisecond), sp99.Round(time.Millisecond), smx.Round(time.Millisecond))
	cordoned, twice := e.Cordons.Count()
	r.Check(len(res.FromReady) == res.Faults, "only %d of %d faults cordoned within 60s of their send", len(res.FromReady), res.Faults)
	r.Check(twice == 0, "%d of %d cordoned nodes cordoned twice", twice, cordoned)
	r.Check(res.Background.Verified(0.95) == nil, "background, %s after the faults: %v", catchUp, res.Background.Verified(0.95))
	if e.storing() {
		// At least once: events of a call that failed at the run's end
		// may be stored without being counted as acknowledged.
		r.Figure("broker-restart zero loss: %d distinct background event ids in ClickHouse (%d rows before merges) for %d acknowledged",
			res.Stored, res.Rows, res.Background.Sent)
		r.Check(res.Stored >= uint64(res.Background.Sent), "stored %d distinct background ids, acknowledged %d: %d lost", res.Stored, res.Background.Sent, res.Background.Sent-int64(res.Stored))
	}
	return nil
}
