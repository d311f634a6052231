// Package agent is the node agent's runtime: configuration (TOML + flags),
// the explicit registry of checks, the runner that calls each check on its
// own schedule with a deadline, panic recovery and a success metric (in the
// style of node_exporter's collectors), the durable on-disk spool, the
// sender that drains it to the gateway over gRPC, and /metrics + /healthz.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/procfs/sysfs"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/agents/check"
	"github.com/faultline/faultline/agents/localaction"
	"github.com/faultline/faultline/agents/podres"
	"github.com/faultline/faultline/agents/relay"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/validate"
)

// Scheduled is a check with its schedule.
type Scheduled struct {
	Check    check.Check
	Interval time.Duration
	Timeout  time.Duration
}

// Options are collaborators of an Agent, for tests.
type Options struct {
	// Checks replaces the checks built from the registry.
	Checks []Scheduled
	// DialOptions are added to the gateway connection.
	DialOptions []grpc.DialOption
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// podresTTL is how long one kubelet pod-resources listing is used.
const podresTTL = 5 * time.Second

// maxGPUPods bounds the events.MetaGPUPods value (the gateway refuses
// metadata values over 2048 bytes); a longer list is left out.
const maxGPUPods = 2000

// Agent runs checks, spools their events and sends them.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	m      *Metrics
	spool  *Spool
	sender *Sender
	checks []Scheduled
	now    func() time.Time
	podres *podres.Lister // nil: off
	relay  *relay.Server  // nil: off (nvsentinel_socket)
	// machine is this machine's system UUID, stamped on every event
	// (events.MetaSystemUUID; "": unknown, none stamped).
	machine string

	// triggers asks a check's loop to run now (Trigger), one per check.
	triggers map[string]chan struct{}

	mu      sync.Mutex
	lastRun map[string]time.Time
	// recent is, by check, the latest of its last run's start and end and
	// the last request to run it that was accepted (requestRun).
	recent    map[string]time.Time
	unspooled map[string][]*keptEvent // by check: its events the spool has not taken, in order
	// keptMax bounds the encoded bytes of one check's unspooled events
	// (maxKeptBytes).
	keptMax   int
	podresErr string // the last pod-resources error logged
	started   time.Time
}

// New builds the agent: every enabled check (a check that cannot start, such
// as the NIC check without GPU metadata, is an error), the spool and the
// sender.
func New(cfg Config, log *slog.Logger, opt Options) (*Agent, error) {
	a := &Agent{cfg: cfg, log: log, m: NewMetrics(), now: opt.Now, lastRun: map[string]time.Time{},
		recent: map[string]time.Time{}, unspooled: map[string][]*keptEvent{}, keptMax: maxKeptBytes, machine: systemUUID(cfg.MachineSysfs, log)}
	if a.now == nil {
		a.now = time.Now
	}
	a.checks = opt.Checks
	if a.checks == nil {
		cfg.hostZone(log)
		for _, name := range cfg.Checks {
			s := spec(name)
			if s == nil {
				return nil, fmt.Errorf("checks: unknown check %q", name)
			}
			c, err := s.New(&cfg, log)
			if err != nil {
				return nil, fmt.Errorf("check %s: %w", name, err)
			}
			a.checks = append(a.checks, Scheduled{Check: c, Interval: s.Interval(&cfg), Timeout: s.Timeout(&cfg)})
		}
	}
	a.triggers = make(map[string]chan struct{}, len(a.checks))
	for _, s := range a.checks {
		a.triggers[s.Check.Name()] = make(chan struct{}, 1)
	}
	sp, err := OpenSpool(cfg.Spool.Dir, cfg.Spool.MaxBytes, log, a.m)
	if err != nil {
		return nil, err
	}
	a.spool = sp
	a.sender, err = NewSender(cfg.Gateway, sp, log, a.m, opt.DialOptions...)
	if err != nil {
		sp.Close()
		return nil, err
	}
	a.sender.node = cfg.NodeName
	if cfg.NVSentinelSocket != "" {
		a.relay, err = relay.New(relay.Config{Socket: cfg.NVSentinelSocket, Group: cfg.NVSentinelSocketGroup, Own: reportedBy(cfg.Checks), SystemUUID: a.machine},
			cfg.NodeName, sp, log, a.m.Registry, a.now)
		if err != nil {
			a.sender.Close()
			sp.Close()
			return nil, err
		}
	}
	if cfg.PodResourcesSocket != "" {
		// Connected at the first listing (podres.New dials lazily), not
		// looked for once: a socket missing at start (the kubelet
		// restarting) turned it off for the agent's life, and GPU resets
		// then went unchecked. Until it answers, events carry no GPU pods
		// (logged) and GPU resets are refused.
		if _, err := os.Stat(cfg.PodResourcesSocket); err != nil {
			log.Warn("kubelet pod-resources socket unavailable at start; read again when needed", "socket", cfg.PodResourcesSocket, "err", err)
		}
		if a.podres, err = podres.New(cfg.PodResourcesSocket, podresTTL); err != nil {
			if a.relay != nil {
				a.relay.Close()
			}
			a.sender.Close()
			sp.Close()
			return nil, err
		}
	}
	return a, nil
}

// Metrics returns the agent's metrics.
func (a *Agent) Metrics() *Metrics { return a.m }

// Spool returns the agent's spool.
func (a *Agent) Spool() *Spool { return a.spool }

// Run runs until ctx ends or the metrics listener fails; the spool keeps
// what was not sent.
func (a *Agent) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer a.spool.Close()
	defer a.sender.Close()
	if a.podres != nil {
		defer a.podres.Close()
	}
	if a.relay != nil {
		defer a.relay.Close() // also when Run fails before serving it
	}
	a.started = a.now()
	// Everything that can fail is set up before the first goroutine
	// starts: a failure returning after them would close the spool under
	// a sender still running.
	var la *localaction.Server
	if a.cfg.LocalActions.Listen != "" {
		var err error
		if la, err = localaction.New(a.cfg.LocalActions, a.cfg.NodeName, a.log, a.gpuPods()); err != nil {
			return err
		}
	}
	var ln net.Listener
	if a.cfg.MetricsAddr != "" {
		var err error
		if ln, err = net.Listen("tcp", a.cfg.MetricsAddr); err != nil {
			return fmt.Errorf("metrics_addr: %w", err)
		}
	}
	var wg sync.WaitGroup
	if ln != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.serveMetrics(ctx, ln, metricsLimits); err != nil {
				cancel(fmt.Errorf("metrics server: %w", err))
			}
		}()
		a.log.Info("serving /metrics and /healthz", "addr", ln.Addr().String(), "max_conns", metricsLimits.maxConns)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = a.sender.Run(ctx)
	}()
	if a.relay != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.relay.Serve(ctx); err != nil {
				cancel(err)
			}
		}()
	}
	if la != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := la.Serve(ctx); err != nil {
				cancel(err)
			}
		}()
	}
	for _, s := range a.checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.loop(ctx, s)
		}()
	}
	names := make([]string, len(a.checks))
	for i, s := range a.checks {
		names[i] = s.Check.Name()
	}
	a.log.Info("agent running", "node", a.cfg.NodeName, "checks", strings.Join(names, ","), "gateway", a.cfg.Gateway.Addr,
		"nvsentinel_socket", a.cfg.NVSentinelSocket, "machine", a.machine)
	<-ctx.Done()
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// serverLimits bound what the clients of metrics_addr hold.
type serverLimits struct {
	readHeader, read, write, idle time.Duration
	maxConns                      int
}

// metricsLimits: on the node's address (hostNetwork) any pod of the
// cluster reaches metrics_addr, so what one client holds is bounded: a
// request (none has a body) must arrive within 5 s, its answer be
// written within 30 s (a /metrics scrape, Prometheus's timeout is 10 s by
// default), a connection is closed after its answer (no keep-alive: a
// client asking again within any idle timeout would keep its connection,
// and 64 of them every connection) and past maxConns open connections a
// new one waits in the listen queue until one ends. Before, a connection
// stayed open for ever after one GET /healthz: thousands of them (a
// goroutine and ~20 KiB each) took the agent's 128 MiB, every check on
// the node down. 64: Prometheus's scrapes, the kubelet's probes and a few
// run requests at once.
var metricsLimits = serverLimits{readHeader: 5 * time.Second, read: 5 * time.Second, write: 30 * time.Second, idle: 5 * time.Second, maxConns: 64}

// serveMetrics serves a.Handler on ln within lim until ctx ends.
func (a *Agent) serveMetrics(ctx context.Context, ln net.Listener, lim serverLimits) error {
	srv := &http.Server{
		Handler:           a.Handler(),
		ReadHeaderTimeout: lim.readHeader,
		ReadTimeout:       lim.read,
		WriteTimeout:      lim.write,
		IdleTimeout:       lim.idle,
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}
	srv.SetKeepAlivesEnabled(false) // one request a connection: see metricsLimits
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done():
		case <-stopped:
			return
		}
		sctx, c := context.WithTimeout(context.Background(), 2*time.Second)
		defer c()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(netutil.LimitListener(ln, lim.maxConns)); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// loop runs s at start, every s.Interval and when triggered; a
// check.Retrier's next run is sooner when it asks (RetryIn).
func (a *Agent) loop(ctx context.Context, s Scheduled) {
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	trig := a.triggers[s.Check.Name()]
	r, _ := s.Check.(check.Retrier)
	for {
		a.RunOnce(ctx, s)
		if r != nil {
			next := s.Interval
			if d := r.RetryIn(); d > 0 && d < next {
				next = d
			}
			t.Reset(next)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-trig:
			t.Reset(s.Interval)
		}
	}
}

// Trigger asks the named check ("" for every check) to run now, besides
// its schedule (the conformance check's "on request": SIGUSR1 to
// faultline-agent, or POST /checks/<name>/run on its local endpoint). It
// never blocks: a request while one is pending is the same request. It
// reports whether such a check runs.
func (a *Agent) Trigger(name string) bool {
	found := false
	for n, ch := range a.triggers {
		if name != "" && n != name {
			continue
		}
		found = true
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	return found
}

// requestRun is Trigger for one check asked over HTTP (POST
// /checks/<name>/run), which anyone who reaches metrics_addr can send: it
// is refused while the check ran (started or ended) or was last asked to
// less than min_trigger_interval ago, or its own interval where shorter.
// It reports whether such a check runs, the least gap between requests
// and, when refused, how long until a request is taken.
func (a *Agent) requestRun(name string) (found bool, gap, wait time.Duration) {
	i := slices.IndexFunc(a.checks, func(s Scheduled) bool { return s.Check.Name() == name })
	if i < 0 {
		return false, 0, 0
	}
	gap = min(a.cfg.MinTriggerInterval, a.checks[i].Interval)
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if last, ok := a.recent[name]; ok && gap > 0 {
		if wait = last.Add(gap).Sub(now); wait > 0 {
			return true, gap, wait
		}
	}
	a.recent[name] = now
	return a.Trigger(name), gap, 0
}

// RunOnce calls one check once with its deadline and recovery, records the
// metrics, stamps and spools the events. Events the spool cannot take are
// kept, in memory, and spooled first: the check's state in memory has
// moved past them, and it would not report them again. On a failing disk
// the check's next run waits for them. A spool that refuses them for
// capacity (full, or past its 90% mark for a non-fatal event) does not
// hold the check up: it runs on, its new events kept behind the refused
// ones (spoolKept), its fatal ones spooled ahead of them; past keptMax
// bytes the oldest non-fatal unhealthy ones are dropped, and where its
// fatal and healthy ones alone pass it, it waits (boundKept). Before, it
// waited too, and a check that had a non-fatal event refused (kmsg's
// non-fatal Xids ahead of a fatal one) stopped until the backlog dropped
// below 80%: /dev/kmsg overwrote its fatal Xid unread, and the room kept
// for fatal events served nothing. The check's state is committed only
// once none of its events is kept: a restart before reports them again.
func (a *Agent) RunOnce(ctx context.Context, s Scheduled) {
	name := s.Check.Name()
	if !a.spoolUnspooled(s) {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	start := a.now()
	a.mu.Lock()
	a.recent[name] = start
	a.mu.Unlock()
	evs, err := safeCheck(cctx, s.Check)
	dur := a.now().Sub(start)
	result := "ok"
	switch {
	case errors.Is(err, errPanic):
		result = "panic"
	case err != nil && cctx.Err() != nil:
		result = "timeout"
	case err != nil:
		result = "error"
	}
	a.m.checkRuns.WithLabelValues(name, result).Inc()
	a.m.checkDuration.WithLabelValues(name).Set(dur.Seconds())
	if err != nil {
		a.m.checkSuccess.WithLabelValues(name).Set(0)
		a.log.Error("check failed", "check", name, "result", result, "err", err)
	} else {
		a.m.checkSuccess.WithLabelValues(name).Set(1)
	}
	a.mu.Lock()
	a.lastRun[name] = a.now()
	a.recent[name] = a.lastRun[name]
	a.mu.Unlock()
	evs = dropNil(evs, name, a.log)
	if len(evs) > 0 {
		a.m.checkEvents.WithLabelValues(name).Add(float64(len(evs)))
		a.stamp(name, evs)
		a.attachGPUPods(ctx, evs)
		for _, ev := range evs {
			a.log.Info("event", "check", name, "checkName", ev.GetCheckName(), "fatal", ev.GetIsFatal(), "healthy", ev.GetIsHealthy(), "message", ev.GetMessage())
		}
	}
	// A full spool refuses the events after the first that does not fit,
	// without an error: those are kept like a failing disk's, and the
	// state is not committed.
	if kept, over, err := a.spoolKept(name, evs); kept > 0 {
		switch {
		case err != nil:
			a.log.Error("events not spooled; kept for the check's next run, its state not saved", "check", name, "events", kept, "err", err)
		case over:
			a.log.Warn("spool full: the check's kept fatal and healthy events pass what the agent keeps in memory; the check waits for the spool, its state not saved",
				"check", name, "events", kept, "max_bytes", a.keptMax)
		case len(evs) > 0:
			a.log.Warn("spool full: events kept for the spool, the check's state not saved", "check", name, "events", kept)
		}
		return
	}
	if result != "panic" {
		a.commit(s)
	}
}

// spoolUnspooled spools the events of the check's earlier runs that the
// spool did not take, then, once none is left, commits the check's state;
// it reports whether the check may run: not while the disk fails, nor
// while its kept events are more than keptMax bytes of fatal and healthy
// ones, which are never dropped.
func (a *Agent) spoolUnspooled(s Scheduled) bool {
	name := s.Check.Name()
	a.mu.Lock()
	before := len(a.unspooled[name])
	a.mu.Unlock()
	if before == 0 {
		return true
	}
	kept, over, err := a.spoolKept(name, nil)
	switch {
	case err != nil || over:
		if err != nil {
			a.log.Error("events still not spooled; the check waits for the spool", "check", name, "events", kept, "err", err)
		} // past keptMax: logged once, when the check's run kept them
		a.mu.Lock()
		a.lastRun[name] = a.now() // waiting for the disk or the spool, not wedged
		a.mu.Unlock()
		return false
	case kept == 0:
		a.log.Info("events spooled at last", "check", name, "events", before)
		a.commit(s)
	} // a full spool's refusal: its episode is logged once, by the spool
	return true
}

// maxKeptBytes bounds the encoded events one check keeps for a spool that
// refuses them (1 MiB: thousands of kmsg events; the agent's memory limit
// is 128 MiB).
const maxKeptBytes = 1 << 20

// keptEvent is an event of a check that the spool has not taken yet.
type keptEvent struct {
	ev      *datamodels.HealthEvent
	refused bool // the spool refused it before: its refusal was counted then
}

// spoolKept offers the spool the check's kept events, then fresh (its
// run's new ones), in order. Where the spool refuses one for capacity, it
// offers it the fatal events after it, whose room (the spool's last 10%)
// the refused non-fatal ones cannot take: those are spooled ahead of them
// (a recovery the gateway receives after a newer fault lifts nothing:
// quarantine compares their generatedTimestamps). What the spool did not
// take is kept, up to keptMax bytes: past it the oldest non-fatal
// unhealthy events are dropped (boundKept), never on a failing disk (the
// check waits for it: the queue holds one run at most). It returns how
// many events are kept, whether they are still more than keptMax bytes
// (fatal and healthy ones: the check waits), and the error of a spool
// that could not write.
func (a *Agent) spoolKept(name string, fresh []*datamodels.HealthEvent) (int, bool, error) {
	a.mu.Lock()
	q := a.unspooled[name]
	a.mu.Unlock()
	for _, ev := range fresh {
		q = append(q, &keptEvent{ev: ev})
	}
	n, err := a.offer(q)
	q = q[n:]
	if err == nil && len(q) > 0 {
		q, err = a.spoolFatalAhead(name, q)
	}
	over := false
	if err == nil {
		q, over = a.boundKept(name, q)
	}
	a.mu.Lock()
	if len(q) == 0 {
		delete(a.unspooled, name)
	} else {
		a.unspooled[name] = q
	}
	a.mu.Unlock()
	return len(q), over, err
}

// offer appends q's events, in order, up to the first the spool refuses;
// each one the spool refused before through AppendAgain (not counted
// again), the others through Append. It returns how many were spooled,
// and marks the ones refused.
func (a *Agent) offer(q []*keptEvent) (int, error) {
	n := 0
	for n < len(q) {
		j := n + 1
		for j < len(q) && q[j].refused == q[n].refused {
			j++
		}
		evs := make([]*datamodels.HealthEvent, 0, j-n)
		for _, k := range q[n:j] {
			evs = append(evs, k.ev)
		}
		var took int
		var err error
		if q[n].refused {
			took, err = a.spool.AppendAgain(evs)
		} else {
			took, err = a.spool.Append(evs)
		}
		if err != nil {
			return n, err
		}
		for _, k := range q[n+took : j] {
			k.refused = true // Append counted every event after the first refused
		}
		if n += took; n < j {
			return n, nil
		}
	}
	return n, nil
}

// spoolFatalAhead offers the spool the fatal events of q (its first event
// refused), in order, and returns q without those it took.
func (a *Agent) spoolFatalAhead(name string, q []*keptEvent) ([]*keptEvent, error) {
	var fatal []*keptEvent
	for _, k := range q {
		if k.ev.GetIsFatal() {
			fatal = append(fatal, k)
		}
	}
	if len(fatal) == 0 {
		return q, nil
	}
	n, err := a.offer(fatal)
	if n == 0 {
		return q, err
	}
	rest := make([]*keptEvent, 0, len(q)-n)
	for _, k := range q {
		if !k.ev.GetIsFatal() || !slices.Contains(fatal[:n], k) {
			rest = append(rest, k)
		}
	}
	a.log.Warn("spool full: fatal events spooled ahead of the check's kept non-fatal ones", "check", name, "fatal", n, "kept", len(rest))
	return rest, err
}

// boundKept drops the oldest non-fatal unhealthy events of q while they
// are more than keptMax bytes; it reports whether q is still more. A
// fatal event (a fault) and a healthy one (the recovery that lifts a
// fault) are never dropped: the check's state moved past them, so it would
// not report them again. Where dropping every non-fatal unhealthy event
// would not bring q to keptMax, none is dropped: the check waits for the
// spool (spoolUnspooled), q growing no more.
func (a *Agent) boundKept(name string, q []*keptEvent) ([]*keptEvent, bool) {
	size, droppable := 0, 0
	sizes := make([]int, len(q))
	for i, k := range q {
		sizes[i] = proto.Size(k.ev)
		size += sizes[i]
		if mayDrop(k.ev) {
			droppable += sizes[i]
		}
	}
	if size <= a.keptMax {
		return q, false
	}
	if size-droppable > a.keptMax {
		return q, true
	}
	rest := make([]*keptEvent, 0, len(q))
	dropped := 0
	for i, k := range q {
		if size > a.keptMax && mayDrop(k.ev) {
			size -= sizes[i]
			dropped++
			continue
		}
		rest = append(rest, k)
	}
	a.m.keptDropped.WithLabelValues(name).Add(float64(dropped))
	a.log.Error("spool full: the check's oldest kept non-fatal events dropped, more than the agent keeps in memory for the spool",
		"check", name, "dropped", dropped, "kept", len(rest), "max_bytes", a.keptMax)
	return rest, false
}

// mayDrop reports whether boundKept may drop ev: a non-fatal unhealthy
// event.
func mayDrop(ev *datamodels.HealthEvent) bool {
	return !ev.GetIsFatal() && !ev.GetIsHealthy()
}

// dropNil removes the nil events a check returned (a bug in the check),
// with a warning naming it: stamping one would panic outside the check's
// recovery and take the whole agent down.
func dropNil(evs []*datamodels.HealthEvent, name string, log *slog.Logger) []*datamodels.HealthEvent {
	if !slices.Contains(evs, nil) {
		return evs
	}
	out := make([]*datamodels.HealthEvent, 0, len(evs))
	for _, ev := range evs {
		if ev != nil {
			out = append(out, ev)
		}
	}
	log.Warn("check returned nil events; dropped", "check", name, "nil_events", len(evs)-len(out))
	return out
}

// commit saves the check's state (check.Committer), once its events are
// in the spool.
func (a *Agent) commit(s Scheduled) {
	if c, ok := s.Check.(check.Committer); ok {
		if err := c.Commit(); err != nil {
			a.log.Warn("check state not saved", "check", s.Check.Name(), "err", err)
		}
	}
}

func (a *Agent) stamp(name string, evs []*datamodels.HealthEvent) {
	ps := datamodels.ProcessingStrategy(datamodels.ProcessingStrategy_value[a.cfg.ProcessingStrategy])
	now := timestamppb.New(a.now())
	for _, ev := range evs {
		if ev.NodeName == "" {
			ev.NodeName = a.cfg.NodeName
		}
		if ev.Agent == "" {
			ev.Agent = "faultline-agent/" + name
		}
		if ev.GeneratedTimestamp == nil {
			ev.GeneratedTimestamp = now
		}
		if ev.ProcessingStrategy == datamodels.ProcessingStrategy_UNSPECIFIED {
			ev.ProcessingStrategy = ps
		}
		events.SetSystemUUID(ev, a.machine, validate.MaxMetadata)
		validate.Clean(ev, now.AsTime()) // whatever a check read, the gateway takes it
	}
}

// systemUUID reads the machine's system UUID from sysfs's DMI class
// (prometheus/procfs): "" where it cannot (the file is root's alone; no
// DMI, as on some Arm servers) or what it holds is no UUID (longer than
// maxSystemUUID, or other than hex digits and dashes: stamped on relayed
// events before they are validated, it would have every call refused),
// said once at start.
func systemUUID(sysfsPath string, log *slog.Logger) string {
	var uuid string
	fs, err := sysfs.NewFS(sysfsPath)
	if err == nil {
		var dmi *sysfs.DMIClass
		if dmi, err = fs.DMIClass(); err == nil && dmi.ProductUUID != nil {
			uuid = strings.TrimSpace(*dmi.ProductUUID)
		}
	}
	if uuid != "" && (len(uuid) > maxSystemUUID || strings.Trim(uuid, "0123456789abcdefABCDEF-") != "") {
		err = fmt.Errorf("product_uuid %q is not a UUID", validate.Short(uuid))
		uuid = ""
	}
	if uuid == "" {
		log.Info("the machine's system UUID is not known: events carry none, and a Node kept across a machine swap cannot tell the earlier machine's late events apart",
			"file", filepath.Join(sysfsPath, "class/dmi/id/product_uuid"), "err", err)
	}
	return uuid
}

// maxSystemUUID bounds what product_uuid may hold (a UUID is 36).
const maxSystemUUID = 64

// attachGPUPods adds events.MetaGPUPods (and MetaGPUPodsAt) to the
// unhealthy events about GPUs: the pods holding those GPUs, when the
// kubelet can say (see podres). A kubelet that does not answer, or an
// event without room for two more metadata keys, costs the events nothing
// but this metadata.
func (a *Agent) attachGPUPods(ctx context.Context, evs []*datamodels.HealthEvent) {
	if a.podres == nil {
		return
	}
	var (
		alloc  podres.Allocations
		listed bool
	)
	for i, ev := range evs {
		var gpus []string
		for _, e := range ev.GetEntitiesImpacted() {
			if e.GetEntityType() == events.EntityGPU {
				gpus = append(gpus, e.GetEntityValue())
			}
		}
		if len(gpus) == 0 || ev.GetIsHealthy() {
			continue
		}
		if !listed {
			var err error
			listed = true
			if alloc, err = a.podres.Allocations(ctx, a.now()); err != nil {
				a.mu.Lock()
				if err.Error() != a.podresErr {
					a.podresErr = err.Error()
					a.log.Warn("GPU pods unknown", "events", len(evs)-i, "err", err)
				}
				a.mu.Unlock()
				return
			}
		}
		pods, known := alloc.Pods(gpus)
		v := strings.Join(pods, ",")
		if !known || len(v) > maxGPUPods {
			continue // unknown: the drain evicts every pod that may use the GPU
		}
		if _, ok := ev.Metadata[events.MetaGPUPods]; !ok && len(ev.Metadata)+2 > validate.MaxMetadata {
			continue // no room: the gateway would refuse the event, so it goes as unknown
		}
		if ev.Metadata == nil {
			ev.Metadata = map[string]string{}
		}
		ev.Metadata[events.MetaGPUPods] = v
		ev.Metadata[events.MetaGPUPodsAt] = alloc.At.UTC().Format(time.RFC3339Nano)
	}
}

var errPanic = errors.New("check panicked")

func safeCheck(ctx context.Context, c check.Check) (evs []*datamodels.HealthEvent, err error) {
	defer func() {
		if r := recover(); r != nil {
			evs, err = nil, fmt.Errorf("%w: %v", errPanic, r)
		}
	}()
	return c.Check(ctx)
}

// Handler serves /metrics and /healthz. /healthz answers 503 naming the
// checks that have not completed a run within 3 intervals plus their
// timeout (a wedged loop), else 200 "ok". POST /checks/<name>/run asks the
// check to run now (202), unless it ran or was asked to too recently
// (429 with Retry-After; requestRun).
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("POST /checks/{name}/run", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		found, gap, wait := a.requestRun(name)
		if !found {
			http.Error(w, "no such check running: "+name, http.StatusNotFound)
			return
		}
		if wait > 0 {
			secs := int64((wait + time.Second - 1) / time.Second)
			a.log.Debug("check run request refused: too soon", "check", name, "from", r.RemoteAddr, "retry_after_s", secs)
			w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
			http.Error(w, fmt.Sprintf("check %s ran or was requested less than %v ago (min_trigger_interval, or its interval where shorter): retry in %ds",
				name, gap, secs), http.StatusTooManyRequests)
			return
		}
		a.log.Info("check run requested", "check", name, "from", r.RemoteAddr)
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte("requested\n"))
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		now := a.now()
		var stale []string
		a.mu.Lock()
		for _, s := range a.checks {
			limit := 3*s.Interval + s.Timeout
			last, ok := a.lastRun[s.Check.Name()]
			if !ok {
				last = a.started
			}
			if now.Sub(last) > limit {
				stale = append(stale, s.Check.Name())
			}
		}
		a.mu.Unlock()
		if len(stale) > 0 {
			http.Error(w, "stale checks: "+strings.Join(stale, ","), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// gpuPods is the local action endpoint's PodLister: nil only when
// pod-resources is off (pod_resources_socket "").
func (a *Agent) gpuPods() localaction.PodLister {
	if a.podres == nil {
		return nil
	}
	return podLister{a.podres}
}

// podLister answers the local action endpoint's question from the
// kubelet's pod-resources API: which pods hold these GPUs. A device plugin
// that does not name GPUs by UUID cannot say: that is an error (the reset
// waits, then fails GPUInUse), never "none".
type podLister struct{ l *podres.Lister }

func (p podLister) PodsOf(ctx context.Context, gpus []string) ([]string, error) {
	alloc, err := p.l.Allocations(ctx, time.Now())
	if err != nil {
		return nil, err
	}
	pods, known := alloc.Pods(gpus)
	if !known {
		return nil, errors.New("the device plugin does not name GPUs by UUID: which pods hold them is not known")
	}
	return pods, nil
}
