// Package standalone lets a load-test command (not a test binary) start
// the real servers of internal/testenv and gateway/gatewaytest, which take
// a testing.TB: TB is one whose Fatal prints, runs the cleanups and exits,
// whose Skip (a server not installed) is fatal too, and whose TempDir is
// removed at Close.
package standalone

import (
	"flag"
	"fmt"
	"os"
	"sync"
	"testing"
)

// TB is a testing.TB for a command. Embedding the interface satisfies its
// unexported method; every method testenv calls is implemented here.
type TB struct {
	testing.TB
	name string

	mu       sync.Mutex
	cleanups []func()
	dirs     []string
	failed   bool
	Verbose  bool // print Logf lines
}

var initOnce sync.Once

// New returns a TB named name (used in temporary directory names). Call
// Close when done (also on the error path): it runs the cleanups, stopping
// the servers.
func New(name string) *TB {
	initOnce.Do(func() {
		testing.Init() // testenv calls testing.Short, which needs the test flags parsed
		if !flag.Parsed() {
			_ = flag.CommandLine.Parse(nil)
		}
	})
	return &TB{name: name}
}

// Close runs the cleanups in reverse order and removes the temporary directories.
func (t *TB) Close() {
	t.mu.Lock()
	cs := t.cleanups
	t.cleanups = nil
	dirs := t.dirs
	t.dirs = nil
	t.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
	for _, d := range dirs {
		os.RemoveAll(d)
	}
}

func (t *TB) Name() string { return t.name }
func (t *TB) Helper()      {}
func (t *TB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}
func (t *TB) TempDir() string {
	d, err := os.MkdirTemp("", t.name+"-")
	if err != nil {
		t.Fatalf("TempDir: %v", err)
	}
	t.mu.Lock()
	t.dirs = append(t.dirs, d)
	t.mu.Unlock()
	return d
}
func (t *TB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}
func (t *TB) Log(args ...any) {
	if t.Verbose {
		fmt.Fprintln(os.Stderr, args...)
	}
}
func (t *TB) Logf(format string, args ...any) {
	if t.Verbose {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
	}
}
func (t *TB) Error(args ...any) {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
	fmt.Fprintln(os.Stderr, args...)
}
func (t *TB) Errorf(format string, args ...any) { t.Error(fmt.Sprintf(format, args...)) }
func (t *TB) Fatal(args ...any) {
	t.Error(args...)
	t.FailNow()
}
func (t *TB) Fatalf(format string, args ...any) { t.Fatal(fmt.Sprintf(format, args...)) }
func (t *TB) Fail() {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
}

// FailNow stops the servers and exits the command with status 1.
func (t *TB) FailNow() {
	t.Close()
	os.Exit(1)
}
func (t *TB) Skip(args ...any)                 { t.Fatal(append([]any{"cannot run:"}, args...)...) }
func (t *TB) Skipf(format string, args ...any) { t.Skip(fmt.Sprintf(format, args...)) }
func (t *TB) SkipNow()                         { t.Skip() }
func (t *TB) Skipped() bool                    { return false }
func (t *TB) Setenv(key, value string)         { os.Setenv(key, value) }
func (t *TB) Chdir(dir string)                 { os.Chdir(dir) }
