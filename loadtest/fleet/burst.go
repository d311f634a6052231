package fleet

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/internal/fleetsim"
	"github.com/faultline/faultline/processors"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/quarantine"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// burstMarker is the metadata key every burst event carries, so the
// zero-loss count in ClickHouse counts them and nothing else (not the
// warm-up, not correlate's derived events).
const burstMarker = "loadtest_burst"

// burstRoles are the roles a fabric outage runs through by default: the
// store (every event kept), correlate (the fabric rules over ClickHouse)
// and quarantine (cordons under the breaker).
const burstRoles = "store,correlate,quarantine"

func burstOpts(p Params) Options {
	roles := p.Roles
	if roles == "" {
		roles = burstRoles
	}
	return Options{Clusters: p.Clusters, Nodes: p.Nodes, Roles: roles, BreakerOff: p.BreakerOff, ClickHouse: true,
		// One token per cluster stands for all of its nodes' agents
		// (each would be its own caller, 20,000/s each): the per-caller
		// limit is lifted so the burst goes as fast as the gateway and
		// the broker take it. Every other setting is the shipped default.
		Gateway: func(c *gateway.Config) { c.RatePerCaller = 0 },
		Modify: func(c *processors.Config) {
			if p.NodeEvents != nil {
				c.Quarantine.NodeEvents = *p.NodeEvents
			}
			if p.KubeQPS > 0 {
				c.Kube.QPS, c.Kube.Burst = p.KubeQPS, int(2*p.KubeQPS)
			}
		}}
}

// BurstEvent is event seq of a cluster's fabric outage over nodes nodes:
// round after round over every node, each round one kind — an InfiniBand
// port DOWN (fatal), a link_downed counter increase, the fabric check's
// degraded NVLink fabric health — on port/GPU (round/3) mod 8, so the
// first round takes every node's mlx5_0 down. Its id is the client's
// ("burst-<seq>", unique per cluster: the gateway derives the stored id
// from it and the cluster) and it carries burstMarker.
func BurstEvent(nodes int, seq int64) *datamodels.HealthEvent {
	node := NodeName(int(seq % int64(nodes)))
	round := int(seq / int64(nodes))
	k := (round / 3) % 8
	var ev *datamodels.HealthEvent
	switch round % 3 {
	case 0:
		ev = fleetsim.PortDown(node, k)
	case 1:
		ev = fleetsim.LinkDowned(node, k)
	default:
		ev = fleetsim.FabricUnhealthy(node, k)
	}
	if ev.Metadata == nil {
		ev.Metadata = map[string]string{}
	}
	ev.Metadata[burstMarker] = "1"
	ev.Id = fmt.Sprintf("burst-%d", seq)
	return ev
}

// groupTopics are the consumer groups of the roles run and the topics
// each consumes (processors' role contract: group "faultline-<role>",
// quarantine's retry consumer its own group over its retry topic).
func groupTopics(roles string, clusters []string) (map[string][]string, error) {
	cfg := processors.DefaultConfig()
	cfg.Roles = roles
	sel, err := cfg.Selected()
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	add := func(pc pipeline.Config) {
		g := pc.Group
		if g == "" {
			g = "faultline-" + pc.Role
		}
		out[g] = pc.Topics
	}
	for _, r := range sel {
		switch r.Name {
		case "store":
			add(cfg.Store.Pipeline())
		case "correlate":
			add(cfg.Correlate.Pipeline())
		case "quarantine":
			pc := cfg.Quarantine.Pipeline()
			add(pc)
			pc.Role, pc.Topics = quarantine.Role+"-retry", quarantine.RetryTopics(clusters)
			add(pc)
		case "drain":
			add(cfg.Drain.Pipeline())
		case "remediate":
			add(cfg.Remediate.Pipeline())
		case "conformance":
			add(cfg.Conformance.Pipeline())
		}
	}
	return out, nil
}

// groupDrain is what the lag watch saw of one consumer group.
type groupDrain struct {
	Group   string
	Topics  []string
	PeakLag int64
	Lag     int64                    // at the last poll
	ZeroAt  time.Duration            // since the first send, of the poll that began the current run of lag 0 on every topic (0: lag not 0)
	TopicAt map[string]time.Duration // the same per topic
	// BacklogAt is when (since the first send) the group had committed
	// every partition of the topic up to its end offset at the moment the
	// last send was acknowledged: the burst's backlog drained, whatever
	// was appended later (actions, derived events).
	BacklogAt map[string]time.Duration
	Records   int64 // records its topics took from the first send until it drained
	startEnd  int64 // its topics' end offsets summed at the first send
}

// LagWatch polls every group's committed offsets against its topics' end
// offsets (kadm), from the first send on.
type LagWatch struct {
	adm    *kadm.Client
	groups map[string][]string
	t0     time.Time
	mu     sync.Mutex
	state  map[string]*groupDrain
	polls  int
	last   time.Duration // since the first send, of the last successful poll
	errs   int
	lastE  error
	// target: each topic's end offsets per partition when the last send
	// was acknowledged (nil before).
	target map[string]map[int32]int64
}

func newLagWatch(adm *kadm.Client, groups map[string][]string) *LagWatch {
	w := &LagWatch{adm: adm, groups: groups, state: map[string]*groupDrain{}}
	for g, ts := range groups {
		w.state[g] = &groupDrain{Group: g, Topics: ts, TopicAt: map[string]time.Duration{}, BacklogAt: map[string]time.Duration{}}
	}
	return w
}

// lags returns each group's lag per topic (committed offset, 0 when
// none, to the end offset, summed over partitions) and its topics' end
// offsets summed.
func (w *LagWatch) lags(ctx context.Context) (lag map[string]map[string]int64, ends map[string]int64, err error) {
	lag, ends, _, _, err = w.offsets(ctx)
	return lag, ends, err
}

// offsets is lags, with each group's committed offsets and each topic's
// end offsets per partition.
func (w *LagWatch) offsets(ctx context.Context) (lag map[string]map[string]int64, ends map[string]int64,
	commits map[string]map[string]map[int32]int64, endp map[string]map[int32]int64, err error) {
	var topics []string
	for _, ts := range w.groups {
		for _, t := range ts {
			if !slices.Contains(topics, t) {
				topics = append(topics, t)
			}
		}
	}
	end, err := w.adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if err := end.Error(); err != nil {
		return nil, nil, nil, nil, err
	}
	endp = map[string]map[int32]int64{}
	for t, ps := range end {
		endp[t] = map[int32]int64{}
		for p, o := range ps {
			endp[t][p] = o.Offset
		}
	}
	lag, ends, commits = map[string]map[string]int64{}, map[string]int64{}, map[string]map[string]map[int32]int64{}
	for g, ts := range w.groups {
		// A group just formed may not have its coordinator yet.
		var committed kadm.OffsetResponses
		waitFor(ctx, 10*time.Second, func() bool {
			committed, err = w.adm.FetchOffsets(ctx, g)
			return !kerr.IsRetriable(err)
		})
		if err != nil {
			return nil, nil, nil, nil, fmt.Errorf("offsets of %s: %w", g, err)
		}
		lag[g], commits[g] = map[string]int64{}, map[string]map[int32]int64{}
		for _, t := range ts {
			commits[g][t] = map[int32]int64{}
			for _, o := range end[t] {
				at := int64(0)
				if c, ok := committed.Lookup(t, o.Partition); ok && c.Err == nil && c.At >= 0 {
					at = c.At
				}
				commits[g][t][o.Partition] = at
				lag[g][t] += max(0, o.Offset-at)
				ends[g] += o.Offset
			}
		}
	}
	return lag, ends, commits, endp, nil
}

// markSent records each topic's end offsets now (the last send
// acknowledged): the backlog each group must commit past.
func (w *LagWatch) markSent(ctx context.Context) error {
	_, _, _, endp, err := w.offsets(ctx)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.target = endp
	w.mu.Unlock()
	return nil
}

// start records the end offsets at the first send and polls every
// interval until ctx ends.
func (w *LagWatch) start(ctx context.Context, t0 time.Time, interval time.Duration) error {
	w.t0 = t0
	_, ends, err := w.lags(ctx)
	if err != nil {
		return err
	}
	for g, s := range w.state {
		s.startEnd = ends[g]
	}
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			w.poll(ctx)
		}
	}()
	return nil
}

func (w *LagWatch) poll(ctx context.Context) {
	lag, ends, commits, _, err := w.offsets(ctx)
	at := time.Since(w.t0)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.polls++
	if err != nil {
		w.errs++
		w.lastE = err
		return
	}
	w.last = at
	for g, s := range w.state {
		var l int64
		for _, t := range s.Topics {
			if _, done := s.BacklogAt[t]; !done && w.target != nil {
				caught := true
				for p, off := range w.target[t] {
					if commits[g][t][p] < off {
						caught = false
					}
				}
				if caught {
					s.BacklogAt[t] = at
				}
			}
			tl := lag[g][t]
			l += tl
			switch {
			case tl > 0:
				delete(s.TopicAt, t)
			case s.TopicAt[t] == 0:
				s.TopicAt[t] = at
			}
		}
		s.Lag = l
		s.PeakLag = max(s.PeakLag, l)
		switch {
		case l > 0:
			s.ZeroAt = 0
		case s.ZeroAt == 0:
			s.ZeroAt = at
			s.Records = ends[g] - s.startEnd
		}
	}
}

// drained reports whether every group stood at lag 0 at the last poll
// taken at or after since (since the first send).
func (w *LagWatch) drained(since time.Duration) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last <= since {
		return false
	}
	for _, s := range w.state {
		if s.ZeroAt == 0 {
			return false
		}
	}
	return true
}

func (w *LagWatch) snapshot() []groupDrain {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]groupDrain, 0, len(w.state))
	for _, s := range w.state {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	return out
}

// burstResend outlasts a backlog: up to 1,000 pushbacks, waiting 5 ms
// longer after each up to 200 ms (≈ 3 min in all).
var burstResend = resend{tries: 1000, wait: func(try int) time.Duration { return time.Duration(min(5+5*try, 200)) * time.Millisecond }}

// burstSend sends events events spread evenly over the clusters, each
// cluster's share from workers callers in gRPC batches of batch, as fast
// as the gateway acknowledges them (backpressure is backed off and sent
// again with the same ids: stored once).
func (e *Env) burstSend(ctx context.Context, events int64, nodes, batch, workers int) LoadResult {
	var sent, failed, pushed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	per := events / int64(len(e.Clusters))
	for ci, c := range e.Clusters {
		share := per
		if ci == len(e.Clusters)-1 {
			share = events - per*int64(len(e.Clusters)-1)
		}
		var next atomic.Int64
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					first := next.Add(int64(batch)) - int64(batch)
					if first >= share {
						return
					}
					evs := make([]*datamodels.HealthEvent, 0, batch)
					for s := first; s < min(share, first+int64(batch)); s++ {
						evs = append(evs, BurstEvent(nodes, s))
					}
					_, pb, err := e.sendAccepted(ctx, GRPC, c, evs, burstResend)
					pushed.Add(pb)
					if err != nil {
						failed.Add(int64(len(evs)))
						e.TB.Logf("fleet: burst: %v", err)
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

func runBurst(ctx context.Context, e *Env, p Params, r *Report) error {
	groups, err := groupTopics(e.Opts.Roles, e.Clusters)
	if err != nil {
		return err
	}
	if strings.Contains(e.Opts.Roles, "quarantine") && len(e.Kubes) < len(e.Clusters) {
		return fmt.Errorf("burst: %d of %d clusters have a kube-apiserver (is kube installed? scripts/testenv/install.sh kube)", len(e.Kubes), len(e.Clusters))
	}
	lw := newLagWatch(kadm.NewClient(e.KafkaClient()), groups)
	nodesAll := p.Nodes * len(e.Clusters)
	want := breakerShare(p.Nodes)
	if p.BreakerOff {
		want = p.Nodes
	}
	workers := 8
	const batch = 500

	t0 := time.Now() // the clock starts when the first request is sent
	lctx, stopLag := context.WithCancel(ctx)
	defer stopLag()
	if err := lw.start(lctx, t0, 250*time.Millisecond); err != nil {
		return fmt.Errorf("burst: lag: %w", err)
	}
	res := e.burstSend(ctx, int64(p.Events), p.Nodes, batch, workers)
	sentIn := time.Since(t0)
	if err := lw.markSent(ctx); err != nil {
		return fmt.Errorf("burst: lag: %w", err)
	}
	r.Figure("burst over %s: %d fabric-outage events (PortDown, link_downed, GPUFabricHealth; every node's ports, round after round) sent in gRPC batches of %d from %d callers per cluster: %s",
		e.Describe(), p.Events, batch, workers, res)
	r.Check(res.Failed == 0 && res.Sent == int64(p.Events), "acknowledged %d of %d events (%d in failed calls)", res.Sent, p.Events, res.Failed)

	// Drained: every group at lag 0 on all of its topics in one poll
	// taken after the last send was acknowledged.
	drained := waitFor(ctx, p.Duration, func() bool { return lw.drained(sentIn) })
	allIn := time.Since(t0)
	for _, g := range lw.snapshot() {
		state := fmt.Sprintf("lag 0 at %s from the first send (%s after the last ack)", g.ZeroAt.Round(time.Millisecond), max(0, g.ZeroAt-sentIn).Round(time.Millisecond))
		if g.ZeroAt == 0 {
			state = fmt.Sprintf("NOT drained after %s: lag %d", allIn.Round(time.Second), g.Lag)
		}
		rate := ""
		if g.ZeroAt > 0 && g.Records > 0 {
			rate = fmt.Sprintf(", %.0f records/s from the first send", float64(g.Records)/g.ZeroAt.Seconds())
		}
		var per, backlog []string
		for _, t := range g.Topics {
			if at, ok := g.TopicAt[t]; ok {
				per = append(per, fmt.Sprintf("%s at %s", t, at.Round(time.Millisecond)))
			} else {
				per = append(per, t+" not drained")
			}
			if at, ok := g.BacklogAt[t]; ok {
				backlog = append(backlog, fmt.Sprintf("%s at %s", t, at.Round(time.Millisecond)))
			} else {
				backlog = append(backlog, t+" not caught up")
			}
		}
		r.Figure("burst drain %s: the backlog at the last ack committed past: %s; %s (per topic, start of the final run of lag 0: %s); peak lag %d; %d records appended to its topics meanwhile%s",
			g.Group, strings.Join(backlog, ", "), state, strings.Join(per, ", "), g.PeakLag, g.Records, rate)
		r.Check(g.ZeroAt > 0, "group %s not drained within %s (lag %d)", g.Group, p.Duration, g.Lag)
	}
	lw.mu.Lock()
	polls, errs, lastE := lw.polls, lw.errs, lw.lastE
	lw.mu.Unlock()
	if errs > 0 {
		r.Figure("burst: %d of %d lag polls failed (last: %v)", errs, polls, lastE)
	}
	if !drained {
		r.Check(false, "not every group drained within %s", p.Duration)
	}

	// Zero loss: every acknowledged event's id is in the store.
	if e.storing() {
		stored, rows := e.storedMarked(ctx, burstMarker, res.Sent)
		r.Figure("burst zero loss: %d distinct burst event ids in ClickHouse (%d rows before merges) for %d acknowledged", stored, rows, res.Sent)
		r.Check(stored == uint64(res.Sent), "stored %d distinct burst ids, acknowledged %d: %d lost", stored, res.Sent, int64(res.Sent)-int64(stored))
	}

	// The breaker: its policy share cordoned per cluster within its
	// window (max_percent of the nodes per sliding window; it closes by
	// itself a window after it opened, so a backlog that takes longer than
	// the window lets the next share through — counted apart), every other
	// node held (a held_by_breaker action); none cordoned twice.
	if strings.Contains(e.Opts.Roles, "quarantine") {
		window := processors.DefaultConfig().Quarantine.Breaker.Window
		covered := func(c string) (cordoned map[string]time.Time, held map[string]bool, union int) {
			cordoned, held = e.Cordons.FirstIn(c), e.Actions.NodeSetIn("quarantine/held_by_breaker", c)
			union = len(cordoned)
			for n := range held {
				if _, ok := cordoned[n]; !ok {
					union++
				}
			}
			return cordoned, held, union
		}
		ok := waitFor(ctx, 60*time.Second, func() bool {
			for _, c := range e.Clusters {
				cordoned, _, union := covered(c)
				if len(cordoned) < want || (!p.BreakerOff && union < p.Nodes) {
					return false
				}
			}
			return true
		})
		time.Sleep(2 * time.Second) // anything beyond the share would show now
		cordonedAll, twice := e.Cordons.Count()
		heldActions, _ := e.Actions.Count("quarantine/held_by_breaker")
		applied, _ := e.Actions.Count("quarantine/applied")
		windows := 1 + int(time.Since(t0)/window)
		var per []string
		for _, c := range e.Clusters {
			cordoned, held, union := covered(c)
			var firstAt time.Time
			for _, t := range cordoned {
				if firstAt.IsZero() || t.Before(firstAt) {
					firstAt = t
				}
			}
			inWindow, later := 0, time.Duration(0)
			for _, t := range cordoned {
				if t.Sub(firstAt) < window {
					inWindow++
				} else if d := t.Sub(t0); later == 0 || d < later {
					later = d
				}
			}
			neverCordoned := union - len(cordoned)
			line := fmt.Sprintf("%s %d cordoned within the breaker's window (%s) + %d after it, %d held and never cordoned (%d held at some point)",
				c, inWindow, window, len(cordoned)-inWindow, neverCordoned, len(held))
			if later > 0 {
				line += fmt.Sprintf(", the first cordon after the window %s after the first send", later.Round(time.Millisecond))
			}
			per = append(per, line)
			r.Check(ok && inWindow == want, "%s: cordoned %d nodes within the breaker's window, its policy share of %d is %d", c, inWindow, p.Nodes, want)
			r.Check(len(cordoned) <= want*windows, "%s: cordoned %d nodes in %d breaker window(s), the policy allows %d", c, len(cordoned), windows, want*windows)
			r.Check(union == p.Nodes, "%s: cordoned or held %d of %d nodes: some never decided", c, union, p.Nodes)
		}
		r.Figure("burst breaker: %d of %d nodes cordoned (policy share %d per cluster per %s; %d twice), %d held_by_breaker actions, %d quarantine/applied: %s",
			cordonedAll, nodesAll, want, window, twice, heldActions, applied, strings.Join(per, "; "))
		r.Check(twice == 0, "%d nodes cordoned twice", twice)
	}
	r.Figure("burst: all %d acknowledged events drained by every role in %s from the first send (send %s, %.0f events/s end to end)",
		res.Sent, allIn.Round(time.Millisecond), sentIn.Round(time.Millisecond), float64(res.Sent)/allIn.Seconds())
	return nil
}
