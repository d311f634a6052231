// Package pipeline is the one shape every processor role has: consume a
// Kafka topic as a consumer group, hand each partition's batch to the role's
// Handler, produce what it returns (outputs and dead letters), and only then
// mark the offsets for commit (at-least-once; every side effect is
// idempotent). Marked offsets are committed in the background every
// CommitInterval, and synchronously before partitions move to another
// replica and at shutdown, so a slow or failing-over group coordinator
// never holds up the next batch.
//
// Retry with backoff (a failed batch is held, its partitions paused, while
// the replica's other partitions go on: held.go), dead-lettering of poison
// records, per-batch timeouts and metrics are written here once and wrap
// every role.
package pipeline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// Handler is a role's logic. Handle gets the records of one partition in
// offset order and returns what to produce; it is called again with the same
// records when it returns an error (after a backoff), so its side effects
// must be idempotent. Records it can never process go in Result.Dead.
type Handler interface {
	Handle(ctx context.Context, recs []*kgo.Record) (Result, error)
}

// PartitionObserver is implemented by handlers that want to know which
// partitions of their topics this replica consumes (the correlate sweep
// evaluates only the groups whose records land on them). total is the
// topic's partition count, 0 when it could not be read.
type PartitionObserver interface {
	PartitionsAssigned(topic string, partitions []int32, total int)
	PartitionsRevoked(topic string, partitions []int32)
}

// Producer is what work outside Handle (the correlate sweep, quarantine's
// manual-uncordon watch) produces through: a *kgo.Client.
type Producer interface {
	ProduceSync(ctx context.Context, rs ...*kgo.Record) kgo.ProduceResults
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, recs []*kgo.Record) (Result, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, recs []*kgo.Record) (Result, error) {
	return f(ctx, recs)
}

// Result is what a handled batch produces before its offsets are committed.
type Result struct {
	// Out are records to produce (Topic must be set).
	Out []*kgo.Record
	// Dead are records that can never be processed, with the reason.
	Dead []Dead
	// Rest are topics the batch asks the runner not to fetch until the
	// time given (a requeue topic whose records are not due yet): once
	// the batch's offsets are marked, each is paused until the earliest
	// time any batch of the poll asked for. Records of other topics are
	// fetched and handled meanwhile.
	Rest map[string]time.Time
	// Produced, when set, is called once Out is on the broker (before the
	// batch's offsets are marked): what the handler keeps until its
	// outputs are produced may go.
	Produced func()
}

// Dead is a poison record and why.
type Dead struct {
	Record *kgo.Record
	Reason error
}

// Config configures a Runner.
type Config struct {
	// Role names the processor role; it is the consumer group suffix and the
	// metrics label.
	Role string
	// Group is the consumer group. Default DefaultGroup(Role).
	Group string
	// Topics consumed.
	Topics []string
	// BatchTimeout bounds one Handle call. Default 30s.
	BatchTimeout time.Duration
	// MaxBackoff caps the retry backoff. Default 10s.
	MaxBackoff time.Duration
	// MaxPollRecords bounds one poll. Default 5000.
	MaxPollRecords int
	// Linger is how long the runner keeps polling to gather MinBatch
	// records before it hands over what it has, for roles that write in
	// bulk. Default 0: each poll is handled as it comes.
	Linger time.Duration
	// MinBatch is the record count at which the runner stops lingering.
	// Default MaxPollRecords.
	MinBatch int
	// MaxBatchBytes stops lingering once the records gathered hold this
	// many bytes of keys and values, whatever MinBatch says: batches of
	// the largest events (~200 KB each) are bounded by bytes, not by
	// count (the first poll of a batch is bounded by the client's fetch
	// buffer). Default 64 MiB.
	MaxBatchBytes int
	// MergePartitions hands all the partitions gathered together to one
	// Handle call (each partition's records in offset order, partitions one
	// after the other), so a bulk writer writes once per batch. Default
	// false: one Handle call per partition, run concurrently.
	MergePartitions bool
	// Overlap handles a round of batches while the next is polled, and
	// starts handling the next before the first has finished (never more
	// than two rounds at once): a bulk writer decodes its next batch while
	// its last is still being written, instead of the two taking turns.
	// Offsets are still marked round by round, in order, each only after
	// its round succeeded; records polled behind a batch that failed join
	// it and are held with it (holding.absorb). A rebalance waits for the
	// older of two rounds only: what the newer holds of a revoked
	// partition is not marked, and its next owner handles it again. For
	// a role whose batches may take effect out of order and twice (the
	// store: rows keyed by event id) and never rest a topic
	// (Result.Rest). Default false.
	Overlap bool
	// LagInterval is how often the group's consumer lag is measured for
	// the faultline_processor_consumer_lag metric; 0 uses the default,
	// negative disables it. Default 15s.
	LagInterval time.Duration
	// CommitInterval is how often the offsets of handled batches are
	// committed; a replica that crashes hands at most about this much
	// work to its successor again. Default 1s.
	CommitInterval time.Duration
	// FetchMaxWait bounds how long a fetch waits for new records. A role
	// whose batches rest a topic (Result.Rest) sets it short: a rested
	// topic is fetched again only with the next fetch request, and an idle
	// one waits this long. Default franz-go's 5s.
	FetchMaxWait time.Duration
	// StartWithin, when positive, is where the group starts a partition it
	// has no committed offset for (its first start, a renamed group, or
	// offsets the broker dropped after offsets.retention.minutes): at the
	// first record stamped (Kafka's record timestamp, the producer's clock)
	// no more than StartWithin before the group assigned it, instead of the
	// log's start (a record written meanwhile is never skipped:
	// startOffsets), and that start is committed at once (commitStarts: a
	// restart before a record was handled there does not start it again
	// from a later time). A committed offset always wins. For a role that acts on
	// nothing older (quarantine's max_event_age): it does not read a
	// week of the topic to decide none of it. Default 0: the log's start.
	StartWithin time.Duration
	// ConsumeOpts are extra franz-go options (tests use them for short
	// session timeouts).
	ConsumeOpts []kgo.Opt
}

// Runner runs one role over Kafka.
type Runner struct {
	cfg     Config
	kcfg    kafka.Config
	h       Handler
	log     *slog.Logger
	metrics *Metrics
}

// DefaultGroup is a role's consumer group unless Config.Group says
// otherwise: "faultline-" + role.
func DefaultGroup(role string) string { return "faultline-" + role }

// NewRunner returns a runner for the handler; metrics may be shared by roles.
func NewRunner(cfg Config, kcfg kafka.Config, h Handler, log *slog.Logger, m *Metrics) *Runner {
	if cfg.Group == "" {
		cfg.Group = DefaultGroup(cfg.Role)
	}
	if cfg.BatchTimeout == 0 {
		cfg.BatchTimeout = 30 * time.Second
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 10 * time.Second
	}
	if cfg.MaxPollRecords == 0 {
		cfg.MaxPollRecords = 5000
	}
	if cfg.MinBatch == 0 {
		cfg.MinBatch = cfg.MaxPollRecords
	}
	if cfg.MaxBatchBytes == 0 {
		cfg.MaxBatchBytes = 64 << 20
	}
	if cfg.LagInterval == 0 {
		cfg.LagInterval = 15 * time.Second
	}
	if cfg.CommitInterval == 0 {
		cfg.CommitInterval = time.Second
	}
	if m != nil {
		// Exported from the start (at 0), so alerts on their rate see the
		// role before its first error.
		m.records.WithLabelValues(cfg.Role)
		m.errors.WithLabelValues(cfg.Role)
		m.dead.WithLabelValues(cfg.Role)
	}
	return &Runner{cfg: cfg, kcfg: kcfg, h: h, log: log.With("role", cfg.Role), metrics: m}
}

// Run consumes until ctx ends, then commits what was finished and leaves the
// group.
func (r *Runner) Run(ctx context.Context) error {
	obs, _ := r.h.(PartitionObserver)
	var (
		cl   *kgo.Client
		kept atomic.Pointer[kgo.Client] // cl, for the group's callbacks
		held holding                    // failed batches (held.go)
	)
	held.pause = func(m map[string][]int32) { cl.PauseFetchPartitions(m) }
	held.wake = func(m map[string][]int32) { cl.ResumeFetchPartitions(m) }
	opts := append([]kgo.Opt{
		kgo.ConsumerGroup(r.cfg.Group),
		kgo.ConsumeTopics(r.cfg.Topics...),
		kgo.AutoCommitMarks(),
		kgo.AutoCommitInterval(r.cfg.CommitInterval),
		kgo.AutoCommitCallback(r.committed),
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) {
			// What was handled is committed before the partitions move,
			// so their next owner does not handle it again.
			r.commit(ctx, cl)
			held.revoked(m)
			if obs != nil {
				revoked(obs, m)
			}
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			held.revoked(m)
			if obs != nil {
				revoked(obs, m)
			}
		}),
	}, slices.Concat(r.kcfg.GroupOpts(), roundBound(r.cfg.BatchTimeout), r.cfg.ConsumeOpts)...)
	if r.cfg.FetchMaxWait > 0 {
		opts = append(opts, kgo.FetchMaxWait(r.cfg.FetchMaxWait))
	}
	startLog := []any{"group", r.cfg.Group, "topics", r.cfg.Topics}
	if r.cfg.StartWithin > 0 {
		// Not ConsumeStartOffset(AfterMilli): it can skip a record
		// produced while it lists (startOffsets). ConsumeResetOffset
		// (AtStart, above) still handles a committed offset that fell
		// below the log's start.
		opts = append(opts, kgo.AdjustFetchOffsetsFn(startWithin(r.cfg.StartWithin, &kept, r.log)))
		startLog = append(startLog, "uncommitted_partitions_within", r.cfg.StartWithin)
	}
	if obs != nil {
		opts = append(opts, observePartitions(obs, r.cfg.Topics, r.log)...)
	}
	var err error
	cl, err = kafka.NewClient(r.kcfg, r.log, opts...)
	if err != nil {
		return err
	}
	kept.Store(cl)
	defer cl.Close()
	var rests resting
	defer rests.stop()
	r.log.Info("processor started", startLog...)
	if r.cfg.LagInterval > 0 {
		lctx, stopLag := context.WithCancel(ctx)
		defer stopLag()
		go r.watchLag(lctx, cl)
	}
	var running *round // Overlap: the round being handled while the next is polled
	for {
		pctx, cancel := held.untilDue(ctx) // a held batch's next try ends the wait
		polled := r.poll(pctx, cl, running.finished())
		cancel()
		if ctx.Err() != nil {
			r.finish(ctx, cl, &held, &rests, running)
			// Commit with a fresh context so a shutdown does not lose
			// finished work.
			r.commit(context.WithoutCancel(ctx), cl)
			cl.AllowRebalance()
			r.log.Info("processor stopping")
			return nil
		}
		if r.cfg.MergePartitions && len(polled) > 1 {
			var all []*kgo.Record
			for _, b := range polled {
				all = append(all, b...)
			}
			polled = [][]*kgo.Record{all}
		}
		now := time.Now()
		if running != nil && held.due(now) {
			// A held batch is tried again only once every record
			// polled behind it has joined it (holding.absorb).
			r.finish(ctx, cl, &held, &rests, running)
			running = nil
		}
		next := &round{revokes: held.round(), done: make(chan struct{})}
		if running == nil {
			// Never beside a running round, even when a batch turned due
			// since held.due above (a retried batch's success makes the
			// others due at once, from its handler's goroutine): the
			// running round may hold records polled behind it, and they
			// would be marked without it.
			next.batches = held.take(now)
		}
		for _, recs := range polled {
			next.batches = append(next.batches, &batch{recs: recs})
		}
		go func() {
			defer close(next.done)
			next.ok, next.rest, next.failed = r.handleAll(ctx, cl, &held, next.batches)
		}()
		r.finish(ctx, cl, &held, &rests, running)
		running = next
		if !r.cfg.Overlap || len(next.batches) == 0 {
			r.finish(ctx, cl, &held, &rests, next)
			running = nil
		}
		cl.AllowRebalance()
	}
}

// round is the batches of one poll (and the held batches due with it),
// handled together.
type round struct {
	revokes uint64 // holding.round when it was polled
	batches []*batch
	done    chan struct{} // closed once handled
	// What handleAll returned.
	ok, failed []*batch
	rest       map[string]time.Time
}

// finished is closed once the round is handled; nil for no round.
func (rd *round) finished() <-chan struct{} {
	if rd == nil {
		return nil
	}
	return rd.done
}

// finish waits for the round (nil: none) and marks the offsets of its
// batches that succeeded, holds those that failed and rests the topics it
// asks to. A batch the shutdown cut is held too: with Overlap the next
// round, handed over behind it, may have succeeded, and its offsets of
// the cut batch's partitions must wait behind it, not be committed past
// it (the cut batch lost).
func (r *Runner) finish(ctx context.Context, cl *kgo.Client, held *holding, rests *resting, rd *round) {
	if rd == nil {
		return
	}
	<-rd.done
	var done []*kgo.Record
	for _, b := range rd.ok {
		done = append(done, lastPerPartition(held.absorb(b.recs, rd.revokes))...)
	}
	cl.MarkCommitRecords(done...)
	for _, b := range rd.failed {
		held.failed(b, rd.revokes, r.cfg.MaxBackoff)
	}
	r.metrics.heldFor.WithLabelValues(r.cfg.Role).Set(held.oldest(time.Now()).Seconds())
	rests.rest(cl, rd.rest)
}

// resting pauses fetching topics until a time, each with its own timer.
// A timer that had already fired when its topic was rested again must not
// resume the new rest: each rest has a generation, and a timer resumes
// its topic only while its generation is the topic's latest (checked and
// resumed under mu, which rest holds while it pauses).
type resting struct {
	mu     sync.Mutex
	gen    map[string]uint64
	timers map[string]*time.Timer
}

// fetchPauser is the part of *kgo.Client that resting uses.
type fetchPauser interface {
	PauseFetchTopics(topics ...string) []string
	ResumeFetchTopics(topics ...string)
}

// rest pauses each topic of until, and resumes it then; a topic already
// resting rests until the new time instead.
func (rs *resting) rest(cl fetchPauser, until map[string]time.Time) {
	if len(until) == 0 {
		return
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.timers == nil {
		rs.timers = map[string]*time.Timer{}
		rs.gen = map[string]uint64{}
	}
	for topic, t := range until {
		if tm := rs.timers[topic]; tm != nil {
			tm.Stop()
		}
		rs.gen[topic]++
		gen := rs.gen[topic]
		cl.PauseFetchTopics(topic)
		rs.timers[topic] = time.AfterFunc(time.Until(t), func() {
			rs.mu.Lock()
			defer rs.mu.Unlock()
			if rs.gen[topic] == gen {
				cl.ResumeFetchTopics(topic)
			}
		})
	}
}

// stop stops the timers (the client is closing); a timer already firing
// resumes nothing.
func (rs *resting) stop() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for topic, tm := range rs.timers {
		tm.Stop()
		rs.gen[topic]++
	}
}

// commit commits the marked offsets now, waiting up to 10s.
func (r *Runner) commit(ctx context.Context, cl *kgo.Client) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		r.log.Warn("commit failed; records will be redelivered", "err", err)
	}
}

// committed logs a background commit that failed (one superseded by the
// next is canceled, not failed): its records are committed by a later
// one, or handled again by the next owner of their partitions.
func (r *Runner) committed(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
	if err == nil {
		err = commitError(resp)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		r.log.Warn("commit failed; records will be redelivered", "err", err)
	}
}

// commitError is the first partition error of a commit's response.
func commitError(resp *kmsg.OffsetCommitResponse) error {
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return fmt.Errorf("%s[%d]: %w", t.Topic, p.Partition, err)
			}
		}
	}
	return nil
}

func revoked(obs PartitionObserver, m map[string][]int32) {
	for t, ps := range m {
		obs.PartitionsRevoked(t, ps)
	}
}

// observePartitions tells obs of the group's assignments (Run tells it of
// revoked and lost ones).
func observePartitions(obs PartitionObserver, topics []string, log *slog.Logger) []kgo.Opt {
	return []kgo.Opt{
		// Every consumed topic, at every assignment: franz-go calls this
		// with an empty map when a rebalance gives the replica nothing
		// new, and a topic that gained partitions must be counted anew
		// (Ownership's modulus) though none of them came here.
		kgo.OnPartitionsAssigned(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) {
			details, err := kadm.NewClient(cl).ListTopics(ctx, topics...)
			if err != nil {
				log.Warn("partition counts unknown", "topics", topics, "err", err)
			}
			for _, t := range topics {
				obs.PartitionsAssigned(t, m[t], len(details[t].Partitions))
			}
		}),
	}
}

// poll returns the next records, one slice per partition in offset order:
// one poll, or with Linger set, polls until MinBatch records,
// MaxBatchBytes or Linger. It stops waiting for a first record once
// running closes (the round being handled is, and its offsets wait to be
// marked).
func (r *Runner) poll(ctx context.Context, cl *kgo.Client, running <-chan struct{}) [][]*kgo.Record {
	var (
		order   []TopicPart
		parts   = map[TopicPart][]*kgo.Record{}
		n, size int
	)
	add := func(fetches kgo.Fetches) {
		fetches.EachError(func(t string, p int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			r.log.Warn("fetch error", "topic", t, "partition", p, "err", err)
		})
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			k := TopicPart{p.Topic, p.Partition}
			if _, ok := parts[k]; !ok {
				order = append(order, k)
			}
			parts[k] = append(parts[k], p.Records...)
			n += len(p.Records)
			for _, rec := range p.Records {
				size += len(rec.Key) + len(rec.Value)
			}
		})
	}
	first := ctx
	if running != nil {
		var stop context.CancelFunc
		first, stop = context.WithCancel(ctx)
		defer stop()
		go func() {
			select {
			case <-running:
				stop()
			case <-first.Done():
			}
		}()
	}
	add(cl.PollRecords(first, r.cfg.MaxPollRecords))
	if r.cfg.Linger > 0 && n > 0 {
		deadline := time.Now().Add(r.cfg.Linger)
		for n < r.cfg.MinBatch && size < r.cfg.MaxBatchBytes && ctx.Err() == nil && time.Now().Before(deadline) {
			lctx, cancel := context.WithDeadline(ctx, deadline)
			add(cl.PollRecords(lctx, min(r.cfg.MaxPollRecords, r.cfg.MinBatch-n)))
			cancel()
		}
	}
	out := make([][]*kgo.Record, 0, len(order))
	for _, k := range order {
		out = append(out, parts[k])
	}
	return out
}

// watchLag sets the consumer lag gauge of every partition the group
// consumes, every LagInterval, until ctx ends.
func (r *Runner) watchLag(ctx context.Context, cl *kgo.Client) {
	adm := kadm.NewClient(cl)
	t := time.NewTicker(r.cfg.LagInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		lags, err := adm.Lag(ctx, r.cfg.Group)
		if err == nil {
			err = lags.Error()
		}
		if err != nil {
			if ctx.Err() == nil {
				r.log.Debug("consumer lag not measured", "err", err)
			}
			continue
		}
		lags.Each(func(l kadm.DescribedGroupLag) {
			for topic, ps := range l.Lag {
				for p, ml := range ps {
					if ml.Lag >= 0 {
						r.metrics.lag.WithLabelValues(r.cfg.Role, topic, strconv.Itoa(int(p))).Set(float64(ml.Lag))
					}
				}
			}
		})
	}
}

// handleAll handles the batches concurrently (each a partition's, or a
// merged poll) and returns those that succeeded (outputs produced), the
// topics they ask to rest, each until the earliest time asked, and those
// that failed. A held batch that succeeded is let go
// (holding.succeeded).
func (r *Runner) handleAll(ctx context.Context, cl *kgo.Client, held *holding, batches []*batch) (ok []*batch, rest map[string]time.Time, failed []*batch) {
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for _, b := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			succeeded, until := r.try(ctx, cl, b)
			mu.Lock()
			defer mu.Unlock()
			if !succeeded {
				failed = append(failed, b)
				return
			}
			ok = append(ok, b)
			held.succeeded(b)
			for topic, t := range until {
				if rest == nil {
					rest = map[string]time.Time{}
				}
				if old, ok := rest[topic]; !ok || t.Before(old) {
					rest[topic] = t
				}
			}
		}()
	}
	wg.Wait()
	return ok, rest, failed
}

// lastPerPartition returns the last record of each partition in recs.
func lastPerPartition(recs []*kgo.Record) []*kgo.Record {
	var out []*kgo.Record
	for i, rec := range recs {
		if i == len(recs)-1 || recs[i+1].Topic != rec.Topic || recs[i+1].Partition != rec.Partition {
			out = append(out, rec)
		}
	}
	return out
}

// try handles the batch once; it returns whether it succeeded and the
// topics the batch asks to rest. A failure is logged with the wait before
// the next try (held.go).
func (r *Runner) try(ctx context.Context, cl *kgo.Client, b *batch) (bool, map[string]time.Time) {
	part := strconv.Itoa(int(b.recs[0].Partition))
	start := time.Now()
	rest, err := r.handleOnce(ctx, cl, b.recs)
	if err != nil && ctx.Err() != nil {
		// Cut by the shutdown, not failed: uncommitted, the group
		// hands it out again.
		r.log.Info("batch interrupted by the shutdown; it will be handled again", "partition", part,
			"first_offset", b.recs[0].Offset, "records", len(b.recs))
		return false, nil
	}
	r.metrics.observe(r.cfg.Role, len(b.recs), time.Since(start), err)
	if err == nil {
		return true, rest
	}
	// Logged at the 1st, 2nd, 4th, 8th… failed try: a batch held through
	// an hour's outage (of a cluster, say) logs a dozen lines, not one per
	// try. Each try is counted in the metrics.
	if attempt := b.tries + 1; attempt&(attempt-1) == 0 {
		r.log.Warn("batch failed; retrying", "partition", part, "first_offset", b.recs[0].Offset,
			"records", len(b.recs), "attempt", attempt, "backoff", max(b.backoff, 100*time.Millisecond), "err", err)
	}
	return false, nil
}

func (r *Runner) handleOnce(ctx context.Context, cl *kgo.Client, recs []*kgo.Record) (rest map[string]time.Time, err error) {
	hctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler: %w", Panic(p))
		}
	}()
	res, err := r.h.Handle(hctx, recs)
	if err != nil {
		return nil, err
	}
	out := res.Out
	for _, d := range res.Dead {
		dl := DeadLetter(d.Record, d.Reason)
		dl.Headers = append(dl.Headers, kgo.RecordHeader{Key: HeaderRole, Value: []byte(r.cfg.Role)})
		out = append(out, dl)
	}
	if len(out) > 0 {
		pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.BatchTimeout)
		defer pcancel()
		if err := cl.ProduceSync(pctx, out...).FirstErr(); err != nil {
			return nil, fmt.Errorf("produce %d outputs: %w", len(out), err)
		}
		for _, rec := range out {
			r.metrics.produced.WithLabelValues(r.cfg.Role, rec.Topic).Inc()
		}
	}
	// Said once written: a batch whose produce failed is handled again,
	// and its dead letters with it.
	for _, d := range res.Dead {
		r.metrics.dead.WithLabelValues(r.cfg.Role).Inc()
		r.log.Warn("record dead-lettered", "topic", d.Record.Topic, "partition", d.Record.Partition,
			"offset", d.Record.Offset, "reason", d.Reason)
	}
	if res.Produced != nil {
		res.Produced()
	}
	return res.Rest, nil
}

// roundBound bounds a round of batches, and waits for it: a round's Handle
// and its produce each end within batchTimeout (the produce's context
// ends a try the broker has not answered:
// AllowIdempotentProduceCancellation; a batch cut short is held and
// produced again, the same records, which their ids make one), and the
// group waits two of them and a margin for this member to join a
// rebalance (kgo.BlockRebalanceOnPoll holds it until the round is
// finished). franz-go's default rebalance timeout, 60 s, was shorter than
// a round of the roles whose batch_timeout is 2m: a rebalance begun while
// a slow apiserver held a batch put the member out of the group, and its
// partitions were handled by another member beside it.
func roundBound(batchTimeout time.Duration) []kgo.Opt {
	return []kgo.Opt{kgo.AllowIdempotentProduceCancellation(), kgo.RebalanceTimeout(max(time.Minute, 2*batchTimeout+30*time.Second))}
}

// HeaderRole names the role that dead-lettered a record (every role that
// cannot process a record dead-letters its own copy).
const HeaderRole = "faultline-role"

// deadLetterMax bounds a dead letter's key, value and headers, under what
// the producer sends (franz-go's 1,000,012-byte batch): a record near the
// broker's own limit (1 MiB by default) failed its dead letter, and so
// its batch, at every try — the partition stopped for good.
const deadLetterMax = 900_000

// DeadLetter returns the dead-letter record for rec: same key and value,
// with the reason (at most 4 KiB) and the source position in headers. A
// record whose dead letter would pass deadLetterMax goes without its
// value and its own headers, its key bounded: its value's size and
// SHA-256 say which it was.
func DeadLetter(rec *kgo.Record, reason error) *kgo.Record {
	msg := "unknown"
	if reason != nil {
		msg = events.Truncate(reason.Error(), 4096)
	}
	key, value, hdrs := rec.Key, rec.Value, append([]kgo.RecordHeader(nil), rec.Headers...)
	size := len(key) + len(value)
	for _, h := range hdrs {
		size += len(h.Key) + len(h.Value)
	}
	if size > deadLetterMax-len(msg)-1024 {
		sum := sha256.Sum256(value)
		key, value = []byte(events.BoundKey(string(key), 512)), nil
		hdrs = []kgo.RecordHeader{
			{Key: events.HeaderValueBytes, Value: []byte(strconv.Itoa(len(rec.Value)))},
			{Key: events.HeaderValueSHA256, Value: []byte(hex.EncodeToString(sum[:]))},
		}
	}
	return &kgo.Record{
		Topic: events.TopicDeadLetter,
		Key:   key,
		Value: value,
		Headers: append(hdrs,
			kgo.RecordHeader{Key: events.HeaderError, Value: []byte(msg)},
			kgo.RecordHeader{Key: events.HeaderSource, Value: []byte(rec.Topic)},
			kgo.RecordHeader{Key: events.HeaderSourcePart, Value: []byte(strconv.Itoa(int(rec.Partition)))},
			kgo.RecordHeader{Key: events.HeaderSourceOff, Value: []byte(strconv.FormatInt(rec.Offset, 10))},
		),
	}
}

// Metrics are the pipeline's Prometheus metrics, labelled by role.
type Metrics struct {
	records *prometheus.CounterVec
	errors  *prometheus.CounterVec
	dead    *prometheus.CounterVec
	// produced counts the outputs acknowledged by the broker, by topic: a
	// requeued role's trips round its requeue topic show here.
	produced *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	lag      *prometheus.GaugeVec
	// heldFor is how long the replica's oldest held batch has been
	// failing: a partition stuck behind one batch while the others go on
	// shows here, not in the role's handled rate.
	heldFor *prometheus.GaugeVec
}

// NewMetrics registers the pipeline metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		records:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_processor_records_total", Help: "Records handled successfully."}, []string{"role"}),
		errors:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_processor_batch_errors_total", Help: "Batches that failed and were retried."}, []string{"role"}),
		dead:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_processor_dead_letters_total", Help: "Records sent to the dead-letter topic."}, []string{"role"}),
		produced: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_processor_produced_total", Help: "Records produced and acknowledged (outputs, requeues, dead letters), by topic."}, []string{"role", "topic"}),
		latency:  prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "faultline_processor_batch_seconds", Help: "Time to handle one partition batch.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"role"}),
	}
	m.lag = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "faultline_processor_consumer_lag", Help: "Records of the consumed topics not yet committed by the role's consumer group."}, []string{"role", "topic", "partition"})
	m.heldFor = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "faultline_processor_held_batch_seconds", Help: "How long the oldest batch this replica holds (failed, retried with backoff, its partitions paused) has been failing; 0 when none is held."}, []string{"role"})
	reg.MustRegister(m.records, m.errors, m.dead, m.produced, m.latency, m.lag, m.heldFor)
	return m
}

func (m *Metrics) observe(role string, n int, d time.Duration, err error) {
	m.latency.WithLabelValues(role).Observe(d.Seconds())
	if err != nil {
		m.errors.WithLabelValues(role).Inc()
		return
	}
	m.records.WithLabelValues(role).Add(float64(n))
}

// ActionID is a deterministic action id: 32 hex digits of the SHA-256 of
// the parts, each followed by NUL, so a retried batch (or another replica)
// writes the same ids.
func ActionID(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// ActionRecord is the actions-topic record of an audit Action, keyed by its
// cluster/node like every record of that node.
func ActionRecord(a *faultlinev1.Action) (*kgo.Record, error) {
	b, err := events.MarshalAction(a)
	if err != nil {
		return nil, fmt.Errorf("encode action: %w", err)
	}
	return &kgo.Record{Topic: events.TopicActions, Key: events.Key(a.GetCluster(), a.GetNode()), Value: b}, nil
}
