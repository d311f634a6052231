package quarantine

import (
	"slices"
	"time"
)

// Flapping faults and their stabilization window.
//
// A fault (FaultKey: a check on an entity) that keeps coming back after
// recoveries would otherwise cordon and uncordon its node on every flap
// (a NIC port going DOWN/ACTIVE every 500 ms cordoned its node 39 times in
// 20 s), and each short recovery hides that the hardware is unstable (the
// NIC monitor design's "alert blinking"). So the state remembers when each
// fault began (its onsets), also for flap_window after the fault was
// lifted, and a recovery of a fault that began flap_threshold times within
// flap_window does not lift it: the fault stays standing (cordon, taint,
// condition), marked stabilizing, until the entity has stayed healthy for
// stabilization_window; a new occurrence meanwhile cancels the pending
// lift, and the fault stays flapping (its next recovery waits a whole
// window again) until it is lifted. Only the third occurrence within the
// window is held, not the first two: the first recovery of any fault lifts
// it at once, so a fault that occurs once or twice is not slowed down, and
// the onsets outlive the lift so the third makes the fault sticky. The quarantine role's sweep (sweep.go) lifts the faults whose
// deadline passed, since the agent may send nothing more. A fault that is
// not flapping recovers at once, as before.

// maxOnsets bounds the onsets kept per fault key (so flap_threshold is at
// most maxOnsets).
const maxOnsets = 8

// FlapPolicy is when a fault is flapping and how long a flapping fault
// must stay healthy before it is lifted. A zero field disables it.
type FlapPolicy struct {
	// Threshold: a fault that began this many times within Window is
	// flapping (its current onset included).
	Threshold int
	// Window over which onsets are counted, and how long the onsets of a
	// lifted fault are kept.
	Window time.Duration
	// Stabilization: how long a flapping fault's entity must stay healthy
	// before the fault is lifted.
	Stabilization time.Duration
}

// Enabled reports whether flapping faults are held.
func (p FlapPolicy) Enabled() bool {
	return p.Threshold > 0 && p.Window > 0 && p.Stabilization > 0
}

// Stabilizing reports whether the fault recovered but is held until LiftAt.
func (f *Fault) Stabilizing() bool { return !f.LiftAt.IsZero() }

// addOnset records an onset of key (kept sorted, newest maxOnsets).
func (s *State) addOnset(key string, at time.Time) {
	if s.History == nil {
		s.History = map[string][]time.Time{}
	}
	h := append(s.History[key], at.UTC())
	slices.SortFunc(h, func(a, b time.Time) int { return a.Compare(b) })
	if len(h) > maxOnsets {
		h = h[len(h)-maxOnsets:]
	}
	s.History[key] = h
	s.trimHistory()
}

// trimHistory keeps the onsets of at most maxFaults keys (those with the
// newest onsets).
func (s *State) trimHistory() {
	if len(s.History) <= maxFaults {
		return
	}
	keys := s.historyByAge()
	for _, k := range keys[:len(keys)-maxFaults] {
		delete(s.History, k)
	}
}

// historyByAge is the history's keys, the one with the oldest newest onset
// first.
func (s *State) historyByAge() []string {
	keys := make([]string, 0, len(s.History))
	for k := range s.History {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	newest := func(k string) time.Time { h := s.History[k]; return h[len(h)-1] }
	slices.SortStableFunc(keys, func(a, b string) int {
		if len(s.History[a]) == 0 || len(s.History[b]) == 0 {
			return len(s.History[a]) - len(s.History[b])
		}
		return newest(a).Compare(newest(b))
	})
	return keys
}

// PruneHistory drops the onsets older than the policy's window before now
// (all of them when the policy is disabled); it reports whether anything
// was dropped.
func (s *State) PruneHistory(now time.Time, p FlapPolicy) bool {
	changed := false
	for k, h := range s.History {
		keep := h[:0:0]
		if p.Enabled() {
			for _, t := range h {
				if t.After(now.Add(-p.Window)) {
					keep = append(keep, t)
				}
			}
		}
		switch {
		case len(keep) == 0:
			delete(s.History, k)
			changed = true
		case len(keep) < len(h):
			s.History[k] = keep
			changed = true
		}
	}
	if len(s.History) == 0 {
		s.History = nil
	}
	return changed
}

// Occurrences counts the onsets of the fault key within the policy's
// window before at: the standing fault's current onset (if it stands) and
// the recorded onsets of earlier episodes and of re-occurrences while it
// was stabilizing.
func (s *State) Occurrences(key string, at time.Time, p FlapPolicy) int {
	n := 0
	if _, ok := s.Faults[key]; ok {
		n++ // the episode that is recovering now
	}
	for _, t := range s.History[key] {
		if t.After(at.Add(-p.Window)) && !t.After(at) {
			n++
		}
	}
	return n
}

// lift removes a standing fault; with the policy enabled its onset joins
// the key's history (for flap_window), so its next occurrences count.
func (s *State) lift(key string, p FlapPolicy) {
	f := s.Faults[key]
	delete(s.Faults, key)
	if f != nil && p.Enabled() {
		s.addOnset(key, f.Since)
	}
}

// RecoverFlapping is Recover with flapping faults held: a fault the event
// clears is lifted at once (removed) unless it began p.Threshold times
// within p.Window or was found flapping before and has stood since (it
// recurred while stabilizing), then it is held (stabilizing until at+p.Stabilization,
// or now+p.Stabilization when the recovery has no time or one in the
// future). A fault already stabilizing is left as it is (its deadline
// counts from its first recovery) unless the deadline passed, then it is
// lifted. A fault last seen after the recovery was generated stays (stale).
// With the policy disabled it is Recover (and forgets the onsets of what
// it lifts).
func (s *State) RecoverFlapping(check string, entities []string, at, now time.Time, p FlapPolicy) (removed, held, stale []string) {
	healthySince := at
	if healthySince.IsZero() || healthySince.After(now) {
		healthySince = now
	}
	for _, k := range s.keys() {
		f := s.Faults[k]
		if !sameIdentity(f.Check, check, maxCheckKey) || (len(entities) > 0 && !recovers(f.Entity, entities)) {
			continue
		}
		if !at.IsZero() && at.Before(f.LastSeen) {
			stale = append(stale, k)
			continue
		}
		switch {
		case !p.Enabled():
			delete(s.Faults, k)
			delete(s.History, k)
			removed = append(removed, k)
		case f.Stabilizing():
			if !now.Before(f.LiftAt) {
				s.lift(k, p)
				removed = append(removed, k)
			}
		case f.Flapping || s.Occurrences(k, healthySince, p) >= p.Threshold:
			f.Flapping = true
			f.RecoveredAt = healthySince.UTC()
			f.LiftAt = healthySince.Add(p.Stabilization).UTC()
			if !now.Before(f.LiftAt) { // a recovery older than the window: healthy long enough
				s.lift(k, p)
				removed = append(removed, k)
				continue
			}
			held = append(held, k)
		default:
			s.lift(k, p)
			removed = append(removed, k)
		}
	}
	if p.Enabled() {
		s.PruneHistory(now, p)
	}
	return removed, held, stale
}

// LiftStabilized lifts the stabilizing faults whose deadline passed by now
// and drops onsets older than the window; it returns the lifted keys and
// whether the state changed.
func (s *State) LiftStabilized(now time.Time, p FlapPolicy) (lifted []string, changed bool) {
	for _, k := range s.keys() {
		if f := s.Faults[k]; f.Stabilizing() && !now.Before(f.LiftAt) {
			s.lift(k, p)
			lifted = append(lifted, k)
		}
	}
	pruned := s.PruneHistory(now, p)
	return lifted, len(lifted) > 0 || pruned
}

// NextSweep is when the state next needs the sweep: the earliest deadline
// of a stabilizing fault, or, with nothing standing, when the newest
// remembered onset leaves the window (so the annotation goes), or when a
// remembered recovery is forgotten; zero: never.
func (s *State) NextSweep(p FlapPolicy) time.Time {
	var next time.Time
	earlier := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	if t := s.nextForget(); !t.IsZero() {
		// After Until: pruneRecovered forgets what is past it.
		earlier(t.Add(time.Nanosecond))
	}
	for _, f := range s.Faults {
		if f.Stabilizing() {
			earlier(f.LiftAt)
		}
	}
	if len(s.Faults) == 0 {
		var newest time.Time
		for _, h := range s.History {
			if len(h) > 0 && h[len(h)-1].After(newest) {
				newest = h[len(h)-1]
			}
		}
		if !newest.IsZero() {
			earlier(newest.Add(p.Window))
		}
	}
	return next
}
