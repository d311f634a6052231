package fleet

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"golang.org/x/sync/errgroup"

	"github.com/faultline/faultline/internal/fleetsim"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// rollRoles are the roles broker-roll runs: a fault's whole path, from
// the stored event to the RebootNode.
const rollRoles = "store,quarantine,drain,remediate"

// rollFaultEvery is how often broker-roll sends a fault while it rolls.
const rollFaultEvery = 500 * time.Millisecond

// BrokerRollStep is one broker's restart in a roll.
type BrokerRollStep struct {
	Broker int32
	At     time.Duration // the SIGTERM, from the roll's start
	// Stopping is SIGTERM to exit (the broker's controlled shutdown hands
	// its partitions' leadership over first); Starting the start to the
	// broker serving metadata that lists it; InSync from then until every
	// partition of every topic has all its replicas in sync again.
	Stopping, Starting, InSync time.Duration
}

// BrokerRollResult is what BrokerRoll measured.
type BrokerRollResult struct {
	Steps []BrokerRollStep
	Roll  time.Duration // the first SIGTERM to the last broker back in every ISR
	// Faults are the faults sent, one every rollFaultEvery, the first
	// Baseline of them before the roll (what the path takes without it),
	// the others from the roll's start until its end (at most
	// Params.Faults in all), in the order sent.
	Faults    []RollFault
	Baseline  int
	Pushbacks int64 // the faults' calls pushed back and sent again
	// Drained are the faults' nodes with a drain/succeeded action;
	// DrainedTwice those with more than one drain/in_progress id (a drain
	// started twice; a resumed drain says its start again with its id);
	// PodsLeft the faults' pods still on the apiserver.
	// (The background's fatal nodes are left out: each of their repeated
	// faults is a new quarantine/applied, and a new drain by design.)
	Drained, DrainedTwice, PodsLeft int
	// Cordoned and Rebooted are the faults' nodes seen cordoned and with
	// a RebootNode; RebootedTwice the nodes with more than one RebootNode.
	Cordoned, Rebooted, RebootedTwice int
	// CordonedAll and RebootedAll count every node of the cluster, the
	// background's included (its fatal nodes; with the correlate role
	// and the breaker off, the nodes its verdicts quarantine).
	CordonedAll, RebootedAll int
	// With the correlate role, each fault comes with a pair of Xid 31 on
	// GPU 0 of a node of its own beyond the fleet's, rollPairGap apart
	// (two batches, mostly: the window needs the first from ClickHouse or
	// correlate's memory of unstored records). Judged are those nodes with
	// a verdict of correlateRule on the events topic, JudgedTwice those
	// with two verdict ids.
	Judging             bool
	Judged, JudgedTwice int
	OutageBackground
}

// RollFault is one fault of BrokerRoll: its first send, from the roll's
// start (negative before it), and the time from there to each step of its
// path (0: not seen): its cordon and its RebootNode seen on watches of the
// apiserver, its drain's start and end seen on the actions topic.
type RollFault struct {
	Sent                                       time.Duration
	ToCordon, ToDrain, ToDrained, ToRebootNode time.Duration
	// ToVerdict: from the first send of its pair's second Xid 31
	// (pushbacks included) to the verdict (with the correlate role).
	ToVerdict time.Duration
}

// rollPairGap is the time between a pair's two Xid 31.
const rollPairGap = 250 * time.Millisecond

// sendPair sends the two Xid 31 of fault i's pair (node pairNode), each
// with an id of its own and sent again while pushed back, and returns
// when the second was first sent: before its first try, pushbacks
// included, as the faults' clock starts at their first send.
func (e *Env) sendPair(ctx context.Context, cluster, pairNode string, i int, pushbacks *atomic.Int64) (time.Time, error) {
	var at time.Time
	for k := range 2 {
		if k > 0 {
			time.Sleep(rollPairGap)
		}
		ev := fleetsim.Xid(pairNode, 0, 31)
		ev.Id = fmt.Sprintf("broker-roll-pair-%d-%d", i, k)
		at = time.Now() // not sendAccepted's: that is the accepted try's
		_, n, err := e.sendAccepted(ctx, GRPC, cluster, []*datamodels.HealthEvent{ev}, faultResend)
		pushbacks.Add(n)
		if err != nil {
			return at, fmt.Errorf("send pair %d's Xid 31 #%d: %w", i, k+1, err)
		}
	}
	return at, nil
}

// BrokerRoll restarts every broker of a cluster of brokers
// (Options.Brokers) in turn, as an upgrade or a configuration change
// does: SIGTERM, start again, and on to the next once every partition has
// all its replicas in sync. Under it: p.Rate events/s of mixed background
// sent as agents send, and a fatal event every rollFaultEvery, each for
// its own node with DrainPodsPerNode pods and sent again while pushed
// back, through the whole path (rollRoles) — the first few before the
// roll, the rest until it ends. Each node must be cordoned once, drained
// once (every pod gone) and get one RebootNode, and every background
// event the gateway acknowledged must reach ClickHouse. With the correlate
// role each fault comes with a pair of Xid 31 (RollFault.ToVerdict): each
// pair's node must be judged once.
func BrokerRoll(ctx context.Context, e *Env, p Params) (BrokerRollResult, error) {
	res := BrokerRollResult{Baseline: max(1, min(10, p.Faults/2))}
	if e.Cluster == nil {
		return res, fmt.Errorf("broker-roll needs a cluster of brokers (Options.Brokers)")
	}
	if p.Faults < 2 {
		return res, fmt.Errorf("broker-roll needs at least 2 faults, one before the roll and one during it")
	}
	cluster := e.Clusters[0]
	k := e.Kubes[cluster]
	k.ApplyCRDs(e.TB, janitorCRDs())
	reboots, err := WatchResources(ctx, e.TB, k, RebootNodes)
	if err != nil {
		return res, err
	}
	if err := createDrainNamespace(ctx, k.Client()); err != nil {
		return res, err
	}
	WatchPods(ctx, e.TB, k, drainNamespace, true)
	if err := createPods(ctx, k.Client(), nodeNames(0, p.Faults)); err != nil {
		return res, err
	}
	adm := kadm.NewClient(e.KafkaClient())
	var judged *verdicts
	if res.Judging = strings.Contains(e.Opts.Roles, "correlate") || e.Opts.Roles == "all"; res.Judging {
		judged = e.followVerdicts(ctx)
	}
	pairNode := func(i int) string { return NodeName(p.Nodes + i) } // beyond the background's nodes
	bg, err := faultBackground(ctx, e, p, "broker-roll")
	if err != nil {
		return res, err
	}
	time.Sleep(3 * time.Second) // the background flows, the groups settled

	// The faults: sent from this goroutine, each call in its own.
	sent := make([]time.Time, 0, p.Faults)
	pairSent := make([]time.Time, p.Faults) // the pair's second send, by fault
	var pushbacks atomic.Int64
	var g errgroup.Group
	baseline, rolled, faults := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(faults)
		tick := time.NewTicker(rollFaultEvery)
		defer tick.Stop()
		for i := range p.Faults {
			at := time.Now() // the clock starts at the first send
			sent = append(sent, at)
			g.Go(func() error { return e.sendFault(ctx, cluster, i, &pushbacks) })
			if judged != nil {
				g.Go(func() (err error) {
					pairSent[i], err = e.sendPair(ctx, cluster, pairNode(i), i, &pushbacks)
					return err
				})
			}
			if i == res.Baseline-1 {
				close(baseline)
			}
			select {
			case <-tick.C:
			case <-rolled:
				return
			}
		}
	}()
	endFaults := func() error {
		close(rolled)
		<-faults
		return g.Wait()
	}
	<-baseline
	began := time.Now()
	for i, b := range e.Cluster.Brokers {
		step := BrokerRollStep{Broker: int32(i + 1)} // node ids 1..n in order
		t0 := time.Now()
		b.Stop()
		t1 := time.Now()
		b.Start()
		t2 := time.Now()
		if !waitFor(ctx, 2*time.Minute, func() bool { return inSync(ctx, adm) }) {
			_ = endFaults()
			bg.Stop()
			return res, fmt.Errorf("broker %d: replicas not in sync 2m after its restart", step.Broker)
		}
		step.At, step.Stopping, step.Starting, step.InSync = t0.Sub(began), t1.Sub(t0), t2.Sub(t1), time.Since(t2)
		res.Steps = append(res.Steps, step)
	}
	res.Roll = time.Since(began)
	err = endFaults()
	res.Pushbacks = pushbacks.Load()
	if err != nil {
		bg.Stop()
		return res, err
	}
	n := len(sent)
	res.OutageBackground = e.endOutage(ctx, cluster, n, bg)
	waitFor(ctx, time.Minute, func() bool {
		for i := range n {
			if !reboots.Has(NodeName(i)) {
				return false
			}
		}
		return true
	})
	if judged != nil {
		waitFor(ctx, time.Minute, func() bool {
			for i := range n {
				if _, ok := judged.at(cluster, pairNode(i)); !ok {
					return false
				}
			}
			return true
		})
	}
	for i, at := range sent {
		node := NodeName(i)
		f := RollFault{Sent: at.Sub(began)}
		if t, ok := e.Cordons.At(cluster, node); ok {
			f.ToCordon = t.Sub(at)
			res.Cordoned++
		}
		if t, ok := reboots.At(node); ok {
			f.ToRebootNode = t.Sub(at)
			res.Rebooted++
		}
		if n, t := e.Actions.Of(events.KindDrain+"/"+events.OutcomeInProgress, cluster, node); n > 0 {
			f.ToDrain = t.Sub(at)
			if n > 1 {
				res.DrainedTwice++
			}
		}
		if n, t := e.Actions.Of(events.KindDrain+"/"+events.OutcomeSucceeded, cluster, node); n > 0 {
			f.ToDrained = t.Sub(at)
			res.Drained++
		}
		if judged != nil {
			if t, ok := judged.at(cluster, pairNode(i)); ok {
				f.ToVerdict = t.Sub(pairSent[i])
				res.Judged++
			}
			if judged.of(cluster, pairNode(i)) > 1 {
				res.JudgedTwice++
			}
		}
		res.Faults = append(res.Faults, f)
	}
	res.RebootedAll, res.RebootedTwice = reboots.Count()
	res.CordonedAll = e.Cordons.CountIn(cluster)
	if res.PodsLeft, err = podsLeft(ctx, k.Client(), 0, n); err != nil {
		return res, err
	}
	return res, nil
}

// inSync reports whether every partition of every topic, the internal
// ones included, has all its replicas in sync.
func inSync(ctx context.Context, adm *kadm.Client) bool {
	td, err := adm.ListTopicsWithInternal(ctx)
	if err != nil || td.Error() != nil {
		return false
	}
	for _, t := range td {
		for _, pd := range t.Partitions {
			if pd.Err != nil || len(pd.ISR) < len(pd.Replicas) {
				return false
			}
		}
	}
	return true
}

func runBrokerRoll(ctx context.Context, e *Env, p Params, r *Report) error {
	res, err := BrokerRoll(ctx, e, p)
	if err != nil {
		return err
	}
	r.Figure("broker-roll over %s: %d brokers restarted one after the other in %s; background %s",
		e.Describe(), len(res.Steps), res.Roll.Round(time.Millisecond), res.Background)
	for _, s := range res.Steps {
		r.Figure("broker-roll: broker %d stopped in %s, ready %s after its start, every replica in sync %s later",
			s.Broker, s.Stopping.Round(time.Millisecond), s.Starting.Round(time.Millisecond), s.InSync.Round(time.Millisecond))
	}
	r.Figure("broker-roll: %d faults sent one every %s, %d before the roll and %d during it; %d calls pushed back",
		len(res.Faults), rollFaultEvery, res.Baseline, len(res.Faults)-res.Baseline, res.Pushbacks)
	for _, part := range []struct {
		name   string
		faults []RollFault
	}{{"before the roll", res.Faults[:res.Baseline]}, {"during the roll", res.Faults[res.Baseline:]}} {
		step := func(d func(RollFault) time.Duration) string {
			var ds []time.Duration
			for _, f := range part.faults {
				if d(f) > 0 {
					ds = append(ds, d(f))
				}
			}
			return spread(ds)
		}
		verdict := ""
		if res.Judging {
			verdict = "; " + correlateRule + " verdict from its pair's second Xid 31 " + step(func(f RollFault) time.Duration { return f.ToVerdict })
		}
		r.Figure("broker-roll: the %d faults sent %s, from the send: cordon %s; drain started %s; drained %s; RebootNode %s%s",
			len(part.faults), part.name, step(func(f RollFault) time.Duration { return f.ToCordon }), step(func(f RollFault) time.Duration { return f.ToDrain }),
			step(func(f RollFault) time.Duration { return f.ToDrained }), step(func(f RollFault) time.Duration { return f.ToRebootNode }), verdict)
	}
	if slow, in, ok := res.slowestCordon(); ok {
		r.Figure("broker-roll: the slowest cordon during the roll, %s, was of a fault sent %s after broker %d's SIGTERM",
			slow.ToCordon.Round(time.Millisecond), (slow.Sent - in.At).Round(time.Millisecond), in.Broker)
	}
	n := len(res.Faults)
	r.Figure("broker-roll: %d of %d faults' nodes drained (%d pods left), %d with a RebootNode; %d drains started twice, %d nodes with two RebootNodes; in all (the background's nodes too) %d nodes cordoned, %d with a RebootNode",
		res.Drained, n, res.PodsLeft, res.Rebooted, res.DrainedTwice, res.RebootedTwice, res.CordonedAll, res.RebootedAll)
	r.Check(res.Drained == n && res.PodsLeft == 0, "%d of %d faults' nodes drained, %d of their pods left", res.Drained, n, res.PodsLeft)
	r.Check(res.Rebooted == n, "%d of %d faults' nodes got a RebootNode within a minute of the last cordon", res.Rebooted, n)
	r.Check(res.DrainedTwice == 0 && res.RebootedTwice == 0, "applied twice: %d drains started twice, %d nodes with two RebootNodes", res.DrainedTwice, res.RebootedTwice)
	if res.Judging {
		r.Figure("broker-roll: %d of %d pairs' nodes judged (%s), %d judged twice", res.Judged, n, correlateRule, res.JudgedTwice)
		r.Check(res.Judged == n && res.JudgedTwice == 0, "%d of %d pairs' nodes judged (%s) within a minute of the last cordon, %d judged twice", res.Judged, n, correlateRule, res.JudgedTwice)
	}
	checkOutage(r, e, p, "broker-roll", res.Cordoned, n, res.OutageBackground)
	return nil
}

// slowestCordon returns the fault sent during the roll slowest to be
// cordoned, and the step (the broker's restart) it was sent in.
func (res BrokerRollResult) slowestCordon() (slow RollFault, in BrokerRollStep, ok bool) {
	for _, f := range res.Faults[res.Baseline:] {
		if f.ToCordon > slow.ToCordon {
			slow, ok = f, true
		}
	}
	for _, s := range res.Steps {
		if s.At <= slow.Sent {
			in = s
		}
	}
	return slow, in, ok
}
