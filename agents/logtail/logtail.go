// Package logtail follows a text log file the way tail -F does, for the
// agent checks that read one (the FM and NVLSM logs, kern.log).
//
// A Follower keeps the file open between reads, so a log renamed away by
// rotation is read to its end (a last line without a newline included)
// before the new file is read from its start — reopening by name lost
// what was written between the last read and the rename. A file shorter
// than the offset, or whose first bytes changed (copytruncate, then more
// written than was read before), is read again from its start.
//
// Its reads are bounded: at most a given number of bytes per read (the
// rest waits for the next one); a line longer than MaxLineBytes is cut
// there. A run of NUL bytes ends a line and is skipped — the zero-filled
// tail a power cut can leave has no newline, often begins mid-line, and
// the line written after it began with it: the text before the zeros is
// read as a line of its own (a line cut short, as the power cut left it),
// the line after them as another.
package logtail

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
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
}

// Resume makes the first read go on at offset when the file is still the
// inode a previous run read (its Position); otherwise it is read as new.
func (t *Follower) Resume(inode uint64, offset int64) {
	t.inode, t.offset = inode, offset
}

// Position is the inode and offset of the line to read next, to Resume
// from after a restart.
func (t *Follower) Position() (inode uint64, offset int64) { return t.inode, t.offset }

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
	fi, err := os.Stat(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	first := !t.started
	t.started = true
	if t.f != nil {
		if cur, err := t.f.Stat(); err == nil && fi != nil && os.SameFile(fi, cur) {
			_, err := t.readOn(limit, false, fn)
			return err
		}
		// Renamed or removed: the rest of it first.
		more, err := t.readOn(limit, true, fn)
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
	t.f, t.inode, t.head, t.skip = f, ino, nil, false
	switch {
	case resumed:
	case first && t.Replay > 0 && fi.Size() > t.Replay:
		// From the first line that starts in the last Replay bytes.
		t.offset, t.skip = fi.Size()-t.Replay-1, true
	default:
		t.offset = 0
	}
	_, err = t.readOn(limit, false, fn)
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
// before the file's end (limit, fn). rotated: the file will not grow, a
// last line without a newline is read too.
func (t *Follower) readOn(limit int64, rotated bool, fn func(string) bool) (more bool, err error) {
	fi, err := t.f.Stat()
	if err != nil {
		return false, err
	}
	head, err := t.readHead(fi.Size())
	if err != nil {
		return false, err
	}
	if fi.Size() < t.offset || !bytes.HasPrefix(head, t.head) {
		t.offset, t.skip = 0, false
	}
	t.head = head
	stop := t.offset + limit // the read's bound
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
				return t.offset < fi.Size(), err
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
				return t.offset < fi.Size(), nil
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
