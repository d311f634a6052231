package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/fleetsim"
	"github.com/faultline/faultline/processors/store"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// storeEvent is event seq of a store round: a mix of a healthy GPU check,
// a port down, a link_downed counter increase and a fatal Xid over 1,000
// nodes.
func storeEvent(seq int) *datamodels.HealthEvent {
	node := NodeName(seq % 1000)
	switch seq % 4 {
	case 0:
		return fleetsim.Healthy(node, seq%8)
	case 1:
		return fleetsim.PortDown(node, seq%8)
	case 2:
		return fleetsim.LinkDowned(node, seq%8)
	default:
		return fleetsim.Xid(node, seq%8, 79)
	}
}

// gatewayRecord is ev of cluster as the gateway produces it to the events
// topic: an id, the cluster, received now.
func gatewayRecord(cluster string, ev *datamodels.HealthEvent) (*kgo.Record, error) {
	ev.Id, ev.Cluster, ev.ReceivedTimestamp = events.NewID(), cluster, timestamppb.Now()
	v, err := events.Marshal(ev)
	if err != nil {
		return nil, err
	}
	return &kgo.Record{Topic: events.TopicEvents, Key: events.Key(cluster, ev.NodeName), Value: v}, nil
}

func storeRecords(cluster string, from, n int) ([]*kgo.Record, error) {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		var err error
		if recs[i], err = gatewayRecord(cluster, storeEvent(from+i)); err != nil {
			return nil, err
		}
	}
	return recs, nil
}

// scaleStore: each round's events produced straight to the events topic
// (what the gateway produces) under a cluster name of their own, stored
// events counted in ClickHouse as distinct ids (the dedup every query of
// faultline applies: a batch replayed after a SIGKILL writes its rows
// again, ReplacingMergeTree collapses them) and as raw rows. The ceiling
// is the store's own handler in this process writing the same number of
// events from memory in the shipped batch size, one batch at a time (one
// replica's write path) and 4 at a time: decoding, columns and ClickHouse
// without the broker, the consumer group or the replicas' processes.
func (e *Env) scaleStore(ctx context.Context) *scaleTarget {
	cl := e.KafkaClient()
	produce := func(ctx context.Context, recs []*kgo.Record) error {
		return cl.ProduceSync(ctx, recs...).FirstErr()
	}
	// The round's distinct ids, read at most every 250ms: uniqExact over
	// the round's rows is ClickHouse CPU taken from the store's inserts.
	var (
		mu    sync.Mutex
		cur   string
		at    time.Time
		last  int
		round int
		recs  []*kgo.Record // the round's events, encoded before the clock starts
	)
	distinct := func(cluster string) (ids, rows int) {
		var d, r uint64
		if err := e.CH.QueryRow(ctx, "SELECT uniqExact(id), count() FROM events WHERE cluster = ?", cluster).Scan(&d, &r); err != nil {
			e.TB.Logf("fleet: count stored events: %v", err)
		}
		return int(d), int(r)
	}
	count := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(at) >= 250*time.Millisecond {
			last, _ = distinct(cur)
			at = time.Now()
		}
		return last, 0 // a duplicate row is by design (detail counts them)
	}
	return &scaleTarget{prefix: "scale store", noun: "events stored", unit: "events", item: "events", done: "stored",
		probe: func(ctx context.Context, probe string) (bool, error) {
			one, err := storeRecords("probe", 0, 1)
			if err != nil {
				return false, err
			}
			before, _ := distinct("probe")
			if err := produce(ctx, one); err != nil {
				return false, err
			}
			return waitFor(ctx, 2*time.Minute, func() bool { n, _ := distinct("probe"); return n > before }), nil
		},
		prepare: func(_ context.Context, _, n int) (err error) {
			mu.Lock()
			defer mu.Unlock()
			round++
			cur, at, last = fmt.Sprintf("scale-%02d", round), time.Time{}, 0
			recs, err = storeRecords(cur, 0, n)
			return err
		},
		blast: func(ctx context.Context, from, n int) LoadResult {
			if err := produce(ctx, recs); err != nil {
				e.TB.Logf("fleet: produce store events: %v", err)
				return LoadResult{Failed: int64(n)}
			}
			return LoadResult{Sent: int64(n)}
		},
		count: count,
		detail: func(done int) string {
			ids, rows := distinct(cur)
			return fmt.Sprintf(", %d distinct ids in %d rows (%d duplicate rows, collapsed by the dedup every query applies)", ids, rows, rows-ids)
		},
		ceiling: func(ctx context.Context, r *Report, n int) error {
			h := store.New(e.CH, slog.New(slog.DiscardHandler), nil)
			batch := store.DefaultConfig().BatchRecords
			for _, writers := range []int{1, 4} {
				cluster := fmt.Sprintf("scale-ceiling-%d", writers)
				recs, err := storeRecords(cluster, 0, n)
				if err != nil {
					return err
				}
				t0 := time.Now()
				var g errgroup.Group
				g.SetLimit(writers)
				for i := 0; i < n; i += batch {
					b := recs[i:min(n, i+batch)]
					g.Go(func() error { _, err := h.Handle(ctx, b); return err })
				}
				if err := g.Wait(); err != nil {
					return fmt.Errorf("scale store ceiling: %w", err)
				}
				took := time.Since(t0)
				ids, rows := distinct(cluster)
				r.Figure("scale store ceiling: the store's handler in this process, the same events from memory, batches of %d (shipped batch_records), %d at a time, no broker: %d events in %s = %.0f events/s (%d distinct ids in %d rows)",
					batch, writers, n, took.Round(time.Millisecond), float64(n)/took.Seconds(), ids, rows)
				r.Check(ids == n, "ceiling: %d of %d events stored", ids, n)
			}
			return nil
		},
	}
}
