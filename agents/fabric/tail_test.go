package fabric

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestExecRunnerStopsAtItsDeadline: a command whose child keeps its
// output open past the deadline returns soon after it (WaitDelay), not
// when the child ends — the check, and its lock, were held until then.
func TestExecRunnerStopsAtItsDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := ExecRunner{}.Run(ctx, "sh", "-c", "sleep 30 & sleep 30")
	if took := time.Since(start); err == nil || took > 10*time.Second {
		t.Fatalf("returned after %v (err %v); want an error within the deadline and WaitDelay", took, err)
	}
}

// TestLogReaderBoundsAMessage: continuation lines past maxMessageBytes
// are dropped — a message of endless unprefixed lines grew without bound,
// each line copying all before it.
func TestLogReaderBoundsAMessage(t *testing.T) {
	r := &LogReader{Loc: time.UTC}
	r.Feed("[Dec 03 2026 07:00:00] [ERROR] [tid 1] a dump follows")
	for range 20000 {
		r.Feed("    continuation line of the dump, forty-odd bytes\n")
	}
	got := r.Flush()
	if len(got) != 1 || len(got[0].Raw) > maxMessageBytes+100 || !strings.HasPrefix(got[0].Msg, "a dump follows\ncontinuation") {
		t.Fatalf("%d messages, the first %d bytes; want one of at most ~%d", len(got), len(got[0].Raw), maxMessageBytes)
	}
}

// TestExecRunnerKillsTheChildren: at the deadline a wrapper's child is
// killed with it (the command runs in a process group of its own) — it
// was left running, one more each poll while the hang lasted.
func TestExecRunnerKillsTheChildren(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := (ExecRunner{}).Run(ctx, "sh", "-c", "sleep 30 & echo $! > "+pidFile+"; wait"); err == nil {
		t.Fatal("no error past the deadline")
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(b))
	for deadline := time.Now().Add(3 * time.Second); alive(pid); {
		if time.Now().After(deadline) {
			t.Fatalf("the wrapper's child %s still runs after the command returned", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// alive reports whether process pid runs (exists and is no zombie).
func alive(pid string) bool {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return false
	}
	_, after, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(after, "Z")
}
