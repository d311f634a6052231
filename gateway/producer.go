package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// Produce errors a caller maps to a status.
var (
	// ErrOverloaded: the producer buffer cannot take the batch (429).
	ErrOverloaded = errors.New("producer buffer full")
	// ErrUnavailable: Kafka did not acknowledge in time (503).
	ErrUnavailable = errors.New("kafka unavailable")
)

// Producer writes accepted events to Kafka: idempotent, acks=all, keyed
// cluster/node.
type Producer struct {
	cl         *kgo.Client
	maxBuffer  int
	maxBytes   int64
	timeout    time.Duration
	log        *slog.Logger
	bufferedMu sync.Mutex
	// held is the encoded bytes of the batches handed to the client whose
	// records are not all acknowledged or failed yet (each batch's records
	// share one buffer, which lives as long as any of them): what calls
	// already answered, 503 after produce_timeout, leave buffered while a
	// broker hangs. An atomic rather than the client's
	// BufferedProduceBytes, which takes its producer lock.
	held atomic.Int64
}

// ProducerOpts are the producer settings of a gateway run with cfg:
// acks from every in-sync replica (idempotent writes are the default with
// acks=all), cfg's buffer, delivery timeout and linger, lz4. A load
// test's raw producer, its ceiling, uses them to produce as the gateway
// does.
func ProducerOpts(cfg Config) []kgo.Opt {
	return []kgo.Opt{
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.MaxBufferedRecords(cfg.MaxBufferedRecords),
		kgo.RecordDeliveryTimeout(cfg.ProduceTimeout),
		kgo.ProducerLinger(cfg.ProducerLinger),
		kgo.ProducerBatchCompression(kgo.Lz4Compression(), kgo.NoCompression()),
	}
}

// NewProducer connects a producer client.
func NewProducer(kcfg kafka.Config, cfg Config, log *slog.Logger) (*Producer, error) {
	cl, err := kafka.NewClient(kcfg, log, append(ProducerOpts(cfg), kgo.DefaultProduceTopic(events.TopicEvents))...)
	if err != nil {
		return nil, err
	}
	return &Producer{cl: cl, maxBuffer: cfg.MaxBufferedRecords, maxBytes: cfg.MaxBufferedBytes, timeout: cfg.ProduceTimeout, log: log}, nil
}

// BufferedBytes is the encoded bytes of the records the producer holds
// (gateway.max_buffered_bytes bounds it).
func (p *Producer) BufferedBytes() int64 { return p.held.Load() }

// Produce writes the events and returns once Kafka acknowledged every one,
// or an error wrapping ErrOverloaded or ErrUnavailable. A batch that does not
// fit in the buffer, its records or its bytes, is refused whole before
// anything is produced.
func (p *Producer) Produce(ctx context.Context, evs []*datamodels.HealthEvent) error {
	if len(evs) == 0 {
		return nil
	}
	recs, size, err := records(evs)
	if err != nil {
		return err
	}
	// Reserve buffer space for the whole batch under a lock so concurrent
	// requests cannot both pass the check and then half-fail.
	p.bufferedMu.Lock()
	if int(p.cl.BufferedProduceRecords())+len(recs) > p.maxBuffer {
		p.bufferedMu.Unlock()
		return fmt.Errorf("%w: %d records buffered, batch of %d does not fit", ErrOverloaded, p.cl.BufferedProduceRecords(), len(recs))
	}
	// A call answered 503 leaves its records buffered (the idempotent
	// producer fails none it may have sent), and its retry adds them
	// again: the bytes are bounded here, not by the call's budgets.
	if held := p.held.Load(); held+int64(size) > p.maxBytes {
		p.bufferedMu.Unlock()
		return fmt.Errorf("%w: %d bytes buffered, batch of %d bytes does not fit gateway.max_buffered_bytes (%d)", ErrOverloaded, held, size, p.maxBytes)
	}
	p.held.Add(int64(size))
	// The last record's acknowledgement closes done: no goroutine waits
	// on the batch's behalf.
	var (
		pending  atomic.Int64
		done     = make(chan struct{})
		errMu    sync.Mutex
		firstErr error
	)
	pending.Store(int64(len(recs)))
	promise := func(_ *kgo.Record, err error) {
		if err != nil {
			errMu.Lock()
			if firstErr == nil {
				firstErr = err
			}
			errMu.Unlock()
		}
		if pending.Add(-1) == 0 {
			p.held.Add(-int64(size))
			close(done)
		}
	}
	for i := range recs {
		p.cl.Produce(ctx, &recs[i], promise)
	}
	p.bufferedMu.Unlock()

	// The idempotent producer never fails a record it may already have
	// sent, so a broker outage would hold the request forever: answer
	// Unavailable after the timeout instead. Records still buffered may be
	// written later; the caller retries (at-least-once).
	timer := time.NewTimer(p.timeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		return fmt.Errorf("%w: not acknowledged within %s", ErrUnavailable, p.timeout)
	case <-ctx.Done():
		return fmt.Errorf("%w: %v", ErrUnavailable, ctx.Err())
	}
	errMu.Lock()
	defer errMu.Unlock()
	if firstErr != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, firstErr)
	}
	return nil
}

// records encodes a batch's events as its Kafka records: the records, and
// every record's key and value, in one allocation each rather than three
// per event (the gateway's allocations are much of its CPU: its own, and
// the garbage collector's). size is the bytes of the keys and values.
func records(evs []*datamodels.HealthEvent) (recs []kgo.Record, size int, err error) {
	sizes := make([]int, len(evs))
	total := 0
	for i, ev := range evs {
		sizes[i] = ev.SizeVT()
		total += len(ev.GetCluster()) + 1 + len(ev.GetNodeName()) + sizes[i]
	}
	buf := make([]byte, 0, total)
	recs = make([]kgo.Record, len(evs))
	for i, ev := range evs {
		start := len(buf)
		buf = events.AppendKey(buf, ev.GetCluster(), ev.GetNodeName())
		recs[i].Key = buf[start:len(buf):len(buf)]
		start = len(buf)
		buf = buf[:start+sizes[i]]
		if _, err := ev.MarshalToSizedBufferVT(buf[start:]); err != nil {
			return nil, 0, fmt.Errorf("encode event %d: %w", i, err)
		}
		recs[i].Value = buf[start:len(buf):len(buf)]
	}
	return recs, total, nil
}

// Ping reports whether a broker answers.
func (p *Producer) Ping(ctx context.Context) error { return p.cl.Ping(ctx) }

// Close flushes what is buffered (bounded by ctx) and closes the client.
func (p *Producer) Close(ctx context.Context) {
	if err := p.cl.Flush(ctx); err != nil {
		p.log.Warn("flush on shutdown incomplete", "err", err)
	}
	p.cl.Close()
}
