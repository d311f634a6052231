package fabric

import (
	"context"
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
