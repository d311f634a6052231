package pipeline

import (
	"log/slog"
	"slices"
	"sync"
	"time"
)

// Stale gathers what one batch did not act on for its age (a replayed or
// long-delayed record: quarantine.max_event_age, drain.max_trigger_age), so
// the role says it once per batch, not once per record. Safe for the
// batch's concurrent workers; the zero value is ready.
type Stale struct {
	mu       sync.Mutex
	n        int
	oldest   time.Duration
	clusters []string
}

// Add counts one record of cluster, age old.
func (s *Stale) Add(cluster string, age time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	s.oldest = max(s.oldest, age)
	if !slices.Contains(s.clusters, cluster) {
		s.clusters = append(s.clusters, cluster)
	}
}

// Log says at Warn, when anything was counted, msg with how many records,
// the oldest's age, their clusters and attrs.
func (s *Stale) Log(log *slog.Logger, msg string, attrs ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		return
	}
	slices.Sort(s.clusters)
	log.Warn(msg, append([]any{"records", s.n, "oldest_age", s.oldest.Round(time.Second), "clusters", s.clusters}, attrs...)...)
}
