package kmsg

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestJournalTimeoutKillsGroup: journalctl (kmsg.journalctl) may be a
// wrapper that runs the host's journalctl as its child (sh, nsenter). At
// the check's deadline the whole process group is killed: before, only
// the wrapper was, its child went on holding the output open, and the
// read (the check) waited for it past its deadline.
func TestJournalTimeoutKillsGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	script := filepath.Join(dir, "journalctl")
	body := "#!/bin/sh\n" +
		`echo '{"__CURSOR":"s=1;i=1","MESSAGE":"one","__REALTIME_TIMESTAMP":"1"}'` + "\n" +
		"sleep 30 &\necho $! > " + pidFile + "\nwait\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	j := newJournal(script, sourceState{})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	var lines int
	err := j.read(ctx, 100, func(Line) { lines++ })
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("read returned %v after its deadline (err %v)", took, err)
	}
	if err == nil {
		t.Error("a journalctl killed at the deadline: no error")
	}
	if lines != 1 || j.cursor != "s=1;i=1" {
		t.Errorf("read %d entries, cursor %q; want 1 and its cursor", lines, j.cursor)
	}
	b, rerr := os.ReadFile(pidFile)
	if rerr != nil {
		t.Fatal(rerr)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	deadline := time.Now().Add(3 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("journalctl's child %d outlived the deadline", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive: the process runs (not gone, not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || len(s) < i+3 || s[i+2] != 'Z'
}
