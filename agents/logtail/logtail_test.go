package logtail

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func appendFile(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// read reads once, at most limit bytes, all lines.
func read(t *testing.T, tl *Follower, path string, limit int64) []string {
	t.Helper()
	var out []string
	if err := tl.Read(path, limit, func(l string) bool { out = append(out, l); return true }); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return out
}

func lines(from, to int) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		fmt.Fprintf(&b, "line %d\n", i) // 7 bytes each below 10
	}
	return b.String()
}

const fatal = "[Dec 03 2026 07:01:00] [ERROR] [tid 1] detected NVSwitch fatal error 12028 on NVSwitch pci bus id 00000000:05:00.0"

// TestFollowerFollowsCopytruncate: a log copied and truncated in place
// (the same inode) that grew past the old offset before the next read is
// read from its start — read on from the old offset, the new file's first
// lines were lost and the first line read was cut mid-word.
func TestFollowerFollowsCopytruncate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fabricmanager.log")
	appendFile(t, path, "[Dec 03 2026 07:00:00] [INFO] first\n[Dec 03 2026 07:00:01] [INFO] second\n")
	var tl Follower
	if got := read(t, &tl, path, 1<<20); len(got) != 2 {
		t.Fatalf("first read: %q", got)
	}
	if err := os.WriteFile(path, []byte(fatal+"\nthird\n"), 0o644); err != nil { // truncates in place
		t.Fatal(err)
	}
	if got := read(t, &tl, path, 1<<20); !slices.Equal(got, []string{fatal, "third"}) {
		t.Fatalf("after copytruncate: %q; want the fatal line whole, then the third", got)
	}
}

// TestFollowerReadsARenamedLogToItsEnd: lines written after the last read
// and before the log was renamed away are read before the new log — they
// were lost (a fatal SXid or an Xid among them never reported).
func TestFollowerReadsARenamedLogToItsEnd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fabricmanager.log")
	appendFile(t, path, "first\n")
	var tl Follower
	if got := read(t, &tl, path, 1<<20); !slices.Equal(got, []string{"first"}) {
		t.Fatalf("first read: %q", got)
	}
	appendFile(t, path, fatal+"\ncut short by the rot")
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	appendFile(t, path, "new log\n")
	if got, want := read(t, &tl, path, 1<<20), []string{fatal, "cut short by the rot", "new log"}; !slices.Equal(got, want) {
		t.Fatalf("after the rename: %q; want %q", got, want)
	}
	// Renamed again with more than one read's limit left in it: its rest
	// over the next reads, then the new file.
	appendFile(t, path, lines(0, 6))
	if err := os.Rename(path, path+".2"); err != nil {
		t.Fatal(err)
	}
	appendFile(t, path, "newer\n")
	var all []string
	for range 4 {
		all = append(all, read(t, &tl, path, 20)...)
	}
	if want := append(strings.Split(strings.TrimSuffix(lines(0, 6), "\n"), "\n"), "newer"); !slices.Equal(all, want) {
		t.Fatalf("a rotated file read over reads of 20 bytes: %q", all)
	}
	// Removed, not recreated: nothing, and no error; then a new one.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if got := read(t, &tl, path, 1<<20); len(got) != 0 {
		t.Fatalf("removed: %q", got)
	}
	appendFile(t, path, "another\n")
	if got := read(t, &tl, path, 1<<20); !slices.Equal(got, []string{"another"}) {
		t.Fatalf("recreated: %q", got)
	}
}

// TestFollowerStopsAtARotatedLogsLastLine: fn returning false on the last
// line of a log renamed away stops the read there — the new log was
// opened and fn called again on its first line, one line past kmsg's
// max_lines_per_check and its stop at the check's deadline at each
// rotation; the new log is read by the next read, from its start.
func TestFollowerStopsAtARotatedLogsLastLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kern.log")
	appendFile(t, path, "first\n")
	var tl Follower
	if got := read(t, &tl, path, 1<<20); !slices.Equal(got, []string{"first"}) {
		t.Fatalf("first read: %q", got)
	}
	appendFile(t, path, "old last\n")
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	appendFile(t, path, "new first\nnew second\n")
	var got []string
	if err := tl.Read(path, 1<<20, func(l string) bool { got = append(got, l); return false }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{"old last"}) || !tl.More() {
		t.Fatalf("stopped by fn on the rotated log's last line: fn called on %q (More %v), want once, More", got, tl.More())
	}
	if got, want := read(t, &tl, path, 1<<20), []string{"new first", "new second"}; !slices.Equal(got, want) {
		t.Fatalf("the next read: %q, want %q", got, want)
	}
}

// TestFollowerBoundsItsReads: the first read of a long log replays its
// last Replay bytes from a line's start (a log present later is read from
// its start); one read takes at most its limit, no line lost or cut
// across reads; fn returning false stops the read after that line.
func TestFollowerBoundsItsReads(t *testing.T) {
	dir := t.TempDir()
	long := filepath.Join(dir, "long.log")
	appendFile(t, long, lines(0, 10))
	tl := Follower{Replay: 15}
	if got, want := read(t, &tl, long, 1<<20), []string{"line 8", "line 9"}; !slices.Equal(got, want) {
		t.Fatalf("first read of a long log: %q; want %q", got, want)
	}

	late := filepath.Join(dir, "late.log")
	tl = Follower{Replay: 15}
	if got := read(t, &tl, late, 1<<20); len(got) != 0 {
		t.Fatalf("no log yet: %q", got)
	}
	appendFile(t, late, lines(0, 10))
	var all []string
	for range 6 {
		got := read(t, &tl, late, 20) // two lines and a part
		if len(got) > 2 {
			t.Fatalf("a read of 20 bytes: %q", got)
		}
		all = append(all, got...)
	}
	if len(all) != 10 || all[0] != "line 0" || all[9] != "line 9" {
		t.Fatalf("read in parts: %q; want line 0 … line 9", all)
	}

	var one Follower
	var got []string
	if err := one.Read(long, 1<<20, func(l string) bool { got = append(got, l); return len(got) < 3 }); err != nil || len(got) != 3 {
		t.Fatalf("stopped at 3: %q, %v", got, err)
	}
	if rest := read(t, &one, long, 1<<20); len(rest) != 7 || rest[0] != "line 3" {
		t.Fatalf("the rest: %q", rest)
	}
}

// TestFollowerMore: More tells a read stopped by its limit (or fn) from
// one that reached the file's end, a line still being written included.
func TestFollowerMore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fabricmanager.log")
	appendFile(t, path, lines(0, 10)) // 70 bytes
	var tl Follower
	for i, want := range []bool{true, true, true, true, false, false} { // 14 bytes a read
		read(t, &tl, path, 20)
		if tl.More() != want {
			t.Fatalf("read %d: More %v, want %v", i, tl.More(), want)
		}
	}
	appendFile(t, path, "line 10 still being wri")
	if read(t, &tl, path, 1<<20); tl.More() {
		t.Fatal("a line still being written: More")
	}
	var one Follower
	if err := one.Read(path, 1<<20, func(string) bool { return false }); err != nil || !one.More() {
		t.Fatalf("stopped by fn: More %v, %v", one.More(), err)
	}
}

// TestFollowerReadsPastZerosAndLongLines: a power cut's zero-filled tail
// (no newline) is skipped and the line written after it read — it was
// glued to the zeros, and a fatal SXid or FM's start line on it was not
// recognised; a line longer than MaxLineBytes is cut there.
func TestFollowerReadsPastZerosAndLongLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fabricmanager.log")
	appendFile(t, path, "before the power cut\n"+strings.Repeat("\x00", 100<<10)+fatal+"\n"+
		strings.Repeat("x", 200<<10)+"\nafter\n")
	var tl Follower
	got := read(t, &tl, path, 1<<20)
	if len(got) != 4 || got[1] != fatal || got[3] != "after" {
		t.Fatalf("%d lines; want the fatal line whole after the zeros, then the long one, then \"after\"", len(got))
	}
	if n := len(got[2]); n != MaxLineBytes {
		t.Fatalf("a 200 KiB line read as %d bytes; want it cut at %d", n, MaxLineBytes)
	}
}

// TestFollowerReadsPastZerosMidLine: a power cut's zero-filled tail that
// begins mid-line ends that line; the line written after the zeros is a
// line of its own — it was glued to the half line and the zeros (a run
// shorter than a line's bound), or dropped as the rest of a cut line (a
// longer one). Read a line a read (fn stopping), the same lines.
func TestFollowerReadsPastZerosMidLine(t *testing.T) {
	const half = "[Dec 03 2026 07:00:59] [INFO] half a li"
	want := []string{"before", half, fatal, "after"}
	for _, zeros := range []int{1, 4096, MaxLineBytes - 60, 100 << 10, 200 << 10} {
		t.Run(fmt.Sprint(zeros), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "fabricmanager.log")
			appendFile(t, path, "before\n"+half+strings.Repeat("\x00", zeros)+fatal+"\nafter\n")
			var tl Follower
			if got := read(t, &tl, path, 1<<20); !slices.Equal(got, want) {
				t.Fatalf("%d lines: %.200q; want %q", len(got), got, want)
			}
			var one Follower
			var got []string
			for range 6 {
				if err := one.Read(path, 1<<20, func(l string) bool { got = append(got, l); return false }); err != nil {
					t.Fatal(err)
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("a line a read: %d lines: %.200q; want %q", len(got), got, want)
			}
		})
	}
	// A line after the zeros longer than MaxLineBytes is cut at
	// MaxLineBytes of its own.
	path := filepath.Join(t.TempDir(), "fabricmanager.log")
	appendFile(t, path, "before\n"+half+strings.Repeat("\x00", 1000)+strings.Repeat("x", 200<<10)+"\nafter\n")
	var tl Follower
	got := read(t, &tl, path, 1<<20)
	if len(got) != 4 || got[1] != half || len(got[2]) != MaxLineBytes || got[3] != "after" {
		t.Fatalf("%d lines; want before, the half line, %d x's, after", len(got), MaxLineBytes)
	}
}

// TestFollowerResumes: a position saved before a restart is read on from
// when the file is the same inode and still starts with the bytes it
// started with; another file, or the same inode with other first bytes (a
// log truncated in place that grew past the offset, or a rotated log's
// inode number reused by the new one), is read from its start — it was
// read on mid-file, its first lines (an Xid among them) lost. A position
// without a fingerprint (saved by an earlier version) trusts the inode.
func TestFollowerResumes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kern.log")
	appendFile(t, path, lines(0, 4))
	var tl Follower
	read(t, &tl, path, 1<<20)
	ino, off, head := tl.Position()
	tl.Close()
	appendFile(t, path, lines(4, 6))

	again := Follower{Replay: 1}
	again.Resume(ino, off, head)
	if got := read(t, &again, path, 1<<20); !slices.Equal(got, []string{"line 4", "line 5"}) || !again.Resumed() {
		t.Fatalf("resumed: %q (resumed %v)", got, again.Resumed())
	}
	old := Follower{}
	old.Resume(ino, off, "")
	if got := read(t, &old, path, 1<<20); !slices.Equal(got, []string{"line 4", "line 5"}) {
		t.Fatalf("resumed without a fingerprint: %q", got)
	}
	other := Follower{}
	other.Resume(ino+1, off, head)
	if got := read(t, &other, path, 1<<20); len(got) != 6 || other.Resumed() {
		t.Fatalf("resumed on another inode: %q; want the file from its start", got)
	}
	mismatch := Follower{}
	mismatch.Resume(ino, off, "28:0123456789abcdef0123456789abcdef")
	if got := read(t, &mismatch, path, 1<<20); len(got) != 6 || mismatch.Resumed() {
		t.Fatalf("resumed with other first bytes: %q; want the file from its start", got)
	}

	// Truncated in place while the agent was down, then grown past the
	// saved offset: the same inode, other content.
	ino, off, head = again.Position()
	again.Close()
	regrown := "[ 12.000000] NVRM: Xid (PCI:0000:05:00): 79, pid=1, GPU has fallen off the bus.\n" + lines(0, 9)
	if err := os.WriteFile(path, []byte(regrown), 0o644); err != nil {
		t.Fatal(err)
	}
	if int64(len(regrown)) <= off {
		t.Fatalf("the new content (%d bytes) does not pass the offset %d", len(regrown), off)
	}
	restarted := Follower{Replay: 1 << 20}
	restarted.Resume(ino, off, head)
	got := read(t, &restarted, path, 1<<20)
	if len(got) != 10 || !strings.Contains(got[0], "Xid") || restarted.Resumed() {
		t.Fatalf("truncated and regrown while down: %q; want the new file from its start, its Xid first", got)
	}
}

// TestFollowerPositionBeforeARead: a position taken before the file was
// read (missing yet) is the resumed one, fingerprint included.
func TestFollowerPositionBeforeARead(t *testing.T) {
	var tl Follower
	tl.Resume(7, 42, "5:00")
	read(t, &tl, filepath.Join(t.TempDir(), "missing.log"), 1<<20)
	if ino, off, head := tl.Position(); ino != 7 || off != 42 || head != "5:00" {
		t.Fatalf("position: %d %d %q", ino, off, head)
	}
}
