package fleet

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/faultline/faultline/internal/fleetsim"
	"github.com/faultline/faultline/processors/drain"
	"github.com/faultline/faultline/processors/remediate"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// slowLanes are the roles with a slow lane and its topic (requeue.Lane).
var slowLanes = []struct{ role, topic string }{{drain.Role, drain.TopicSlow}, {remediate.Role, remediate.TopicSlow}}

// slowFaultEvery spaces slow-cluster's rounds of faults (one per cluster
// each round).
const slowFaultEvery = 100 * time.Millisecond

// runSlowCluster: the first cluster's API server answers every request,
// but Params.Latency late (a latency proxy in front of it: its etcd slow,
// a region far away); the others' at once. Under Rate events/s of mixed
// background over every cluster, once the role has found the cluster
// slow (the background's fatal nodes reach it first; until its first
// requests are answered the batches that meet it wait for them, which is
// timed apart: the onset), Faults fatal events per cluster are sent, a
// round of one per cluster every slowFaultEvery, each for its own node:
// the other clusters' faults must be cordoned without waiting for the
// slow one (each within one of its requests, p99), and every fault of the
// slow cluster too, each node once. With the roles drain and remediate
// (Params.Roles, apiserverRoles), each fault's node runs DrainPodsPerNode
// pods, and its path goes on to its RebootNode: the figures are each
// group's send -> RebootNode (produced), every node with one, none twice.
func runSlowCluster(ctx context.Context, e *Env, p Params, r *Report) error {
	if len(e.Clusters) < 2 || e.Opts.SlowFirst == 0 {
		return fmt.Errorf("slow-cluster: needs 2 clusters or more, the first behind a latency proxy (%d clusters)", len(e.Clusters))
	}
	slow := e.Clusters[0]
	path := strings.Contains(e.Opts.Roles, "remediate")
	if path {
		if err := e.faultPaths(ctx, p.Faults); err != nil {
			return err
		}
	}
	adm := kadm.NewClient(e.KafkaClient())
	deferred := func() int64 { return deferredTo(ctx, adm, slow) }
	bg, err := faultBackground(ctx, e, p, "slow-cluster")
	if err != nil {
		return err
	}
	// Until the role knows the cluster is slow (its first requests
	// answered), the batch that meets it waits for them, and the batches
	// behind it: the onset, timed here — from the background's start
	// until a record of the cluster was deferred and the quarantine group
	// is caught up again (under half a second of the background behind) —
	// and not in the faults' figures. With quarantine.slow_cluster 0
	// (never deferred) there is no onset to wait out: the faults follow
	// 3 s of background.
	// With drain and remediate, each of their roles meets it too (once
	// the background's first fatal nodes of the cluster are cordoned):
	// the onset lasts until each has handed a record to its slow lane
	// and its group is caught up with the actions topic (under 50 records
	// behind; its requeue topic carries the slow cluster's work round
	// between the lane and the main path, Turn by Turn).
	t0 := time.Now()
	known, onset := true, "none (never deferred)"
	within := 60 * time.Second
	if path {
		within = 2 * time.Minute
	}
	if e.pcfg.Quarantine.SlowCluster > 0 {
		known = waitFor(ctx, within, func() bool {
			if deferred() <= 0 {
				return false
			}
			lag, ok := quarantineLag(ctx, adm)
			if !ok || float64(lag) >= p.Rate/2 {
				return false
			}
			if !path {
				return true
			}
			for _, l := range slowLanes {
				if lag, ok := groupLag(ctx, adm, l.role, events.TopicActions); !ok || lag >= 50 || topicRecords(ctx, adm, l.topic) <= 0 {
					return false
				}
			}
			return true
		})
		onset = time.Since(t0).Round(time.Millisecond).String() + " after the background started"
	} else {
		time.Sleep(3 * time.Second)
	}
	sent := map[string][]time.Time{}
	for _, c := range e.Clusters {
		sent[c] = make([]time.Time, p.Faults)
	}
	for i := range p.Faults {
		for _, c := range e.Clusters {
			sent[c][i] = time.Now() // the clock starts when the request is sent
			if err := e.Send(ctx, GRPC, c, []*datamodels.HealthEvent{fleetsim.Xid(NodeName(i), i%8, 79)}); err != nil {
				bg.Stop()
				return fmt.Errorf("send fault %d of %s: %w", i, c, err)
			}
		}
		time.Sleep(slowFaultEvery)
	}
	for _, c := range e.Clusters {
		e.waitCordoned(ctx, c, p.Faults)
	}
	time.Sleep(2 * time.Second) // a second cordon would show
	res := bg.Stop()
	_, twice := e.Cordons.Count()

	var fast []time.Duration
	for _, c := range e.Clusters[1:] {
		fast = append(fast, e.cordonedAfter(c, p.Faults, func(i int) time.Time { return sent[c][i] })...)
	}
	own := e.cordonedAfter(slow, p.Faults, func(i int) time.Time { return sent[slow][i] })
	_, fastP99, _ := percentiles(append([]time.Duration(nil), fast...))
	r.Figure("slow-cluster over %s: %s's API server answers each request %s late (a proxy), the others' at once; slow_cluster %s; background %s",
		e.Describe(), slow, p.Latency, e.slowClusterSetting(), res)
	r.Figure("slow-cluster: onset (%s's first record deferred, on the slow lanes too with drain and remediate, and the groups caught up): %s; then the other clusters' faults, %d of %d cordoned, send->watch %s; %s's, %d of %d, %s; %d records deferred to its retry topic; %d cordoned twice",
		slow, onset, len(fast), p.Faults*(len(e.Clusters)-1), spread(fast), slow, len(own), p.Faults, spread(own), deferred(), twice)
	r.Check(res.Verified(p.loadShare()) == nil, "%v", res.Verified(p.loadShare()))
	r.Check(known, "%s not deferred (or, with drain and remediate, not on their slow lanes), or the groups not caught up, within %s of the background: %s", slow, within, onsetState(ctx, adm, slow, path))
	r.Check(len(fast) == p.Faults*(len(e.Clusters)-1), "only %d of the other clusters' %d faults cordoned within 60s", len(fast), p.Faults*(len(e.Clusters)-1))
	r.Check(len(own) == p.Faults, "only %d of %s's %d faults cordoned within 60s", len(own), slow, p.Faults)
	r.Check(fastP99 < p.Latency, "the other clusters' faults waited for the slow one: p99 %s, not within one of its requests (%s)", fastP99.Round(time.Millisecond), p.Latency)
	r.Check(twice == 0, "%d nodes cordoned twice", twice)
	if path {
		slowCheckPath(ctx, e, p, r, sent)
	}
	return nil
}

// slowCheckPath waits for every fault's RebootNode (at most five minutes,
// the background stopped: the slow cluster's lanes work off what it left)
// and reports each group's send -> RebootNode (produced on the actions
// topic): the fast clusters' paths must not wait for the slow one's — a
// drain and its remediation are a dozen requests, the fast clusters' p99
// within five of the slow cluster's.
func slowCheckPath(ctx context.Context, e *Env, p Params, r *Report, sent map[string][]time.Time) {
	last := apiserverSteps[len(apiserverSteps)-1].kindOutcome
	after := func(clusters []string) []time.Duration {
		var out []time.Duration
		for _, c := range clusters {
			for i, t0 := range sent[c] {
				if n, t := e.Actions.Produced(last, c, NodeName(i)); n > 0 {
					out = append(out, t.Sub(t0))
				}
			}
		}
		return out
	}
	all := p.Faults * len(e.Clusters)
	waitFor(ctx, 5*time.Minute, func() bool { return len(after(e.Clusters)) == all })
	fast, own := after(e.Clusters[1:]), after(e.Clusters[:1])
	rebooted, twice := 0, 0
	for _, c := range e.Clusters {
		n, tw, err := rebootNodesOf(ctx, e.Kubes[c], p.Faults)
		if err != nil {
			r.Check(false, "%v", err)
			return
		}
		rebooted, twice = rebooted+n, twice+tw
	}
	r.Figure("slow-cluster: send -> RebootNode (produced): the other clusters' faults %d of %d, %s; %s's %d of %d, %s; %d nodes with a RebootNode, %d with two",
		len(fast), p.Faults*(len(e.Clusters)-1), spread(fast), e.Clusters[0], len(own), p.Faults, spread(own), rebooted, twice)
	r.Check(rebooted == all && twice == 0, "%d of %d faults' nodes with a RebootNode, %d with two", rebooted, all, twice)
	_, fastP99, _ := percentiles(append([]time.Duration(nil), fast...))
	r.Check(fastP99 < 5*p.Latency, "the other clusters' paths waited for the slow one: send -> RebootNode p99 %s, not within five of its requests (%s)", fastP99.Round(time.Millisecond), 5*p.Latency)
}

// onsetState says where each role stands with the slow cluster: what a
// failed onset check shows.
func onsetState(ctx context.Context, adm *kadm.Client, slow string, path bool) string {
	lag, _ := quarantineLag(ctx, adm)
	out := fmt.Sprintf("quarantine: %d deferred, lag %d", deferredTo(ctx, adm, slow), lag)
	if path {
		for _, l := range slowLanes {
			actions, _ := groupLag(ctx, adm, l.role, events.TopicActions)
			all, _ := groupLag(ctx, adm, l.role, "")
			out += fmt.Sprintf("; %s: %d on its lane, lag %d on the actions topic, %d in all", l.role, topicRecords(ctx, adm, l.topic), actions, all)
		}
	}
	return out
}
