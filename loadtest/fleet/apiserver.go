package fleet

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

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

// resumeBound is how soon after its apiserver is ready again (/readyz, what
// the roles' gate probes) every fault's path must reach its RebootNode —
// or after its node's pods are gone, for a node whose pods the kubelet
// was still finishing then (kubeletHeld).
// The gate's backoff reaches its 30 s cap within seconds of an outage; work
// that waited it out would resume 15–30 s after (its jitter): the bound
// tells the two apart. The figures count from the apiserver's first answer,
// which comes earlier (1.5–4 s here, more on a busy machine).
const resumeBound = 10 * time.Second

// apiserverSteps are a fault's steps, as its actions say them on the
// actions topic.
var apiserverSteps = []struct{ name, kindOutcome string }{
	{"cordoned", events.KindQuarantine + "/" + events.OutcomeApplied},
	{"drain started", events.KindDrain + "/" + events.OutcomeInProgress},
	{"drained", events.KindDrain + "/" + events.OutcomeSucceeded},
	{"RebootNode", events.KindRemediate + "/" + events.OutcomeApplied},
}

// runAPIServerRestart sends Faults fatal events to the first cluster under
// Rate events/s of mixed background (over every cluster), one every
// apiserverFaultEvery, each for its own node with DrainPodsPerNode pods,
// and kills that cluster's apiserver (SIGKILL) once half of them have
// their drains started: the kill finds the faults at every step of their
// path (cordoned or not yet, draining, drained and waiting for their
// RebootNode). The other clusters then get Faults each, which must reach
// their RebootNodes while the first is down. It stays down for Duration —
// long enough for the gate's backoff to reach its cap — and is started
// again. Every fault's path must then go on as soon as the apiserver is
// ready: each node cordoned, drained and given its RebootNode once, within
// resumeBound of that (or of its pods' end, kubeletHeld); the figures are
// each step's time from the apiserver's first answer.
func runAPIServerRestart(ctx context.Context, e *Env, p Params, r *Report) error {
	cluster := e.Clusters[0]
	k := e.Kubes[cluster]
	faults := min(p.Faults, breakerShare(p.Nodes))
	if err := e.faultPaths(ctx, faults); err != nil {
		return err
	}
	// produced returns when fault i's step (apiserverSteps[s]) on cluster
	// c was produced, if it was seen on the actions topic.
	produced := func(c string, s, i int) (time.Time, bool) {
		n, t := e.Actions.Produced(apiserverSteps[s].kindOutcome, c, NodeName(i))
		return t, n > 0
	}
	// seen returns when each of cluster's faults' step s was produced, for
	// those seen.
	seen := func(s int) []time.Time {
		var out []time.Time
		for i := range faults {
			if t, ok := produced(cluster, s, i); ok {
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
	first := time.Now()
	sends.Go(func() error {
		_, err := sendEach(ctx, e, []string{cluster}, faults, &pushbacks)
		return err
	})
	last := len(apiserverSteps) - 1
	started := waitFor(ctx, time.Minute, func() bool { return len(seen(1)) >= max(1, faults/2) })
	k.Kill()
	killed := time.Now()
	if err := sends.Wait(); err != nil {
		bg.Stop()
		return err
	}
	// The other clusters' faults, sent while the first is down: each path
	// must go to its end meanwhile (the roles' requeue topics are shared
	// by every cluster). The first stays down Duration, and longer until
	// they are through (at most a minute), so the check does not hang on
	// how busy the machine is.
	byStart := time.Now()
	bySent, err := sendEach(ctx, e, e.Clusters[1:], faults, &pushbacks)
	if err != nil {
		bg.Stop()
		return err
	}
	// rebootedBefore counts the other clusters' faults whose RebootNode
	// was produced before t.
	rebootedBefore := func(t time.Time) int {
		n := 0
		for c := range bySent {
			for i := range faults {
				if at, ok := produced(c, last, i); ok && at.Before(t) {
					n++
				}
			}
		}
		return n
	}
	others := len(bySent) * faults
	time.Sleep(p.Duration - time.Since(byStart))
	waitFor(ctx, time.Minute, func() bool { return rebootedBefore(time.Now().Add(time.Hour)) == others })
	restart := time.Now()
	answered := firstAnswer(ctx, k, NodeName(0))
	k.Start()
	ready := time.Now()
	back := <-answered
	held := kubeletHeld(ctx, k.Client(), nodeNames(0, faults))
	done := waitFor(ctx, 2*time.Minute, func() bool { return len(seen(last)) >= faults })
	gone := <-held
	load := bg.Stop()
	var rebooted, twice, left int
	for _, c := range e.Clusters {
		n, tw, err := rebootNodesOf(ctx, e.Kubes[c], faults)
		if err != nil {
			return err
		}
		l, err := podsLeft(ctx, e.Kubes[c].Client(), 0, faults)
		if err != nil {
			return err
		}
		rebooted, twice, left = rebooted+n, twice+tw, left+l
	}

	// Each fault's step was produced before the kill, while the apiserver
	// was down (decided before the kill, produced with a batch that met the
	// dead apiserver; or needing none) or after it answered again (its
	// time from then: a role's request may succeed from that moment, some
	// way ahead of /readyz).
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
	r.Figure("apiserver-restart over %s: %d faults sent one every %s; the apiserver killed %s after the first send, once %d drains had started; down %s, answering again %s after its start (ready %s); background %s",
		e.Describe(), faults, apiserverFaultEvery, killed.Sub(first).Round(time.Millisecond), steps[1].before, restart.Sub(killed).Round(time.Millisecond),
		back.Sub(restart).Round(time.Millisecond), ready.Sub(restart).Round(time.Millisecond), load)
	for s, st := range apiserverSteps {
		w := steps[s]
		r.Figure("apiserver-restart: %s: %d before the kill, %d while it was down, %d after it answered, from then %s", st.name, w.before, w.during, len(w.after), spread(w.after))
	}
	snap := e.Actions.Snapshot()
	r.Figure("apiserver-restart: %d nodes with a RebootNode (%d with two), %d of the faults' pods left, %d calls pushed back; in all (the background's fatal nodes too; records, distinct ids): quarantine/applied %d (%d), drain/in_progress %d (%d), drain/skipped %d (repeats a finished drain covered), remediate/applied %d, drain/failed %d, remediate/failed %d",
		rebooted, twice, left, pushbacks.Load(), snap[apiserverSteps[0].kindOutcome], e.Actions.Distinct(apiserverSteps[0].kindOutcome),
		snap[apiserverSteps[1].kindOutcome], e.Actions.Distinct(apiserverSteps[1].kindOutcome),
		snap[events.KindDrain+"/"+events.OutcomeSkipped], snap[apiserverSteps[3].kindOutcome], snap[events.KindDrain+"/"+events.OutcomeFailed], snap[events.KindRemediate+"/"+events.OutcomeFailed])
	r.Check(started, "%d of %d faults' drains started within a minute (before the kill)", steps[1].before, faults)
	r.Check(done, "%d of %d faults' nodes got a RebootNode within 2 minutes of the apiserver answering again", len(seen(last)), faults)
	// Each fault's RebootNode from when its path could go on: the
	// apiserver ready, and its node's pods gone where a kubelet still had
	// to finish them.
	var slowest, goneAfter, rebootAfter []time.Duration
	for i := range faults {
		t, ok := produced(cluster, last, i)
		if !ok || t.Before(back) {
			continue
		}
		from := ready
		if g, ok := gone[NodeName(i)]; ok {
			goneAfter, rebootAfter = append(goneAfter, g.Sub(back)), append(rebootAfter, t.Sub(g))
			if g.After(from) {
				from = g
			}
		}
		slowest = append(slowest, t.Sub(from))
	}
	if len(gone) > 0 {
		r.Figure("apiserver-restart: %d of the faults' nodes had pods the apiserver took the eviction of before the kill, still terminating when it answered again (a kubelet finishes them once its pod watch is back: client-go's reflector backoff, up to 30 s, doubled by its jitter; the drain waits for them, as kubectl drain does): gone %s after it answered; those nodes' RebootNodes %s after their pods were gone",
			len(gone), spread(goneAfter), spread(rebootAfter))
	}
	if len(slowest) > 0 {
		_, _, mx := percentiles(slowest)
		r.Check(mx <= resumeBound, "the slowest fault's RebootNode came %s after the apiserver was ready (or, later, its node's terminating pods were gone; bound %s: work waited out its backoff)",
			mx.Round(time.Millisecond), resumeBound)
	}
	if len(e.Clusters) > 1 {
		for s, st := range apiserverSteps {
			var from []time.Duration
			for c, sent := range bySent {
				for i, t0 := range sent {
					if t, ok := produced(c, s, i); ok {
						from = append(from, t.Sub(t0))
					}
				}
			}
			r.Figure("apiserver-restart: the other %d cluster(s)' %d faults, sent while the first was down: %s %d, from the send %s", len(bySent), others, st.name, len(from), spread(from))
		}
		late := others - rebootedBefore(restart)
		r.Check(late == 0, "%d of the other clusters' faults had no RebootNode before the first cluster's apiserver was started again (it stayed down %s)", late, restart.Sub(killed).Round(time.Millisecond))
	}
	r.Check(left == 0, "%d of the faults' pods left (every cluster)", left)
	r.Check(load.Verified(p.loadShare()) == nil, "background: %v", load.Verified(p.loadShare()))
	// The faults' nodes only: each repeated fatal event of the
	// background's nodes is a new cordon and drain by design.
	twiceCordoned, twiceStarted := 0, 0
	for _, c := range e.Clusters {
		for i := range faults {
			if n, _ := e.Actions.Produced(apiserverSteps[0].kindOutcome, c, NodeName(i)); n > 1 {
				twiceCordoned++
			}
			if n, _ := e.Actions.Produced(apiserverSteps[1].kindOutcome, c, NodeName(i)); n > 1 {
				twiceStarted++
			}
		}
	}
	all := faults * len(e.Clusters)
	r.Check(twiceCordoned == 0 && twiceStarted == 0 && twice == 0 && rebooted == all,
		"applied twice: %d nodes cordoned twice, %d drains started twice, %d nodes with two RebootNodes; %d of %d with one", twiceCordoned, twiceStarted, twice, rebooted, all)
	return nil
}

// faultPaths readies every cluster for the faults' whole path: the
// janitor's CRDs (RebootNode), and DrainPodsPerNode pods on each of nodes
// 0..faults-1, the kubelet's part played by a pod watch.
func (e *Env) faultPaths(ctx context.Context, faults int) error {
	for _, c := range e.Clusters {
		kc := e.Kubes[c]
		kc.ApplyCRDs(e.TB, janitorCRDs())
		if err := createDrainNamespace(ctx, kc.Client()); err != nil {
			return err
		}
		WatchPods(ctx, e.TB, kc, drainNamespace, true)
		if err := createPods(ctx, kc.Client(), nodeNames(0, faults)); err != nil {
			return err
		}
	}
	return nil
}

// sendEach sends faults fatal events to each of clusters (nodes 0..faults-1
// of each), one every apiserverFaultEvery, and returns when each was sent.
func sendEach(ctx context.Context, e *Env, clusters []string, faults int, pushbacks *atomic.Int64) (map[string][]time.Time, error) {
	sent := map[string][]time.Time{}
	var g errgroup.Group
	tick := time.NewTicker(apiserverFaultEvery)
	defer tick.Stop()
	for i := range faults {
		for _, c := range clusters {
			sent[c] = append(sent[c], time.Now())
			g.Go(func() error { return e.sendFault(ctx, c, i, pushbacks) })
		}
		<-tick.C
	}
	return sent, g.Wait()
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

// kubeletHeld follows the pods of nodes (in drainNamespace) that are
// terminating when the restarted apiserver first lists them: their
// evictions were taken before the kill, and the kubelet finishes them only
// once its pod watch is back (kwok's, WatchPods', a real kubelet's
// client-go reflector retries with a backoff of up to 30 s, doubled by its
// jitter). It sends, once every such pod is gone or a few minutes have
// passed, when each such node's last one was gone.
func kubeletHeld(ctx context.Context, kc kubernetes.Interface, nodes []string) <-chan map[string]time.Time {
	out := make(chan map[string]time.Time, 1)
	in := map[string]bool{}
	for _, n := range nodes {
		in[n] = true
	}
	go func() {
		gone := map[string]time.Time{}
		var held map[string]map[string]bool // node -> its pods followed; nil until the first list
		for end := time.Now().Add(3 * time.Minute); ctx.Err() == nil && time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			c, cancel := context.WithTimeout(ctx, time.Second)
			l, err := kc.CoreV1().Pods(drainNamespace).List(c, metav1.ListOptions{})
			cancel()
			if err != nil {
				continue
			}
			now, there := time.Now(), map[string]bool{}
			first := held == nil
			if first {
				held = map[string]map[string]bool{}
			}
			for _, p := range l.Items {
				there[p.Name] = true
				if first && in[p.Spec.NodeName] && p.DeletionTimestamp != nil {
					if held[p.Spec.NodeName] == nil {
						held[p.Spec.NodeName] = map[string]bool{}
					}
					held[p.Spec.NodeName][p.Name] = true
				}
			}
			for node, pods := range held {
				for name := range pods {
					if !there[name] {
						delete(pods, name)
					}
				}
				if _, ok := gone[node]; !ok && len(pods) == 0 {
					gone[node] = now
				}
			}
			if len(gone) == len(held) {
				break
			}
		}
		out <- gone
	}()
	return out
}

// firstAnswer asks the restarting apiserver of k for node every 20 ms and
// sends when it first answered (the first moment a role's request could
// succeed), or the time ctx ended.
func firstAnswer(ctx context.Context, k *testenv.Kube, node string) <-chan time.Time {
	out := make(chan time.Time, 1)
	go func() {
		for ctx.Err() == nil {
			c, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_, err := k.Client().CoreV1().Nodes().Get(c, node, metav1.GetOptions{})
			cancel()
			if err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		out <- time.Now()
	}()
	return out
}
