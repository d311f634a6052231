package fabric

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const (
	fmStartLine = "[Oct 28 2024 10:00:01] [INFO] [tid 1] Fabric Manager version 550.127.05 is running with the following configuration options"
	sxid20034   = "[Oct 28 2024 10:29:00] [ERROR] [tid 9] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:07:00.0 physical id 2 port 46"
	sxid12028   = "[Oct 28 2024 10:29:00] [ERROR] [tid 9] detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id 00000000:06:00.0 physical id 1 port 33"
)

// restartNode is an HGX H100 node with a state file, started on this boot
// (09:50) with FM's start line in its log.
func restartNode(t *testing.T) *node {
	t.Helper()
	state := filepath.Join(t.TempDir(), "fabric-state.json")
	n := h100Node(t, func(c *Config) { c.StateFile = state })
	n.healthy()
	n.write("proc/sys/kernel/random/boot_id", "6f7a1c2e-0000-4000-8000-000000000001\n")
	n.write("proc/stat", "cpu  1 2 3 4\nbtime 1730109000\n") // 2024-10-28 09:50:00 UTC
	n.write("fabricmanager.log", fmStartLine+"\n")
	n.restart()
	return n
}

// restart starts the check again from its state file (the agent
// restarted).
func (n *node) restart() {
	n.t.Helper()
	c, err := New(n.c.cfg)
	if err != nil {
		n.t.Fatal(err)
	}
	n.c = c
}

// TestRestartSameSecond: FM's log prints whole seconds, and SXids come in
// bursts: a line written after the last poll, in the second of the last
// line the previous run read, is new after a restart, not taken for one
// that run evaluated — past the saved read position, or, where the
// position cannot be used (the log replaced by another file), by the lines
// of that second the state file keeps.
func TestRestartSameSecond(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replace bool // the log is replaced by a copy (another inode) while the agent is down
	}{
		{"read position resumed", false},
		{"log replaced: by time and the lines of that second", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := restartNode(t)
			n.appendLog("fabricmanager.log", sxid20034)
			if got := shorts(n.poll(0)); got != "FabricManagerNVSwitchError:SXID-20034:fatal@0000:07:00.0" {
				t.Fatalf("first run: %q", got)
			}
			n.appendLog("fabricmanager.log", sxid12028)
			if tc.replace {
				n.write("fabricmanager.log.new", read(t, filepath.Join(n.dir, "fabricmanager.log")))
				if err := os.Rename(filepath.Join(n.dir, "fabricmanager.log.new"), filepath.Join(n.dir, "fabricmanager.log")); err != nil {
					t.Fatal(err)
				}
			}
			n.restart()
			if got := shorts(n.poll(30 * time.Second)); got != "FabricManagerNVSwitchError:SXID-12028:nonfatal@0000:06:00.0" {
				t.Fatalf("after the restart: %q, want the SXid 12028 written in the same second, and only it", got)
			}
			if got := shorts(n.poll(30 * time.Second)); got != "" {
				t.Fatalf("reported again: %q", got)
			}
		})
	}
}

// infoLines appends INFO lines dated at 10:31 to the FM log until it grew
// by size bytes.
func (n *node) infoLines(size int) {
	n.t.Helper()
	f, err := os.OpenFile(filepath.Join(n.dir, "fabricmanager.log"), os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	defer f.Close()
	var b strings.Builder
	for i := 0; b.Len() < size; i++ {
		fmt.Fprintf(&b, "[Oct 28 2024 10:31:00] [INFO] [tid 7] periodic fabric statistics sample %d collected\n", i)
	}
	if _, err := f.WriteString(b.String()); err != nil {
		n.t.Fatal(err)
	}
}

// TestRestartResumesTheLog: a restarted agent reads the FM log on from
// the position the previous run committed, not only the log's last MiB:
// an SXid followed by more than that while the agent was down, or in the
// part of a backlog (more than the 4 MiB read a poll) not read yet when it
// stopped, is reported, once. A log truncated in place while the agent was
// down (the same inode) that grew past the position is read from its
// start: read on from the position, mid-line, its SXid was lost.
func TestRestartResumesTheLog(t *testing.T) {
	const want = "FabricManagerNVSwitchError:SXID-12028:nonfatal@0000:06:00.0"
	sxid := strings.Replace(sxid12028, "10:29:00", "10:30:30", 1)
	for _, tc := range []struct {
		name   string
		before func(n *node) // written after the first poll, then polled once more
		down   func(n *node) // written while the agent is down
	}{
		{"more than 1 MiB written while down", func(n *node) {}, func(n *node) {
			n.appendLog("fabricmanager.log", sxid)
			n.infoLines(replayBytes + 4096)
		}},
		{"a backlog not read yet", func(n *node) {
			n.infoLines(chunkBytes + chunkBytes/8)
			n.appendLog("fabricmanager.log", sxid)
			n.infoLines(replayBytes + 4096)
		}, func(n *node) {}},
		{"truncated in place and grown past the position while down", func(n *node) {}, func(n *node) {
			n.write("fabricmanager.log", sxid+"\n")
			n.infoLines(4096)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := restartNode(t)
			if got := shorts(n.poll(0)); got != "" {
				t.Fatalf("first poll: %q", got)
			}
			tc.before(n)
			got := shorts(n.poll(30 * time.Second))
			tc.down(n)
			n.restart()
			for range 3 {
				if evs := shorts(n.poll(30 * time.Second)); evs != "" {
					got = strings.TrimSpace(got + " " + evs)
				}
			}
			if got != want {
				t.Fatalf("%q, want %q once", got, want)
			}
		})
	}
}

// TestRestartResumesTheJournal: the FM unit's journal cursor is saved with
// the state, so a restarted agent reads on after it (not the last 100
// entries again); a saved cursor the journal no longer has (a volatile
// journal after a reboot) reads the last 100.
func TestRestartResumesTheJournal(t *testing.T) {
	const (
		tail  = "journalctl -u nvidia-fabricmanager -o json --no-pager -n 100"
		after = "journalctl -u nvidia-fabricmanager -o json --no-pager --after-cursor=s=1"
	)
	n := restartNode(t)
	n.r.out["systemctl show"] = showFailed
	n.r.out["journalctl"] = `{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"1730111700000000","SYSLOG_IDENTIFIER":"nv-fabricmanager","MESSAGE":"fabric manager NVIDIA GPU driver interface version 550.127.05 don't match with driver version 550.90.07. Please update with matching NVIDIA driver package."}` + "\n"
	n.poll(30 * time.Second)
	if n.r.called(tail) != 1 {
		t.Fatalf("journal not read from its tail: %v", n.r.calls)
	}
	n.restart()
	n.poll(30 * time.Second)
	if n.r.called(after) != 1 || n.r.called(tail) != 1 {
		t.Errorf("after a restart the journal was not read on after the saved cursor: %v", n.r.calls)
	}
	n.r.err[after] = fmt.Errorf("exit status 1: Failed to seek to cursor: Invalid argument")
	n.restart()
	n.poll(30 * time.Second)
	if n.r.called(tail) != 2 {
		t.Errorf("a saved cursor the journal does not have: the tail not read instead: %v", n.r.calls)
	}
}

// TestRestartBeforeCommitKeepsIDs: the log lines a restart reads again —
// the agent killed after their events were spooled, before Commit saved
// the read position past them — make the events they made before, with
// the same ids, so the gateway stores and the rules count them once; a
// line repeated in one second (FM prints whole seconds) is as many
// occurrences, each with an id of its own.
func TestRestartBeforeCommitKeepsIDs(t *testing.T) {
	const multicast = "[Oct 28 2024 10:29:00] [ERROR] [tid 77] failed to find the GPU handle 5410063385821516767 in the multicast team request setup 6130285411925746235."
	n := restartNode(t)
	n.poll(0)
	for _, l := range []string{sxid20034, sxid20034, sxid12028, multicast} {
		n.appendLog("fabricmanager.log", l)
	}
	ids := func() []string {
		t.Helper()
		n.now = n.now.Add(30 * time.Second)
		evs, err := n.c.Check(context.Background()) // spooled; killed before Commit
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, ev := range evs {
			out = append(out, ev.GetErrorCode()[0]+"="+ev.GetId())
		}
		return out
	}
	first := ids()
	n.restart()
	again := ids()
	if len(first) != 4 || !slices.Equal(first, again) {
		t.Fatalf("events before the restart %q, after it %q: want the same 4 with the same ids", first, again)
	}
	seen := map[string]bool{}
	for _, e := range first {
		code, id, _ := strings.Cut(e, "=")
		if id == "" || seen[id] {
			t.Errorf("%s: id %q: want one of its own", code, id)
		}
		seen[id] = true
	}
}

// TestRestartSameLineSameSecondNewID: FM logs the same SXid line twice
// in one second; the first is reported and committed, the agent restarts,
// and the second — read on from the committed position, or, the log
// replaced, told from the first by the lines of that second the state
// keeps — is an occurrence of its own: an id other than the first's, not
// deduplicated away by the store.
func TestRestartSameLineSameSecondNewID(t *testing.T) {
	for _, replace := range []bool{false, true} {
		t.Run(fmt.Sprintf("replace=%v", replace), func(t *testing.T) {
			n := restartNode(t)
			n.appendLog("fabricmanager.log", sxid20034)
			first := n.poll(0)
			if len(first) != 1 || first[0].GetId() == "" {
				t.Fatalf("first run: %q", shorts(first))
			}
			n.appendLog("fabricmanager.log", sxid20034)
			if replace {
				n.write("fabricmanager.log.new", read(t, filepath.Join(n.dir, "fabricmanager.log")))
				if err := os.Rename(filepath.Join(n.dir, "fabricmanager.log.new"), filepath.Join(n.dir, "fabricmanager.log")); err != nil {
					t.Fatal(err)
				}
			}
			n.restart()
			again := n.poll(30 * time.Second)
			if len(again) != 1 || shorts(again) != shorts(first) {
				t.Fatalf("after the restart: %q, want the repeated SXid once", shorts(again))
			}
			if id := again[0].GetId(); id == "" || id == first[0].GetId() {
				t.Errorf("repeated line's id %q, first's %q: want one of its own", id, first[0].GetId())
			}
			if got := shorts(n.poll(30 * time.Second)); got != "" {
				t.Fatalf("reported again: %q", got)
			}
		})
	}
}
