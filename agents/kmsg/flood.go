package kmsg

import (
	"fmt"
	"hash/maphash"
	"sort"
	"strconv"
	"time"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// dedup remembers recently seen lines so that one record twice in what
// one parser reads — captures of one log concatenated for "kmsg parse", a
// log holding a message twice — is reported once. (The check reads one
// source, and a restart starts a new set: lines read again then keep
// their events' ids instead, Check.occurrenceIDs.) A line is known by its
// body plus its printk timestamp (µs, one per record), or, for a line
// without one, its wall-clock time when printed to a fraction of a
// second; any other line is never a duplicate. Whole seconds (syslog,
// dmesg -T) do not tell a line from a real repeat within its second (an
// Xid storm: each its own occurrence), with or without a printk time
// beside them, so they are not used.
type dedup struct {
	seed maphash.Seed
	set  map[dedupKey]struct{}
	ring []dedupKey
	next int
}

// dedupKey identifies a line by a 64-bit hash of its body and one of its
// timestamps; a collision needs the same timestamp too.
type dedupKey struct {
	kind byte // 'm' kernel timestamp, 'w' wall clock
	ts   int64
	h    uint64
}

func newDedup(n int) *dedup {
	return &dedup{seed: maphash.MakeSeed(), set: make(map[dedupKey]struct{}, n), ring: make([]dedupKey, n)}
}

func (d *dedup) seen(r record) bool {
	var key dedupKey
	switch {
	case r.mono >= 0:
		key = dedupKey{'m', r.mono, maphash.String(d.seed, r.body)}
	case !r.wall.IsZero() && r.fine:
		key = dedupKey{'w', r.wall.UnixNano(), maphash.String(d.seed, r.body)}
	default:
		return false
	}
	if _, ok := d.set[key]; ok {
		return true
	}
	if old := d.ring[d.next]; old.kind != 0 {
		delete(d.set, old)
	}
	d.ring[d.next] = key
	d.set[key] = struct{}{}
	d.next = (d.next + 1) % len(d.ring)
	return false
}

// flood rate-limits one error on one device (a flood key): per window the
// first burst occurrences are reported as they come; later ones are counted
// and reported as one event whose metadata "count" says how many occurrences
// it stands for, with "flood"="true" when more than one. While a flood goes
// on, each window yields one such event; every occurrence is in exactly one
// event's count, so sums over "count" are exact.
type flood struct {
	window  time.Duration
	burst   int
	m       map[string]*floodEntry
	now     time.Time // latest event time seen
	nowAt   time.Time // clock reading when now was seen
	ready   []*datamodels.HealthEvent
	maxKeys int
}

type floodEntry struct {
	start, last time.Time
	emitted     int
	suppressed  int
	first       time.Time // first suppressed occurrence
	tmpl        func() *datamodels.HealthEvent
	closed      bool
	flooding    bool // the last closed window had suppressed occurrences
}

func newFlood(window time.Duration, burst int) *flood {
	return &flood{window: window, burst: burst, m: map[string]*floodEntry{}, maxKeys: 100000}
}

func (f *flood) observe(t time.Time, clock time.Time) {
	if t.After(f.now) {
		f.now = t
	}
	f.nowAt = clock
}

// admit reports whether an occurrence is to be reported now; when not, it
// is counted, and build makes its event if it ends up closing the window.
// Events are built lazily so that a flood costs a key lookup per line;
// build must make a new event on each call (a summary adds its count to
// the one it gets, and held makes one at every poll).
func (f *flood) admit(key string, build func() *datamodels.HealthEvent, t time.Time) bool {
	e := f.m[key]
	if e == nil {
		if len(f.m) >= f.maxKeys {
			return true // never drop for lack of room; just stop limiting
		}
		f.m[key] = &floodEntry{start: t, last: t, emitted: 1}
		return true
	}
	// A window flush closed takes no more occurrences, even one whose own
	// time falls inside it (line times running behind the clock, the clock
	// stepped forward): nothing would report it. It opens a new window.
	if e.closed || t.Sub(e.start) > f.window || e.start.Sub(t) > f.window {
		if !e.closed {
			f.close(e)
		}
		cont := e.flooding && absDur(t.Sub(e.last)) <= f.window
		*e = floodEntry{start: t, last: t, flooding: e.flooding}
		if cont {
			e.emitted = f.burst
			f.suppress(e, build, t)
			return false
		}
		e.emitted = 1
		return true
	}
	e.last = t
	if e.emitted < f.burst {
		e.emitted++
		return true
	}
	f.suppress(e, build, t)
	return false
}

func (f *flood) suppress(e *floodEntry, ev func() *datamodels.HealthEvent, t time.Time) {
	if e.suppressed == 0 {
		e.first = t
	}
	e.suppressed++
	e.tmpl = ev
	e.last = t
}

func (f *flood) close(e *floodEntry) {
	e.closed = true
	e.flooding = e.suppressed > 0
	if e.suppressed == 0 {
		return
	}
	f.ready = append(f.ready, f.summary(e))
	e.suppressed = 0
	e.tmpl = nil
}

// end closes key's window, its summary for take, and forgets the key: its
// error has cleared, so a summary after the recovery would report the
// fault again, and the same error after it is a new fault, reported at
// once rather than taken for the flood going on.
func (f *flood) end(key string) {
	if e := f.m[key]; e != nil {
		if !e.closed {
			f.close(e)
		}
		delete(f.m, key)
	}
}

// summary is the event of the occurrences e holds: its last one's, with
// their count and (for a line with a known time) the times of the first
// and the last.
func (f *flood) summary(e *floodEntry) *datamodels.HealthEvent {
	ev := e.tmpl()
	ev.Metadata["count"] = strconv.Itoa(e.suppressed)
	if ev.GeneratedTimestamp != nil {
		// Also for one occurrence: the summary is never the event of
		// one already reported, under its id.
		ev.Metadata["first_seen"] = e.first.Format(time.RFC3339Nano)
		ev.Metadata["last_seen"] = e.last.Format(time.RFC3339Nano)
	}
	if e.suppressed > 1 {
		ev.Metadata["flood"] = "true"
		ev.Message = fmt.Sprintf("%s (repeated %d times, rate-limited)", ev.Message, e.suppressed)
	}
	return ev
}

// held returns, in a stable order, the summaries the open windows holding
// occurrences would close with now, and leaves them open: what a restart
// before they close must not lose (Check saves them with the read
// position). Past maxBytes of summaries, a window is closed instead, its
// summary returned by take.
func (f *flood) held(maxBytes int) []*datamodels.HealthEvent {
	var keys []string
	for k, e := range f.m {
		if !e.closed && e.suppressed > 0 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var out []*datamodels.HealthEvent
	n := 0
	for _, k := range keys {
		e := f.m[k]
		ev := f.summary(e)
		if n += ev.SizeVT(); n > maxBytes {
			f.close(e)
			continue
		}
		out = append(out, ev)
	}
	return out
}

// take returns the summaries closed by admit.
func (f *flood) take() []*datamodels.HealthEvent {
	r := f.ready
	f.ready = nil
	return r
}

// flush closes the windows that have ended by now (all of them when final)
// and returns their summaries in a stable order.
func (f *flood) flush(final bool, clock time.Time) []*datamodels.HealthEvent {
	now := f.now
	if !f.nowAt.IsZero() && clock.After(f.nowAt) {
		now = now.Add(clock.Sub(f.nowAt))
	}
	keys := make([]string, 0, len(f.m))
	for k := range f.m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		e := f.m[k]
		if !e.closed && (final || now.Sub(e.start) > f.window) {
			f.close(e)
		}
		if e.closed && now.Sub(e.last) > 3*f.window {
			delete(f.m, k)
		}
	}
	return f.take()
}
