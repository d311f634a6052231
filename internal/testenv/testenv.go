// Package testenv starts real Kafka, ClickHouse, ZooKeeper and Kubernetes
// servers for integration tests, and runs SQL on chdb-core (a current
// ClickHouse engine in-process).
//
// Every server runs as a child process of the test binary, listens only on
// free 127.0.0.1 ports, keeps its data and logs in the test's temporary
// directory, and is stopped by t.Cleanup. When a test fails, the tail of each
// server's log is printed with the test output. A server that exits with an
// error without being stopped (a crash) is reported after those logs, on a
// line holding CrashMarker, with its crash lines.
//
// The binaries come from scripts/testenv/install.sh and are found through
// environment variables (set them with `eval "$(scripts/testenv/env.sh)"`),
// else in the default cache ${FAULTLINE_CACHE:-$HOME/.cache/faultline}:
//
//	FAULTLINE_KAFKA_LIBS       directory of Kafka broker jars
//	FAULTLINE_CLICKHOUSE_BIN   clickhouse-server (or the multi-call clickhouse) binary
//	FAULTLINE_ZOOKEEPER_LIBS   directory of ZooKeeper server jars
//	FAULTLINE_CHDB_PYTHON      python of a venv with chdb-core
//	FAULTLINE_KUBE_ASSETS      directory with etcd, kube-apiserver,
//	                           kube-controller-manager, kwok and stages/
//	FAULTLINE_JAVA             java binary (default: java on PATH)
//
// Under `go test -short` every test that starts a server is skipped. When a
// binary is missing the test is skipped with a message naming the install
// command, except when CI is set or FAULTLINE_REQUIRE_SERVERS=1: then it
// fails, so that CI never passes by skipping. Tests that start a server
// some other way (internal/chserver, faultline dev) call Server first.
//
// StartKafka(t, KafkaSecure()) adds SASL_SSL and mutual-TLS listeners with
// a generated CA; SharedSecureKafka shares one such broker among the tests
// of a binary whose TestMain calls Main. StartKafkaCluster starts a KRaft
// cluster of several brokers (SharedKafkaCluster shares one of three);
// StartClickHouseCluster starts a ZooKeeper and several ClickHouse servers
// with a sharded and a replicated cluster defined; RunChdb runs SQL steps
// on chdb-core and (*ClickHouse).RunSQLSteps the same steps on a server.
//
// Typical use:
//
//	func TestStore(t *testing.T) {
//		k := testenv.StartKafka(t)
//		ch := testenv.StartClickHouse(t)
//		db := ch.DB(t)
//		cl := k.Client(t, kgo.ConsumeTopics("events"))
//		...
//	}
package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Versions installed by scripts/testenv/install.sh; keep them in step.
const (
	// KafkaVersion is the Apache Kafka release whose jars are looked up in the cache.
	KafkaVersion = "4.1.1"
	// KubeVersion is the kube-apiserver release looked up in the cache.
	KubeVersion = "v1.34.4"
)

// installHint is printed when a server binary is missing.
const installHint = "scripts/testenv/install.sh"

// CacheDir returns ${FAULTLINE_CACHE:-$HOME/.cache/faultline}.
func CacheDir() string {
	if d := os.Getenv("FAULTLINE_CACHE"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "faultline-cache")
	}
	return filepath.Join(home, ".cache", "faultline")
}

// serversRequired reports whether a missing server must fail the test
// instead of skipping it: in CI, or when FAULTLINE_REQUIRE_SERVERS=1.
func serversRequired() bool {
	return os.Getenv("CI") != "" || os.Getenv("FAULTLINE_REQUIRE_SERVERS") == "1"
}

// verdict is what a test that needs a real server does.
type verdict int

const (
	run verdict = iota
	skip
	fail
)

// decide is the rule every server test follows: under -short it skips
// (make test-unit: the fast tests only); a server that is not installed
// skips it, or fails it when servers are required (CI,
// FAULTLINE_REQUIRE_SERVERS=1), so that CI never passes by skipping.
func decide(short, installed, required bool) verdict {
	switch {
	case short:
		return skip
	case installed:
		return run
	case required:
		return fail
	}
	return skip
}

// Server is what every test that starts a real server calls first (the
// Start functions of this package do): it skips the test under -short, and
// when installErr says the server is not installed it skips the test, or
// fails it when servers are required (CI, FAULTLINE_REQUIRE_SERVERS=1).
func Server(tb testing.TB, what string, installErr error) {
	tb.Helper()
	switch decide(testing.Short(), installErr == nil, serversRequired()) {
	case skip:
		if installErr == nil {
			tb.Skipf("testenv: -short: not starting %s", what)
		}
		tb.Skipf("testenv: %s: %v", what, installErr)
	case fail:
		tb.Fatalf("testenv: %s: %v (CI or FAULTLINE_REQUIRE_SERVERS=1: not skipping)", what, installErr)
	}
}

// missing skips (or, in CI, fails) the test because a server is not installed.
func missing(tb testing.TB, component, what string) {
	tb.Helper()
	Server(tb, component, fmt.Errorf("not installed (%s); run `%s %s` and `eval \"$(scripts/testenv/env.sh)\"`",
		what, installHint, component))
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(tb testing.TB) int {
	tb.Helper()
	return freePorts(tb, 1)[0]
}

// handedOut are the ports this test binary already gave to a server; the
// kernel may offer a just-closed port again, so they are never reused.
var (
	portsMu   sync.Mutex
	handedOut = map[int]bool{}
	portLocks []*os.File // held until the process exits
)

// freePorts returns n distinct free ports for servers.
//
// They come from below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), which outgoing connections
// never take: a port picked from the ephemeral range could be taken by any
// client socket (a Kafka client, a test's HTTP call) between the pick and
// the server's bind, which on a loaded machine happened ("Address already
// in use"). Each port is also claimed with an flock on a file in the temp
// dir, held while this process lives, so concurrent test binaries never
// pick the same one; and it must be bindable now.
func freePorts(tb testing.TB, n int) []int {
	tb.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	lo, hi := serverPortRange()
	lockDir := filepath.Join(os.TempDir(), "faultline-testenv-ports")
	if err := os.MkdirAll(lockDir, 0o777); err != nil {
		tb.Fatalf("testenv: port lock dir: %v", err)
	}
	var ports []int
	start := lo + int(time.Now().UnixNano()%int64(hi-lo))
	for i := 0; i < hi-lo && len(ports) < n; i++ {
		p := lo + (start-lo+i*7919)%(hi-lo) // a stride prime to the range walks it all
		if handedOut[p] || !claimPort(lockDir, p) {
			continue
		}
		handedOut[p] = true
		ports = append(ports, p)
	}
	if len(ports) < n {
		tb.Fatalf("testenv: no free port in %d-%d", lo, hi)
	}
	return ports
}

// claimPort takes the port's lock file and checks the port can be bound.
func claimPort(dir string, p int) bool {
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return false
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		f.Close()
		return false
	}
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
	if err != nil {
		f.Close()
		return false
	}
	l.Close()
	portLocks = append(portLocks, f)
	return true
}

// serverPortRange is [lo, hi): the ports below the ephemeral range, above
// the well-known and usual service ports.
func serverPortRange() (lo, hi int) {
	lo, hi = 20000, 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if eph, err := strconv.Atoi(f[0]); err == nil && eph > 12000 {
				hi = eph
				lo = max(10000, min(lo, hi-2000))
			}
		}
	}
	return lo, hi
}

// isExecutable reports whether path is a regular file with an execute bit.
func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// process is one server child process with its log file. It can be started
// again after it exits, with the same command line.
type process struct {
	name    string
	path    string
	args    []string
	env     []string
	dir     string
	logPath string

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{} // closed when cmd has exited
	err      error         // cmd.Wait result, valid after done is closed
	stopping bool          // stop signalled the current run
	crashes  []string      // runs that failed without stop: how and when
}

// start launches the process, appending its output to logPath.
func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("%s is already running", p.name)
		}
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open %s log: %w", p.name, err)
	}
	fmt.Fprintf(logf, "\n==== testenv: %s start %s: %s %s\n", p.name, time.Now().Format(time.RFC3339Nano), p.path, strings.Join(p.args, " "))
	cmd := exec.Command(p.path, p.args...)
	cmd.Dir = p.dir
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	// Own process group, so a signal reaches any children; and die with
	// the test binary if it is killed without running its cleanups.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.stopping = cmd, done, false
	go func() {
		err := cmd.Wait()
		at := time.Now().Format(time.RFC3339Nano)
		fmt.Fprintf(logf, "==== testenv: %s exited %s: %v\n", p.name, at, err)
		logf.Close()
		p.mu.Lock()
		p.err = err
		if err != nil && !p.stopping {
			p.crashes = append(p.crashes, fmt.Sprintf("%v at %s", err, at))
		}
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// pid is the process id while it runs, 0 otherwise.
func (p *process) pid() int {
	if !p.running() {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// running reports whether the process was started and has not exited.
func (p *process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// exited returns a channel closed when the current run exits, or nil if
// the process was never started.
func (p *process) exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// stop sends sig to the process group and waits up to grace for the exit,
// then kills it. It is a no-op when the process is not running.
func (p *process) stop(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	if cmd == nil {
		p.mu.Unlock()
		return
	}
	select {
	case <-done:
		p.mu.Unlock()
		return
	default:
	}
	p.stopping = true
	p.mu.Unlock()
	_ = syscall.Kill(-cmd.Process.Pid, sig)
	select {
	case <-done:
		return
	case <-time.After(grace):
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// exitErr describes how the process ended, for error messages.
func (p *process) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		return errors.New("exited with status 0")
	}
	return p.err
}

// logTail returns the last n lines of the process log (n <= 0: all).
func (p *process) logTail(n int) string { return p.logLines(n, nil) }

// logLines returns the last n lines of the process log that keep accepts
// (nil: every line; n <= 0: all of them).
func (p *process) logLines(n int, keep func(string) bool) string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	var ring []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		if keep != nil && !keep(sc.Text()) {
			continue
		}
		if n > 0 && len(ring) == n {
			ring = ring[1:]
		}
		ring = append(ring, sc.Text())
	}
	return strings.Join(ring, "\n")
}

// crashLine matches what a dying server writes: ClickHouse's fatal-signal
// report (BaseDaemon, with its stack), std::terminate, a JVM's fatal error.
var crashLine = regexp.MustCompile(`BaseDaemon|<Fatal>|Received signal|terminate called|Terminating|hs_err|OutOfMemoryError|==== testenv: `)

// CrashMarker begins the message testenv logs for each server that exited
// with an error on its own while a test ran; scripts/gotest.sh looks for it.
const CrashMarker = "testenv: server crashed:"

// crashWatch holds, per test, every process it started, so that one report
// of those that crashed prints after all the server logs.
var crashWatch sync.Map // testing.TB -> *watched

type watched struct {
	mu    sync.Mutex
	procs []*process
}

// watchedFor returns tb's crash watch. The first call for a test registers
// the report's cleanup before any server's: cleanups run last-in first-out,
// so the report prints after every server's log and every server stopped.
func watchedFor(tb testing.TB) *watched {
	v, loaded := crashWatch.LoadOrStore(tb, new(watched))
	w := v.(*watched)
	if !loaded {
		tb.Cleanup(func() {
			crashWatch.Delete(tb)
			w.mu.Lock()
			defer w.mu.Unlock()
			for _, p := range w.procs {
				p.mu.Lock()
				crashes := slices.Clone(p.crashes)
				p.mu.Unlock()
				for _, c := range crashes {
					tb.Logf("%s %s exited on its own (%s), not stopped by the test; its last crash lines (%s):\n%s",
						CrashMarker, p.name, c, p.logPath, p.logLines(40, crashLine.MatchString))
				}
			}
		})
	}
	return w
}

func (w *watched) add(p *process) {
	w.mu.Lock()
	w.procs = append(w.procs, p)
	w.mu.Unlock()
}

// group is the set of processes of one server, with the cleanup that
// prints their logs when the test failed.
type group struct {
	tb      testing.TB
	procs   []*process
	watched *watched
}

// newGroup registers a cleanup that prints the tail of every process log
// if the test failed. Register it before the cleanup that stops the
// processes, so the logs include the shutdown.
func newGroup(tb testing.TB) *group {
	g := &group{tb: tb, watched: watchedFor(tb)}
	tb.Cleanup(func() {
		if !tb.Failed() && os.Getenv("FAULTLINE_TESTENV_LOGS") == "" {
			return
		}
		n := logTailLines
		if v, err := strconv.Atoi(os.Getenv("FAULTLINE_TESTENV_LOG_LINES")); err == nil {
			n = v
		}
		for _, p := range g.procs {
			tb.Logf("testenv: last lines of %s log (%s):\n%s", p.name, p.logPath, p.logTail(n))
		}
	})
	return g
}

// logTailLines is how much of each server log a failed test prints;
// FAULTLINE_TESTENV_LOG_LINES overrides it (0: the whole log), and
// FAULTLINE_TESTENV_LOGS=1 prints the logs of passing tests too.
const logTailLines = 120

func (g *group) add(p *process) *process {
	g.procs = append(g.procs, p)
	g.watched.add(p)
	return p
}

// waitReady polls check every interval until it succeeds, p exits, or
// timeout passes.
func waitReady(p *process, timeout time.Duration, check func(ctx context.Context) error) error {
	deadline := time.Now().Add(timeout)
	exited := p.exited()
	var last error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		last = check(ctx)
		cancel()
		if last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s: %w", p.name, timeout, last)
		}
		select {
		case <-exited:
			return fmt.Errorf("%s %v before it was ready (last check: %v)", p.name, p.exitErr(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// writeFile writes data to path or fails the test.
func writeFile(tb testing.TB, path string, data []byte, perm os.FileMode) {
	tb.Helper()
	if err := os.WriteFile(path, data, perm); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
}

// mkdirs creates the directories or fails the test.
func mkdirs(tb testing.TB, dirs ...string) {
	tb.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatalf("testenv: %v", err)
		}
	}
}
