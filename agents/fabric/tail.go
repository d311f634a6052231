package fabric

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/faultline/faultline/agents/logtail"
)

// tailer reads the FM (or NVLSM) log incrementally (logtail: rotation
// followed, reads bounded) into LogLines.
type tailer struct {
	logtail.Follower
	reader *LogReader
	path   string // the file last read
	// saved is the position the previous run of the agent committed (nil:
	// none); the first read went on from it when Resumed.
	saved *logPosition
	// backlog: the file and size the log had at the first read; a read
	// that starts before its end reads lines that were there when the
	// agent started.
	backlog logPosition
	// newest is the time of the newest line the log has given (this
	// run's reads, or the previous run's as saved; zero: none), capped at
	// the poll that read it: the log covers what is dated up to it.
	newest time.Time
}

// logPosition is where a log was read up to (the state file's).
type logPosition struct {
	Path   string `json:"path"`
	Inode  uint64 `json:"inode"`
	Offset int64  `json:"offset"`
	// Head is the fingerprint of the file's first bytes (logtail): the
	// position is used only while the file still starts with them. A
	// position without one (written by an earlier version) trusts the
	// inode.
	Head string `json:"head,omitempty"`
}

const (
	// replayBytes of a log present when the agent starts are read, when
	// the position a previous run committed cannot be used (FM's log may
	// hold up to LOG_FILE_MAX_SIZE, a gigabyte by default: read whole, it
	// was held in memory and replayed as one poll — 256 MB took 800 MB,
	// the agent's limit is 128 MiB).
	replayBytes = 1 << 20
	// chunkBytes at most are read a poll (about 30,000 lines, 40 MB of
	// heap with their events); the rest waits for the next poll.
	chunkBytes = 4 << 20
)

func (t *tailer) read(path string, r *LogReader) ([]LogLine, error) {
	first := t.reader == nil
	if first {
		t.reader, t.Replay = r, replayBytes
		if err := t.start(path); err != nil {
			return nil, err
		}
	}
	t.path = path
	ino, off, _ := t.Position()
	replayed := first || (ino == t.backlog.Inode && off < t.backlog.Offset)
	var out []LogLine
	err := t.Read(path, chunkBytes, func(line string) bool {
		out = append(out, t.reader.Feed(line)...)
		return true
	})
	// A message may still receive continuation lines; it is reported
	// with the next read, unless the file is idle: flush what waits.
	out = append(out, t.reader.Flush()...)
	now := time.Now()
	if r.Now != nil {
		now = r.Now()
	}
	for i := range out {
		out[i].Replayed, out[i].Resumed = replayed, t.Resumed()
		lt := out[i].Time
		if lt.After(now) {
			lt = now
		}
		if lt.After(t.newest) {
			t.newest = lt
		}
	}
	return out, err
}

// start resumes at the saved position when the log is still the file it
// was read in — the same inode, still starting with the same bytes — and
// not shorter than it (otherwise its last replayBytes are read, taken for
// new by their time; logtail decides at the first read), and notes the
// backlog.
func (t *tailer) start(path string) error {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fabric log %s: %w", path, err)
	}
	ino := inodeOf(fi)
	if p := t.saved; p != nil && p.Path == path {
		t.Resume(p.Inode, p.Offset, p.Head)
	}
	t.backlog = logPosition{Path: path, Inode: ino, Offset: fi.Size()}
	return nil
}

// position is the position to commit: where the log was read up to, or
// the saved one while it was not read (nil: none).
func (t *tailer) position() *logPosition {
	if t.reader == nil {
		return t.saved
	}
	ino, off, head := t.Position()
	if ino == 0 {
		return nil
	}
	return &logPosition{Path: t.path, Inode: ino, Offset: off, Head: head}
}

func inodeOf(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
