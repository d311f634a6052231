// Package store is the store processor role (`faultline process
// --role=store`): it consumes the events and actions topics and writes them
// to ClickHouse in bulk, committing offsets only after the rows are written.
//
// Delivery is at-least-once: a batch whose insert succeeded but whose
// commit did not (a crash, a rebalance, a ClickHouse error after the data
// arrived) is written again. The tables are ReplacingMergeTree keyed by
// event id and every query of faultline deduplicates by id, so a second
// copy is never counted (exactly-once effect).
package store

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/ClickHouse/clickhouse-go/v2/lib/proto"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/rows"
	"github.com/faultline/faultline/schemas/events"
)

// Role is the role's name.
const Role = "store"

// Topics the store role consumes.
var Topics = []string{events.TopicEvents, events.TopicActions}

// Config configures the store role.
type Config struct {
	// BatchRecords is the size threshold: the role writes once this many
	// records are gathered. Default 50000.
	BatchRecords int `toml:"batch_records"`
	// BatchBytes is the size threshold in bytes of record keys and values:
	// the role writes once the records gathered hold this many, whatever
	// their count. It bounds the role's memory with the largest events:
	// a batch is held about four times over (the records, their decoded
	// fields, ClickHouse's column buffers) and two are in hand at once.
	// Default 24 MiB (50,000 events of the usual ~400 bytes stay under it).
	BatchBytes int `toml:"batch_bytes"`
	// BatchLinger is the time threshold: the role writes what it has once
	// this long has passed since the first record of a batch. Default 1s.
	BatchLinger time.Duration `toml:"batch_linger"`
	// Retention is the age after which whole months of events, actions and
	// fingerprints are dropped (by the month they were received); 0 keeps
	// everything. Default 2160h (90 days).
	Retention time.Duration `toml:"retention"`
	// RetentionInterval is how often retention runs. Default 1h.
	RetentionInterval time.Duration `toml:"retention_interval"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		BatchRecords:      50000,
		BatchBytes:        24 << 20,
		BatchLinger:       time.Second,
		Retention:         90 * 24 * time.Hour,
		RetentionInterval: time.Hour,
	}
}

// RegisterFlags adds the config's flags with the given prefix ("store.").
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.IntVar(&c.BatchRecords, prefix+"batch-records", c.BatchRecords, "store: write once this many records are gathered")
	fs.IntVar(&c.BatchBytes, prefix+"batch-bytes", c.BatchBytes, "store: write once the records gathered hold this many bytes")
	fs.DurationVar(&c.BatchLinger, prefix+"batch-linger", c.BatchLinger, "store: write what was gathered after this long")
	fs.DurationVar(&c.Retention, prefix+"retention", c.Retention, "store: drop months of history received longer ago than this (0: keep all)")
	fs.DurationVar(&c.RetentionInterval, prefix+"retention-interval", c.RetentionInterval, "store: how often retention runs")
}

// Validate names the first bad key.
func (c Config) Validate(prefix string) error {
	switch {
	case c.BatchRecords < 1:
		return fmt.Errorf("%sbatch_records: must be at least 1, got %d", prefix, c.BatchRecords)
	case c.BatchBytes < 1<<20:
		return fmt.Errorf("%sbatch_bytes: must be at least 1 MiB (1048576), got %d", prefix, c.BatchBytes)
	case c.BatchLinger < 0:
		return fmt.Errorf("%sbatch_linger: must not be negative, got %s", prefix, c.BatchLinger)
	case c.Retention < 0:
		return fmt.Errorf("%sretention: must not be negative, got %s", prefix, c.Retention)
	case c.Retention > 0 && c.Retention < 24*time.Hour:
		return fmt.Errorf("%sretention: at least 24h (partitions are months), got %s", prefix, c.Retention)
	case c.RetentionInterval <= 0:
		return fmt.Errorf("%sretention_interval: must be positive, got %s", prefix, c.RetentionInterval)
	}
	return nil
}

// OverlapMemory is the least Go memory limit (GOMEMLIMIT; none set is no
// limit) at which the role decodes its next batch while the last is
// written. Two batches of 50,000 events in hand peaked at 450–550 MiB of
// live heap, one at ~300 MiB: under the chart's old 512Mi (GOMEMLIMIT 460
// MiB) the collector ran without pause, the role's CPU doubled, and the
// pod's limit was within reach (loadtest/RESULTS.md §5).
const OverlapMemory = 768 << 20

// Pipeline returns the runner settings of the store role: gather up to
// BatchRecords or BatchBytes for up to BatchLinger, all partitions in one
// write, and where the memory limit leaves room for two (OverlapMemory)
// the next batch decoded while the last is written (rows are keyed by
// event id: their order does not matter).
func (c Config) Pipeline() pipeline.Config {
	return pipeline.Config{
		Role:            Role,
		Topics:          Topics,
		MaxPollRecords:  min(c.BatchRecords, 10000),
		MinBatch:        c.BatchRecords,
		MaxBatchBytes:   c.BatchBytes,
		Linger:          c.BatchLinger,
		MergePartitions: true,
		Overlap:         debug.SetMemoryLimit(-1) >= OverlapMemory,
	}
}

// Metrics are the store's own metrics (the pipeline's cover records,
// batch errors, dead letters and consumer lag).
type Metrics struct {
	rows     *prometheus.CounterVec
	errors   *prometheus.CounterVec
	insert   *prometheus.HistogramVec
	dropped  *prometheus.CounterVec
	lastDone prometheus.Gauge
}

// NewMetrics registers the store metrics on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		rows:     prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_store_rows_written_total", Help: "Rows inserted into ClickHouse, by table (a retried batch counts again)."}, []string{"table"}),
		errors:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_store_write_errors_total", Help: "Failed ClickHouse inserts, by table; the batch is retried."}, []string{"table"}),
		insert:   prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "faultline_store_insert_seconds", Help: "Time of one ClickHouse insert, by table.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"table"}),
		dropped:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "faultline_store_retention_partitions_dropped_total", Help: "Monthly partitions dropped by retention, by table."}, []string{"table"}),
		lastDone: prometheus.NewGauge(prometheus.GaugeOpts{Name: "faultline_store_last_write_timestamp_seconds", Help: "Unix time of the last successful write."}),
	}
	// Exported from the start (at 0), so alerts on their rate see them.
	for _, table := range []string{"events", "actions"} {
		m.errors.WithLabelValues(table)
	}
	if reg != nil {
		reg.MustRegister(m.rows, m.errors, m.insert, m.dropped, m.lastDone)
	}
	return m
}

// Handler writes batches of events and actions records to ClickHouse.
type Handler struct {
	conn clickhouse.Conn
	log  *slog.Logger
	m    *Metrics
	// pinSync is whether inserts send async_insert=0 (insertSettings):
	// decided once, by New, from the server's version, and turned off for
	// the process's life when a shard refuses the setting at the send
	// (dropAsync).
	pinSync atomic.Bool
	// unpinnedUntil (Unix nanoseconds) is set when the server an insert
	// reached refuses the setting at the query (dropAsync): inserts go
	// without it until then, and try it again after (repinAfter).
	unpinnedUntil atomic.Int64
	// now is the clock (time.Now; tests inject one).
	now func() time.Time
	// afterInsert, when set, runs after a batch's rows are written and
	// before Handle returns (tests inject crashes here).
	afterInsert func(ctx context.Context, rows int) error
}

// New returns a handler writing through conn. It asks the server's version
// once, here, to know whether the inserts send async_insert=0 (an unknown
// version: they do, until a server refuses it: dropAsync).
func New(conn clickhouse.Conn, log *slog.Logger, m *Metrics) *Handler {
	if m == nil {
		m = NewMetrics(nil)
	}
	h := &Handler{conn: conn, log: log.With("role", "store"), m: m, now: time.Now}
	srv, err := conn.ServerVersion()
	if err != nil {
		h.log.Warn("clickhouse server version unknown; inserts send async_insert=0 until a server refuses it", "err", err)
	}
	h.pinSync.Store(err != nil || hasAsyncInsert(srv.Version))
	return h
}

// Handle decodes the records, dead-letters the undecodable ones, and writes
// the rest: one insert per table. The runner hands over the next batch
// while this one is written (pipeline.Config.Overlap), so its decode runs
// beside this insert at the full batch size (smaller inserts overlapped
// cost ClickHouse 2× its CPU per event at 10,000 rows; decoding on several
// goroutines saved nothing: loadtest/RESULTS.md §5).
func (h *Handler) Handle(ctx context.Context, recs []*kgo.Record) (pipeline.Result, error) {
	var (
		res pipeline.Result
		evs rows.Events
		acs rows.Actions
	)
	evs.Grow(len(recs)) // nearly all are events
	for _, rec := range recs {
		var err error
		switch rec.Topic {
		case events.TopicEvents:
			err = evs.Add(rec)
		case events.TopicActions:
			err = acs.Add(rec)
		default:
			err = fmt.Errorf("%w: store does not consume topic %s", rows.ErrPoison, rec.Topic)
		}
		if err != nil {
			if !errors.Is(err, rows.ErrPoison) {
				return res, err
			}
			res.Dead = append(res.Dead, pipeline.Dead{Record: rec, Reason: err})
		}
	}
	nEv, nAc := evs.Len(), acs.Len()
	evCols, acCols := evs.Columns(), acs.Columns()
	// From here the decoded rows are held by the columns alone, and insert
	// lets go of each once it is copied into the insert's block: they are
	// collected while ClickHouse inserts, not kept until Handle returns
	// (with the next batch decoded meanwhile, they were a third of the
	// role's peak heap).
	evs, acs = rows.Events{}, rows.Actions{}
	if nEv > 0 {
		if err := h.insert(ctx, "events", rows.EventColumns, evCols, nEv); err != nil {
			return pipeline.Result{}, err
		}
	}
	if nAc > 0 {
		if err := h.insert(ctx, "actions", rows.ActionColumns, acCols, nAc); err != nil {
			return pipeline.Result{}, err
		}
	}
	if h.afterInsert != nil {
		if err := h.afterInsert(ctx, nEv+nAc); err != nil {
			return pipeline.Result{}, err
		}
	}
	h.m.lastDone.SetToCurrentTime()
	return res, nil
}

// asyncInsertSince is the first ClickHouse version with async_insert
// (21.11); older servers refuse a setting they do not know.
var asyncInsertSince = proto.Version{Major: 21, Minor: 11}

// hasAsyncInsert is whether a server of version v has async_insert.
func hasAsyncInsert(v proto.Version) bool {
	return proto.CheckMinVersion(asyncInsertSince, v)
}

// insertSettings are the settings of the store's inserts:
//
//   - insert_deduplicate=0: on a cluster the tables are Replicated, which
//     drop an inserted block identical to one written before — and then
//     skip the block's materialized views too (18.16 always does; newer
//     servers unless deduplicate_blocks_in_dependent_materialized_views,
//     0 by default). A batch whose events insert succeeded and whose
//     view insert failed (a ZooKeeper blip, too many parts, the batch
//     timeout), retried within the same second (the block holds stored,
//     DEFAULT now(); the first retry comes after 100 ms), was dropped
//     whole: in events, never in recent_events or derived_events. Every
//     read deduplicates by id, so the retry's copies cost nothing. A
//     Distributed insert (insert_distributed_sync=1) passes the setting on
//     to every shard's insert, 18.16's too.
//   - async_insert=0 when pinned (servers of 21.11 and newer): a profile
//     with async_insert=1 and wait_for_async_insert=0 (ClickHouse Cloud
//     can set it) would acknowledge rows only buffered, the offsets would
//     be committed, and a restart before the flush would lose them unseen.
func insertSettings(pinSync bool) ch.Settings {
	s := ch.Settings{"insert_deduplicate": 0}
	if pinSync {
		s["async_insert"] = 0
	}
	return s
}

// unknownSetting is ClickHouse's UNKNOWN_SETTING error code.
const unknownSetting = 115

// refusedAsync is whether err is a server refusing async_insert: a server
// older than 21.11 among several (clickhouse.addr's list, a Service over
// replicas mid-upgrade, a shard of the cluster) when the one New asked
// was newer.
func refusedAsync(err error) bool {
	ex, ok := errors.AsType[*ch.Exception](err)
	return ok && ex.Code == unknownSetting && strings.Contains(ex.Message, "async_insert")
}

// insert writes one columnar block to table.
func (h *Handler) insert(ctx context.Context, table, columns string, cols []any, n int) (err error) {
	began := time.Now()
	defer func() {
		if err != nil {
			h.m.errors.WithLabelValues(table).Inc()
			err = fmt.Errorf("insert %d rows into %s: %w", n, table, err)
			return
		}
		h.m.insert.WithLabelValues(table).Observe(time.Since(began).Seconds())
		h.m.rows.WithLabelValues(table).Add(float64(n))
	}()
	query := "INSERT INTO " + table + " (" + columns + ")"
	batch, err := h.prepare(ctx, query)
	if err != nil && h.dropAsync(err, false) {
		batch, err = h.prepare(ctx, query) // no row was copied yet: at once
	}
	if err != nil {
		return err
	}
	defer batch.Close()
	for i := range cols {
		if err := rows.AppendColumn(batch.Column(i), cols[i]); err != nil {
			return fmt.Errorf("column %d: %w", i, err)
		}
		cols[i] = nil // copied into the block
	}
	err = batch.Send()
	h.dropAsync(err, true) // a shard refused it: the batch's retry goes without
	return err
}

// prepare starts an insert with the store's settings.
func (h *Handler) prepare(ctx context.Context, query string) (driver.Batch, error) {
	ctx = ch.Context(ctx, ch.WithSettings(insertSettings(h.pinned())))
	return h.conn.PrepareBatch(ctx, query)
}

// repinAfter is how long inserts go without async_insert=0 after the
// server an insert reached refused it at the query.
const repinAfter = 10 * time.Minute

// pinned is whether an insert now sends async_insert=0: the server New
// asked has it, no shard refused it, and no server refused it at the
// query in the last repinAfter.
func (h *Handler) pinned() bool {
	return h.pinSync.Load() && h.now().UnixNano() >= h.unpinnedUntil.Load()
}

// dropAsync stops sending async_insert=0 (logged) when err is a server
// refusing it, and reports whether it was.
//
// Refused at the send (atSend: a shard of the cluster, older than the
// server the insert reached), it is dropped for the process's life: other
// shards may have written the rows and the insert failed, so trying the
// setting again would fail a batch, and write its rows twice, every
// repinAfter for as long as the old shard remains (an 18.16 shard is
// supported).
//
// Refused at the query (the server the insert reached: a rolling upgrade
// of clickhouse.addr's servers), no row was sent and the insert is made
// again at once: the setting is dropped for repinAfter only, then tried
// again, and kept once every server has it.
func (h *Handler) dropAsync(err error, atSend bool) bool {
	if !refusedAsync(err) {
		return false
	}
	if atSend {
		if h.pinSync.Swap(false) {
			h.log.Warn("a clickhouse shard has no async_insert (older than 21.11): inserts go without async_insert=0 until the store restarts", "err", err)
		}
		return true
	}
	now := h.now()
	if h.unpinnedUntil.Swap(now.Add(repinAfter).UnixNano()) <= now.UnixNano() {
		h.log.Warn("a clickhouse server has no async_insert (older than 21.11): inserts go without async_insert=0, tried again later", "retry_in", repinAfter, "err", err)
	}
	return true
}

// RunRetention drops expired partitions every interval until ctx ends.
func RunRetention(ctx context.Context, conn clickhouse.Conn, database string, c Config, m *Metrics, log *slog.Logger, now func() time.Time) {
	interval := c.RetentionInterval
	if interval <= 0 {
		interval = time.Hour
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		// The recent tables are dropped after clickhouse.RecentRetention
		// even when the history is kept forever (Retention 0).
		for _, table := range clickhouse.RecentTables {
			dropped, err := clickhouse.DropOlderThan(ctx, conn, database, table, clickhouse.RecentRetention, now(), log)
			m.dropped.WithLabelValues(table).Add(float64(len(dropped)))
			if err != nil && ctx.Err() == nil {
				log.Warn("retention failed; retrying at the next interval", "table", table, "err", err)
			}
		}
		for _, table := range clickhouse.RetainedTables {
			if c.Retention <= 0 {
				break
			}
			dropped, err := clickhouse.DropOlderThan(ctx, conn, database, table, c.Retention, now(), log)
			m.dropped.WithLabelValues(table).Add(float64(len(dropped)))
			if err != nil && ctx.Err() == nil {
				log.Warn("retention failed; retrying at the next interval", "table", table, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
