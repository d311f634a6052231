// Package warnlimit spaces a log line repeated under a flood: each key
// (a refused credential or address, a library's message) is logged at most
// once per window, up to a number of keys a window, then one line says the
// rest are not named until the window ends. The keys held are bounded, so
// an attacker with many credentials or addresses cannot grow them; the
// metrics beside a warning count every occurrence.
package warnlimit

import (
	"sync"
	"time"
)

// Limit is one such spacing, safe for concurrent use.
type Limit struct {
	window  time.Duration
	maxKeys int

	mu    sync.Mutex
	start time.Time
	keys  map[string]struct{}
	full  bool // the window's "not named" line was let through
}

// New returns a Limit of maxKeys keys per window.
func New(window time.Duration, maxKeys int) *Limit {
	return &Limit{window: window, maxKeys: maxKeys, keys: make(map[string]struct{}, maxKeys)}
}

// Allow says whether a line about key may be logged at now (named) or,
// the window's keys spent, whether this is the window's one line saying
// so (full); both false: drop it.
func (w *Limit) Allow(key string, now time.Time) (named, full bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if now.Sub(w.start) >= w.window {
		w.start, w.full = now, false
		clear(w.keys)
	}
	if _, seen := w.keys[key]; seen {
		return false, false
	}
	if len(w.keys) < w.maxKeys {
		w.keys[key] = struct{}{}
		return true, false
	}
	if w.full {
		return false, false
	}
	w.full = true
	return false, true
}
