// Package pipeline is the one shape every processor role has: consume a
// Kafka topic as a consumer group, hand each partition's batch to the role's
// Handler, produce what it returns (outputs and dead letters), and only then
// commit the offsets (at-least-once; every side effect is idempotent).
//
// Retry with backoff, dead-lettering of poison records, per-batch timeouts
// and metrics are written here once and wrap every role.
package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/schemas/events"
)

// Handler is a role's logic. Handle gets the records of one partition in
// offset order and returns what to produce; it is called again with the same
// records when it returns an error (after a backoff), so its side effects
// must be idempotent. Records it can never process go in Result.Dead.
type Handler interface {
	Handle(ctx context.Context, recs []*kgo.Record) (Result, error)
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
	// Group is the consumer group. Default "faultline-" + Role.
	Group string
	// Topics consumed.
	Topics []string
	// BatchTimeout bounds one Handle call. Default 30s.
	BatchTimeout time.Duration
	// MaxBackoff caps the retry backoff. Default 10s.
	MaxBackoff time.Duration
	// MaxPollRecords bounds one poll. Default 5000.
	MaxPollRecords int
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

// NewRunner returns a runner for the handler; metrics may be shared by roles.
func NewRunner(cfg Config, kcfg kafka.Config, h Handler, log *slog.Logger, m *Metrics) *Runner {
	if cfg.Group == "" {
		cfg.Group = "faultline-" + cfg.Role
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
	return &Runner{cfg: cfg, kcfg: kcfg, h: h, log: log.With("role", cfg.Role), metrics: m}
}

// Run consumes until ctx ends, then commits what was finished and leaves the
// group.
func (r *Runner) Run(ctx context.Context) error {
	opts := append([]kgo.Opt{
		kgo.ConsumerGroup(r.cfg.Group),
		kgo.ConsumeTopics(r.cfg.Topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
	}, r.cfg.ConsumeOpts...)
	cl, err := kafka.NewClient(r.kcfg, r.log, opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	r.log.Info("processor started", "group", r.cfg.Group, "topics", r.cfg.Topics)
	for {
		fetches := cl.PollRecords(ctx, r.cfg.MaxPollRecords)
		if ctx.Err() != nil {
			cl.AllowRebalance()
			r.log.Info("processor stopping")
			return nil
		}
		fetches.EachError(func(t string, p int32, err error) {
			r.log.Warn("fetch error", "topic", t, "partition", p, "err", err)
		})
		var batches [][]*kgo.Record
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) > 0 {
				batches = append(batches, p.Records)
			}
		})
		done := r.handleAll(ctx, cl, batches)
		if len(done) > 0 {
			// Commit with a fresh context so a shutdown does not lose
			// finished work.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			if err := cl.CommitRecords(cctx, done...); err != nil {
				r.log.Warn("commit failed; records will be redelivered", "err", err)
			}
			cancel()
		}
		cl.AllowRebalance()
	}
}

// handleAll handles each partition's batch concurrently and returns the last
// record of every batch that finished (outputs produced).
func (r *Runner) handleAll(ctx context.Context, cl *kgo.Client, batches [][]*kgo.Record) []*kgo.Record {
	var (
		mu   sync.Mutex
		done []*kgo.Record
		wg   sync.WaitGroup
	)
	for _, b := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r.handleWithRetry(ctx, cl, b) {
				mu.Lock()
				done = append(done, b[len(b)-1])
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return done
}

// handleWithRetry retries the batch until it succeeds or ctx ends.
func (r *Runner) handleWithRetry(ctx context.Context, cl *kgo.Client, recs []*kgo.Record) bool {
	backoff := 100 * time.Millisecond
	part := strconv.Itoa(int(recs[0].Partition))
	for attempt := 1; ; attempt++ {
		start := time.Now()
		err := r.handleOnce(ctx, cl, recs)
		r.metrics.observe(r.cfg.Role, len(recs), time.Since(start), err)
		if err == nil {
			return true
		}
		r.log.Warn("batch failed; retrying", "partition", part, "first_offset", recs[0].Offset,
			"records", len(recs), "attempt", attempt, "backoff", backoff, "err", err)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, r.cfg.MaxBackoff)
	}
}

func (r *Runner) handleOnce(ctx context.Context, cl *kgo.Client, recs []*kgo.Record) (err error) {
	hctx, cancel := context.WithTimeout(ctx, r.cfg.BatchTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panic: %v", p)
		}
	}()
	res, err := r.h.Handle(hctx, recs)
	if err != nil {
		return err
	}
	out := res.Out
	for _, d := range res.Dead {
		out = append(out, DeadLetter(d.Record, d.Reason))
		r.metrics.dead.WithLabelValues(r.cfg.Role).Inc()
		r.log.Warn("record dead-lettered", "topic", d.Record.Topic, "partition", d.Record.Partition,
			"offset", d.Record.Offset, "reason", d.Reason)
	}
	if len(out) == 0 {
		return nil
	}
	pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.BatchTimeout)
	defer pcancel()
	if err := cl.ProduceSync(pctx, out...).FirstErr(); err != nil {
		return fmt.Errorf("produce %d outputs: %w", len(out), err)
	}
	return nil
}

// DeadLetter returns the dead-letter record for rec: same key and value,
// with the reason and the source position in headers.
func DeadLetter(rec *kgo.Record, reason error) *kgo.Record {
	msg := "unknown"
	if reason != nil {
		msg = reason.Error()
	}
	return &kgo.Record{
		Topic: events.TopicDeadLetter,
		Key:   rec.Key,
		Value: rec.Value,
		Headers: append(append([]kgo.RecordHeader(nil), rec.Headers...),
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
	latency *prometheus.HistogramVec
}

// NewMetrics registers the pipeline metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		records: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_processor_records_total", Help: "Records handled successfully."}, []string{"role"}),
		errors:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_processor_batch_errors_total", Help: "Batches that failed and were retried."}, []string{"role"}),
		dead:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_processor_dead_letters_total", Help: "Records sent to the dead-letter topic."}, []string{"role"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "faultline_processor_batch_seconds", Help: "Time to handle one partition batch.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"role"}),
	}
	reg.MustRegister(m.records, m.errors, m.dead, m.latency)
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
