package gateway

import (
	"sync"
	"time"
)

// warnLimit spaces a warning repeated under a flood (a refused
// credential, a refused client address): each key is logged at most once
// per window, up to maxKeys keys a window, then one line says the rest
// are not named until the window ends. The keys held are bounded, so an
// attacker with many credentials or addresses cannot grow them; the
// metrics count every refusal.
type warnLimit struct {
	window  time.Duration
	maxKeys int

	mu    sync.Mutex
	start time.Time
	keys  map[string]struct{}
	full  bool // the window's "not named" line was let through
}

func newWarnLimit(window time.Duration, maxKeys int) *warnLimit {
	return &warnLimit{window: window, maxKeys: maxKeys, keys: make(map[string]struct{}, maxKeys)}
}

// allow says whether a warning about key may be logged at now (named) or,
// the window's keys spent, whether this is the window's one line saying
// so (full); both false: drop it.
func (w *warnLimit) allow(key string, now time.Time) (named, full bool) {
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

// Warnings about refused callers and connections: each credential or
// address named at most once per warnWindow, warnKeys of them a window.
const (
	warnWindow = 10 * time.Second
	warnKeys   = 16
)
