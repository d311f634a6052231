package kmsg

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/faultline/faultline/agents/logtail"
	"github.com/faultline/faultline/agents/topology/topologytest"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestConfigValidate: each bad setting is refused on its own, naming its
// key and quoting its value.
func TestConfigValidate(t *testing.T) {
	def := DefaultConfig()
	if err := def.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"source", func(c *Config) { c.Source = "tape" }, `kmsg.source: "tape" is not kmsg, journal or file`},
		{"file source without a file", func(c *Config) { c.Source, c.File = SourceFile, "" }, "kmsg.file: required"},
		{"max lines", func(c *Config) { c.MaxLinesPerCheck = -1 }, "kmsg.max_lines_per_check: must not be negative, got -1"},
		{"poll interval", func(c *Config) { c.PollInterval = -time.Second }, "kmsg.poll_interval: must not be negative, got -1s"},
		{"flood window", func(c *Config) { c.FloodWindow = -time.Second }, "kmsg.flood_window: must not be negative, got -1s"},
		{"flood burst", func(c *Config) { c.FloodBurst = -2 }, "kmsg.flood_burst: must not be negative, got -2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mod(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

// TestRebootReportsHealthy: after a reboot the check reports each of its
// checks healthy once, generated at the boot's start and naming no entity
// — nothing else lifted the quarantine of an Xid the node was rebooted
// for — after the previous boot's unread lines and before this boot's.
func TestRebootReportsHealthy(t *testing.T) {
	dir := t.TempDir()
	logf, bootf := filepath.Join(dir, "kern.log"), filepath.Join(dir, "boot_id")
	write := func(at time.Time, xid string) {
		t.Helper()
		f, err := os.OpenFile(logf, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fmt.Fprintf(f, "%s gpu-node-42 kernel: NVRM: Xid (PCI:0000:3b:00): %s, pid=1, name=x, DBE\n", at.Format("Jan _2 15:04:05"), xid)
	}
	boot1 := time.Date(2024, 10, 28, 9, 0, 0, 0, time.UTC)
	boot2 := boot1.Add(2 * time.Hour)
	run := func(boot string, at time.Time) []string {
		t.Helper()
		if err := os.WriteFile(bootf, []byte(boot+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := New(Config{Source: SourceFile, File: logf, StateDir: dir, BootIDPath: bootf, ProcStatPath: "/nonexistent",
			Parser: ParserConfig{BootTime: at, Year: 2024, Location: time.UTC, Now: func() time.Time { return at.Add(time.Hour) }}})
		if err != nil {
			t.Fatal(err)
		}
		evs, err := c.Check(context.Background())
		if err == nil {
			err = c.Commit()
		}
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, ev := range evs {
			out = append(out, fmt.Sprintf("%s %v %v entities=%d %s", ev.GetCheckName(), ev.GetErrorCode(), ev.GetIsHealthy(),
				len(ev.GetEntitiesImpacted()), ev.GetGeneratedTimestamp().AsTime().Format("15:04")))
		}
		return out
	}
	write(boot1.Add(time.Minute), "48")
	if got := run("boot-a", boot1); len(got) != 1 {
		t.Fatalf("first boot: %q", got)
	}
	if got := run("boot-a", boot1); len(got) != 0 {
		t.Fatalf("restart on the same boot: %q", got)
	}
	write(boot2.Add(-time.Minute), "79") // before the reboot, not read yet
	write(boot2.Add(time.Minute), "48")  // this boot's
	want := []string{
		"SysLogsXIDError [XID-79] false entities=1 10:59",
		"SysLogsXIDError [] true entities=0 11:00",
		"SysLogsSXIDError [] true entities=0 11:00",
		"SysLogsGPUFallenOff [] true entities=0 11:00",
		"SysLogsNICDriverError [] true entities=0 11:00",
		"SysLogsXIDError [XID-48] false entities=1 11:01",
	}
	if got := run("boot-b", boot2); !slices.Equal(got, want) {
		t.Fatalf("after the reboot:\n got %q\nwant %q", got, want)
	}
	if got := run("boot-b", boot2); len(got) != 0 {
		t.Fatalf("restart after the reboot reported again: %q", got)
	}
}

// TestFileWithoutPositionSkipsEarlierBoots: a file source with no position
// to resume at (first start, the state file missing or not usable, no
// state_dir) reads a kern.log from its start, and a kern.log spans several
// boots: the lines dated before this boot's start are not reported — an
// Xid 79 of a week ago, on a node since repaired and rebooted, would be
// taken for a current fault with no healthy event after it — while this
// boot's are.
//
// So too when a position was saved for the file but the log is no longer
// the file it was saved in (rotated while the agent was down: another
// inode; truncated and written again: other first bytes), read from its
// start: the fatal Xid that made a remediation reboot the node was
// reported again, the node just repaired quarantined again. A position
// the log still matches goes on from it, the boot before's lines
// unread then reported.
func TestFileWithoutPositionSkipsEarlierBoots(t *testing.T) {
	boot := time.Date(2024, 10, 28, 9, 0, 0, 0, time.UTC)
	thisBoot := []string{"SysLogsXIDError [XID-48] healthy=false"}
	for _, tc := range []struct {
		name string
		// state is the state file's content, "" none; FILE, INODE, OFFSET
		// and HEAD stand for the log's path and its position after its
		// first line.
		state string
		dir   bool // a state_dir
		want  []string
	}{
		{"first start", "", true, thisBoot},
		{"state file corrupt", "{not json", true, thisBoot},
		{"state of another file", `{"file":"/var/log/other.log","offset":99}`, true, thisBoot},
		{"no state_dir", "", false, thisBoot},
		{"position of a log rotated away", `{"file":"FILE","inode":INODE1,"offset":OFFSET,"head":"HEAD"}`, true, thisBoot},
		{"position of a log truncated and refilled", `{"file":"FILE","inode":INODE,"offset":OFFSET,"head":"28:0123456789abcdef0123456789abcdef"}`, true, thisBoot},
		{"position resumed", `{"file":"FILE","inode":INODE,"offset":0,"head":"HEAD"}`, true,
			[]string{"SysLogsXIDError [XID-79] healthy=false", "SysLogsXIDError [XID-48] healthy=false"}},
		// Saved in this boot (the agent restarted, the log rotated
		// meanwhile): every line of the new log is of this boot, even one
		// whose time reads as before it (the lines' zone read wrong).
		{"position of this boot, log rotated away", `{"bootId":"BOOT","file":"FILE","inode":INODE1,"offset":OFFSET,"head":"HEAD"}`, true,
			[]string{"SysLogsXIDError [XID-79] healthy=false", "SysLogsXIDError [XID-48] healthy=false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			logf := filepath.Join(dir, "kern.log")
			xid := func(at time.Time, code string) string {
				return at.Format("Jan _2 15:04:05") + " gpu-node-42 kernel: NVRM: Xid (PCI:0000:3b:00): " + code + ", pid=1, name=x, DBE\n"
			}
			if err := os.WriteFile(logf, []byte(xid(boot.Add(-7*24*time.Hour), "79")+xid(boot.Add(time.Minute), "48")), 0o644); err != nil {
				t.Fatal(err)
			}
			var first logtail.Follower
			if err := first.Read(logf, 1<<20, func(string) bool { return false }); err != nil {
				t.Fatal(err)
			}
			ino, off, head := first.Position()
			first.Close()
			const bootID = "5f1c7a3e-2b4d-4e6f-8a9b-0c1d2e3f4a5b"
			if err := os.WriteFile(filepath.Join(dir, "boot_id"), []byte(bootID+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			tc.state = strings.NewReplacer("BOOT", bootID, "FILE", logf, "INODE1", strconv.FormatUint(ino+1, 10), "INODE", strconv.FormatUint(ino, 10),
				"OFFSET", strconv.FormatInt(off, 10), "HEAD", head).Replace(tc.state)
			cfg := Config{Source: SourceFile, File: logf, BootIDPath: filepath.Join(dir, "boot_id"), ProcStatPath: "/nonexistent",
				Parser: ParserConfig{BootTime: boot, Year: 2024, Location: time.UTC, Now: func() time.Time { return boot.Add(time.Hour) }}}
			if tc.dir {
				cfg.StateDir = filepath.Join(dir, "state")
			}
			if tc.state != "" {
				if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(cfg.StateDir, "kmsg-file.json"), []byte(tc.state), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cfg.Logger = slog.New(slog.DiscardHandler)
			c, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			evs, err := c.Check(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, ev := range evs {
				got = append(got, fmt.Sprintf("%s %v healthy=%v", ev.GetCheckName(), ev.GetErrorCode(), ev.GetIsHealthy()))
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("events %q, want %q", got, tc.want)
			}
		})
	}
}

// TestPositionSavedOnCommit: the read position is saved when the runner
// commits (the events spooled), not when the lines are read: an agent
// killed in between reads them again instead of resuming past them.
func TestPositionSavedOnCommit(t *testing.T) {
	dir := t.TempDir()
	logf := filepath.Join(dir, "kern.log")
	if err := os.WriteFile(logf, []byte("[ 1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	check := func() (*Check, int) {
		t.Helper()
		c, err := New(Config{Source: SourceFile, File: logf, StateDir: dir, ProcStatPath: "/nonexistent"})
		if err != nil {
			t.Fatal(err)
		}
		evs, err := c.Check(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return c, len(evs)
	}
	if _, n := check(); n != 1 {
		t.Fatalf("first read: %d events", n)
	}
	c, n := check() // killed before its events were spooled: read again
	if n != 1 {
		t.Fatalf("after a kill before the commit: %d events, want the line's again", n)
	}
	if err := c.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, n := check(); n != 0 {
		t.Fatalf("after the commit: %d events, want none", n)
	}
}

// twoXidsFile is a file source's Config over a kern.log of two Xid 31
// lines (each its own GPU), its state, boot id (written when bootID) and
// /proc/stat (not written) in one temporary directory.
func twoXidsFile(t *testing.T, bootID bool) Config {
	t.Helper()
	dir := t.TempDir()
	logf := filepath.Join(dir, "kern.log")
	lines := "[ 1.0] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=x, Ch 00000008, intr 10000000. MMU Fault\n" +
		"[ 2.0] NVRM: Xid (PCI:0000:5d:00): 31, pid=1, name=x, Ch 00000008, intr 10000000. MMU Fault\n"
	if err := os.WriteFile(logf, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Source: SourceFile, File: logf, StateDir: dir,
		BootIDPath: filepath.Join(dir, "boot_id"), ProcStatPath: filepath.Join(dir, "stat")}
	if bootID {
		if err := os.WriteFile(cfg.BootIDPath, []byte("5c1e9a2b-0d3f-4e7a-9b1c-2d3e4f5a6b7c\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return cfg
}

// TestRereadLinesKeepTheirIDs: the lines a restart reads again (the agent
// killed after spooling their events, before Commit) make events with the
// ids of the first read, so the gateway stores them once and the rules
// count them once; different lines have different ids. A file's lines
// need no boot id (each has its own time); without the line's time the
// check sets none: the spool gives a new one.
func TestRereadLinesKeepTheirIDs(t *testing.T) {
	for _, tc := range []struct {
		name       string
		bootID     bool
		procStat   bool
		wantStable bool
	}{
		{"boot id and line times known", true, true, true},
		{"no boot id", false, true, true},
		{"no line times", true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := twoXidsFile(t, tc.bootID)
			if tc.procStat {
				if err := os.WriteFile(cfg.ProcStatPath, []byte("cpu 1 2 3\nbtime 1764763200\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			read := func() []string {
				t.Helper()
				c, err := New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				evs, err := c.Check(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				var ids []string
				for _, ev := range evs {
					if ev.GetCheckName() == CheckXID {
						ids = append(ids, ev.GetId())
					}
				}
				if len(ids) != 2 {
					t.Fatalf("%d Xid events, want 2", len(ids))
				}
				return ids
			}
			first := read()
			again := read() // killed before Commit: the same lines again
			if !tc.wantStable {
				if first[0] != "" || again[0] != "" {
					t.Fatalf("ids %q, %q: want none (the spool's)", first, again)
				}
				return
			}
			for i := range first {
				if first[i] == "" || first[i] != again[i] {
					t.Fatalf("event %d: id %q on the first read, %q after the restart: want one id", i, first[i], again[i])
				}
			}
			if first[0] == first[1] {
				t.Fatalf("two lines share id %s", first[0])
			}
		})
	}
}

// TestLinesOfTheBootBeforeKeepTheirIDs: a journal or file source read
// again after a reboot — the agent killed after spooling their events but
// before Commit — serves lines of the boot before; their events have the ids they had when read in that boot, not
// new ones of this boot's id (the gateway would store them again and the
// rules count each Xid again: one Xid 31 twice reaches
// RepeatedXID31OnSameGPU's 2). The journal's lines carry their boot
// (metadata boot_id); this boot's lines have ids of their own. A file read
// with no position kept serves this boot's lines only.
func TestLinesOfTheBootBeforeKeepTheirIDs(t *testing.T) {
	bootA, bootB := "0a1b2c3d-4e5f-4061-8273-94a5b6c7d8e9", "f9e8d7c6-b5a4-4392-8170-6f5e4d3c2b1a"
	startA := time.Date(2024, 10, 28, 9, 0, 0, 0, time.UTC)
	startB := startA.Add(2 * time.Hour)
	line := func(source string, i int, boot string, at time.Time) string {
		msg := fmt.Sprintf("NVRM: Xid (PCI:0000:3b:00): 31, pid=%d, name=x, Ch 00000008, intr 10000000. MMU Fault", 100+i)
		if source == SourceJournal {
			return fmt.Sprintf(`{"__CURSOR":"s=1;i=%d","__REALTIME_TIMESTAMP":"%d","_BOOT_ID":%q,"_TRANSPORT":"kernel","MESSAGE":%q}`,
				i, at.UnixMicro(), strings.ReplaceAll(boot, "-", ""), msg)
		}
		return at.Format("Jan _2 15:04:05") + " gpu-node-42 kernel: " + msg
	}
	for _, tc := range []struct {
		name   string
		source string
		state  bool // a state dir keeps the read position
	}{
		{"journal, killed before its commit", SourceJournal, true},
		{"file, killed before its commit", SourceFile, true},
		{"file, no position kept", SourceFile, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			logf, bootf, statf := filepath.Join(dir, "log"), filepath.Join(dir, "boot_id"), filepath.Join(dir, "stat")
			journalctl := filepath.Join(dir, "journalctl")
			// The fake journalctl prints the entries after --after-cursor.
			script := "#!/bin/sh\nc=\nfor a in \"$@\"; do case \"$a\" in --after-cursor=*) c=\"${a#--after-cursor=}\";; esac; done\n" +
				"if [ -z \"$c\" ]; then cat " + logf + "; else awk -v c=\"\\\"__CURSOR\\\":\\\"$c\\\"\" 'f{print} index($0,c){f=1}' " + logf + "; fi\n"
			if err := os.WriteFile(journalctl, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			cfg := Config{Source: tc.source, File: logf, JournalctlPath: journalctl, BootIDPath: bootf, ProcStatPath: statf}
			if tc.state {
				cfg.StateDir = filepath.Join(dir, "state")
			}
			n := 0
			logged := func(boot string, at time.Time) string {
				t.Helper()
				n++
				f, err := os.OpenFile(logf, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				fmt.Fprintln(f, line(tc.source, n, boot, at))
				return fmt.Sprintf("pid=%d", 100+n)
			}
			// read runs the check once in a boot: the ids of its Xid events
			// by line, committed or not.
			read := func(boot string, start time.Time, commit bool) map[string]string {
				t.Helper()
				if err := os.WriteFile(bootf, []byte(boot+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(statf, []byte(fmt.Sprintf("cpu 1 2 3\nbtime %d\n", start.Unix())), 0o644); err != nil {
					t.Fatal(err)
				}
				c, err := New(Config{Source: cfg.Source, File: cfg.File, JournalctlPath: cfg.JournalctlPath, BootIDPath: cfg.BootIDPath,
					ProcStatPath: cfg.ProcStatPath, StateDir: cfg.StateDir,
					Parser: ParserConfig{Year: 2024, Location: time.UTC, Now: func() time.Time { return start.Add(time.Hour) }}})
				if err != nil {
					t.Fatal(err)
				}
				evs, err := c.Check(context.Background())
				if err == nil && commit {
					err = c.Commit()
				}
				if err != nil {
					t.Fatal(err)
				}
				ids := map[string]string{}
				for _, ev := range evs {
					if ev.GetCheckName() == CheckXID && !ev.GetIsHealthy() {
						msg := ev.GetMetadata()["kernel_message"]
						ids[msg[strings.Index(msg, "pid="):strings.Index(msg, ", name")]] = ev.GetId()
					}
				}
				return ids
			}
			first := logged(bootA, startA.Add(time.Minute))
			a1 := read(bootA, startA, true)
			second := logged(bootA, startA.Add(time.Hour))
			a2 := read(bootA, startA, false) // spooled, killed before the commit
			third := logged(bootB, startB.Add(time.Minute))
			b := read(bootB, startB, false)
			if !tc.state {
				// Read from the start again, in this boot only this boot's
				// line counts (TestFileWithoutPositionSkipsEarlierBoots).
				if a1[first] == "" || a2[first] != a1[first] || len(b) != 1 || b[third] == "" {
					t.Fatalf("first read %q, %q; after the reboot %q: want %s with one id in its boot, then %s alone", a1, a2, b, first, third)
				}
				return
			}
			want := map[string]string{second: a2[second], third: b[third]}
			for l, id := range want {
				if id == "" {
					t.Fatalf("%s: no id (first read %q, %q; after the reboot %q)", l, a1, a2, b)
				}
			}
			for l := range want {
				if l == third {
					continue
				}
				before := a1[l]
				if a2[l] != "" && before != "" && a2[l] != before {
					t.Fatalf("%s: id %q, then %q in its own boot", l, before, a2[l])
				} else if before == "" {
					before = a2[l]
				}
				if b[l] != before {
					t.Errorf("%s, logged in the boot before: id %q after the reboot, %q when read in its boot: want the same", l, b[l], before)
				}
			}
			if b[third] == b[second] {
				t.Errorf("this boot's line has the id of the one before: %s", b[third])
			}
		})
	}
}

// TestStateFileNotUsed: a state file the check cannot use — larger than it
// ever writes (damaged, or state_dir holding another file under its name),
// corrupt, unreadable — is not read into memory whole nor silently taken
// for a first start: the check starts afresh (the log read from its start,
// its lines' events keeping their ids) and warns why; a missing one is a
// first start, not warned about.
func TestStateFileNotUsed(t *testing.T) {
	for _, tc := range topologytest.StateDamages(maxStateBytes, "{\"file\": \"/var/log/kern") {
		t.Run(tc.Name, func(t *testing.T) {
			cfg := twoXidsFile(t, true)
			var logs strings.Builder
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			xids := func(commit bool) int {
				t.Helper()
				c, err := New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				evs, err := c.Check(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if commit {
					if err := c.Commit(); err != nil {
						t.Fatal(err)
					}
				}
				n := 0
				for _, ev := range evs {
					if ev.GetCheckName() == CheckXID {
						n++
					}
				}
				return n
			}
			if n := xids(true); n != 2 {
				t.Fatalf("first run: %d Xid events, want 2", n)
			}
			tc.Alter(t, filepath.Join(cfg.StateDir, "kmsg-file.json"))
			logs.Reset()
			if n := xids(false); n != 2 {
				t.Errorf("restart: %d Xid events, want 2 (the log read again from its start)", n)
			}
			warned := strings.Contains(logs.String(), "level=WARN")
			if warned != (tc.Warn != "") || !strings.Contains(logs.String(), tc.Warn) {
				t.Errorf("log, want a warning naming %q: %s", tc.Warn, logs.String())
			}
		})
	}
}

// TestPositionWrittenWhenMoved: the read position is written (fsync'd,
// renamed into place) at a Commit after lines were read, not at every
// poll of a quiet kernel log — a write and two fsyncs every 5s on every
// node for nothing.
func TestPositionWrittenWhenMoved(t *testing.T) {
	dir := t.TempDir()
	logf := filepath.Join(dir, "kern.log")
	if err := os.WriteFile(logf, []byte("[ 1.0] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=x, MMU Fault\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Source: SourceFile, File: logf, StateDir: dir,
		BootIDPath: filepath.Join(dir, "boot_id"), ProcStatPath: filepath.Join(dir, "stat")}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	state := filepath.Join(dir, "kmsg-file.json")
	poll := func(what string, lines string) uint64 {
		t.Helper()
		if lines != "" {
			f, err := os.OpenFile(logf, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteString(lines)
			f.Close()
		}
		if _, err := c.Check(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := c.Commit(); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(state)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	for _, step := range []struct {
		what, lines string
		written     bool
	}{
		{"lines read", "", true},
		{"nothing new", "", false},
		{"nothing new again", "", false},
		{"a new line", "[ 2.0] usb 1-1: new device\n", true},
		{"nothing new after it", "", false},
	} {
		before, _ := os.Stat(state)
		ino := poll(step.what, step.lines)
		if written := before == nil || before.Sys().(*syscall.Stat_t).Ino != ino; written != step.written {
			t.Errorf("%s: state file written %v, want %v", step.what, written, step.written)
		}
	}
	// A restart resumes where the position was last written.
	c2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if evs, err := c2.Check(context.Background()); err != nil || len(evs) != 0 {
		t.Fatalf("after a restart: %d events (%v), want none", len(evs), err)
	}
}

// TestRestartKeepsFloodCounts: occurrences a flood window holds (counted,
// to be reported when it closes) when the agent restarts are reported by
// the next process: three Xid 31s a second apart, a restart within the
// window, three counted. A restart before that process committed reports
// them again with the same id (stored once), not again under a new one.
func TestRestartKeepsFloodCounts(t *testing.T) {
	dir := t.TempDir()
	logf := filepath.Join(dir, "kern.log")
	var lines string
	for i := 1; i <= 3; i++ {
		lines += fmt.Sprintf("[ %d.0] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=x, Ch 00000008, intr 10000000. MMU Fault\n", i)
	}
	if err := os.WriteFile(logf, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	boot := time.Date(2024, 10, 28, 9, 0, 0, 0, time.UTC)
	statf := filepath.Join(dir, "stat")
	if err := os.WriteFile(statf, []byte(fmt.Sprintf("cpu 1 2 3\nbtime %d\n", boot.Unix())), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(at time.Time, commit bool) []*datamodels.HealthEvent {
		t.Helper()
		return checkOnce(t, Config{Source: SourceFile, File: logf, StateDir: filepath.Join(dir, "state"), ProcStatPath: statf,
			BootIDPath: filepath.Join(dir, "boot_id"), Parser: ParserConfig{Now: func() time.Time { return at }}}, commit)
	}
	count := func(evs []*datamodels.HealthEvent) int {
		n := 0
		for _, ev := range evs {
			c, _ := strconv.Atoi(ev.GetMetadata()["count"])
			n += c
		}
		return n
	}
	before := run(boot.Add(4*time.Second), true) // the window of 1 s still open
	killed := run(boot.Add(8*time.Second), false)
	after := run(boot.Add(9*time.Second), true)
	if n := count(before) + count(after); n != 3 {
		t.Fatalf("counts add up to %d, want 3: before the restart %s\nafter it %s", n, encodeT(before), encodeT(after))
	}
	if len(killed) != len(after) || len(after) != 1 || killed[0].GetId() == "" || killed[0].GetId() != after[0].GetId() {
		t.Fatalf("reported again after a restart before the commit: %s\nthen %s", encodeT(killed), encodeT(after))
	}
	if evs := run(boot.Add(10*time.Second), true); len(evs) != 0 {
		t.Fatalf("reported again after the commit: %s", encodeT(evs))
	}
}

// TestHeldFloodCountsBounded: the flood summaries saved with the position
// are bounded (maxHeldBytes); the windows past the bound are closed at
// once, so a restart still counts every occurrence and the state file
// stays one the next process reads.
func TestHeldFloodCountsBounded(t *testing.T) {
	dir := t.TempDir()
	logf := filepath.Join(dir, "kern.log")
	var b strings.Builder
	const gpus = 1200
	for i := range gpus {
		for s := 1; s <= 2; s++ {
			fmt.Fprintf(&b, "[ %d.0] NVRM: Xid (PCI:0000:%02x:%02x): 31, pid=1, name=x, Ch 00000008, intr 10000000. MMU Fault\n", s, i/256, i%256)
		}
	}
	if err := os.WriteFile(logf, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	boot := time.Date(2024, 10, 28, 9, 0, 0, 0, time.UTC)
	statf := filepath.Join(dir, "stat")
	if err := os.WriteFile(statf, []byte(fmt.Sprintf("cpu 1 2 3\nbtime %d\n", boot.Unix())), 0o644); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, at := range []time.Duration{4 * time.Second, 9 * time.Second} {
		var logs strings.Builder
		c, err := New(Config{Source: SourceFile, File: logf, StateDir: filepath.Join(dir, "state"), ProcStatPath: statf,
			BootIDPath: filepath.Join(dir, "boot_id"), Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			Parser: ParserConfig{Now: func() time.Time { return boot.Add(at) }}})
		if err != nil {
			t.Fatal(err)
		}
		evs, err := c.Check(context.Background())
		if err == nil {
			err = c.Commit()
		}
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(logs.String(), "level=WARN") {
			t.Fatalf("after %s: %s", at, logs.String())
		}
		for _, ev := range evs {
			n, _ := strconv.Atoi(ev.GetMetadata()["count"])
			total += n
		}
	}
	if total != 2*gpus {
		t.Fatalf("counts add up to %d, want %d", total, 2*gpus)
	}
	fi, err := os.Stat(filepath.Join(dir, "state", "kmsg-file.json"))
	if err != nil || fi.Size() > maxStateBytes {
		t.Fatalf("state file: %v, %v bytes (at most %d)", err, fi.Size(), maxStateBytes)
	}
}

// TestFileMissingAtStartIsRetried: a file source whose file is missing at
// start (kern.log not created yet by rsyslog, a logrotate window, a
// hostPath mounted late) is looked for again at every check — it was
// taken for "not present" once and never read, every Xid in it lost until
// a restart — and, missing past missingFileGrace, the check fails naming
// the file, so the lost source shows as a failing check.
func TestFileMissingAtStartIsRetried(t *testing.T) {
	dir := t.TempDir()
	logf := filepath.Join(dir, "kern.log")
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	c, err := New(Config{Source: SourceFile, File: logf, StateDir: dir, ProcStatPath: "/nonexistent",
		Parser: ParserConfig{Location: time.UTC, Now: func() time.Time { return now }}})
	if err != nil {
		t.Fatal(err)
	}
	if evs, err := c.Check(context.Background()); err != nil || len(evs) != 0 {
		t.Fatalf("missing at start: %v %v, want nothing and no error within the grace", evs, err)
	}
	now = now.Add(missingFileGrace + time.Second)
	if _, err := c.Check(context.Background()); err == nil || !strings.Contains(err.Error(), logf) {
		t.Fatalf("missing past the grace: err %v, want one naming %s", err, logf)
	}
	if err := c.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(logf, []byte("[ 1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	evs, err := c.Check(context.Background())
	if err != nil || len(evs) != 1 || evs[0].GetErrorCode()[0] != "XID-79" {
		t.Fatalf("file created later: %v %v, want its Xid 79", evs, err)
	}
}

// TestRepeatsInOneSecondKeepTheirOwnIDs: a kern.log prints whole seconds;
// an Xid repeated on one GPU within one second is as many occurrences,
// each with an id of its own (the store keeps one event per id), and the
// same ids when a restart reads the lines again. With printk times
// (rsyslog's "[  500.100000]") the event carries its line's
// (kernel_timestamp); without them (rsyslog's traditional format) the
// line is never a duplicate of the one before, and its event carries the
// line's place in the file (file_offset), which a restart resuming at
// the saved position mid-second reads the same.
func TestRepeatsInOneSecondKeepTheirOwnIDs(t *testing.T) {
	const msg = "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, Graphics Exception: ESR 0x514648=0x1000f"
	now := time.Date(2024, 10, 28, 10, 5, 0, 0, time.UTC) // windows long closed
	for _, tc := range []struct {
		name  string
		lines []string
	}{
		{"syslog with printk times", []string{
			"Oct 28 10:00:01 node kernel: [  500.100000] " + msg,
			"Oct 28 10:00:01 node kernel: [  500.600000] " + msg,
			"Oct 28 10:00:01 node kernel: [  500.900000] " + msg,
		}},
		{"syslog without printk times", []string{
			"Oct 28 10:00:01 node kernel: " + msg,
			"Oct 28 10:00:01 node kernel: " + msg,
			"Oct 28 10:00:01 node kernel: " + msg,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			logf := filepath.Join(dir, "kern.log")
			cfg := Config{Source: SourceFile, File: logf, StateDir: dir,
				BootIDPath: filepath.Join(dir, "boot_id"), ProcStatPath: filepath.Join(dir, "stat"),
				Parser: ParserConfig{Location: time.UTC, Now: func() time.Time { return now }}}
			run := func(commit bool) []*datamodels.HealthEvent {
				t.Helper()
				return checkOnce(t, cfg, commit)
			}
			write := func(lines []string) {
				t.Helper()
				f, err := os.OpenFile(logf, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if _, err := f.WriteString(strings.Join(lines, "\n") + "\n"); err != nil {
					t.Fatal(err)
				}
			}
			ids := map[string]bool{}
			total := 0
			take := func(evs []*datamodels.HealthEvent) {
				t.Helper()
				for _, ev := range evs {
					if ids[ev.GetId()] || ev.GetId() == "" {
						t.Fatalf("id %q twice or none:\n%s", ev.GetId(), encodeT(evs))
					}
					ids[ev.GetId()] = true
					n, _ := strconv.Atoi(ev.GetMetadata()["count"])
					total += n
				}
			}
			// The first line read and committed; the other two of its
			// second written after it, read by the next process.
			write(tc.lines[:1])
			take(run(true))
			write(tc.lines[1:])
			first := run(false)
			take(first)
			again := run(true) // killed before Commit: the same lines again
			if len(again) != len(first) {
				t.Fatalf("read again: %d events, want %d", len(again), len(first))
			}
			for i := range again {
				if again[i].GetId() != first[i].GetId() {
					t.Fatalf("event %d: id %q, read again %q", i, first[i].GetId(), again[i].GetId())
				}
			}
			last := run(true) // the occurrence the open window held
			take(last)
			if total != 3 {
				t.Fatalf("counts add up to %d, want 3:\n%s\n%s", total, encodeT(first), encodeT(last))
			}
		})
	}
}

// checkOnce runs one Check of a check built from cfg, commits what it
// read when commit is set, and closes it: a poll of an agent's process.
func checkOnce(t *testing.T, cfg Config, commit bool) []*datamodels.HealthEvent {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	evs, err := c.Check(context.Background())
	if err == nil && commit {
		err = c.Commit()
	}
	if err != nil {
		t.Fatal(err)
	}
	return evs
}
