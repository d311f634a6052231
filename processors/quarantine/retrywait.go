package quarantine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors/pipeline"
)

// retryGroup is the retry consumer's group.
var retryGroup = pipeline.DefaultGroup(Role + "-retry")

// retryWaiting follows the retry topics (RetryTopics) and knows, by key
// (cluster/node), the records the retry consumer's group has not consumed
// yet — deferred by any replica, before or after this one started. A
// node's newer record must not be decided before them: a recovery applied
// first, the retried fault would cordon a healthy node. The in-memory
// grace period after a deferral (Handler.deferring) keeps that order only
// on the replica that deferred, and only for 2×retry_wait.
//
// It holds ≈ 50 bytes per waiting record (a 500,000-record backlog:
// ≈ 25 MB per replica) and reads each record once; idle retry topics cost
// two requests a second (a fetch of them all, the group's offsets).
type retryWaiting struct {
	log    *slog.Logger
	group  string
	topics []string
	cl     *kgo.Client

	mu     sync.Mutex
	keys   map[string]int                         // waiting records per key
	queued map[pipeline.TopicPart][]waitingRecord // in offset order
	next   map[pipeline.TopicPart]int64           // the next offset to read
}

type waitingRecord struct {
	offset int64
	key    string
}

// openRetryTopics creates the retry topics of clusters where missing and
// returns them with every other cluster's found on the broker: a cluster
// since removed from the configuration leaves its records there, which
// are decided as any unknown cluster's (dry-run), not left unread.
func openRetryTopics(ctx context.Context, kcfg kafka.Config, log *slog.Logger, clusters []string) ([]string, error) {
	cl, err := kafka.NewClient(kcfg, log)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute) // kafka.CreateTopics' bound
	defer cancel()
	topics := RetryTopics(clusters)
	if err := kafka.EnsureTopics(ctx, cl, kcfg, topics...); err != nil {
		return nil, err
	}
	listed, err := kadm.NewClient(cl).ListTopics(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the retry topics: %w", err)
	}
	for _, t := range listed.Names() {
		if strings.HasPrefix(t, TopicRetry+".") && !slices.Contains(topics, t) {
			topics = append(topics, t)
		}
	}
	return topics, nil
}

// catchUpTimeout bounds how long opening reads the records already
// waiting.
const catchUpTimeout = 30 * time.Second

// openRetryWaiting reads topics from group's committed offsets to their
// ends as of now (for at most catchUpTimeout) and returns the follower,
// its client still consuming; run it to keep up. caughtUp is false when
// the end was not reached in time (the rest is read by run). A partition
// the group has no commit for is read from where the group starts it
// (within: its pipeline.Config.StartWithin; 0: the log's start).
func openRetryWaiting(ctx context.Context, kcfg kafka.Config, log *slog.Logger, group string, topics []string, within time.Duration) (w *retryWaiting, caughtUp bool, err error) {
	cl, err := kafka.NewClient(kcfg, log)
	if err != nil {
		return nil, false, err
	}
	w = newRetryWaiting(log, group, topics)
	w.cl = cl
	ends, err := w.start(ctx, within)
	if err != nil {
		cl.Close()
		return nil, false, err
	}
	cctx, cancel := context.WithTimeout(ctx, catchUpTimeout)
	defer cancel()
	for !w.reached(ends) {
		if cctx.Err() != nil {
			return w, false, nil
		}
		w.poll(cctx)
	}
	return w, true, nil
}

func newRetryWaiting(log *slog.Logger, group string, topics []string) *retryWaiting {
	return &retryWaiting{log: log, group: group, topics: topics, keys: map[string]int{},
		queued: map[pipeline.TopicPart][]waitingRecord{}, next: map[pipeline.TopicPart]int64{}}
}

// start begins consuming every partition of the topics where the group
// stands and returns the partitions' end offsets. Where the group has no
// commit it stands where it will start (within > 0: the first record
// stamped within that of now, as the group's StartWithin; before the
// group's own listing, so never after it: a record counted that the group
// skips only waits until the group commits the partition); where that
// cannot be listed, at the log's start (the same error the group logs).
func (w *retryWaiting) start(ctx context.Context, within time.Duration) (map[pipeline.TopicPart]int64, error) {
	adm := kadm.NewClient(w.cl)
	starts, err := adm.ListStartOffsets(ctx, w.topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("start offsets of the retry topics: %w", err)
	}
	ends, err := adm.ListEndOffsets(ctx, w.topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("end offsets of the retry topics: %w", err)
	}
	committed, err := w.committed(ctx)
	if err != nil {
		return nil, err
	}
	if within > 0 {
		uncommitted := map[string][]int32{}
		starts.Each(func(s kadm.ListedOffset) {
			if _, ok := committed[pipeline.TopicPart{Topic: s.Topic, Partition: s.Partition}]; !ok {
				uncommitted[s.Topic] = append(uncommitted[s.Topic], s.Partition)
			}
		})
		if len(uncommitted) > 0 {
			at, err := pipeline.StartOffsets(ctx, adm, time.Now().Add(-within), uncommitted)
			if err != nil {
				w.log.Warn("the retry topics' uncommitted partitions are followed from the log's start: their offsets by time could not be listed", "err", err)
			}
			for topic, ps := range at {
				for p, o := range ps {
					committed[pipeline.TopicPart{Topic: topic, Partition: p}] = o
				}
			}
		}
	}
	from := map[string]map[int32]kgo.Offset{}
	end := map[pipeline.TopicPart]int64{}
	starts.Each(func(s kadm.ListedOffset) {
		tp := pipeline.TopicPart{Topic: s.Topic, Partition: s.Partition}
		at := max(s.Offset, committed[tp])
		if from[s.Topic] == nil {
			from[s.Topic] = map[int32]kgo.Offset{}
		}
		from[s.Topic][s.Partition] = kgo.NewOffset().At(at)
		w.next[tp] = at
	})
	ends.Each(func(e kadm.ListedOffset) { end[pipeline.TopicPart{Topic: e.Topic, Partition: e.Partition}] = e.Offset })
	w.cl.AddConsumePartitions(from)
	return end, nil
}

// committed returns the group's committed offsets on the topics
// (partitions it never committed are absent).
func (w *retryWaiting) committed(ctx context.Context) (map[pipeline.TopicPart]int64, error) {
	adm := kadm.NewClient(w.cl)
	resp, err := adm.FetchOffsets(ctx, w.group)
	for try := 1; kerr.IsRetriable(err) && try < 50 && ctx.Err() == nil; try++ { // a coordinator still loading
		time.Sleep(200 * time.Millisecond)
		resp, err = adm.FetchOffsets(ctx, w.group)
	}
	out := map[pipeline.TopicPart]int64{}
	if errors.Is(err, kerr.GroupIDNotFound) { // never committed
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("offsets of group %s: %w", w.group, err)
	}
	resp.Each(func(o kadm.OffsetResponse) {
		if o.Err == nil && o.At >= 0 {
			out[pipeline.TopicPart{Topic: o.Topic, Partition: o.Partition}] = o.At
		}
	})
	return out, nil
}

// reached reports whether every partition was read up to ends.
func (w *retryWaiting) reached(ends map[pipeline.TopicPart]int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for p, e := range ends {
		if w.next[p] < e {
			return false
		}
	}
	return true
}

// poll reads what the topics have now (waiting at most until ctx ends).
func (w *retryWaiting) poll(ctx context.Context) error {
	fs := w.cl.PollFetches(ctx)
	var errs []error
	fs.EachError(func(_ string, _ int32, err error) {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	fs.EachRecord(func(r *kgo.Record) {
		key, tp := string(r.Key), pipeline.PartOf(r)
		w.keys[key]++
		w.queued[tp] = append(w.queued[tp], waitingRecord{offset: r.Offset, key: key})
		w.next[tp] = r.Offset + 1
	})
	return errors.Join(errs...)
}

// consumed forgets the records before the group's committed offsets.
func (w *retryWaiting) consumed(committed map[pipeline.TopicPart]int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for p, q := range w.queued {
		c, ok := committed[p]
		if !ok {
			continue
		}
		i := sort.Search(len(q), func(i int) bool { return q[i].offset >= c })
		if i == 0 {
			continue
		}
		for _, r := range q[:i] {
			if w.keys[r.key]--; w.keys[r.key] <= 0 {
				delete(w.keys, r.key)
			}
		}
		w.queued[p] = append([]waitingRecord(nil), q[i:]...)
	}
}

// waits reports whether a record keyed key waits on a retry topic.
func (w *retryWaiting) waits(key []byte) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.keys[string(key)] > 0
}

// run keeps up with the retry topics and with the group's progress (every
// second) until ctx ends; failures are logged at most once a minute.
func (w *retryWaiting) run(ctx context.Context) {
	defer w.cl.Close()
	var lastLog time.Time
	report := func(what string, err error) {
		if err != nil && ctx.Err() == nil && time.Since(lastLog) > time.Minute {
			lastLog = time.Now()
			w.log.Warn("following the retry topic: "+what, "err", err)
		}
	}
	var refreshed time.Time
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		report("read", w.poll(pctx))
		cancel()
		if time.Since(refreshed) < time.Second {
			continue
		}
		refreshed = time.Now()
		committed, err := w.committed(ctx)
		report("group offsets", err)
		if err == nil {
			w.consumed(committed)
		}
	}
}
