// Package report delivers a preflight check's HealthEvents, through the
// node agent's relay socket (Config.RelaySocket) or, on the legacy path,
// to the gateway directly.
//
// Through the relay (agents/relay), a run sends its events to the agent on
// its node, whose answer means they are in the agent's spool (fsync'd);
// the agent delivers them with its own credential, bound to its node, and
// refuses events for any other node. The check needs no gateway token, and
// no spool of its own: what the agent did not take by the drain timeout is
// lost (FlushResult.Lost) and the run exits non-zero for the kubelet to run
// it again.
//
// To the gateway (the legacy path: the token is then one every node's
// checks share, a cluster-wide credential in tenants' namespaces), a run
// sends with the node agent's durable spool and sender (agents/agent):
// events are fsync'd to a spool on the node before anything is sent, sent oldest first
// until the gateway returned ids for them, and whatever a run could not
// deliver within its drain timeout stays on disk for the next run on the
// node to send. Nothing accepted is lost when the gateway is briefly down.
//
// Check runs are short-lived init containers, several of which can run on
// one node at once (one per pod), so each run spools into its own
// directory under the configured root, locked with flock(2) while the run
// lives (from before it is in view under its name). A run also adopts the
// directories of earlier runs that left events behind (unlocked: their
// process is gone), sends those before its own, oldest run first, and
// removes directories it emptied. Checks run as the pods' users: the root
// is 1777 (sticky), and a run opens the directory it leaves events in to
// every UID, so that a run of any user adopts it. A run that cannot open
// a spool at all reports directly (Direct).
package report

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/faultline/faultline/agents/agent"
	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/internal/unixsock"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/validate"
)

// SpoolConfig is where and how long a run keeps undelivered events.
type SpoolConfig struct {
	// Dir is the root of the per-run spools, on the node (a hostPath) so
	// that a later run can send what this one could not (default
	// "/var/lib/faultline-preflight/spool").
	Dir string `toml:"dir"`
	// MaxBytes caps one run's spool (default 4 MiB).
	MaxBytes int64 `toml:"max_bytes"`
	// DrainTimeout is how long a run waits for the gateway to take its
	// events (and those it adopted) before exiting with them spooled, or,
	// with RelaySocket, for the agent's relay to take them (default 60s).
	DrainTimeout time.Duration `toml:"drain_timeout"`
}

// Config is the reporting part of a check's configuration.
type Config struct {
	// RelaySocket is the node agent's relay socket (agents/relay; the
	// agent's nvsentinel_socket) as mounted in the check: when set, events
	// go through the agent, with its node-bound credential, and the
	// gateway and spool keys are not used ("", the default: the gateway
	// directly, with the token in gateway.token_file).
	RelaySocket string              `toml:"relay_socket"`
	Gateway     agent.GatewayConfig `toml:"gateway"`
	Spool       SpoolConfig         `toml:"spool"`
}

// DefaultConfig returns the defaults documented on the fields: TLS to
// "faultline-gateway.faultline.svc:50051", the bearer token in
// "/var/run/secrets/faultline-preflight/token".
func DefaultConfig() Config {
	return Config{
		Gateway: agent.GatewayConfig{Addr: "faultline-gateway.faultline.svc:50051",
			TokenFile: "/var/run/secrets/faultline-preflight/token",
			Timeout:   10 * time.Second, BatchSize: 500, MaxBackoff: 5 * time.Second},
		Spool: SpoolConfig{Dir: "/var/lib/faultline-preflight/spool", MaxBytes: 4 << 20, DrainTimeout: 60 * time.Second},
	}
}

// RegisterFlags adds --gateway.* and --spool.* flags bound to c.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	g := &c.Gateway
	fs.StringVar(&c.RelaySocket, "relay-socket", c.RelaySocket, "the node agent's relay socket: send through the agent instead of the gateway (no token)")
	fs.StringVar(&g.Addr, "gateway.addr", g.Addr, "gateway gRPC address")
	fs.StringVar(&g.TokenFile, "gateway.token-file", g.TokenFile, "file holding the bearer token (re-read before each send, never logged)")
	fs.BoolVar(&g.Insecure, "gateway.insecure", g.Insecure, "send WITHOUT TLS: token and events in clear; for a local or test gateway only")
	fs.StringVar(&g.CAFile, "gateway.ca-file", g.CAFile, "PEM CA bundle that signs the gateway's certificate (default: system roots)")
	fs.StringVar(&g.ServerName, "gateway.server-name", g.ServerName, "name verified in the gateway's certificate (default: from gateway.addr)")
	fs.StringVar(&g.CertFile, "gateway.cert-file", g.CertFile, "PEM client certificate (mutual TLS)")
	fs.StringVar(&g.KeyFile, "gateway.key-file", g.KeyFile, "PEM key of the client certificate")
	fs.DurationVar(&g.Timeout, "gateway.timeout", g.Timeout, "one SubmitEvents call")
	fs.IntVar(&g.BatchSize, "gateway.batch-size", g.BatchSize, "most events per SubmitEvents call")
	fs.DurationVar(&g.MaxBackoff, "gateway.max-backoff", g.MaxBackoff, "retry backoff cap")
	fs.StringVar(&c.Spool.Dir, "spool.dir", c.Spool.Dir, "root of the per-run spools (a directory on the node)")
	fs.Int64Var(&c.Spool.MaxBytes, "spool.max-bytes", c.Spool.MaxBytes, "one run's spool capacity in bytes")
	fs.DurationVar(&c.Spool.DrainTimeout, "spool.drain-timeout", c.Spool.DrainTimeout, "how long to wait for the gateway (or the relay) before exiting with events spooled")
}

// Validate names the first bad key. Without relay_socket, the token file
// must hold a token; its content is read as a config.Secret and never
// printed.
func (c *Config) Validate() error {
	if c.RelaySocket != "" {
		if err := c.ValidateRelaySocket(); err != nil {
			return err
		}
		return c.Spool.Validate()
	}
	if err := c.Gateway.Validate(); err != nil {
		return err
	}
	if c.Gateway.TokenFile != "" {
		if _, err := config.ReadSecret(c.Gateway.TokenFile, ""); err != nil {
			return fmt.Errorf("gateway.token_file: %w", err)
		}
	}
	return c.Spool.Validate()
}

// ValidateRelaySocket checks relay_socket ("" is valid: off).
func (c *Config) ValidateRelaySocket() error {
	switch {
	case c.RelaySocket == "":
		return nil
	case !filepath.IsAbs(c.RelaySocket):
		return fmt.Errorf("relay_socket: %q is not an absolute path", c.RelaySocket)
	case len(c.RelaySocket) > unixsock.MaxPath:
		return fmt.Errorf("relay_socket: %q is longer than a unix socket's path may be (%d bytes)", c.RelaySocket, unixsock.MaxPath)
	}
	return nil
}

// Validate names the first bad spool key.
func (s SpoolConfig) Validate() error {
	if s.Dir == "" {
		return errors.New("spool.dir: must be set")
	}
	if s.MaxBytes < 64<<10 {
		return fmt.Errorf("spool.max_bytes: %d is below 64 KiB", s.MaxBytes)
	}
	if s.DrainTimeout <= 0 {
		return errors.New("spool.drain_timeout: must be positive")
	}
	return nil
}

// Reporter spools a run's events and sends them, with those earlier runs
// left behind.
type Reporter struct {
	cfg   Config
	log   *slog.Logger
	m     *agent.Metrics
	dir   string // "" without a spool (Direct)
	start int64  // when the run opened, unix ns: its place among the runs
	lock  *os.File
	spool *agent.Spool // nil without a spool (Direct)
	// unspooled are the events Report could not spool, for Flush to send
	// directly (with cfg.RelaySocket, all of them, for the relay).
	unspooled []*datamodels.HealthEvent
}

// Open creates this run's spool directory under cfg.Spool.Dir and locks it.
// The root is made world-writable and sticky (1777) when this run owns it,
// so that runs of every UID on the node can make their directories there
// and none can remove or rename another's. An error means no spool: the
// caller reports with Direct instead.
//
// With cfg.RelaySocket the run has no spool of its own (the agent's
// holds what it takes): Open returns Direct's Reporter, which sends
// through the relay.
func Open(cfg Config, log *slog.Logger) (*Reporter, error) {
	if cfg.RelaySocket != "" {
		return Direct(cfg, log), nil
	}
	if err := openRoot(cfg.Spool.Dir); err != nil {
		return nil, fmt.Errorf("spool.dir: %w", err)
	}
	start := time.Now().UnixNano()
	name := fmt.Sprintf("run-%d-%d", start, os.Getpid())
	dir := filepath.Join(cfg.Spool.Dir, name)
	// Made under a name Flush passes over (newPrefix) and locked before
	// it is renamed into view: another run's Flush never finds a live
	// run's directory unlocked, to adopt, find empty and remove.
	tmp := filepath.Join(cfg.Spool.Dir, newPrefix+name)
	if err := os.Mkdir(tmp, 0o750); err != nil {
		return nil, fmt.Errorf("spool.dir: %w", err)
	}
	lock, err := lockDir(tmp, false)
	if err != nil {
		_ = os.RemoveAll(tmp)
		return nil, fmt.Errorf("spool.dir: lock %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		removeLocked(tmp, lock)
		return nil, fmt.Errorf("spool.dir: %w", err)
	}
	m := agent.NewMetrics()
	sp, err := agent.OpenSpool(dir, cfg.Spool.MaxBytes, log, m)
	if err != nil {
		removeLocked(dir, lock)
		return nil, err
	}
	return &Reporter{cfg: cfg, log: log, m: m, dir: dir, start: start, lock: lock, spool: sp}, nil
}

// Direct returns a Reporter without a spool, for a run whose spool could
// not be opened (Open's error): Report keeps the events and Flush sends
// them directly, after any earlier run's events it can adopt. What the
// gateway did not take by the drain timeout is lost (FlushResult.Lost).
func Direct(cfg Config, log *slog.Logger) *Reporter {
	return &Reporter{cfg: cfg, log: log, m: agent.NewMetrics(), start: time.Now().UnixNano()}
}

// openRoot creates the spool root, world-writable and sticky when this
// process owns it (it made it, or it runs as the owner).
func openRoot(root string) error {
	if err := os.MkdirAll(root, 0o750); err != nil {
		return err
	}
	info, err := os.Stat(root)
	if err != nil {
		return err
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok && int(st.Uid) == os.Geteuid() && info.Mode()&(os.ModePerm|os.ModeSticky) != rootMode {
		if err := os.Chmod(root, rootMode); err != nil {
			return err
		}
	}
	return nil
}

// rootMode is the spool root's: every UID makes its runs' directories
// there, none removes or renames another's.
const rootMode = os.ModeSticky | 0o777

// Dir is this run's spool directory; "" without a spool (Direct).
func (r *Reporter) Dir() string { return r.dir }

// Report appends events durably (fsync'd), all or none; with
// cfg.RelaySocket it keeps them for Flush to send through the relay. Events the spool
// refuses (full, or the node's disk failing) are an error, and are kept
// for Flush to send directly: a check's result is never dropped silently.
// Their text, read from the tools' output, is made one the gateway takes
// first (validate.Clean): an event it refused would be dropped from the
// spool.
func (r *Reporter) Report(evs []*datamodels.HealthEvent) error {
	now := time.Now()
	for _, ev := range evs {
		validate.Clean(ev, now)
		if ev.Id == "" {
			// The idempotency key, as the spool gives it: an event both
			// spooled and sent directly is stored once.
			ev.Id = events.NewID()
		}
	}
	if r.spool == nil {
		r.unspooled = append(r.unspooled, evs...)
		return nil
	}
	if err := r.spool.AppendAll(evs); err != nil {
		r.unspooled = append(r.unspooled, evs...)
		return fmt.Errorf("spool: %w; Flush sends the %d events directly", err, len(evs))
	}
	return nil
}

// FlushResult says what a Flush delivered.
type FlushResult struct {
	// Adopted is the number of earlier runs' spools this run sent from.
	Adopted int
	// Pending is the bytes still spooled (this run's and adopted) when
	// Flush returned: 0 means everything spooled reached the gateway.
	Pending int64
	// Lost is the number of events Report could not spool that did not
	// reach the gateway either: no later run sends them.
	Lost int
	// NoAgent: with RelaySocket, the socket never existed by the drain
	// timeout: the node has no agent (Lost counts the events).
	NoAgent bool
}

// Flush sends this run's events and any earlier run left behind until all
// are delivered, the drain timeout passes or ctx ends: one run's after
// another, in the order the runs started, each only once the gateway took
// every event of the runs before it. What it has not reached stays
// spooled, for the next run to send in the same order.
//
// With cfg.RelaySocket it sends this run's events to the agent's relay
// instead, and adopts nothing.
func (r *Reporter) Flush(ctx context.Context) FlushResult {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Spool.DrainTimeout)
	defer cancel()
	if r.cfg.RelaySocket != "" {
		lost, noAgent := r.sendRelay(ctx, r.unspooled)
		r.unspooled = nil
		return FlushResult{Lost: lost, NoAgent: noAgent}
	}
	type job struct {
		dir   string
		spool *agent.Spool
		start int64
		lock  *os.File
		own   bool
	}
	jobs := []job{{dir: r.dir, start: r.start, spool: r.spool, own: true}}
	res := FlushResult{}
	ents, _ := os.ReadDir(r.cfg.Spool.Dir)
	for _, e := range ents {
		dir := filepath.Join(r.cfg.Spool.Dir, e.Name())
		if e.IsDir() && strings.HasPrefix(e.Name(), newPrefix) {
			// A run that died before its directory was renamed into view
			// spooled nothing there; one younger than a minute may be
			// starting (not yet locked).
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Minute {
				if lock, err := lockDir(dir, true); err == nil {
					removeLocked(dir, lock)
				}
			}
			continue
		}
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "run-") {
			continue
		}
		if dir == r.dir {
			continue
		}
		lock, err := lockDir(dir, true)
		if errors.Is(err, fs.ErrPermission) {
			// Another UID's directory: a live run's (0750 while it runs),
			// or one a run of that UID left when it was killed before
			// Close shared it. Not held back for: a live run of another
			// pod would delay this run's results, failures included. A
			// killed run's events reach the gateway when a run of its UID
			// (or root) comes, after this run's: an old failure may then
			// land after this pass (README, "Runs as the pod's user").
			r.log.Warn("cannot open another user's spool directory: its events, if it was left by a killed run, are sent by a later run of that user, after this run's", "dir", dir, "err", err)
			continue
		}
		if err != nil {
			continue // a live run holds it
		}
		sp, err := agent.OpenSpool(dir, r.cfg.Spool.MaxBytes, r.log, r.m)
		if err != nil {
			r.log.Warn("cannot open an earlier run's spool; leaving it", "dir", dir, "err", err)
			lock.Close()
			continue
		}
		if sp.Pending() == 0 {
			sp.Close()
			removeLocked(dir, lock)
			continue
		}
		r.log.Info("sending events an earlier run left spooled", "dir", dir, "bytes", sp.Pending())
		res.Adopted++
		jobs = append(jobs, job{dir: dir, start: runStart(dir), spool: sp, lock: lock})
	}
	// One run after another, oldest first, each only once the gateway took
	// every event of the runs before it: a run that failed while the
	// gateway was down, and a later run that passed, would otherwise race,
	// and the older failure landing last would quarantine the node the
	// newer pass had cleared (a cordoned node gets no pod to run the check
	// again). The older failure still reaches the gateway, before the pass.
	slices.SortStableFunc(jobs, func(a, b job) int { return cmp.Compare(a.start, b.start) })
	reached := false // this run's turn came
	for _, j := range jobs {
		ok := true
		if j.own && len(r.unspooled) > 0 {
			// The events the spool refused go with this run's spool.
			lost := make(chan int)
			go func() { lost <- r.sendUnspooled(ctx) }()
			ok = r.drain(ctx, j.spool)
			res.Lost = <-lost
		} else {
			ok = r.drain(ctx, j.spool)
		}
		reached = reached || j.own
		if !ok {
			break // what is newer waits for the next run
		}
	}
	if !reached && len(r.unspooled) > 0 {
		r.log.Error("earlier runs' events were not all delivered in time; this run's events that could not be spooled were not sent after them",
			"events", len(r.unspooled))
		res.Lost = len(r.unspooled)
	}
	for _, j := range jobs {
		if j.own {
			if j.spool != nil {
				res.Pending += j.spool.Pending()
			}
			continue
		}
		res.Pending += j.spool.Pending()
		empty := j.spool.Pending() == 0
		j.spool.Close()
		if empty {
			removeLocked(j.dir, j.lock)
		} else {
			share(j.dir) // the cursor this run wrote
			j.lock.Close()
		}
	}
	return res
}

// drain sends a spool's events until the gateway took them all (true),
// the sender cannot be built, or ctx ends.
func (r *Reporter) drain(ctx context.Context, sp *agent.Spool) bool {
	if sp == nil || sp.Pending() == 0 {
		return true
	}
	s, err := agent.NewSender(r.cfg.Gateway, sp, r.log, r.m)
	if err != nil {
		r.log.Error("cannot build the gateway sender; events stay spooled", "err", err)
		return false
	}
	defer s.Close()
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(sctx) }()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for sp.Pending() > 0 && sctx.Err() == nil {
		select {
		case <-sctx.Done():
		case <-t.C:
		}
	}
	cancel()
	<-done
	return sp.Pending() == 0
}

// runStart is when the run of a spool directory ("run-<unix ns>-<pid>")
// opened it; 0 when its name does not say.
func runStart(dir string) int64 {
	f := strings.Split(filepath.Base(dir), "-")
	if len(f) < 2 {
		return 0
	}
	ns, _ := strconv.ParseInt(f[1], 10, 64)
	return ns
}

// sendUnspooled sends the events Report could not spool, one per call (one
// may be what overflowed the spool), each retried with backoff until the
// gateway returned its id or ctx ends; it returns how many were not
// delivered. An event the gateway can never take (refused as invalid, or
// larger alone than it or a proxy in front of it takes) is not retried:
// it is logged, counted as not delivered, and the next one is sent.
func (r *Reporter) sendUnspooled(ctx context.Context) int {
	s, err := agent.NewSender(r.cfg.Gateway, nil, r.log, r.m)
	if err != nil {
		r.log.Error("cannot build the gateway sender for the events not spooled", "err", err)
		return len(r.unspooled)
	}
	defer s.Close()
	lost := 0
	backoff := 200 * time.Millisecond
	for len(r.unspooled) > 0 {
		ev := r.unspooled[0]
		err := s.Submit(ctx, r.unspooled[:1])
		switch {
		case err == nil:
			r.unspooled = r.unspooled[1:]
			continue
		case agent.Undeliverable(err):
			r.log.Error("gateway refused an event that could not be spooled as invalid or too large; it can never be delivered",
				"check", ev.GetCheckName(), "message", ev.GetMessage(), "bytes", ev.SizeVT(), "err", err)
			lost++
			r.unspooled = r.unspooled[1:]
			continue
		}
		r.log.Warn("sending the events not spooled failed; retrying", "events", len(r.unspooled), "err", err)
		select {
		case <-ctx.Done():
			return lost + len(r.unspooled)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, max(r.cfg.Gateway.MaxBackoff, 200*time.Millisecond))
	}
	return lost
}

// Close closes this run's spool; its directory is removed when empty and
// otherwise left (unlocked, and opened to every UID: share) for a later
// run to send.
func (r *Reporter) Close() error {
	if r.spool == nil {
		return nil
	}
	empty := r.spool.Pending() == 0
	err := r.spool.Close()
	if empty {
		removeLocked(r.dir, r.lock)
	} else {
		r.log.Warn("events left spooled for the next preflight run on this node", "dir", r.dir)
		share(r.dir)
		r.lock.Close()
	}
	return err
}

// share opens a spool directory a run leaves events in to the later runs
// of every UID (the checks run as the pods' users): the directory 0777,
// the files of it this process owns 0666, so that a later run can lock
// it, read the events, move the cursor and remove what it sent. Done
// while the lock is held; a live run's directory stays its own (0750).
// Anyone who could alter these events holds the gateway token the check
// sends with (legacy path only: the relay path has no spool), and could
// send any event for any node anyway.
func share(dir string) {
	_ = os.Chmod(dir, 0o777)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Type().IsRegular() {
			_ = os.Chmod(filepath.Join(dir, e.Name()), 0o666)
		}
	}
}

// newPrefix names a run's directory until it is locked (Open).
const newPrefix = ".new-"

// lockDir takes an exclusive flock on dir/.lock; with nonBlocking a held
// lock is an error instead of a wait.
func lockDir(dir string, nonBlocking bool) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o640)
	if err != nil {
		return nil, err
	}
	how := syscall.LOCK_EX
	if nonBlocking {
		how |= syscall.LOCK_NB
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, err
	}
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return f, nil
}

// removeLocked deletes a drained spool directory while holding its lock.
func removeLocked(dir string, lock *os.File) {
	_ = os.RemoveAll(dir)
	lock.Close()
}
