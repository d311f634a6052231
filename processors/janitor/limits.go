package janitor

import "sync"

// limiter counts the operations in progress per cluster, per rack and per
// provider (within a cluster). An operation holds its slot from the
// moment its signal is recorded until its resource completes; holding is
// keyed by the resource, so taking it again is a no-op.
type limiter struct {
	cluster, rack, provider int // 0: no limit

	mu      sync.Mutex
	holders map[string]slot // resource key → its slot
	counts  map[string]int  // "c/<cluster>", "r/<cluster>/<rack>", "p/<cluster>/<provider>"
}

type slot struct{ keys [3]string }

func newLimiter(cluster, rack, provider int) *limiter {
	return &limiter{cluster: cluster, rack: rack, provider: provider, holders: map[string]slot{}, counts: map[string]int{}}
}

func slotFor(cluster, rack, provider string) slot {
	return slot{keys: [3]string{"c/" + cluster, "r/" + cluster + "/" + rack, "p/" + cluster + "/" + provider}}
}

// acquire takes a slot for the resource unless a limit is reached (force:
// take it anyway — an operation already in progress when the janitor
// started). It returns which limit refused ("" when taken).
func (l *limiter) acquire(res, cluster, rack, provider string, force bool) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.holders[res]; ok {
		return ""
	}
	s := slotFor(cluster, rack, provider)
	if !force {
		for i, max := range [3]int{l.cluster, l.rack, l.provider} {
			if max > 0 && l.counts[s.keys[i]] >= max {
				return [3]string{"max_concurrent", "max_concurrent_per_rack", "max_concurrent_per_provider"}[i]
			}
		}
	}
	for _, k := range s.keys {
		l.counts[k]++
	}
	l.holders[res] = s
	return ""
}

// release gives the resource's slot back (a no-op when it holds none).
func (l *limiter) release(res string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.holders[res]; ok {
		l.drop(res, s)
	}
}

// releaseCluster gives back every slot held in the cluster: its watch
// stopped (the Lease lost, an error Run retries), and only that watch's
// reconciles and delete events gave slots back, so a resource finished
// and deleted while another janitor worked the cluster held its slot for
// ever. The cluster's next watch takes the slots of the operations then
// in progress again (runCluster).
func (l *limiter) releaseCluster(cluster string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for res, s := range l.holders {
		if s.keys[0] == "c/"+cluster {
			l.drop(res, s)
		}
	}
}

// drop gives back slot s of res; l.mu is held.
func (l *limiter) drop(res string, s slot) {
	for _, k := range s.keys {
		if l.counts[k]--; l.counts[k] <= 0 {
			delete(l.counts, k)
		}
	}
	delete(l.holders, res)
}

// inProgress is the cluster's count.
func (l *limiter) inProgress(cluster string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts["c/"+cluster]
}
