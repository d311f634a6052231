package fleet

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/remediate"
	"github.com/faultline/faultline/schemas/events"
)

// apiserverRoles are the roles apiserver-restart runs: a fault's path
// from its cordon to its RebootNode.
const apiserverRoles = "quarantine,drain,remediate"

// apiserverFaultEvery spaces apiserver-restart's faults, so that the kill
// finds them at different steps of their path.
const apiserverFaultEvery = 100 * time.Millisecond

// resumeBound is how soon after its apiserver is back every fault's path
// must reach its RebootNode. The gate's backoff reaches its 30 s cap
// within seconds of an outage; work that waited it out would resume 15–30 s
// after (its jitter): the bound tells the two apart.
const resumeBound = 10 * time.Second

// apiserverSteps are a fault's steps, as its actions say them on the
// actions topic.
var apiserverSteps = []struct{ name, kindOutcome string }{
	{"cordoned", events.KindQuarantine + "/" + events.OutcomeApplied},
	{"drain started", events.KindDrain + "/" + events.OutcomeInProgress},
	{"drained", events.KindDrain + "/" + events.OutcomeSucceeded},
	{"RebootNode", events.KindRemediate + "/" + events.OutcomeApplied},
}

// runAPIServerRestart sends Faults fatal events under Rate events/s of
// mixed background, one every apiserverFaultEvery, each for its own node
// with DrainPodsPerNode pods,
// and kills the cluster's apiserver (SIGKILL) once half of them have
// their drains started: the kill finds the faults at every step of their
// path (cordoned or not yet, draining, drained and waiting for their
// RebootNode). It stays down for Duration — long enough for the gate's
// backoff to reach its cap — and is started again. Every fault's path must
// then go on as soon as the apiserver answers: each node cordoned, drained
// and given its RebootNode once, within resumeBound of the apiserver being
// back; the figures are each step's time from then.
func runAPIServerRestart(ctx context.Context, e *Env, p Params, r *Report) error {
	cluster := e.Clusters[0]
	k := e.Kubes[cluster]
	faults := min(p.Faults, breakerShare(p.Nodes))
	k.ApplyCRDs(e.TB, janitorCRDs())
	if err := createDrainNamespace(ctx, k.Client()); err != nil {
		return err
	}
	WatchPods(ctx, e.TB, k, drainNamespace, true)
	if err := createPods(ctx, k.Client(), nodeNames(0, faults)); err != nil {
		return err
	}
	// seen returns when each fault's step (apiserverSteps[s]) seen on the
	// actions topic was produced, for those seen.
	seen := func(s int) []time.Time {
		var out []time.Time
		for i := range faults {
			if n, t := e.Actions.Produced(apiserverSteps[s].kindOutcome, cluster, NodeName(i)); n > 0 {
				out = append(out, t)
			}
		}
		return out
	}

	bg, err := faultBackground(ctx, e, p, "apiserver-restart")
	if err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // the background flows

	var pushbacks atomic.Int64
	var sends errgroup.Group
	sendsDone := make(chan struct{})
	first := time.Now()
	go func() {
		defer close(sendsDone)
		tick := time.NewTicker(apiserverFaultEvery)
		defer tick.Stop()
		for i := range faults {
			sends.Go(func() error { return e.sendFault(ctx, cluster, i, &pushbacks) })
			<-tick.C
		}
	}()
	last := len(apiserverSteps) - 1
	started := waitFor(ctx, time.Minute, func() bool { return len(seen(1)) >= max(1, faults/2) })
	k.Kill()
	killed := time.Now()
	<-sendsDone
	if err := sends.Wait(); err != nil {
		bg.Stop()
		return err
	}
	time.Sleep(p.Duration)
	restart := time.Now()
	k.Start()
	back := time.Now()
	done := waitFor(ctx, 2*time.Minute, func() bool { return len(seen(last)) >= faults })
	load := bg.Stop()
	rebooted, twice, err := rebootNodesOf(ctx, k, faults)
	if err != nil {
		return err
	}
	left, err := podsLeft(ctx, k.Client(), 0, faults)
	if err != nil {
		return err
	}

	// Each fault's step was produced before the kill, while the apiserver
	// was down or starting (decided before the kill, produced with a batch
	// that met the dead apiserver; or needing none) or after it was ready
	// (its time from then).
	type when struct { // one step's faults
		before, during int
		after          []time.Duration
	}
	steps := make([]when, len(apiserverSteps))
	for s := range apiserverSteps {
		for _, t := range seen(s) {
			switch {
			case t.Before(killed):
				steps[s].before++
			case t.Before(back):
				steps[s].during++
			default:
				steps[s].after = append(steps[s].after, t.Sub(back))
			}
		}
	}
	r.Figure("apiserver-restart over %s: %d faults sent one every %s; the apiserver killed %s after the first send, once %d drains had started; down %s, ready again %s after its start; background %s",
		e.Describe(), faults, apiserverFaultEvery, killed.Sub(first).Round(time.Millisecond), steps[1].before, p.Duration, back.Sub(restart).Round(time.Millisecond), load)
	for s, st := range apiserverSteps {
		w := steps[s]
		r.Figure("apiserver-restart: %s: %d before the kill, %d before it was ready again, %d after, from then %s", st.name, w.before, w.during, len(w.after), spread(w.after))
	}
	snap := e.Actions.Snapshot()
	r.Figure("apiserver-restart: %d nodes with a RebootNode (%d with two), %d of the faults' pods left, %d calls pushed back; in all (the background's fatal nodes too): quarantine/applied %d, drain/in_progress %d, drain/skipped %d (repeats a finished drain covered), remediate/applied %d, drain/failed %d, remediate/failed %d",
		rebooted, twice, left, pushbacks.Load(), snap[apiserverSteps[0].kindOutcome], snap[apiserverSteps[1].kindOutcome],
		snap[events.KindDrain+"/"+events.OutcomeSkipped], snap[apiserverSteps[3].kindOutcome], snap[events.KindDrain+"/"+events.OutcomeFailed], snap[events.KindRemediate+"/"+events.OutcomeFailed])
	r.Check(started, "%d of %d faults' drains started within a minute (before the kill)", steps[1].before, faults)
	r.Check(done, "%d of %d faults' nodes got a RebootNode within 2 minutes of the apiserver being back", len(seen(last)), faults)
	if after := steps[last].after; len(after) > 0 {
		_, _, slowest := percentiles(after)
		r.Check(slowest <= resumeBound, "the slowest fault's RebootNode came %s after the apiserver was back (bound %s: work waited out its backoff)", slowest.Round(time.Millisecond), resumeBound)
	}
	r.Check(left == 0, "%d of the faults' pods left", left)
	r.Check(load.Verified(0.95) == nil, "background: %v", load.Verified(0.95))
	// The faults' nodes only: each repeated fatal event of the
	// background's nodes is a new cordon and drain by design.
	twiceCordoned, twiceStarted := 0, 0
	for i := range faults {
		if n, _ := e.Actions.Produced(apiserverSteps[0].kindOutcome, cluster, NodeName(i)); n > 1 {
			twiceCordoned++
		}
		if n, _ := e.Actions.Produced(apiserverSteps[1].kindOutcome, cluster, NodeName(i)); n > 1 {
			twiceStarted++
		}
	}
	r.Check(twiceCordoned == 0 && twiceStarted == 0 && twice == 0 && rebooted == faults,
		"applied twice: %d nodes cordoned twice, %d drains started twice, %d nodes with two RebootNodes; %d of %d with one", twiceCordoned, twiceStarted, twice, rebooted, faults)
	return nil
}

// rebootNodesOf lists the RebootNodes on k and returns how many of nodes
// 0..n-1 have one, and how many more than one.
func rebootNodesOf(ctx context.Context, k *testenv.Kube, n int) (nodes, twice int, err error) {
	dyn, err := dynamic.NewForConfig(k.RESTConfig())
	if err != nil {
		return 0, 0, err
	}
	l, err := dyn.Resource(RebootNodes).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, fmt.Errorf("list rebootnodes: %w", err)
	}
	per := map[string]int{}
	for _, o := range l.Items {
		per[o.GetLabels()[remediate.LabelNode]]++
	}
	for _, node := range nodeNames(0, n) {
		if per[node] > 0 {
			nodes++
		}
		if per[node] > 1 {
			twice++
		}
	}
	return nodes, twice, nil
}
