package fabric

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTailerFollowsCopytruncate: a log copied and truncated in place (the
// same inode) that grew past the old offset before the next read is read
// from its start — read on from the old offset, the new file's first
// lines were lost and the first line read was cut mid-word.
func TestTailerFollowsCopytruncate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fabricmanager.log")
	line := func(i int, msg string) string {
		return "[Dec 03 2026 05:4" + string(rune('0'+i)) + ":00] [ERROR] [tid 1] " + msg + "\n"
	}
	if err := os.WriteFile(path, []byte(line(0, "first")+line(1, "second")), 0o644); err != nil {
		t.Fatal(err)
	}
	var tl tailer
	r := &LogReader{Loc: time.UTC}
	if got, err := tl.read(path, r); err != nil || len(got) != 2 {
		t.Fatalf("first read: %v, %v", got, err)
	}
	// copytruncate, then FM writes more than was read.
	fatal := line(2, "detected NVSwitch fatal error 12028 on NVSwitch pci bus id 00000000:05:00.0")
	if err := os.WriteFile(path, []byte(fatal+line(3, "third")), 0o644); err != nil { // truncates in place
		t.Fatal(err)
	}
	got, err := tl.read(path, r)
	if err != nil || len(got) != 2 || got[0].Raw != strings.TrimSuffix(fatal, "\n") {
		t.Fatalf("after copytruncate: %+v, %v; want the fatal line whole, then the third", got, err)
	}
}

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
