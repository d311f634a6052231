package quarantine

import (
	"slices"
	"time"
)

// Remembered recoveries.
//
// A recovery generated before a fault's last occurrence does not lift it
// (Recover: stale). The converse needs memory, as a lifted fault leaves
// the state: an occurrence generated before the recovery that lifted its
// fault arrives after it — a gateway's produce that timed out and was
// written after the agent's resend and its next events (behind a load
// balancer the resend goes to another gateway), a record of an older
// episode reordered in some other way — and, decided as new, it
// quarantined a healthy node for good: nothing recovers it again. So the
// lift remembers, per fault key, when the recovery was generated, for
// recovery_memory after the lift (AnnotationRecovered), and an
// occurrence generated no later than that does not quarantine. Both times
// are the source's own (a fault's agent sends its recovery), so a skew
// between the agent and the processor moves nothing.

// maxRecovered bounds the recoveries remembered per node (the newest).
const maxRecovered = maxFaults

// Recovery is a lifted fault's recovery: when it was generated, and until
// when (the processor's clock) it is remembered.
type Recovery struct {
	At    time.Time `json:"at"`
	Until time.Time `json:"until"`
}

// rememberRecovery records that the recovery generated at lifted key, for
// memory after now. A recovery with no time, or a memory of 0, records
// nothing.
func (s *State) rememberRecovery(key string, at, now time.Time, memory time.Duration) {
	if at.IsZero() || memory <= 0 {
		return
	}
	if s.Recovered == nil {
		s.Recovered = map[string]Recovery{}
	}
	if old, ok := s.Recovered[key]; ok && old.At.After(at) {
		at = old.At
	}
	s.Recovered[key] = Recovery{At: at.UTC(), Until: now.Add(memory).UTC()}
	if len(s.Recovered) > maxRecovered {
		keys := s.recoveredByAge()
		for _, k := range keys[:len(keys)-maxRecovered] {
			delete(s.Recovered, k)
		}
	}
}

// Superseded reports whether an occurrence of key generated at is older
// than a remembered recovery of its fault (no later than it was
// generated): a late or repeated copy, which must not quarantine again.
// It returns that recovery's time. A fault that stands again is never
// superseded (its occurrences are its own), nor an occurrence with no
// time. An entry no lift of memory before now could have written (kept
// past now+memory, or generated after it is forgotten: the annotation
// edited) counts for nothing.
func (s *State) Superseded(key string, at, now time.Time, memory time.Duration) (time.Time, bool) {
	if _, standing := s.Faults[key]; standing || at.IsZero() || memory <= 0 {
		return time.Time{}, false
	}
	r, ok := s.Recovered[key]
	if !ok || at.After(r.At) || r.At.After(r.Until) || r.Until.After(now.Add(memory)) || now.After(r.Until) {
		return time.Time{}, false
	}
	return r.At, true
}

// pruneRecovered forgets the recoveries remembered until before now, and
// those of faults that stand again; it reports whether it forgot any.
func (s *State) pruneRecovered(now time.Time) bool {
	n := len(s.Recovered)
	for k, r := range s.Recovered {
		if _, standing := s.Faults[k]; standing || now.After(r.Until) {
			delete(s.Recovered, k)
		}
	}
	if len(s.Recovered) == 0 {
		s.Recovered = nil
	}
	return len(s.Recovered) != n
}

// recoveredByAge is the remembered recoveries' keys, the one forgotten
// first first.
func (s *State) recoveredByAge() []string {
	keys := make([]string, 0, len(s.Recovered))
	for k := range s.Recovered {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	slices.SortStableFunc(keys, func(a, b string) int { return s.Recovered[a].Until.Compare(s.Recovered[b].Until) })
	return keys
}

// nextForget is when the earliest remembered recovery is forgotten (zero:
// none is remembered).
func (s *State) nextForget() time.Time {
	var next time.Time
	for _, r := range s.Recovered {
		if next.IsZero() || r.Until.Before(next) {
			next = r.Until
		}
	}
	return next
}
