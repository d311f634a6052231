// Package logtail follows a text log file the way tail -F does, for the
// agent checks that read one (the FM and NVLSM logs, kern.log).
//
// A Follower keeps the file open between reads, so a log renamed away by
// rotation is read to its end (a last line without a newline included)
// before the new file is read from its start — reopening by name lost
// what was written between the last read and the rename. A file shorter
// than the offset, or whose first bytes changed (copytruncate, then more
// written than was read before), is read again from its start. Its
// Position holds those first bytes' fingerprint too: after a restart the
// file is read on from it only when it is the same inode and still starts
// with them (a log rotated away and deleted whose inode number the new log
// got, or one truncated in place that grew past the offset, is read from
// its start).
//
// Its reads are bounded: at most a given number of bytes per read (the
// rest waits for the next one, as More tells); a line longer than
// MaxLineBytes is cut there. A run of NUL bytes ends a line and is
// skipped — the zero-filled tail a power cut can leave has no newline,
// often begins mid-line, and the line written after it began with it:
// the text before the zeros is read as a line of its own (a line cut
// short, as the power cut left it), the line after them as another.
package logtail

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// MaxLineBytes bounds a line; the rest of a longer one is skipped.
const MaxLineBytes = 64 << 10

// headBytes of the file are compared between reads (copytruncate).
const headBytes = 256

// Follower follows one log file. The zero value reads a file from its
// start.
type Follower struct {
	// Replay, when positive, bounds the first read of a file present when
	// the Follower starts (without a resumed position): it starts at the
	// first line that begins in its last Replay bytes. A file that
	// appears later, or replaces a rotated one, is read from its start.
	Replay int64

	f       *os.File
	inode   uint64
	offset  int64
	head    []byte // the file's first headBytes (fewer while it is shorter)
	skip    bool   // the rest of a cut line is being skipped
	started bool
	// saved is the head fingerprint given to Resume (until the first
	// open); resumed: the first open went on from the resumed position.
	saved   string
	resumed bool
	// more: the last read stopped before the file's end (More).
	more bool
}

// Resume makes the first read go on at offset when the file is still the
// inode a previous run read and still starts with the bytes head (a
// Position's fingerprint) is of; otherwise it is read as new. An empty
// head (a position saved before fingerprints were) trusts the inode and
// offset alone, as then: read from its start, a log present for months
// was reported again, every Xid in it.
func (t *Follower) Resume(inode uint64, offset int64, head string) {
	t.inode, t.offset, t.saved = inode, offset, head
}

// More reports whether the last Read stopped before the end of the file
// (its limit, or fn): the rest waits for the next Read. A line still
// being written at the end is not more.
func (t *Follower) More() bool { return t.more }

// Resumed reports whether the first open went on at the position given to
// Resume.
func (t *Follower) Resumed() bool { return t.resumed }

// Position is the inode and offset of the line to read next, and the
// fingerprint of the file's first bytes, to Resume from after a restart.
func (t *Follower) Position() (inode uint64, offset int64, head string) {
	if t.head == nil {
		return t.inode, t.offset, t.saved // not read yet
	}
	return t.inode, t.offset, fingerprint(t.head)
}

// Offset is the offset just past the line Read is handing to fn (past
// the run of lines split by NULs it is one of); after Read, Position's.
func (t *Follower) Offset() int64 { return t.offset }

// fingerprint identifies a file's first bytes: their length and a hash.
func fingerprint(head []byte) string {
	sum := sha256.Sum256(head)
	return strconv.Itoa(len(head)) + ":" + hex.EncodeToString(sum[:16])
}

// startsWith reports whether the file f starts with the bytes of the
// fingerprint fp ("": no fingerprint, taken for a match).
func startsWith(f *os.File, fp string) (bool, error) {
	if fp == "" {
		return true, nil
	}
	n, _, _ := strings.Cut(fp, ":")
	size, err := strconv.Atoi(n)
	if err != nil || size < 0 || size > headBytes {
		return false, nil // not one Position gave: read the file as new
	}
	head := make([]byte, size)
	if _, err := f.ReadAt(head, 0); err != nil {
		if errors.Is(err, io.EOF) {
			return false, nil // shorter than it was
		}
		return false, err
	}
	return fingerprint(head) == fp, nil
}

// Close closes the file.
func (t *Follower) Close() error {
	if t.f == nil {
		return nil
	}
	err := t.f.Close()
	t.f = nil
	return err
}

// Read hands fn the complete lines written since the last read, at most
// limit bytes of them, until fn returns false. A missing file is no error
// (nothing to read yet).
func (t *Follower) Read(path string, limit int64, fn func(line string) bool) error {
	t.more = false
	fi, err := os.Stat(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	first := !t.started
	t.started = true
	if t.f != nil {
		if cur, err := t.f.Stat(); err == nil && fi != nil && os.SameFile(fi, cur) {
			_, _, err := t.readOn(limit, false, fn)
			return err
		}
		// Renamed or removed: the rest of it first; the new file at the
		// next Read when the limit or fn stopped it.
		more, stopped, err := t.readOn(limit, true, fn)
		if stopped && err == nil {
			t.more = t.more || fi != nil
			return nil
		}
		if more && err == nil {
			return nil
		}
		t.Close()
		if err != nil {
			return err
		}
	}
	if fi == nil {
		return nil
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi, err = f.Stat(); err != nil {
		f.Close()
		return err
	}
	ino := inodeOf(fi)
	resumed := first && ino == t.inode && t.offset <= fi.Size()
	if resumed {
		if resumed, err = startsWith(f, t.saved); err != nil {
			f.Close()
			return err
		}
	}
	t.f, t.inode, t.head, t.skip, t.saved, t.resumed = f, ino, nil, false, "", resumed
	switch {
	case resumed:
	case first && t.Replay > 0 && fi.Size() > t.Replay:
		// From the first line that starts in the last Replay bytes.
		t.offset, t.skip = fi.Size()-t.Replay-1, true
	default:
		t.offset = 0
	}
	_, _, err = t.readOn(limit, false, fn)
	return err
}

func (t *Follower) readHead(size int64) ([]byte, error) {
	head := make([]byte, min(size, headBytes))
	n, err := t.f.ReadAt(head, 0)
	if errors.Is(err, io.EOF) { // truncated since the stat
		err = nil
	}
	return head[:n], err
}

// readOn reads the open file's lines from the offset; more: it stopped
// before the file's end (limit, fn); stopped: fn returned false.
// rotated: the file will not grow, a last line without a newline is read
// too.
func (t *Follower) readOn(limit int64, rotated bool, fn func(string) bool) (more, stopped bool, err error) {
	fi, err := t.f.Stat()
	if err != nil {
		return false, false, err
	}
	head, err := t.readHead(fi.Size())
	if err != nil {
		return false, false, err
	}
	if fi.Size() < t.offset || !bytes.HasPrefix(head, t.head) {
		t.offset, t.skip = 0, false
	}
	t.head = head
	stop := t.offset + limit // the read's bound
	t.more = fi.Size() > stop
	br := bufio.NewReaderSize(io.NewSectionReader(t.f, t.offset, limit), MaxLineBytes)
	for {
		b, err := br.ReadSlice('\n')
		full := errors.Is(err, bufio.ErrBufferFull)
		if err != nil && !full {
			if !rotated || len(b) == 0 || t.offset+int64(len(b)) < fi.Size() {
				// A line cut by the limit, or still being written, waits.
				if errors.Is(err, io.EOF) {
					err = nil
				}
				return t.offset < fi.Size(), false, err
			}
			full = false // the rotated file's last line
		}
		start := t.offset
		t.offset += int64(len(b))
		// A run of NULs ends a line: b holds the lines between them. Its
		// first goes on with a line cut at MaxLineBytes when skip is set;
		// its last is cut there when it filled the buffer.
		skipped := t.skip
		t.skip = full && b[len(b)-1] != 0
		for i := 0; ; {
			end := bytes.IndexByte(b[i:], 0)
			if end < 0 && full && i > 0 && i < len(b) {
				// A line after zeros that filled the buffer: read again
				// from its start, to be cut at MaxLineBytes of its own.
				t.offset, t.skip = start+int64(i), false
				br.Reset(io.NewSectionReader(t.f, t.offset, stop-t.offset))
				break
			}
			if end < 0 {
				end = len(b)
			} else {
				end += i
			}
			line := bytes.Trim(b[i:end], "\r\n")
			if !(skipped && i == 0) && len(line) > 0 && !fn(string(line)) {
				if end < len(b) { // the lines after the zeros on the next read
					t.offset, t.skip = start+int64(end), false
				}
				t.more = t.offset < fi.Size()
				return t.more, true, nil
			}
			if end == len(b) {
				break
			}
			for i = end; i < len(b) && b[i] == 0; i++ {
			}
		}
	}
}

func inodeOf(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
