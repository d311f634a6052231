package correlate

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
)

// StoreProgress returns the store role's committed offsets, by topic and
// partition: every record below its partition's offset is in ClickHouse
// (the store commits a batch after inserting it).
type StoreProgress func(ctx context.Context) (map[string]map[int32]int64, error)

// StoredBeforeNext is the StoreProgress of a caller that stores each batch
// before it hands over the next and keeps its records in partition 0 (the
// benchmarks): no earlier record is unstored.
func StoredBeforeNext(context.Context) (map[string]map[int32]int64, error) {
	all := map[int32]int64{0: math.MaxInt64}
	return map[string]map[int32]int64{events.TopicEvents: all, events.TopicActions: all}, nil
}

// unstored remembers the records of this replica's earlier batches until
// the store has written them. A rule's window is the history in ClickHouse
// plus the batch; an event of an earlier batch that the store has not
// written yet is in neither, so two Xid 31 on one GPU that fall into two
// batches would never reach the threshold of 2 (the second batch's query
// would count 1 and nothing evaluates the group again). Each batch's
// tables therefore carry the remembered records of the batch's nodes (and,
// for a cluster-scope rule triggered in the batch, of its clusters); the
// queries deduplicate by id, so a record both remembered and stored
// counts once.
//
// A record is forgotten once the store's committed offset has passed it
// (progress), or after maxAge, the most that is remembered when the
// store's progress cannot be read; at most max records and maxBytes of
// their keys and values are kept, the oldest forgotten first (forgot
// counts them: a window may then miss them).
type unstored struct {
	progress StoreProgress
	readBack ReadBack
	maxAge   time.Duration
	max      int
	maxBytes int
	seedWait time.Duration // how long a batch with a handed-over partition retries reading the progress
	now      func() time.Time

	mu     sync.Mutex
	recs   []remembered // in arrival order
	bytes  int          // of recs' keys and values
	next   map[pipeline.TopicPart]int64
	forgot prometheus.Counter
	// pending holds, per handed-over partition whose records below the
	// batch were not read back (the store's progress or the read failed),
	// that batch's first offset: a later batch reads them back (unless
	// the partition is revoked first).
	pending map[pipeline.TopicPart]int64
}

type remembered struct {
	rec     *kgo.Record
	cluster string
	at      time.Time
}

// add remembers the batch's records.
func (u *unstored) add(recs []*kgo.Record) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.remember(recs)
	for _, r := range recs {
		u.next[pipeline.PartOf(r)] = r.Offset + 1
	}
}

func (u *unstored) remember(recs []*kgo.Record) {
	at := u.now()
	for _, r := range recs {
		cluster, _, err := events.SplitKey(r.Key)
		if err != nil {
			continue // a record without a cluster/node key is in no window
		}
		u.recs = append(u.recs, remembered{rec: r, cluster: cluster, at: at})
		u.bytes += recordBytes(r)
	}
	over := max(len(u.recs)-u.max, 0)
	for _, m := range u.recs[:over] {
		u.bytes -= recordBytes(m.rec)
	}
	for ; over < len(u.recs) && u.bytes > u.maxBytes; over++ {
		u.bytes -= recordBytes(u.recs[over].rec)
	}
	if over > 0 {
		u.forgot.Add(float64(over))
		n := copy(u.recs, u.recs[over:])
		clear(u.recs[n:]) // the forgotten records are freed
		u.recs = u.recs[:n]
	}
}

// recordBytes is what a remembered record counts against maxBytes.
func recordBytes(r *kgo.Record) int { return len(r.Key) + len(r.Value) }

// progressTimeout bounds the read of the store's progress, once per
// batch: a slow broker delays the batch this much at most; readBackTimeout
// bounds reading a handed-over partition's unstored records.
// seedWait is how long a batch with a handed-over partition retries
// reading the store's progress, every seedRetry, before it goes on and
// leaves the read back to a later batch (a broker restarting: its group
// coordinator moves within seconds).
const (
	progressTimeout = 2 * time.Second
	readBackTimeout = 10 * time.Second
	seedWait        = 10 * time.Second
	seedRetry       = 500 * time.Millisecond
)

// errProgressUnknown: the store's progress could not be read (a broker
// restarting, say). Nothing is missed for it: the remembered records are
// kept until it is known again, or maxAge.
var errProgressUnknown = errors.New("the store's progress is unknown; earlier batches' records are kept until it is known")

// ReadBack reads the records of topic's partition from offset from up to
// (not including) to back from Kafka.
type ReadBack func(ctx context.Context, topic string, partition int32, from, to int64) ([]*kgo.Record, error)

// refresh forgets what the store has written and what is older than
// maxAge. For a partition whose batch does not go on where this replica's
// last batch of it ended — a partition handed over by another replica, or
// this replica's start — it reads back the records below the batch that
// the store has not written (another replica correlated them), so the
// memory is what it would be had this replica handled them. What it could
// not read back is read back with a later batch (pending).
func (u *unstored) refresh(ctx context.Context, batch []*kgo.Record) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	seen := map[pipeline.TopicPart]bool{}
	gaps := map[pipeline.TopicPart]int64{} // the batch's first offset of each partition not continued
	for _, r := range batch {
		tp := pipeline.PartOf(r)
		if !seen[tp] && u.next[tp] != r.Offset {
			gaps[tp] = r.Offset
		}
		seen[tp] = true
	}
	toRead := maps.Clone(gaps)
	for tp, first := range u.pending {
		if _, ok := toRead[tp]; !ok { // handed over again: read from the new batch
			toRead[tp] = first
		}
	}
	seed := len(toRead) > 0 && u.readBack != nil && u.progress != nil
	if len(u.recs) == 0 && !seed {
		return nil
	}
	// Only a batch with a handed-over partition waits for the progress.
	stored, err := u.readProgress(ctx, seed && len(gaps) > 0)
	oldest := u.now().Add(-u.maxAge)
	kept := u.recs[:0]
	for _, m := range u.recs {
		if off, ok := stored[m.rec.Topic][m.rec.Partition]; (ok && m.rec.Offset < off) || m.at.Before(oldest) {
			u.bytes -= recordBytes(m.rec)
			continue
		}
		kept = append(kept, m)
	}
	clear(u.recs[len(kept):])
	u.recs = kept
	if err != nil {
		if seed {
			u.keepPending(toRead)
			return fmt.Errorf("partitions handed to this replica: the records below its batch that the store has not written are not read back yet (a later batch reads them back): %w", err)
		}
		return fmt.Errorf("%w: %w", errProgressUnknown, err)
	}
	if !seed {
		return nil
	}
	for tp, first := range toRead {
		delete(u.pending, tp)
		if _, ok := gaps[tp]; ok {
			u.next[tp] = first // a retry of this batch does not read it back again
		}
		from, ok := stored[tp.Topic][tp.Partition]
		if !ok || from >= first {
			continue // the store is past the batch's start (or never committed): nothing to read
		}
		rctx, cancel := context.WithTimeout(ctx, readBackTimeout)
		recs, rerr := u.readBack(rctx, tp.Topic, tp.Partition, max(from, first-int64(u.max)), first)
		cancel()
		if rerr != nil {
			err = errors.Join(err, fmt.Errorf("read back %s/%d [%d, %d) (a later batch tries again): %w", tp.Topic, tp.Partition, from, first, rerr))
			u.keepPending(map[pipeline.TopicPart]int64{tp: first})
			continue
		}
		u.remember(recs)
	}
	return err
}

// keepPending records gaps as not read back yet.
func (u *unstored) keepPending(gaps map[pipeline.TopicPart]int64) {
	if u.pending == nil {
		u.pending = map[pipeline.TopicPart]int64{}
	}
	maps.Copy(u.pending, gaps)
}

// revoked forgets the partitions' records not read back yet: they are
// now another replica's, which reads them back itself.
func (u *unstored) revoked(topic string, partitions []int32) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, p := range partitions {
		delete(u.pending, pipeline.TopicPart{Topic: topic, Partition: p})
	}
}

// readProgress reads the store's progress (nil if not known). For a batch
// with a handed-over partition (seed), whose records below the batch
// cannot be read back without it, it retries for up to seedWait.
func (u *unstored) readProgress(ctx context.Context, seed bool) (map[string]map[int32]int64, error) {
	if u.progress == nil {
		return nil, nil
	}
	deadline := time.Now().Add(u.seedWait)
	for {
		pctx, cancel := context.WithTimeout(ctx, progressTimeout)
		stored, err := u.progress(pctx)
		cancel()
		if err == nil {
			return stored, nil
		}
		if !seed || time.Now().Add(seedRetry).After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(seedRetry):
		}
	}
}

// of returns the remembered records with a key among recs' keys or a
// cluster in clusters.
func (u *unstored) of(recs []*kgo.Record, clusters map[string]bool) []*kgo.Record {
	keys := make(map[string]bool, len(recs))
	for _, r := range recs {
		keys[string(r.Key)] = true
	}
	return u.ofKeys(keys, clusters)
}

// ofKeys returns the remembered records with a key (cluster/node) in keys
// or a cluster in clusters.
func (u *unstored) ofKeys(keys, clusters map[string]bool) []*kgo.Record {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.recs) == 0 || len(keys)+len(clusters) == 0 {
		return nil
	}
	var out []*kgo.Record
	for _, m := range u.recs {
		if keys[string(m.rec.Key)] || clusters[m.cluster] {
			out = append(out, m.rec)
		}
	}
	return out
}
