// Package conformance is the conformance processor role (`faultline process
// --role=conformance`): it stores the agents' NodeConformance reports
// (agents/conformance) in ClickHouse's conformance table, and every
// sweep_interval evaluates each cluster's conformance groups — per cluster
// and node pool (pool_label) — against the group's configured baseline, or
// else its majority; a node without a report within the staleness window is
// unknown. A drifted node keeps its running work and is deprioritized for
// new work (a PreferNoSchedule taint and a label naming its group), gets a
// Kubernetes Event naming the differing components (expected vs actual),
// and the infrastructure is told through a pluggable notifier (an HTTP
// PATCH like OpenCHAMI SMD's) retried with backoff off the role's path.
// Still drifted after drift_remediation_timeout (24h; 4h for sensitive
// nodes) it is escalated with a fatal event — the quarantine path. A
// sensitive node is sent down that path at once (cordon, taint, drain) and
// only lifted after it conforms again and an operator approved it
// (AnnotationApproved). When a node conforms again its taint and label are
// removed. Every step is an Action on the actions topic.
//
// State lives on the node (AnnotationState), so any replica continues any
// other's work; each cluster is swept by the replica owning its key's
// partition. README.md has the configuration and the flow.
package conformance

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/role"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// Options are the role's collaborators, for tests.
type Options struct {
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Notifier replaces the HTTP notifier of cfg.Notifier.URL.
	Notifier Notifier
}

// Open connects to ClickHouse (applying the migrations) and returns the
// role: its consumer of Topics (the report writer) and two loops, the
// sweep and the notifier's deliveries.
func Open(ctx context.Context, cfg Config, deps role.Deps) (*role.Role, error) {
	return OpenWith(ctx, cfg, deps, nil, Options{})
}

// OpenWith is Open with a prebuilt cluster registry (nil: from deps.Kube)
// and options.
func OpenWith(ctx context.Context, cfg Config, deps role.Deps, reg *clusters.Registry, opt Options) (*role.Role, error) {
	deps = deps.WithDefaults()
	if err := cfg.Validate("conformance."); err != nil {
		return nil, err
	}
	log := deps.Log.With("role", Role)
	if reg == nil {
		reg = clusters.NewRegistry(deps.Kube, opt.Now).WithLog(log)
	}
	conn, err := clickhouse.SetupWait(ctx, deps.ClickHouse, log)
	if err != nil {
		return nil, err
	}
	h := NewHandler(conn, log, opt.Now)
	loop := &sweepLoop{cfg: cfg, deps: deps, log: log, handler: h, configured: deps.Kube.Names()}
	n := opt.Notifier
	if n == nil && cfg.Notifier.URL != "" {
		n = NewHTTPNotifier(cfg.Notifier, nil)
	}
	if n != nil {
		loop.queue = NewQueue(n, cfg.Notifier, log, loop.notified)
	}
	loop.sweeper = NewSweeper(cfg, conn, reg, log, opt.Now, loop.queue)
	r := &role.Role{
		Name:      Role,
		Consumers: []role.Consumer{{Pipeline: cfg.Pipeline(), Handler: h}},
		Loops:     []role.Loop{{Name: "sweep", Run: loop.run}},
		Close:     conn.Close,
	}
	if loop.queue != nil {
		r.Loops = append(r.Loops, role.Loop{Name: "notifier", Run: loop.queue.Run})
	}
	return r, nil
}

type sweepLoop struct {
	cfg        Config
	deps       role.Deps
	log        *slog.Logger
	handler    *Handler
	sweeper    *Sweeper
	queue      *Queue
	configured []string

	prod pipeline.Producer

	// sem bounds the clusters swept at once; wg holds the sweeps running.
	sem chan struct{}
	wg  sync.WaitGroup

	mu       sync.Mutex
	pending  map[string]Output // by cluster: not yet produced
	sweeping map[string]bool   // clusters whose sweep runs
}

func (l *sweepLoop) run(ctx context.Context) error {
	prod, err := kafka.NewClient(l.deps.Kafka, l.log, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0))
	if err != nil {
		return err
	}
	defer prod.Close()
	defer l.wg.Wait() // the sweeps still running, before prod closes
	l.prod = prod
	l.sweeper.SendWith(func(ctx context.Context, o Output) error {
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return Produce(pctx, prod, o)
	})
	t := time.NewTicker(l.cfg.SweepInterval)
	defer t.Stop()
	for {
		l.sweepAll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// sweepAll starts the sweeps of the configured clusters and those with
// recent reports whose key this replica owns, and returns without waiting
// for them: a cluster whose previous sweep still runs is passed over this
// round, so a slow cluster delays its own sweeps only, never another's
// (unless sweepParallel clusters are slow at once). A cluster this replica
// no longer owns (its partition moved in a rebalance) is not swept, but
// what its earlier sweeps could not produce is produced now, not left for
// a sweep of the cluster here that may never come.
func (l *sweepLoop) sweepAll(ctx context.Context) {
	names := slices.Clone(l.configured)
	rows, err := l.handler.conn.Query(ctx, "SELECT DISTINCT cluster FROM conformance WHERE ts >= ?", clampDT(l.sweeper.now().Add(-l.cfg.Staleness)))
	if err != nil {
		l.log.Warn("conformance: clusters not listed", "err", err)
	} else {
		for rows.Next() {
			var c string
			if rows.Scan(&c) == nil && !slices.Contains(names, c) {
				names = append(names, c)
			}
		}
		rows.Close()
	}
	// Clusters are swept concurrently (at most sweepParallel at once),
	// each within its own deadline.
	if l.sem == nil {
		l.sem = make(chan struct{}, sweepParallel)
	}
	l.mu.Lock()
	for c := range l.pending {
		if !slices.Contains(names, c) {
			names = append(names, c)
		}
	}
	l.mu.Unlock()
	for _, c := range names {
		owned := l.handler.Owns(events.Key(c, ""))
		l.mu.Lock()
		_, held := l.pending[c]
		start := (owned || held) && !l.sweeping[c]
		if start {
			if l.sweeping == nil {
				l.sweeping = map[string]bool{}
			}
			l.sweeping[c] = true
		}
		l.mu.Unlock()
		if !start {
			continue
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer func() {
				l.mu.Lock()
				delete(l.sweeping, c)
				l.mu.Unlock()
			}()
			select {
			case l.sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-l.sem }()
			defer func() {
				// A panic is this cluster's failed sweep (the next one tries
				// again), not the end of the process.
				if p := recover(); p != nil {
					l.log.Error("conformance: sweep failed", "cluster", c, "err", pipeline.Panic(p))
				}
			}()
			if !owned {
				l.produce(ctx, c, Output{})
				return
			}
			cctx, cancel := context.WithTimeout(ctx, sweepTimeout)
			defer cancel()
			out, err := l.sweeper.Sweep(cctx, c)
			if err != nil {
				l.log.Warn("conformance: sweep failed", "cluster", c, "err", err)
			}
			l.produce(ctx, c, out)
		}()
	}
}

// sweepParallel bounds the clusters swept at once; sweepTimeout bounds one.
const (
	sweepParallel = 8
	sweepTimeout  = 5 * time.Minute
)

// produce writes a cluster's sweep output — the dry-run decisions (a live
// node's are sent before its state, SendWith) — with what an earlier sweep
// of the cluster could not produce first: a dry-run decision is remembered
// (not decided again), so its Action must not be lost to a Kafka outage.
func (l *sweepLoop) produce(ctx context.Context, cluster string, out Output) {
	l.mu.Lock()
	prev := l.pending[cluster]
	delete(l.pending, cluster)
	l.mu.Unlock()
	all := Output{Actions: append(prev.Actions, out.Actions...), Events: append(prev.Events, out.Events...)}
	if len(all.Actions)+len(all.Events) == 0 {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := Produce(pctx, l.prod, all); err != nil {
		l.log.Error("conformance: sweep output not produced; kept for the next sweep", "cluster", cluster,
			"actions", len(all.Actions), "events", len(all.Events), "err", err)
		l.keep(cluster, all)
	}
}

// keep holds out for the cluster's next sweep to produce, after what is
// held already.
func (l *sweepLoop) keep(cluster string, out Output) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending == nil {
		l.pending = map[string]Output{}
	}
	p := l.pending[cluster]
	l.pending[cluster] = Output{Actions: append(p.Actions, out.Actions...), Events: append(p.Events, out.Events...)}
}

// notified records a notifier result as an Action; one Kafka refused is
// held and produced with the cluster's next sweep, as a sweep's are.
func (l *sweepLoop) notified(n Notification, attempts int, err error) {
	outcome, reason := events.OutcomeApplied, fmt.Sprintf("notified after %d attempt(s)", attempts)
	if err != nil {
		outcome, reason = events.OutcomeFailed, fmt.Sprintf("not notified after %d attempt(s): %v", attempts, err)
	}
	what := "drift"
	if !n.Drifted {
		what = "restored"
	}
	a := l.sweeper.action(n.Cluster, n.Node, events.KindConformanceNotify, outcome, what+": "+reason,
		map[string]string{events.DetailExpected: n.Expected, events.DetailActual: n.Actual, events.DetailAttempts: fmt.Sprint(attempts)}, n.Key, false)
	if l.prod == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := Output{Actions: []*faultlinev1.Action{a}}
	if err := Produce(ctx, l.prod, out); err != nil {
		l.log.Error("conformance: notifier action not produced; kept for the next sweep", "cluster", n.Cluster, "node", n.Node, "err", err)
		l.keep(n.Cluster, out)
	}
}

// Produce writes a sweep's actions and events.
func Produce(ctx context.Context, p pipeline.Producer, out Output) error {
	var recs []*kgo.Record
	for _, a := range out.Actions {
		r, err := pipeline.ActionRecord(a)
		if err != nil {
			return err
		}
		recs = append(recs, r)
	}
	for _, ev := range out.Events {
		b, err := events.Marshal(ev)
		if err != nil {
			return err
		}
		recs = append(recs, &kgo.Record{Topic: events.TopicEvents, Key: events.Key(ev.GetCluster(), ev.GetNodeName()), Value: b})
	}
	if len(recs) == 0 {
		return nil
	}
	return p.ProduceSync(ctx, recs...).FirstErr()
}
