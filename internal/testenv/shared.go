package testenv

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Main runs a package's tests and then stops the servers its tests shared
// (SharedSecureKafka) and removes their files. A package whose tests share
// a server calls it from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
func Main(m *testing.M) {
	shared.mu.Lock()
	shared.main = true
	shared.mu.Unlock()
	code := m.Run()
	stopShared()
	os.Exit(code)
}

// shared holds the servers started once per test binary.
var shared struct {
	mu       sync.Mutex
	main     bool     // Main is running the tests
	root     string   // their files, removed by stopShared
	cleanups []func() // run in reverse by stopShared
	kafka    *Kafka   // SharedSecureKafka's broker

	kafkaCluster   *KafkaCluster // SharedKafkaCluster's brokers
	kafkaClusterTB *sharedTB
}

// SharedSecureKafka returns a broker started with KafkaSecure that every
// test of the binary shares: the first caller starts it (10-20 s), the
// others get it at once, and Main stops it after the last test. Tests must
// not Stop, Kill or Start it, and should use topic and group names of
// their own. When a test that used it fails, the tail of the broker log is
// printed with it. It needs testenv.Main in the package's TestMain; a test
// that needs its own, or a plain broker, calls StartKafka.
//
// Under `go test -short` the test is skipped.
func SharedSecureKafka(tb testing.TB) *Kafka {
	tb.Helper()
	if testing.Short() {
		tb.Skip("testenv: -short: not starting a real Kafka broker")
	}
	if _, ok := kafkaLibs(); !ok {
		StartKafka(tb) // skips, or fails in CI, naming what is missing
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.main {
		tb.Fatal("testenv: SharedSecureKafka needs `func TestMain(m *testing.M) { testenv.Main(m) }` in the test package")
	}
	if shared.kafka == nil {
		if shared.root == "" {
			dir, err := os.MkdirTemp("", "faultline-testenv-shared-")
			if err != nil {
				tb.Fatalf("testenv: %v", err)
			}
			shared.root = dir
		}
		st := &sharedTB{TB: tb, active: true}
		shared.kafka = StartKafka(st, KafkaSecure())
		st.done()
	}
	k := shared.kafka
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("testenv: last lines of the shared kafka log (%s):\n%s", k.proc.logPath, k.proc.logTail(logTailLines))
		}
	})
	return k
}

// SharedKafkaCluster returns a cluster of three brokers (StartKafkaCluster
// defaults: replication factor 3, min.insync.replicas 2; the third broker
// is the only KRaft controller, KafkaControllers(1), so the cluster stays
// in charge of its metadata when the first two are killed: ISRs shrink and
// min.insync.replicas is what refuses writes) that every test of the
// binary shares: the first caller starts it (15-30 s), later ones get
// it at once, and Main stops it after the last test. A test may Kill, Stop
// and Start its brokers (that is what it is for): the next caller gets the
// stopped ones started again first. Tests should use topic and group
// names of their own. It needs testenv.Main in the package's TestMain.
//
// Under `go test -short` the test is skipped.
func SharedKafkaCluster(tb testing.TB) *KafkaCluster {
	tb.Helper()
	if testing.Short() {
		tb.Skip("testenv: -short: not starting a Kafka cluster")
	}
	if _, ok := kafkaLibs(); !ok {
		StartKafka(tb) // skips, or fails in CI, naming what is missing
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.main {
		tb.Fatal("testenv: SharedKafkaCluster needs `func TestMain(m *testing.M) { testenv.Main(m) }` in the test package")
	}
	if shared.root == "" {
		dir, err := os.MkdirTemp("", "faultline-testenv-shared-")
		if err != nil {
			tb.Fatalf("testenv: %v", err)
		}
		shared.root = dir
	}
	if shared.kafkaCluster == nil {
		st := &sharedTB{TB: tb, active: true}
		shared.kafkaCluster, shared.kafkaClusterTB = StartKafkaCluster(st, 3, KafkaControllers(1)), st
		st.done()
	} else if c := shared.kafkaCluster; len(c.running()) < len(c.Brokers) {
		st := shared.kafkaClusterTB
		st.mu.Lock()
		st.TB, st.active = tb, true
		st.mu.Unlock()
		began := time.Now()
		c.Restore(st)
		st.done()
		tb.Logf("testenv: shared kafka cluster restored in %s", time.Since(began).Round(time.Millisecond))
	}
	c := shared.kafkaCluster
	tb.Cleanup(func() {
		if tb.Failed() {
			for _, k := range c.Brokers {
				tb.Logf("testenv: last lines of the shared %s log (%s):\n%s", k.proc.name, k.proc.logPath, k.proc.logTail(logTailLines))
			}
		}
	})
	return c
}

// stopShared runs the shared servers' cleanups and removes their files.
func stopShared() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	for i := len(shared.cleanups) - 1; i >= 0; i-- {
		shared.cleanups[i]()
	}
	shared.cleanups, shared.kafka, shared.kafkaCluster, shared.kafkaClusterTB = nil, nil, nil, nil
	if shared.root != "" {
		_ = os.RemoveAll(shared.root)
		shared.root = ""
	}
}

// sharedTB is the testing.TB of a server that outlives the test starting
// it: its files go under shared.root and its cleanups run in stopShared.
// While the server starts, failures and logs go to that test; afterwards
// logs go to stderr and a failure panics (only reachable by stopping or
// restarting a shared server, which tests must not do).
type sharedTB struct {
	testing.TB
	mu     sync.Mutex
	active bool
}

func (s *sharedTB) done() {
	s.mu.Lock()
	s.active = false
	s.mu.Unlock()
}

func (s *sharedTB) current() testing.TB {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active {
		return s.TB
	}
	return nil
}

// Helper marks the caller as a helper of the starting test.
func (s *sharedTB) Helper() {
	if tb := s.current(); tb != nil {
		tb.Helper()
	}
}

// Logf logs to the starting test, later to stderr.
func (s *sharedTB) Logf(format string, args ...any) {
	if tb := s.current(); tb != nil {
		tb.Logf(format, args...)
		return
	}
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

// Fatalf fails the starting test, later panics.
func (s *sharedTB) Fatalf(format string, args ...any) {
	if tb := s.current(); tb != nil {
		tb.Fatalf(format, args...)
		return
	}
	panic(fmt.Sprintf(format, args...))
}

// Fatal is Fatalf without a format.
func (s *sharedTB) Fatal(args ...any) { s.Fatalf("%s", fmt.Sprint(args...)) }

// Failed is false: the per-test cleanup of SharedSecureKafka prints the
// log of a failed test instead.
func (s *sharedTB) Failed() bool { return false }

// TempDir returns a new directory under shared.root (shared.mu is held by
// SharedSecureKafka while the server starts).
func (s *sharedTB) TempDir() string {
	dir, err := os.MkdirTemp(shared.root, "kafka-")
	if err != nil {
		s.Fatalf("testenv: %v", err)
	}
	return dir
}

// Cleanup defers f to stopShared.
func (s *sharedTB) Cleanup(f func()) { shared.cleanups = append(shared.cleanups, f) }

// WaitBound lets n of a package's parallel tests run at once, where go
// test's default is GOMAXPROCS (2 on the CI machine), unless the command
// line sets -test.parallel. It is for a package whose tests mostly wait
// (leases, timeouts, servers' answers) rather than compute; call it from
// TestMain before m.Run.
func WaitBound(n int) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(n))
	}
}
