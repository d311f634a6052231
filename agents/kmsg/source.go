package kmsg

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/faultline/faultline/agents/logtail"
	"github.com/faultline/faultline/agents/topology"
	"github.com/faultline/faultline/internal/groupcmd"
)

// source delivers kernel-log lines. read is non-blocking: it hands over what
// is available now (at most max lines) and returns.
type source interface {
	read(ctx context.Context, max int, fn func(Line)) error
	// position returns what to persist so that a restart resumes after the
	// last line read.
	position() sourceState
	close() error
}

// sourceState is the persisted read position (state.json under StateDir).
type sourceState struct {
	BootID string `json:"bootId,omitempty"`
	// ClearedBoot is the boot whose start the check reported healthy
	// (Check.afterReboot); another boot id at start means a reboot.
	ClearedBoot string `json:"clearedBoot,omitempty"`
	KmsgSeq     int64  `json:"kmsgSeq,omitempty"`
	Cursor      string `json:"journalCursor,omitempty"`
	File        string `json:"file,omitempty"`
	Inode       uint64 `json:"inode,omitempty"`
	Offset      int64  `json:"offset,omitempty"`
	// Head is the fingerprint of the file's first bytes (logtail): the
	// offset is used only while the file still starts with them (none, in
	// a state written by an earlier version: the inode is trusted).
	Head string `json:"head,omitempty"`
}

// savedState is what the state file holds: the read position, and the
// flood summaries that were held when it was saved.
type savedState struct {
	sourceState
	// Held are the summaries (HealthEvent protobufs, each with its id) of
	// the occurrences that open flood windows held, counted but not yet
	// reported: the lines are behind the position, so a restart reports
	// these instead (Check.Commit).
	Held [][]byte `json:"held,omitempty"`
}

// maxHeldBytes bounds the flood summaries saved with the position; the
// windows past it are closed at once instead (their summaries reported
// then, a window per key and check run at worst).
const maxHeldBytes = 256 << 10

// maxStateBytes bounds the state file read at start: the check writes a
// few hundred bytes (boot ids, a sequence number, a journal cursor, a
// file's path and offset) and at most maxHeldBytes of flood summaries,
// base64 in JSON; a larger file is not one it wrote.
const maxStateBytes = 1 << 20

// loadState reads the state saved at path. A file that cannot be used
// (larger than maxStateBytes, corrupt, unreadable) is a fresh start, as a
// missing one is, but warned about: the log is read from its start.
func loadState(path string, log *slog.Logger) savedState {
	var s savedState
	if path == "" {
		return s
	}
	b, err := topology.ReadCapped(path, maxStateBytes)
	if err == nil {
		err = json.Unmarshal(b, &s)
	}
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			log.Warn("kmsg state file not used: reading the kernel log from its start", "path", path, "err", err)
		}
		return savedState{}
	}
	return s
}

func saveState(path string, s savedState) error {
	if path == "" {
		return nil
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("kmsg state: %w", err)
	}
	if err := topology.AtomicWrite(path, b); err != nil {
		return fmt.Errorf("kmsg state: %w", err)
	}
	return nil
}

// --- /dev/kmsg ---

// kmsgSource reads /dev/kmsg without blocking. Each read(2) returns one
// record "pri,seq,usec,flags;text\n[ KEY=value\n…]". A restart on the same
// boot skips records up to the saved sequence number; on a new boot every
// record in the ring buffer is new.
type kmsgSource struct {
	fd     int
	rd     func(fd int, b []byte) (int, error)
	bootID string
	seq    int64 // last sequence number read
	skip   int64 // records with seq <= skip were read before a restart
	buf    []byte
}

func openKmsg(path, bootID string, st sourceState) (*kmsgSource, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	s := &kmsgSource{fd: fd, rd: syscall.Read, bootID: bootID, seq: -1, skip: -1, buf: make([]byte, 16384)}
	if st.BootID != "" && st.BootID == bootID {
		s.skip = st.KmsgSeq
		s.seq = st.KmsgSeq
	}
	return s, nil
}

func (s *kmsgSource) read(ctx context.Context, max int, fn func(Line)) error {
	for n := 0; n < max; n++ {
		if n%1024 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		k, err := s.rd(s.fd, s.buf)
		switch {
		case errors.Is(err, syscall.EAGAIN):
			return nil
		case errors.Is(err, syscall.EPIPE):
			continue // the ring buffer overwrote records we had not read
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("read /dev/kmsg: %w", err)
		case k == 0:
			return nil
		}
		s.record(s.buf[:k], fn)
	}
	return nil
}

func (s *kmsgSource) record(b []byte, fn func(Line)) {
	semi := bytes.IndexByte(b, ';')
	if semi < 0 {
		return
	}
	head := string(b[:semi])
	text := b[semi+1:]
	if nl := bytes.IndexByte(text, '\n'); nl >= 0 {
		text = text[:nl] // dictionary lines (" SUBSYSTEM=…") follow
	}
	f := strings.SplitN(head, ",", 4)
	if len(f) < 3 {
		return
	}
	pri, err1 := strconv.Atoi(f[0])
	seq, err2 := strconv.ParseInt(f[1], 10, 64)
	usec, err3 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return
	}
	if seq <= s.skip {
		return
	}
	s.seq = seq
	if pri>>3 != 0 {
		return // written by user space, not the kernel: never trusted
	}
	fn(Line{Text: string(text), Mono: usec})
}

func (s *kmsgSource) position() sourceState {
	return sourceState{BootID: s.bootID, KmsgSeq: s.seq}
}

func (s *kmsgSource) close() error { return syscall.Close(s.fd) }

// --- journal ---

// journalSource runs journalctl -k -o json for the entries after the last
// cursor (the whole current boot the first time) and reads its output.
type journalSource struct {
	path   string
	cursor string
	run    func(ctx context.Context, name string, args ...string) (io.ReadCloser, func() error, error)
}

func newJournal(path string, st sourceState) *journalSource {
	return &journalSource{path: path, cursor: st.Cursor, run: startCmd}
}

// journalWaitDelay is how long journalctl's output is read after ctx's end
// killed its process group (a child that left the group and holds the
// output open does not hold the check past it).
const journalWaitDelay = 2 * time.Second

// startCmd starts journalctl in a process group of its own: at ctx's end
// (the check's deadline, a read stopped after its entries, shutdown) the
// whole group is killed, a wrapper's child (sh, nsenter running the
// host's journalctl) with it.
func startCmd(ctx context.Context, name string, args ...string) (io.ReadCloser, func() error, error) {
	cmd := groupcmd.Command(ctx, journalWaitDelay, name, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	return out, cmd.Wait, nil
}

func (j *journalSource) args() []string {
	a := []string{"-k", "-o", "json", "--no-pager"}
	if j.cursor != "" {
		return append(a, "--after-cursor="+j.cursor)
	}
	return append(a, "-b")
}

// read reads at most max entries; journalctl is stopped after them and
// the next read goes on from the last one's cursor (a whole boot's
// backlog, the first time, is read a check at a time).
func (j *journalSource) read(ctx context.Context, max int, fn func(Line)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out, wait, err := j.run(ctx, j.path, j.args()...)
	if err != nil {
		return fmt.Errorf("journalctl: %w", err)
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	last := ""
	n := 0
	for n < max && sc.Scan() {
		line := sc.Text()
		last = line
		fn(Line{Text: line, Mono: -1})
		n++
	}
	scanErr := sc.Err()
	stopped := n == max
	if stopped {
		cancel() // the rest at the next read
	}
	_ = out.Close()
	werr := wait()
	if stopped {
		werr = nil // killed by us
	}
	if last != "" {
		var c struct {
			Cursor string `json:"__CURSOR"`
		}
		if json.Unmarshal([]byte(last), &c) == nil && c.Cursor != "" {
			j.cursor = c.Cursor
		}
	}
	if scanErr != nil {
		return fmt.Errorf("journalctl output: %w", scanErr)
	}
	if werr != nil {
		return fmt.Errorf("journalctl: %w", werr)
	}
	return nil
}

func (j *journalSource) position() sourceState { return sourceState{Cursor: j.cursor} }
func (j *journalSource) close() error          { return nil }

// --- file ---

// fileSource follows a text file (kern.log, a dmesg capture) like tail -F
// (logtail): it resumes at the saved offset, reads a rotated file to its
// end before the new one, starts over when the file was truncated, and
// leaves a partial last line for later.
type fileSource struct {
	path string
	tail logtail.Follower
	// fromStart, when set, is called before the first line is handed
	// over if the file it is read from was not resumed at the saved
	// position (none saved, or the log no longer the file it was saved
	// in): the file is read from its start (Check.open).
	fromStart func()
	begun     bool // a line was handed over, or the first open resumed
}

// fileReadBytes bounds one read (with max lines).
const fileReadBytes = 64 << 20

func newFile(path string, st sourceState, fromStart func()) *fileSource {
	f := &fileSource{path: path, fromStart: fromStart}
	if st.File == path {
		f.tail.Resume(st.Inode, st.Offset, st.Head)
	}
	return f
}

func (f *fileSource) read(ctx context.Context, max int, fn func(Line)) error {
	n := 0
	err := f.tail.Read(f.path, fileReadBytes, func(line string) bool {
		if !f.begun {
			f.begun = true
			if !f.tail.Resumed() && f.fromStart != nil {
				f.fromStart()
			}
		}
		fn(Line{Text: line, Mono: -1, Offset: f.tail.Offset()})
		n++
		return n < max && (n%4096 != 0 || ctx.Err() == nil)
	})
	// Resumed without a line yet: a log rotated later is read from its
	// start, all of it written since.
	f.begun = f.begun || f.tail.Resumed()
	if err == nil {
		err = ctx.Err()
	}
	return err
}

func (f *fileSource) position() sourceState {
	ino, off, head := f.tail.Position()
	return sourceState{File: f.path, Inode: ino, Offset: off, Head: head}
}
func (f *fileSource) close() error { return f.tail.Close() }
