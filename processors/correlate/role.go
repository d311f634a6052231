package correlate

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/role"
	"github.com/faultline/faultline/processors/store"
)

// Open is what the role does at start: compile the rules (a bad rule stops
// start-up naming the rule and field) and connect to ClickHouse (waiting
// while it is unreachable; the schema is applied idempotently). The role
// is its consumer of Topics and, unless SweepInterval is 0, the sweep loop
// (RunSweeps), which produces with its own client; closing it closes the
// connection.
func Open(ctx context.Context, cfg Config, deps role.Deps) (*role.Role, error) {
	deps = deps.WithDefaults()
	log := deps.Log.With("role", Role)
	rules, err := LoadRules(cfg.Rules)
	if err != nil {
		return nil, err
	}
	if rules, err = cfg.applyShadow(rules); err != nil {
		return nil, fmt.Errorf("correlate.shadow: %w", err)
	}
	conn, err := clickhouse.SetupWait(ctx, deps.ClickHouse, log)
	if err != nil {
		return nil, err
	}
	h := New(conn, rules, time.Now, cfg.CacheTTL, log, NewMetrics(deps.Registry))
	log.Info("correlation rules loaded", "rules", Names(rules))
	adm, err := kafka.NewClient(deps.Kafka, log)
	if err != nil {
		conn.Close()
		return nil, err
	}
	h.SetStoreProgress(storeProgress(kadm.NewClient(adm), pipeline.DefaultGroup(store.Role)))
	h.SetReadBack(readBack(deps.Kafka, log, maxUnstoredBytes))
	r := &role.Role{
		Name:      Role,
		Consumers: []role.Consumer{{Pipeline: cfg.Pipeline(), Handler: h}},
		Close:     func() error { adm.Close(); return conn.Close() },
	}
	if cfg.SweepInterval > 0 {
		r.Loops = []role.Loop{{Name: "sweep", Run: func(ctx context.Context) error {
			cl, err := kafka.NewClient(deps.Kafka, log, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0))
			if err != nil {
				return err
			}
			defer cl.Close()
			h.RunSweeps(ctx, cfg.SweepInterval, cl)
			return nil
		}}}
	}
	return r, nil
}

// storeProgress reads the store group's committed offsets.
func storeProgress(adm *kadm.Client, group string) StoreProgress {
	return func(ctx context.Context) (map[string]map[int32]int64, error) {
		resps, err := adm.FetchOffsets(ctx, group)
		if err == nil {
			err = resps.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("committed offsets of %s: %w", group, err)
		}
		out := map[string]map[int32]int64{}
		resps.Each(func(o kadm.OffsetResponse) {
			if out[o.Topic] == nil {
				out[o.Topic] = map[int32]int64{}
			}
			out[o.Topic][o.Partition] = o.At
		})
		return out, nil
	}
}

// readBack reads a partition's range with a client of its own (a handed-
// over partition's first batch: rare), until the record before to or the
// partition's end, keeping the newest maxBytes (key and value) of it as it
// goes: the memory it is for keeps no more (up to 100,000 records of the
// gateway's largest events were 20 GB).
func readBack(cfg kafka.Config, log *slog.Logger, maxBytes int) ReadBack {
	return func(ctx context.Context, topic string, partition int32, from, to int64) ([]*kgo.Record, error) {
		cl, err := kafka.NewClient(cfg, log, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: kgo.NewOffset().At(from)}}))
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		var out []*kgo.Record
		held := 0
		for next := from; next < to; {
			fs := cl.PollFetches(ctx)
			if err := fs.Err0(); err != nil {
				return out, err
			}
			fs.EachPartition(func(p kgo.FetchTopicPartition) {
				for _, r := range p.Records {
					if r.Offset < to {
						out = append(out, r)
						held += recordBytes(r)
					}
					next = r.Offset + 1
				}
				if p.HighWatermark >= 0 && p.HighWatermark <= next {
					next = to // the partition's end
				}
			})
			drop := 0
			for ; held > maxBytes && drop < len(out); drop++ {
				held -= recordBytes(out[drop])
			}
			n := copy(out, out[drop:])
			clear(out[n:])
			out = out[:n]
		}
		return out, nil
	}
}

// RunSweeps runs Sweep every interval until ctx ends, producing what it
// returns. A failed sweep is logged and tried again at the next tick. Derived
// events Kafka refused are produced again on their own, after a backoff
// (sweepMinBackoff doubling to sweepMaxBackoff), not left to the next sweep:
// that one takes them for standing (this replica remembers what it emitted)
// and would not derive them again until correlate.cache_ttl has passed.
// Those acknowledged are not sent again; those still refused after
// cache_ttl are dropped, as the sweep then derives them again (the same ids).
func (h *Handler) RunSweeps(ctx context.Context, interval time.Duration, p pipeline.Producer) {
	t := time.NewTicker(interval)
	defer t.Stop()
	retry := time.NewTimer(0)
	retry.Stop()
	defer retry.Stop()
	var (
		unsent  []sweptRecord
		backoff = sweepMinBackoff
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			at := h.now()
			recs, err := h.Sweep(ctx)
			if err != nil && ctx.Err() == nil {
				h.log.Warn("sweep failed; retrying at the next tick", "err", err)
			}
			for _, r := range recs {
				unsent = append(unsent, sweptRecord{r, at})
			}
		case <-retry.C:
		}
		if len(unsent) == 0 {
			continue
		}
		unsent = h.produceSwept(ctx, p, unsent)
		if len(unsent) == 0 {
			retry.Stop()
			backoff = sweepMinBackoff
			continue
		}
		retry.Reset(backoff)
		backoff = min(2*backoff, sweepMaxBackoff)
	}
}

// The backoff of RunSweeps' produce retries.
const (
	sweepMinBackoff = 100 * time.Millisecond
	sweepMaxBackoff = 10 * time.Second
)

// sweptRecord is a derived event of a sweep and when the sweep began.
type sweptRecord struct {
	rec *kgo.Record
	at  time.Time
}

// produceSwept produces the records and returns those Kafka refused that
// are younger than the cache (what the sweep would not derive again).
func (h *Handler) produceSwept(ctx context.Context, p pipeline.Producer, recs []sweptRecord) []sweptRecord {
	out := make([]*kgo.Record, len(recs))
	index := make(map[*kgo.Record]int, len(recs)) // results come in any order
	for i, r := range recs {
		// A fresh record: franz-go owns one it was given until produced.
		out[i] = &kgo.Record{Topic: r.rec.Topic, Key: r.rec.Key, Value: r.rec.Value, Headers: r.rec.Headers}
		index[out[i]] = i
	}
	var (
		refused []int
		dropped int
		err     error
	)
	now := h.now()
	for _, r := range p.ProduceSync(ctx, out...) {
		if r.Err == nil {
			continue
		}
		err = r.Err
		if i := index[r.Record]; now.Sub(recs[i].at) <= h.ttl {
			refused = append(refused, i)
		} else {
			dropped++
		}
	}
	slices.Sort(refused) // one node's records stay in their order
	left := make([]sweptRecord, 0, len(refused))
	for _, i := range refused {
		left = append(left, recs[i])
	}
	if err != nil && ctx.Err() == nil {
		h.log.Warn("sweep's derived events not produced; retrying", "refused", len(left)+dropped,
			"dropped", dropped, "err", err)
	}
	return left
}
