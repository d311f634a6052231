package pipeline

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// A batch that fails is retried after a backoff (100 ms doubling to
// Config.MaxBackoff) until it succeeds, and its offsets are committed
// only then. Meanwhile it is held: its partitions are paused (nothing
// after it is fetched, so each partition stays in order) and the
// replica's other partitions are fetched and handled as usual. A role
// whose batch fails for one cluster of a fleet (quarantine's retry
// consumer, while that cluster's apiserver is down) holds only the
// partitions that carry that batch, not the whole replica.
//
// A held batch is tried again within a round of the loop, beside the
// batches just polled, and the round ends when every batch of it did: a
// try that waits (quarantine's retry batch waits up to retry_wait for its
// cluster) slows the other partitions to one round per try, never stops
// them. Pausing drops what the client had fetched of a partition beyond
// the held batch (it is fetched again on resume, with the next fetch
// request: a role whose batches are often held sets FetchMaxWait short). A held partition revoked
// by a rebalance (or lost) is dropped from the held batch and resumed:
// its next owner handles it from the committed offset. So is one lost
// while its batch is being tried (a lost session is not held back by the
// try, as a rebalance is): the failed try holds only what is still owned.

// batch is the records of one Handle call and their failed tries.
type batch struct {
	recs    []*kgo.Record
	tries   int           // failed tries
	backoff time.Duration // the wait after the next failure
	due     time.Time     // when a held batch is tried again
	since   time.Time     // its first failure
}

// holding keeps the failed batches until their next try.
type holding struct {
	mu      sync.Mutex
	held    []*batch
	pause   func(map[string][]int32)
	wake    func(map[string][]int32)
	revokes uint64               // calls of revoked
	goneAt  map[TopicPart]uint64 // revokes when each partition last went
}

// TopicPart names a partition of a topic: a map key.
type TopicPart struct {
	Topic     string
	Partition int32
}

// PartOf returns the partition r was read from.
func PartOf(r *kgo.Record) TopicPart { return TopicPart{r.Topic, r.Partition} }

// round marks the start of a round's tries: failed drops the records of
// partitions revoked after it.
func (h *holding) round() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.revokes
}

// failed records a failed try of b, begun in round, and holds it, its
// partitions paused — but for the partitions revoked or lost since the
// round began, which are no longer this replica's.
func (h *holding) failed(b *batch, round uint64, maxBackoff time.Duration) {
	b.tries++
	now := time.Now()
	if b.backoff == 0 {
		b.backoff, b.since = 100*time.Millisecond, now
	}
	b.due = now.Add(b.backoff)
	b.backoff = min(b.backoff*2, maxBackoff)
	h.mu.Lock()
	defer h.mu.Unlock()
	if b.recs = h.absorbLocked(b.recs, round); len(b.recs) == 0 {
		return
	}
	h.held = append(h.held, b)
	h.pause(partitions(b.recs))
}

// absorb returns the records of a batch handled in round that are still
// this replica's alone to mark: those of partitions revoked or lost since
// the round began are dropped, and those of a partition that a held batch
// holds join that batch (after its own records; with Config.Overlap a
// round is handled while the next is polled, so the next may carry a
// failed batch's partitions), so that nothing after a held batch is
// marked before it succeeds.
func (h *holding) absorb(recs []*kgo.Record, round uint64) []*kgo.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.absorbLocked(recs, round)
}

func (h *holding) absorbLocked(recs []*kgo.Record, round uint64) []*kgo.Record {
	if len(h.held) == 0 && h.revokes == round {
		return recs
	}
	holder := map[TopicPart]*batch{}
	for _, b := range h.held {
		for _, r := range b.recs {
			holder[PartOf(r)] = b
		}
	}
	var (
		kept   []*kgo.Record
		joined = map[*batch]bool{}
	)
	for _, r := range recs {
		p := PartOf(r)
		switch b := holder[p]; {
		case h.goneAt[p] > round:
		case b != nil:
			b.recs = append(b.recs, r)
			joined[b] = true
		default:
			kept = append(kept, r)
		}
	}
	for b := range joined {
		// Each partition's records together again, in offset order.
		slices.SortStableFunc(b.recs, func(x, y *kgo.Record) int {
			return cmp.Or(cmp.Compare(x.Topic, y.Topic), cmp.Compare(x.Partition, y.Partition))
		})
	}
	return kept
}

// due reports whether a held batch is due by now.
func (h *holding) due(now time.Time) bool {
	t := h.next()
	return !t.IsZero() && !t.After(now)
}

// succeeded resumes the partitions of b when it was held until now, and
// brings every other held batch's next try forward to now: what held b (a
// cluster's API server, ClickHouse, the broker) is back and may have held
// them too. Each is tried once more at once, not at the end of its backoff
// (up to MaxBackoff, its due times spread over it): quarantine's deferred
// faults, held in several partitions of their cluster's retry topic, are
// all cordoned with the first instead of over the next second. A batch held
// by something else costs one more try, and backs off again from where it was.
func (h *holding) succeeded(b *batch) {
	if b.tries == 0 {
		return
	}
	h.wake(partitions(b.recs))
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, o := range h.held {
		if o.due.After(now) {
			o.due = now
		}
	}
}

// next returns when the earliest held batch is due (zero: none held).
func (h *holding) next() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	var t time.Time
	for _, b := range h.held {
		if t.IsZero() || b.due.Before(t) {
			t = b.due
		}
	}
	return t
}

// oldest returns how long the oldest held batch has been failing, as of
// now (0: none held).
func (h *holding) oldest(now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	var d time.Duration
	for _, b := range h.held {
		d = max(d, now.Sub(b.since))
	}
	return d
}

// take returns (and stops holding) the batches due by now.
func (h *holding) take(now time.Time) []*batch {
	h.mu.Lock()
	defer h.mu.Unlock()
	var due []*batch
	kept := h.held[:0]
	for _, b := range h.held {
		if b.due.After(now) {
			kept = append(kept, b)
		} else {
			due = append(due, b)
		}
	}
	clear(h.held[len(kept):])
	h.held = kept
	return due
}

// revoked drops the records of partitions this replica no longer owns
// from the held batches (a batch left empty goes) and resumes those
// partitions, for when they come back.
func (h *holding) revoked(gone map[string][]int32) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.revokes++
	if h.goneAt == nil {
		h.goneAt = map[TopicPart]uint64{}
	}
	for t, ps := range gone {
		for _, p := range ps {
			h.goneAt[TopicPart{t, p}] = h.revokes
		}
	}
	isGone := func(r *kgo.Record) bool { return h.goneAt[PartOf(r)] == h.revokes }
	kept := h.held[:0]
	for _, b := range h.held {
		if b.recs = slices.DeleteFunc(b.recs, isGone); len(b.recs) > 0 {
			kept = append(kept, b)
		}
	}
	clear(h.held[len(kept):])
	h.held = kept
	h.wake(gone)
}

// untilDue returns ctx bounded by the earliest held batch's next try.
func (h *holding) untilDue(ctx context.Context) (context.Context, context.CancelFunc) {
	if t := h.next(); !t.IsZero() {
		return context.WithDeadline(ctx, t)
	}
	return context.WithCancel(ctx)
}

// partitions returns the topic partitions of recs.
func partitions(recs []*kgo.Record) map[string][]int32 {
	out := map[string][]int32{}
	for i, r := range recs {
		if i == 0 || recs[i-1].Topic != r.Topic || recs[i-1].Partition != r.Partition {
			out[r.Topic] = append(out[r.Topic], r.Partition)
		}
	}
	return out
}
