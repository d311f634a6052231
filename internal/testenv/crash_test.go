package testenv

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// recordingTB collects what testenv logs and runs its cleanups on finish.
type recordingTB struct {
	testing.TB
	cleanups []func()
	logs     []string
}

func (r *recordingTB) Helper()                    {}
func (r *recordingTB) Failed() bool               { return true } // so the server logs print
func (r *recordingTB) Cleanup(f func())           { r.cleanups = append(r.cleanups, f) }
func (r *recordingTB) Logf(f string, args ...any) { r.logs = append(r.logs, fmt.Sprintf(f, args...)) }

func (r *recordingTB) finish() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// TestCrashReport: a server that exits on its own while the test runs is
// reported once per exit, after the logs, with its crash lines; one the
// test stops, or that exits with status 0, is not.
func TestCrashReport(t *testing.T) {
	const crash = `echo "2026.11.28 16:40:03.1 [ 40 ] {} <Error> BaseDaemon: (from thread 38) Received signal Segmentation fault (11)."
echo "2026.11.28 16:40:03.2 [ 38 ] {} <Information> executeQuery: Read 2 rows"
kill -SEGV $$`
	cases := []struct {
		name    string
		script  string
		run     func(p *process) // after the first start
		reports int
	}{
		{"crashes on its own", crash, func(p *process) { <-p.exited() }, 1},
		{"crashes twice, started again in between", crash, func(p *process) {
			<-p.exited()
			if err := p.start(); err != nil {
				t.Fatal(err)
			}
			<-p.exited()
		}, 2},
		{"a one-shot tool that succeeds", "echo formatted", func(p *process) { <-p.exited() }, 0},
		{"stopped by the test", "sleep 60", func(p *process) {
			time.Sleep(100 * time.Millisecond)
			p.stop(syscall.SIGTERM, 5*time.Second)
		}, 0},
		{"still running at the end", "sleep 60", func(p *process) {}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recordingTB{TB: t}
			dir := t.TempDir()
			p := newGroup(rec).add(&process{name: "clickhouse-1", path: "/bin/sh", args: []string{"-c", tc.script},
				dir: dir, logPath: filepath.Join(dir, "stdout.log")})
			if err := p.start(); err != nil {
				t.Fatal(err)
			}
			tc.run(p)
			rec.Cleanup(func() { p.stop(syscall.SIGKILL, 5*time.Second) }) // as a server's Close
			rec.finish()
			var reports []string
			for i, l := range rec.logs {
				if strings.HasPrefix(l, CrashMarker) {
					reports = append(reports, l)
				} else if len(reports) > 0 {
					t.Errorf("log %d comes after a crash report: %q", i, l)
				}
			}
			if len(reports) != tc.reports {
				t.Fatalf("%d crash reports, want %d: %q", len(reports), tc.reports, rec.logs)
			}
			for _, r := range reports {
				for _, want := range []string{"clickhouse-1 exited on its own (signal: segmentation fault at ", "Received signal Segmentation fault (11)", "==== testenv: clickhouse-1 exited"} {
					if !strings.Contains(r, want) {
						t.Errorf("report lacks %q:\n%s", want, r)
					}
				}
				if strings.Contains(r, "executeQuery") {
					t.Errorf("report has a line that is not a crash line:\n%s", r)
				}
			}
		})
	}
}
