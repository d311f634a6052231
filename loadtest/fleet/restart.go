package fleet

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"golang.org/x/sync/errgroup"

	"github.com/faultline/faultline/internal/fleetsim"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// BrokerRestartResult is what BrokerRestart measured.
type BrokerRestartResult struct {
	Stopping, Down, Starting time.Duration // SIGTERM to exit; exit to start; start to ready
	// FromReady is each cordoned fault's time from the broker being ready
	// again to its cordon; FromSend from the send the gateway accepted.
	FromReady, FromSend []time.Duration
	Faults              int
	OutageBackground
}

// OutageBackground is the background of an outage scenario, and what the
// store wrote of it.
type OutageBackground struct {
	Background LoadResult
	// CaughtUp is how long after the faults were cordoned the background
	// was back on its schedule (catchUpMax: not by then).
	CaughtUp time.Duration
	// Stored and Rows are the background's distinct event ids and rows
	// in ClickHouse (with the store role).
	Stored, Rows uint64
}

// catchUpMax bounds how long the background of an outage scenario goes on
// after the faults are cordoned, for its workers to get back on their
// schedule, and caughtUp is how close to it they must be.
const (
	catchUpMax = 30 * time.Second
	caughtUp   = 500 * time.Millisecond
)

// endOutage waits until the first faults nodes of cluster are cordoned,
// lets the background catch up, stops it and, with the store role, counts
// what ClickHouse holds of it.
func (e *Env) endOutage(ctx context.Context, cluster string, faults int, bg *Running) OutageBackground {
	e.waitCordoned(ctx, cluster, faults)
	// The background's calls made while the broker was away are answered
	// after it (or refused and sent again), far behind their schedule; its
	// workers catch up one call at a time — on a loaded machine, seconds.
	// It is stopped once they did, so that the delivered rate says whether
	// they did rather than how long they were given.
	start := time.Now()
	waitFor(ctx, catchUpMax, func() bool { return bg.Behind() <= caughtUp })
	out := OutageBackground{CaughtUp: time.Since(start), Background: bg.Stop()}
	if e.storing() {
		out.Stored, out.Rows = e.storedMarked(ctx, backgroundMarker, out.Background.Sent)
	}
	return out
}

// faultResend sends a fault again every 50 ms while the gateway pushes
// back, up to 100 times.
var faultResend = resend{tries: 100, wait: func(int) time.Duration { return 50 * time.Millisecond }}

// sendFault sends node i's fatal event (an Xid 79) through the gateway,
// again while it pushes back (faultResend), as an agent does, and adds
// the pushbacks to pushbacks.
func (e *Env) sendFault(ctx context.Context, cluster string, i int, pushbacks *atomic.Int64) error {
	ev := []*datamodels.HealthEvent{fleetsim.Xid(NodeName(i), i%8, 79)}
	_, n, err := e.sendAccepted(ctx, GRPC, cluster, ev, faultResend)
	pushbacks.Add(n)
	if err != nil {
		return fmt.Errorf("send fault %d: %w", i, err)
	}
	return nil
}

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
	bg, err := faultBackground(ctx, e, p, "broker-restart")
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
			bg.Stop()
			return res, fmt.Errorf("send fault %d after the restart: %w", i, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	res.OutageBackground = e.endOutage(ctx, cluster, p.Faults, bg)
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
	cordoned := len(res.FromReady)
	r.Figure("broker-restart: %d of %d faults sent after the broker was ready cordoned; ready->first fault's cordon %s; ready->cordon %s; send->cordon %s",
		cordoned, res.Faults, first.Round(time.Millisecond), spread(res.FromReady), spread(res.FromSend))
	checkOutage(r, e, p, "broker-restart", cordoned, res.Faults, res.OutageBackground)
	return nil
}

// checkOutage checks a run of BrokerRestart or BrokerFailover: every
// fault cordoned, no node twice, the background delivered once it caught
// up, and with the store role every acknowledged background event stored.
func checkOutage(r *Report, e *Env, p Params, scenario string, cordonedFaults, faults int, o OutageBackground) {
	bg, stored, rows := o.Background, o.Stored, o.Rows
	cordoned, twice := e.Cordons.Count()
	r.Check(cordonedFaults == faults, "only %d of %d faults cordoned within 60s of their send", cordonedFaults, faults)
	r.Check(twice == 0, "%d of %d cordoned nodes cordoned twice", twice, cordoned)
	r.Figure("%s: the background back on its schedule %s after the faults were cordoned", scenario, o.CaughtUp.Round(time.Millisecond))
	// The background was stopped once at most caughtUp behind its
	// schedule: the events due in that last stretch may be outstanding
	// (25 of the smoke run's ~340 at 50/s — past 5%, it failed runs that
	// had caught up).
	share := p.loadShare()
	if bg.Due > 0 {
		share = min(share, 1-bg.Target*caughtUp.Seconds()/float64(bg.Due))
	}
	r.Check(bg.Verified(share) == nil, "background, %s after the faults: %v", o.CaughtUp.Round(time.Millisecond), bg.Verified(share))
	if e.storing() {
		// At least once: events of a call that failed at the run's end
		// may be stored without being counted as acknowledged.
		r.Figure("%s zero loss: %d distinct background event ids in ClickHouse (%d rows before merges) for %d acknowledged",
			scenario, stored, rows, bg.Sent)
		r.Check(stored >= uint64(bg.Sent), "stored %d distinct background ids, acknowledged %d: %d lost", stored, bg.Sent, bg.Sent-int64(stored))
	}
}

// BrokerFailoverResult is what BrokerFailover measured.
type BrokerFailoverResult struct {
	Victim int32 // node id of the killed broker
	// Led is how many of the events topic's partitions the victim led
	// when it was killed, of Partitions.
	Led, Partitions int
	// Moved is the time from the kill until no partition of the events
	// topic was led by the victim (0: not seen within a minute).
	Moved time.Duration
	// Latencies are each cordoned fault's time from its first send to its
	// cordon on a watch, in the order sent; Sent each fault's first send
	// after the kill.
	Latencies, Sent []time.Duration
	Faults          int
	Pushbacks       int64 // the faults' calls pushed back and sent again
	OutageBackground
}

// BrokerFailover runs p.Rate events/s of mixed background against a
// cluster of brokers (Options.Brokers), kills with SIGKILL the broker
// that coordinates the quarantine role's consumer group — the worst one
// to lose for fault→cordon: the role must find a new coordinator, and
// the broker leads about a third of the events topic's partitions — and
// from the kill on sends p.Faults fatal events spread over p.Duration,
// each for its own node and sent again while pushed back, as an agent
// does. Each fault's time runs from its first send to its cordon seen on
// a watch. With the store role, every background event the gateway
// acknowledged must reach ClickHouse. The killed broker stays down.
func BrokerFailover(ctx context.Context, e *Env, p Params) (BrokerFailoverResult, error) {
	if e.Cluster == nil {
		return BrokerFailoverResult{}, fmt.Errorf("broker-failover needs a cluster of brokers (Options.Brokers)")
	}
	adm := kadm.NewClient(e.KafkaClient())
	bg, err := faultBackground(ctx, e, p, "broker-failover")
	if err != nil {
		return BrokerFailoverResult{}, err
	}
	time.Sleep(3 * time.Second) // the background flows, the group settled
	res := BrokerFailoverResult{Faults: p.Faults}
	co := adm.FindGroupCoordinators(ctx, "faultline-quarantine")["faultline-quarantine"]
	if co.Err != nil {
		bg.Stop()
		return res, fmt.Errorf("find the quarantine group's coordinator: %w", co.Err)
	}
	res.Victim = co.NodeID
	led := func() (int, int, error) {
		td, err := adm.ListTopics(ctx, events.TopicEvents)
		if err != nil {
			return 0, 0, err
		}
		n := 0
		for _, pd := range td[events.TopicEvents].Partitions {
			if pd.Leader == res.Victim {
				n++
			}
		}
		return n, len(td[events.TopicEvents].Partitions), nil
	}
	if res.Led, res.Partitions, err = led(); err != nil {
		bg.Stop()
		return res, fmt.Errorf("list the events topic's leaders: %w", err)
	}

	cluster := e.Clusters[0]
	killed := time.Now()
	e.Cluster.Brokers[res.Victim-1].Kill()
	moved := make(chan time.Duration, 1)
	go func() {
		var d time.Duration
		waitFor(ctx, time.Minute, func() bool {
			n, _, err := led()
			if err == nil && n == 0 {
				d = time.Since(killed)
			}
			return d > 0
		})
		moved <- d
	}()
	sent := make([]time.Time, p.Faults)
	var pushbacks atomic.Int64
	var g errgroup.Group
	for i := range p.Faults {
		time.Sleep(time.Until(killed.Add(p.Duration * time.Duration(i) / time.Duration(p.Faults))))
		sent[i] = time.Now() // the clock starts at the first send
		g.Go(func() error {
			if err := e.sendFault(ctx, cluster, i, &pushbacks); err != nil {
				return fmt.Errorf("%s after the kill: %w", sent[i].Sub(killed).Round(time.Millisecond), err)
			}
			return nil
		})
	}
	err = g.Wait()
	res.Moved = <-moved
	if err != nil {
		bg.Stop()
		return res, err
	}
	res.Pushbacks = pushbacks.Load()
	res.OutageBackground = e.endOutage(ctx, cluster, p.Faults, bg)
	for i := range p.Faults {
		if t, ok := e.Cordons.At(cluster, NodeName(i)); ok {
			res.Latencies = append(res.Latencies, t.Sub(sent[i]))
			res.Sent = append(res.Sent, sent[i].Sub(killed))
		}
	}
	return res, nil
}

func runBrokerFailover(ctx context.Context, e *Env, p Params, r *Report) error {
	res, err := BrokerFailover(ctx, e, p)
	if err != nil {
		return err
	}
	r.Figure("broker-failover over %s: broker %d (the quarantine group's coordinator, leader of %d of %d events partitions) killed; its partitions led by others %s after the kill; background %s",
		e.Describe(), res.Victim, res.Led, res.Partitions, res.Moved.Round(time.Millisecond), res.Background)
	// A fault for a node whose partition the victim led waits for the
	// cluster to fence it and elect another leader; one sent after that
	// should not notice the loss.
	var before, after []time.Duration
	for i, l := range res.Latencies {
		if res.Moved == 0 || res.Sent[i] < res.Moved {
			before = append(before, l)
		} else {
			after = append(after, l)
		}
	}
	r.Figure("broker-failover: %d of %d faults sent over the %s after the kill cordoned, %d calls pushed back; send->cordon of the %d sent before the partitions moved %s, of the %d sent after %s",
		len(res.Latencies), res.Faults, p.Duration, res.Pushbacks, len(before), spread(before), len(after), spread(after))
	r.Check(res.Moved > 0, "the victim still led events partitions a minute after its kill")
	checkOutage(r, e, p, "broker-failover", len(res.Latencies), res.Faults, res.OutageBackground)
	return nil
}
