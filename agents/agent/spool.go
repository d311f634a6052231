package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/faultline/faultline/agents/topology"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// The spool is a directory of segment files named <seq>.seg (seq is a
// zero-padded decimal). A segment is a sequence of records:
//
//	4 bytes big-endian payload length | 4 bytes CRC-32C of the payload | payload
//
// where the payload is one protobuf HealthEvent. Appends go to the newest
// segment and are fsync'd before Append returns; an append that fails (a
// full disk) leaves nothing of itself, so the appends after it stay
// readable. A new segment starts when the current one reaches
// segmentBytes. The read position (segment, offset) lives in the file
// "cursor", replaced atomically after the gateway has
// returned ids for everything before it; segments wholly before the cursor
// are deleted. A crash between the gateway's answer and the cursor update
// resends that batch (at-least-once).
//
// Capacity and what happens when full: the unsent bytes are capped at
// MaxBytes. New events are refused rather than old ones dropped, so the
// gateway always receives an unbroken, ordered prefix of the node's history
// (boundary-crossing events are only meaningful in order). The last 10% of
// the capacity is reserved for fatal events: above 90% a healthy or
// non-fatal event is refused, a fatal one is still accepted until 100%.
// Once the spool has refused an event with 80% of the capacity or more
// unsent it is full: it refuses every non-fatal event until the gateway
// has taken the backlog below 80% of the capacity (fatal ones still while
// they fit). Below 80%, a refused event (one larger than the room left)
// refuses only itself. Within one append every event after a refused one
// is refused too (the agent's runner offers a check's fatal events after
// a refused one again on their own: Agent.spoolKept).
// Every event refused counts once in faultline_agent_spool_dropped_events_total
// {reason="full"|"reserved_for_fatal"} (AppendAgain, the agent's later tries
// of the events it kept, counts none again; an append that fails to write
// counts none, its events tried again through Append); faultline_agent_spool_full is 1 while
// the spool refuses, and the first refusal of an episode logs an error.
type Spool struct {
	dir          string
	maxBytes     int64
	segmentBytes int64
	log          *slog.Logger
	m            *Metrics

	mu      sync.Mutex
	segs    []uint64         // ascending
	sizes   map[uint64]int64 // bytes per segment
	w       segmentFile      // newest segment, opened for append
	open    func(path string) (segmentFile, error)
	cur     Cursor
	full    bool
	closed  bool
	sealed  bool // the newest segment takes no more appends (cutFailedWrite)
	notify  chan struct{}
	crc     *crc32.Table
	scratch []byte
}

// segmentFile is the newest segment, open for appends: an *os.File (a
// test's is one whose disk fills).
type segmentFile interface {
	io.WriteCloser
	Sync() error
	Truncate(size int64) error
}

func openSegment(path string) (segmentFile, error) {
	return os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
}

// Cursor is a read position in the spool.
type Cursor struct {
	Seg uint64 `json:"seg"`
	Off int64  `json:"off"`
}

const recordHeader = 8

// ErrSpoolClosed is returned by Append after Close.
var ErrSpoolClosed = errors.New("spool closed")

// OpenSpool opens (creating if needed) the spool in dir. A torn record at
// the end of the newest segment, left by a crash mid-append, is cut off.
func OpenSpool(dir string, maxBytes int64, log *slog.Logger, m *Metrics) (*Spool, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("spool dir: %w", err)
	}
	seg := maxBytes / 8
	seg = max(min(seg, 4<<20), 4<<10)
	s := &Spool{dir: dir, maxBytes: maxBytes, segmentBytes: seg, log: log, m: m, open: openSegment,
		sizes: map[uint64]int64{}, notify: make(chan struct{}, 1), crc: crc32.MakeTable(crc32.Castagnoli)}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("spool dir: %w", err)
	}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".seg")
		if !ok {
			continue
		}
		seq, err := strconv.ParseUint(name, 10, 64)
		if err != nil {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return nil, fmt.Errorf("spool segment: %w", err)
		}
		s.segs = append(s.segs, seq)
		s.sizes[seq] = info.Size()
	}
	slices.Sort(s.segs)
	if len(s.segs) > 0 {
		last := s.segs[len(s.segs)-1]
		if err := s.repairTail(last); err != nil {
			return nil, err
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "cursor")); err == nil {
		seg, off, ok := strings.Cut(strings.TrimSpace(string(b)), " ")
		a, err1 := strconv.ParseUint(seg, 10, 64)
		o, err2 := strconv.ParseInt(off, 10, 64)
		if ok && err1 == nil && err2 == nil {
			s.cur = Cursor{Seg: a, Off: o}
		}
	}
	if len(s.segs) == 0 || s.cur.Seg < s.segs[0] || s.sizes[s.cur.Seg] < s.cur.Off || s.cur.Off < 0 {
		s.cur = Cursor{}
		if len(s.segs) > 0 {
			s.cur.Seg = s.segs[0]
		}
	}
	if !slices.Contains(s.segs, s.cur.Seg) && len(s.segs) > 0 {
		s.cur = Cursor{Seg: s.segs[0]}
	}
	s.updateGauges()
	if n := s.pendingLocked(); n > 0 {
		log.Info("spool has unsent events from a previous run", "bytes", n, "segments", len(s.segs))
	}
	return s, nil
}

func (s *Spool) segPath(seq uint64) string {
	return filepath.Join(s.dir, fmt.Sprintf("%016d.seg", seq))
}

// repairTail truncates a torn record at the end of a segment: what
// follows its last whole record. A corrupt record with whole records after
// it is not a tail; Peek skips it.
func (s *Spool) repairTail(seq uint64) error {
	b, err := os.ReadFile(s.segPath(seq))
	if err != nil {
		return fmt.Errorf("spool segment: %w", err)
	}
	var off, end int64 // end: past the last whole record
	for off < int64(len(b)) {
		_, n, err := s.decode(b[off:])
		if err != nil {
			off = s.resync(b, off)
			continue
		}
		off += n
		end = off
	}
	if end != int64(len(b)) {
		s.log.Warn("spool: cutting a torn record off the newest segment", "segment", seq, "bytes", int64(len(b))-end)
		if err := os.Truncate(s.segPath(seq), end); err != nil {
			return fmt.Errorf("spool repair: %w", err)
		}
		s.sizes[seq] = end
	}
	return nil
}

var errTorn = errors.New("torn or corrupt record")

// resync returns where the first whole record after the corrupt one at
// off starts (len(b) when none does): a damaged record costs itself, not
// the records after it. Whole means its length fits and its CRC-32C
// matches, which the bytes inside a damaged record match by chance once
// in 2³² offsets.
func (s *Spool) resync(b []byte, off int64) int64 {
	for off++; off+recordHeader < int64(len(b)); off++ {
		if _, _, err := s.decode(b[off:]); err == nil {
			return off
		}
	}
	return int64(len(b))
}

func (s *Spool) decode(b []byte) ([]byte, int64, error) {
	if len(b) < recordHeader {
		return nil, 0, errTorn
	}
	n := binary.BigEndian.Uint32(b)
	if n == 0 || uint64(len(b)-recordHeader) < uint64(n) {
		// n == 0: no event encodes to nothing, and a zero-filled tail (a
		// file extended but not written before a power cut) would pass
		// the checksum (CRC-32C of nothing is 0) as empty events.
		return nil, 0, errTorn
	}
	p := b[recordHeader : recordHeader+int(n)]
	if crc32.Checksum(p, s.crc) != binary.BigEndian.Uint32(b[4:]) {
		return nil, 0, errTorn
	}
	return p, recordHeader + int64(n), nil
}

func (s *Spool) pendingLocked() int64 {
	var n int64
	for _, seq := range s.segs {
		if seq >= s.cur.Seg {
			n += s.sizes[seq]
		}
	}
	return n - s.cur.Off
}

func (s *Spool) updateGauges() {
	if s.m == nil {
		return
	}
	s.m.spoolBytes.Set(float64(s.pendingLocked()))
	if s.full {
		s.m.spoolFull.Set(1)
	} else {
		s.m.spoolFull.Set(0)
	}
}

// Pending returns the unsent bytes.
func (s *Spool) Pending() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pendingLocked()
}

// Notify is signalled after an Append adds events.
func (s *Spool) Notify() <-chan struct{} { return s.notify }

// Append writes the events durably (fsync) in order and returns how many it
// accepted: a prefix of evs, every event after the first refused one
// refused too; refused events are counted and logged as described on
// Spool. On an error nothing is written, and no refusal counted.
func (s *Spool) Append(evs []*datamodels.HealthEvent) (int, error) {
	return s.appendPrefix(evs, true)
}

// AppendAgain is Append for events it refused before (kept by the caller
// and tried again): their refusal was counted then, and is not again.
func (s *Spool) AppendAgain(evs []*datamodels.HealthEvent) (int, error) {
	return s.appendPrefix(evs, false)
}

func (s *Spool) appendPrefix(evs []*datamodels.HealthEvent, count bool) (int, error) {
	if len(evs) == 0 {
		return 0, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrSpoolClosed
	}
	pending := s.pendingLocked()
	buf := s.scratch[:0]
	accepted := 0
	refused := "" // the reason of the first refusal, every later one's too
	nRefused := 0 // counted once the append stands
	for _, ev := range evs {
		if ev.Id == "" {
			// The event's idempotency key: every resend carries it, so the
			// gateway stores a resent event once (events.StoredID).
			ev.Id = events.NewID()
		}
		p, err := proto.Marshal(ev)
		if err != nil {
			return 0, fmt.Errorf("spool encode: %w", err) // nothing written
		}
		size := int64(recordHeader + len(p))
		reason := ""
		switch {
		case refused != "":
			reason = refused // an unbroken prefix: nothing after a refusal
		case pending+size > s.maxBytes:
			reason = "full"
		case !ev.GetIsFatal() && pending+size > s.maxBytes*9/10:
			reason = "reserved_for_fatal"
		case !ev.GetIsFatal() && s.full:
			reason = "full" // until the backlog is below 80% (Commit)
		}
		if reason != "" {
			if refused == "" && !s.latchFull(pending) && count {
				s.log.Warn("spool refused an event larger than the room it has left", "reason", reason,
					"bytes", size, "pending_bytes", pending, "max_bytes", s.maxBytes)
			}
			refused = reason
			nRefused++
			continue
		}
		var h [recordHeader]byte
		binary.BigEndian.PutUint32(h[:], uint32(len(p)))
		binary.BigEndian.PutUint32(h[4:], crc32.Checksum(p, s.crc))
		buf = append(append(buf, h[:]...), p...)
		pending += size
		accepted++
	}
	s.scratch = buf[:0]
	if len(buf) > 0 {
		if err := s.writeLocked(buf); err != nil {
			// Nothing written, nothing counted: the caller tries these
			// events again through Append, which counts their refusals.
			return 0, err
		}
	}
	if s.m != nil && count && nRefused > 0 {
		s.m.spoolDropped.WithLabelValues(refused).Add(float64(nRefused))
	}
	s.updateGauges()
	if accepted > 0 {
		select {
		case s.notify <- struct{}{}:
		default:
		}
	}
	return accepted, nil
}

// latchFull marks the spool full after a refusal, with pending bytes
// unsent, where pending is at or above the 80% below which Commit clears
// it (logging the first refusal of the episode), and reports whether it
// is full. Below, the refusal stands alone: an event or call larger than
// the room left in a spool holding little latched it with nothing to
// send, so no Commit ever cleared it, and every later non-fatal event was
// refused.
func (s *Spool) latchFull(pending int64) bool {
	if s.full || pending < s.maxBytes*8/10 {
		return s.full
	}
	s.log.Error("spool full: refusing new events until the gateway takes the backlog",
		"pending_bytes", pending, "max_bytes", s.maxBytes)
	s.full = true
	return true
}

// ErrSpoolFull is returned by AppendAll when the events do not fit.
var ErrSpoolFull = errors.New("spool full")

// AppendAll is Append, all or none: when the capacity policy (see Spool)
// would refuse any of the events, none is written and the error wraps
// ErrSpoolFull; nothing is counted as dropped, since the caller tells its
// client to resend them (the NVSentinel relay does), and a resend must not
// repeat the events that fitted. Like Append it gives each event without
// an id a new one, the key the gateway stores it under.
func (s *Spool) AppendAll(evs []*datamodels.HealthEvent) error {
	if len(evs) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrSpoolClosed
	}
	pending := s.pendingLocked()
	var buf []byte
	for i, ev := range evs {
		if ev.Id == "" {
			ev.Id = events.NewID()
		}
		p, err := proto.Marshal(ev)
		if err != nil {
			return fmt.Errorf("spool encode: %w", err)
		}
		size := int64(recordHeader + len(p))
		if pending+size > s.maxBytes || (!ev.GetIsFatal() && (s.full || pending+size > s.maxBytes*9/10)) {
			s.latchFull(s.pendingLocked()) // none of these written
			s.updateGauges()
			return fmt.Errorf("%w: %d of its %d bytes hold unsent events, and events[%d] of these %d does not fit (the last 10%% is kept for fatal events; once full, the spool takes non-fatal events again below 80%%)",
				ErrSpoolFull, s.pendingLocked(), s.maxBytes, i, len(evs))
		}
		var h [recordHeader]byte
		binary.BigEndian.PutUint32(h[:], uint32(len(p)))
		binary.BigEndian.PutUint32(h[4:], crc32.Checksum(p, s.crc))
		buf = append(append(buf, h[:]...), p...)
		pending += size
	}
	if err := s.writeLocked(buf); err != nil {
		return err
	}
	s.updateGauges()
	select {
	case s.notify <- struct{}{}:
	default:
	}
	return nil
}

func (s *Spool) writeLocked(buf []byte) error {
	if s.w == nil || s.sealed || s.sizes[s.segs[len(s.segs)-1]] >= s.segmentBytes {
		if s.w != nil {
			s.w.Close()
			s.w = nil
		}
		var seq uint64 = 1
		if len(s.segs) > 0 {
			last := s.segs[len(s.segs)-1]
			seq = last
			if s.sealed || s.sizes[last] >= s.segmentBytes {
				seq = last + 1
			}
		}
		f, err := s.open(s.segPath(seq))
		if err != nil {
			return fmt.Errorf("spool segment: %w", err)
		}
		if !slices.Contains(s.segs, seq) {
			s.segs = append(s.segs, seq)
			s.sizes[seq] = 0
			if len(s.segs) == 1 {
				s.cur = Cursor{Seg: seq}
			}
			syncDir(s.dir)
		}
		s.w, s.sealed = f, false
	}
	seq := s.segs[len(s.segs)-1]
	_, err := s.w.Write(buf)
	if err == nil {
		if err = s.w.Sync(); err != nil {
			err = fmt.Errorf("spool fsync: %w", err)
		}
	} else {
		err = fmt.Errorf("spool write: %w", err)
	}
	if err != nil {
		s.cutFailedWrite(seq)
		return err
	}
	s.sizes[seq] += int64(len(buf))
	return nil
}

// cutFailedWrite removes what a failed write (a full disk writes part of
// it) left after the last whole record of segment seq: appends go to the
// file's end, and a torn record before them cost them too when its
// length field ran over them. When it cannot be cut, the segment takes
// no more appends: the next starts a new one.
func (s *Spool) cutFailedWrite(seq uint64) {
	err := s.w.Truncate(s.sizes[seq])
	if err == nil {
		return
	}
	s.log.Error("spool: cannot cut a failed write off its segment; starting a new one", "segment", seq, "err", err)
	s.w.Close()
	s.w = nil
	s.sealed = true
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// Peek returns up to max events from the read position, oldest first, and
// the cursor just past them; nothing is removed until Commit. A corrupt
// record is skipped, up to the next whole record (counted in
// faultline_agent_spool_corrupt_total).
func (s *Spool) Peek(max int) ([]*datamodels.HealthEvent, Cursor, error) {
	return s.PeekBytes(max, 0)
}

// PeekBytes is Peek of at most maxBytes of encoded events (0: no bound),
// but at least one event.
func (s *Spool) PeekBytes(max int, maxBytes int64) ([]*datamodels.HealthEvent, Cursor, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.cur
	var (
		out  []*datamodels.HealthEvent
		took int64 // bytes of the records of out
		full bool  // the next event would pass maxBytes
	)
	for len(out) < max && !full {
		if !slices.Contains(s.segs, c.Seg) {
			break
		}
		size := s.sizes[c.Seg]
		if c.Off >= size {
			i := slices.Index(s.segs, c.Seg)
			if i+1 >= len(s.segs) {
				break
			}
			c = Cursor{Seg: s.segs[i+1]}
			continue
		}
		f, err := os.Open(s.segPath(c.Seg))
		if err != nil {
			return nil, s.cur, fmt.Errorf("spool read: %w", err)
		}
		b := make([]byte, size-c.Off)
		_, err = f.ReadAt(b, c.Off)
		f.Close()
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, s.cur, fmt.Errorf("spool read: %w", err)
		}
		var off int64
		for len(out) < max && off < int64(len(b)) {
			p, n, err := s.decode(b[off:])
			if err != nil {
				next := s.resync(b, off)
				s.log.Error("spool: corrupt record skipped", "segment", c.Seg, "offset", c.Off+off, "bytes", next-off)
				if s.m != nil {
					s.m.spoolCorrupt.Inc()
				}
				off = next
				continue
			}
			if maxBytes > 0 && len(out) > 0 && took+n > maxBytes {
				full = true
				break
			}
			took += n
			ev := &datamodels.HealthEvent{}
			if err := proto.Unmarshal(p, ev); err != nil {
				s.log.Error("spool: undecodable event skipped", "segment", c.Seg, "err", err)
				if s.m != nil {
					s.m.spoolCorrupt.Inc()
				}
			} else {
				out = append(out, ev)
			}
			off += n
		}
		c.Off += off
	}
	return out, c, nil
}

// Commit moves the read position to c (after the gateway returned ids for
// everything before it), deleting consumed segments.
func (s *Spool) Commit(c Cursor) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur = c
	for len(s.segs) > 1 && s.segs[0] < c.Seg {
		seq := s.segs[0]
		if s.w != nil && seq == s.segs[len(s.segs)-1] {
			break
		}
		if err := os.Remove(s.segPath(seq)); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("spool remove: %w", err)
		}
		delete(s.sizes, seq)
		s.segs = s.segs[1:]
	}
	if err := topology.AtomicWrite(filepath.Join(s.dir, "cursor"), fmt.Appendf(nil, "%d %d\n", c.Seg, c.Off)); err != nil {
		return fmt.Errorf("spool cursor: %w", err)
	}
	if s.full && s.pendingLocked() < s.maxBytes*8/10 {
		s.full = false
		s.log.Info("spool below 80%: accepting events again")
	}
	s.updateGauges()
	return nil
}

// Close closes the open segment; later Appends fail.
func (s *Spool) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.w != nil {
		err := s.w.Close()
		s.w = nil
		return err
	}
	return nil
}
