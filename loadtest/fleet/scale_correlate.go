package fleet

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/fleetsim"
	"github.com/faultline/faultline/schemas/events"
)

// correlateRule is the rule the correlate rounds trigger: two Xid 31 on
// one GPU within 24 h (threshold 2), one verdict per node.
const correlateRule = "RepeatedXID31OnSameGPU"

// correlateRecords is nodes from..from+n of cluster, each with two Xid 31
// events on GPU 0, node after node: the gateway's output (an id, the
// cluster, received now) as the roles read it.
func correlateRecords(cluster string, from, n int) ([]*kgo.Record, error) {
	recs := make([]*kgo.Record, 0, 2*n)
	for i := range n {
		for range 2 {
			r, err := gatewayRecord(cluster, fleetsim.Xid(NodeName(from+i), 0, 31))
			if err != nil {
				return nil, err
			}
			recs = append(recs, r)
		}
	}
	return recs, nil
}

// verdicts follows the derived events of correlateRule on the events
// topic: per cluster, per node, the distinct ids and when the first was
// seen.
type verdicts struct {
	mu    sync.Mutex
	ids   map[string]map[string]map[string]bool
	first map[string]time.Time // by cluster/node
}

// followVerdicts follows the events topic from its end for verdicts of
// correlateRule.
func (e *Env) followVerdicts(ctx context.Context) *verdicts {
	v := &verdicts{ids: map[string]map[string]map[string]bool{}, first: map[string]time.Time{}}
	cl := e.KafkaClient(kgo.ConsumeTopics(events.TopicEvents), kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()))
	go v.follow(ctx, cl)
	return v
}

func (v *verdicts) follow(ctx context.Context, cl *kgo.Client) {
	for ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
			ev, err := events.Unmarshal(rec.Value)
			if err != nil || ev.GetDerivedBy() != correlateRule || ev.GetIsHealthy() {
				return
			}
			v.mu.Lock()
			defer v.mu.Unlock()
			nodes := v.ids[ev.GetCluster()]
			if nodes == nil {
				nodes = map[string]map[string]bool{}
				v.ids[ev.GetCluster()] = nodes
			}
			if nodes[ev.GetNodeName()] == nil {
				nodes[ev.GetNodeName()] = map[string]bool{}
				v.first[string(events.Key(ev.GetCluster(), ev.GetNodeName()))] = time.Now()
			}
			nodes[ev.GetNodeName()][ev.GetId()] = true
		})
	}
}

// at is when node's first verdict was seen.
func (v *verdicts) at(cluster, node string) (time.Time, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	t, ok := v.first[string(events.Key(cluster, node))]
	return t, ok
}

// of is node's distinct verdict ids.
func (v *verdicts) of(cluster, node string) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.ids[cluster][node])
}

// count is cluster's nodes with a verdict, and those with two different
// verdict ids (the same verdict emitted twice under different ids).
func (v *verdicts) count(cluster string) (nodes, twice int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, ids := range v.ids[cluster] {
		nodes++
		if len(ids) > 1 {
			twice++
		}
	}
	return nodes, twice
}

// scaleCorrelate: each round's events produced straight to the events
// topic (what the gateway produces) under a cluster of its own; the
// fleet's store role writes them to ClickHouse, where the rule's window
// query reads the pair when it spans two batches. Done is a node whose
// verdict is on the events topic; twice, a node with two verdict ids (a
// replica's replay after a SIGKILL emits the same deterministic id, which
// is not twice). Correlation here is CPU on the same cores — the
// replicas, ClickHouse, the store role — not I/O (loadtest/correlatebench
// measures one replica against a 10M history).
func (e *Env) scaleCorrelate(ctx context.Context) (*scaleTarget, error) {
	if !e.storing() {
		return nil, fmt.Errorf("scale: role correlate needs the fleet's store role and ClickHouse")
	}
	v := e.followVerdicts(ctx)
	pcl := e.KafkaClient()
	produce := func(ctx context.Context, recs []*kgo.Record) error {
		return pcl.ProduceSync(ctx, recs...).FirstErr()
	}
	var (
		cur   string
		round int
		recs  []*kgo.Record
	)
	return &scaleTarget{prefix: "scale correlate", noun: "nodes judged (" + correlateRule + ", 2 events each)", unit: "verdicts",
		done: "judged", twice: "judged twice",
		probe: func(ctx context.Context, probe string) (bool, error) {
			one, err := correlateRecords("probe-"+probe, 0, 1) // a cluster per probe: no verdict stands
			if err != nil {
				return false, err
			}
			if err := produce(ctx, one); err != nil {
				return false, err
			}
			return waitFor(ctx, 2*time.Minute, func() bool { n, _ := v.count("probe-" + probe); return n > 0 }), nil
		},
		prepare: func(_ context.Context, from, n int) (err error) {
			round++
			cur = fmt.Sprintf("correlate-%02d", round)
			recs, err = correlateRecords(cur, from, n)
			return err
		},
		blast: func(ctx context.Context, from, n int) LoadResult {
			if err := produce(ctx, recs); err != nil {
				e.TB.Logf("fleet: produce correlate events: %v", err)
				return LoadResult{Failed: int64(2 * n)}
			}
			return LoadResult{Sent: int64(2 * n)}
		},
		count: func() (int, int) { return v.count(cur) },
		detail: func(done int) string {
			return fmt.Sprintf(" (%d events evaluated)", 2*done)
		},
	}, nil
}
