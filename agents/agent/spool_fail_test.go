//go:build linux

package agent

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestSpoolFailedWriteKeepsLaterEvents: an append the disk cuts short
// (full: the kernel writes part of the record, then refuses the rest)
// fails, and leaves nothing of itself behind — the events appended after
// it, accepted and fsync'd, are read back, in this run and after a
// restart. A torn record left in the middle of the segment made every
// later record of it unreadable (the rest of the segment was skipped as
// corrupt) and, on reopen, cut off as a torn tail.
func TestSpoolFailedWriteKeepsLaterEvents(t *testing.T) {
	for _, tc := range []struct {
		name string
		room int64 // bytes the disk takes of the failing append
	}{
		{"header cut", 3},
		{"payload cut", recordHeader + 5},
		{"nothing written", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			sp, err := OpenSpool(dir, 64<<10, quiet(), NewMetrics())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { sp.Close() }()
			if err := sp.AppendAll([]*datamodels.HealthEvent{ev("a", false), ev("b", false)}); err != nil {
				t.Fatal(err)
			}
			diskFull(t, sp, sp.Pending()+tc.room, func() {
				if err := sp.AppendAll([]*datamodels.HealthEvent{ev("refused "+strings.Repeat("x", 100), true)}); err == nil {
					t.Fatal("append on a full disk succeeded")
				}
			})
			if err := sp.AppendAll([]*datamodels.HealthEvent{ev("c", false)}); err != nil {
				t.Fatal(err)
			}
			if n, err := sp.Append([]*datamodels.HealthEvent{ev("d", true)}); err != nil || n != 1 {
				t.Fatalf("append d: %d %v", n, err)
			}
			const want = "a,b,c,d"
			got, _, err := sp.Peek(100)
			if err != nil || strings.Join(msgs(got), ",") != want {
				t.Fatalf("read back %v (%v), want %s", msgs(got), err, want)
			}
			sp.Close()
			if sp, err = OpenSpool(dir, 64<<10, quiet(), NewMetrics()); err != nil {
				t.Fatal(err)
			}
			got, _, err = sp.Peek(100)
			if err != nil || strings.Join(msgs(got), ",") != want {
				t.Fatalf("after restart %v (%v), want %s", msgs(got), err, want)
			}
		})
	}
}

// diskFull runs f while no segment of the spool sp may grow past size
// bytes: a write across it writes up to it, then fails (ENOSPC), as on a
// full disk. (RLIMIT_FSIZE would do it in the kernel, but for the whole
// test process: go test's own log file could not be written either.)
func diskFull(t *testing.T, sp *Spool, size int64, f func()) {
	t.Helper()
	full := func(w segmentFile) segmentFile { return &fullDisk{File: w.(*os.File), size: size} }
	sp.mu.Lock()
	open := sp.open
	sp.open = func(path string) (segmentFile, error) {
		w, err := open(path)
		if err != nil {
			return nil, err
		}
		return full(w), nil
	}
	if sp.w != nil {
		sp.w = full(sp.w)
	}
	sp.mu.Unlock()
	defer func() {
		sp.mu.Lock()
		defer sp.mu.Unlock()
		sp.open = open
		if fd, ok := sp.w.(*fullDisk); ok {
			sp.w = fd.File
		}
	}()
	f()
}

// fullDisk is a segment on a disk with room for size bytes of it.
type fullDisk struct {
	*os.File
	size int64
}

func (d *fullDisk) Write(b []byte) (int, error) {
	st, err := d.Stat()
	if err != nil {
		return 0, err
	}
	room := max(d.size-st.Size(), 0)
	if int64(len(b)) <= room {
		return d.File.Write(b)
	}
	n, err := d.File.Write(b[:room])
	if err == nil {
		err = &os.PathError{Op: "write", Path: d.Name(), Err: syscall.ENOSPC}
	}
	return n, err
}

// TestCheckEventsWaitOutAFullDisk: a check reports a transition once (its
// state, in memory, moves past it at once, as the NIC and kmsg checks'
// do); the spool cannot take it (the disk is full). It was dropped — the
// check never reported it again while the agent ran, the node's fault was
// never sent. It is kept, spooled first when the disk has room again, and
// the check runs again, and its state is saved, only then.
func TestCheckEventsWaitOutAFullDisk(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fullRuns int // runs while the disk is full
	}{
		{"full for one run", 1},
		{"full for three runs", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, "127.0.0.1:1")
			var (
				a    *Agent
				runs int
			)
			c := &committingCheck{spool: func() *Spool { return a.Spool() }}
			c.fakeCheck = fakeCheck{"nic", func(context.Context) ([]*datamodels.HealthEvent, error) {
				runs++
				return []*datamodels.HealthEvent{{CheckName: "Port", ComponentClass: "NIC", Message: fmt.Sprintf("run %d", runs)}}, nil
			}}
			sched := Scheduled{Check: c, Interval: time.Minute, Timeout: time.Second}
			a, err := New(cfg, quiet(), Options{Checks: []Scheduled{sched}})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Spool().Close()
			diskFull(t, a.Spool(), 0, func() {
				for range tc.fullRuns {
					a.RunOnce(context.Background(), sched)
				}
			})
			if runs != 1 || len(c.commits) != 0 {
				t.Fatalf("while the disk is full: %d runs, %d commits; want the check run once, its state not saved", runs, len(c.commits))
			}
			a.RunOnce(context.Background(), sched)
			got, _, err := a.Spool().Peek(10)
			if err != nil || strings.Join(msgs(got), ",") != "run 1,run 2" {
				t.Fatalf("spooled %v (%v), want the event of the run on a full disk, then the next", msgs(got), err)
			}
			if len(c.commits) != 2 {
				t.Fatalf("commits %v, want two (after each run's events were spooled)", c.commits)
			}
		})
	}
}
