package correlate

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/clickhouse/chtest"
	"github.com/faultline/faultline/processors/store"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// base is the test epoch; every test time is base + an offset.
var base = time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)

// clock is an injectable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// server starts a ClickHouse for a top-level test (its subtests share it,
// each with its own cluster names).
func server(t *testing.T) *chtest.Server {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a real ClickHouse server")
	}
	return chtest.Start(t)
}

var clusterSeq struct {
	sync.Mutex
	n int
}

// newCluster returns a cluster name no other test uses.
func newCluster(prefix string) string {
	clusterSeq.Lock()
	defer clusterSeq.Unlock()
	clusterSeq.n++
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e6, clusterSeq.n)
}

// harness drives one correlate handler (or several replicas) and a store
// handler the way the pipeline would: a batch goes to correlate, then the
// batch and what correlate derived are stored (so the triggering events are
// never stored before correlate sees them: the race case, every time).
type harness struct {
	t       *testing.T
	srv     *chtest.Server
	clock   *clock
	store   *store.Handler
	h       *Handler
	rules   []*Rule
	derived []*datamodels.HealthEvent
	// cluster, when set, keeps only this cluster's derived events (sweeps
	// see every cluster of the shared server).
	cluster string
}

func newHarness(t *testing.T, s *chtest.Server, rulesTOML []byte, mutate func([]*Rule)) *harness {
	t.Helper()
	rules, err := ParseRules(rulesTOML, nil)
	if err != nil {
		t.Fatalf("rules: %v", err)
	}
	if mutate != nil {
		mutate(rules)
	}
	c := &clock{t: base}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return &harness{t: t, srv: s, clock: c, rules: rules,
		store: store.New(s.Conn, log, store.NewMetrics(nil)),
		h:     New(s.Conn, rules, c.Now, 2*time.Minute, log, nil)}
}

// counterValue reads a counter of the role's metrics.
func counterValue(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// batch hands the records to correlate as one batch, then stores them and
// the derived events; it returns the derived events.
func (hs *harness) batch(recs ...*kgo.Record) []*datamodels.HealthEvent {
	hs.t.Helper()
	return hs.storeDerived(recs, hs.handle(recs))
}

// unstoredBatch hands the records to correlate as one batch and stores
// only what it derives: the store lags behind and has not written the
// batch yet (storeDerived(recs, nil) writes it later); it returns the
// derived events.
func (hs *harness) unstoredBatch(recs ...*kgo.Record) []*datamodels.HealthEvent {
	hs.t.Helper()
	return hs.storeDerived(nil, hs.handle(recs))
}

// handle hands the records to correlate as one batch; it returns what the
// batch produced.
func (hs *harness) handle(recs []*kgo.Record) []*kgo.Record {
	hs.t.Helper()
	res, err := hs.h.Handle(ctx(hs.t), recs)
	if err != nil {
		hs.t.Fatalf("handle: %v", err)
	}
	if len(res.Dead) > 0 {
		hs.t.Fatalf("dead letters: %v", res.Dead[0].Reason)
	}
	return res.Out
}

// batches hands each batch of events to batch in turn; it returns every
// derived event.
func (hs *harness) batches(bs [][]*datamodels.HealthEvent) []*datamodels.HealthEvent {
	hs.t.Helper()
	var got []*datamodels.HealthEvent
	for _, b := range bs {
		var recs []*kgo.Record
		for _, ev := range b {
			recs = append(recs, evRecord(hs.t, ev))
		}
		got = append(got, hs.batch(recs...)...)
	}
	return got
}

func (hs *harness) storeDerived(in, out []*kgo.Record) []*datamodels.HealthEvent {
	hs.t.Helper()
	all := append(append([]*kgo.Record(nil), in...), out...)
	if len(all) > 0 {
		if _, err := hs.store.Handle(ctx(hs.t), all); err != nil {
			hs.t.Fatalf("store: %v", err)
		}
	}
	var d []*datamodels.HealthEvent
	for _, r := range out {
		ev, err := events.Unmarshal(r.Value)
		if err != nil {
			hs.t.Fatal(err)
		}
		if hs.cluster != "" && ev.GetCluster() != hs.cluster {
			continue
		}
		if r.Topic != events.TopicEvents || string(r.Key) != ev.GetCluster()+"/"+nodeOf(ev) {
			hs.t.Fatalf("derived record topic %s key %s", r.Topic, r.Key)
		}
		d = append(d, ev)
	}
	hs.derived = append(hs.derived, d...)
	return d
}

func nodeOf(ev *datamodels.HealthEvent) string {
	if ev.GetNodeName() == "" {
		return ClusterNode
	}
	return ev.GetNodeName()
}

// sweep runs the sweep at base+at and stores what it derives.
func (hs *harness) sweep(at time.Duration) []*datamodels.HealthEvent {
	hs.t.Helper()
	hs.clock.Set(base.Add(at))
	recs, err := hs.h.Sweep(ctx(hs.t))
	if err != nil {
		hs.t.Fatalf("sweep: %v", err)
	}
	return hs.storeDerived(nil, recs)
}

var idSeq struct {
	sync.Mutex
	n int
}

func nextID() string {
	idSeq.Lock()
	defer idSeq.Unlock()
	idSeq.n++
	return events.NewID()
}

func evRecord(t testing.TB, ev *datamodels.HealthEvent) *kgo.Record {
	t.Helper()
	if ev.Id == "" {
		ev.Id = nextID()
	}
	b, err := events.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	node := ev.GetNodeName()
	if node == "" {
		node = ClusterNode // how correlate keys its cluster-wide verdicts
	}
	return &kgo.Record{Topic: events.TopicEvents, Key: events.Key(ev.GetCluster(), node), Value: b, Timestamp: ev.GetGeneratedTimestamp().AsTime()}
}

func actRecord(t testing.TB, a *faultlinev1.Action) *kgo.Record {
	t.Helper()
	b, err := events.MarshalAction(a)
	if err != nil {
		t.Fatal(err)
	}
	return &kgo.Record{Topic: events.TopicActions, Key: events.Key(a.GetCluster(), a.GetNode()), Value: b, Timestamp: a.GetTimestamp().AsTime()}
}

func portEnts(dev string, port int) []*datamodels.Entity {
	return []*datamodels.Entity{{EntityType: events.EntityNIC, EntityValue: dev}, {EntityType: events.EntityNICPort, EntityValue: strconv.Itoa(port)}}
}

// nicState is a NIC agent state-check event (InfiniBandStateCheck).
func nicState(cluster, node string, at time.Duration, healthy bool) *datamodels.HealthEvent {
	ev := &datamodels.HealthEvent{Version: 1, Agent: "nic-health-monitor", ComponentClass: "NIC", CheckName: "InfiniBandStateCheck",
		IsFatal: !healthy, IsHealthy: healthy, Message: "Port mlx5_0 port 1: state DOWN", EntitiesImpacted: portEnts("mlx5_0", 1),
		Metadata: map[string]string{"state": "1: DOWN"}, GeneratedTimestamp: timestamppb.New(base.Add(at)), NodeName: node, Cluster: cluster,
		ProcessingStrategy: datamodels.ProcessingStrategy_EXECUTE_REMEDIATION}
	if !healthy {
		ev.RecommendedAction = datamodels.RecommendedAction_REPLACE_VM
	}
	return ev
}

// linkDowned is a NIC agent degradation-check link_downed increase.
func linkDowned(cluster, node string, at time.Duration, delta int) *datamodels.HealthEvent {
	return &datamodels.HealthEvent{Version: 1, Agent: "nic-health-monitor", ComponentClass: "NIC", CheckName: "InfiniBandDegradationCheck",
		IsFatal: true, ErrorCode: []string{"link_downed"}, EntitiesImpacted: portEnts("mlx5_0", 1),
		Metadata:           map[string]string{"counter": "link_downed", "delta": strconv.Itoa(delta), "value": "9"},
		GeneratedTimestamp: timestamppb.New(base.Add(at)), NodeName: node, Cluster: cluster}
}

// xid is a kmsg agent Xid event on GPU-1 (count occurrences).
func xid(cluster, node string, at time.Duration, code int, fatal bool, count int) *datamodels.HealthEvent {
	md := map[string]string{"count": strconv.Itoa(count)}
	if count > 1 {
		md["flood"] = "true"
	}
	return &datamodels.HealthEvent{Version: 1, Agent: "faultline-agent", ComponentClass: "GPU", CheckName: "SysLogsXIDError",
		IsFatal: fatal, ErrorCode: []string{fmt.Sprintf("XID-%d", code)},
		EntitiesImpacted:   []*datamodels.Entity{{EntityType: "PCI", EntityValue: "0000:17:00"}, {EntityType: "GPU", EntityValue: "GPU-1"}},
		Metadata:           md,
		GeneratedTimestamp: timestamppb.New(base.Add(at)), NodeName: node, Cluster: cluster}
}

func remediation(cluster, node string, at time.Duration) *faultlinev1.Action {
	return &faultlinev1.Action{Id: nextID(), Cluster: cluster, Node: node, Role: "remediate", Kind: "remediate", Outcome: "applied",
		Timestamp: timestamppb.New(base.Add(at))}
}

// quarantined is the quarantine role's action on node at at, applied to
// the Node object created at created.
func quarantined(cluster, node string, at time.Duration, created time.Time) *faultlinev1.Action {
	return &faultlinev1.Action{Id: nextID(), Cluster: cluster, Node: node, Role: "quarantine", Kind: "quarantine", Outcome: "applied",
		Timestamp: timestamppb.New(base.Add(at)), Details: map[string]string{events.DetailNodeCreated: created.UTC().Format(time.RFC3339)}}
}

func uniqDerived(t *testing.T, s *chtest.Server, cluster, rule string) uint64 {
	t.Helper()
	return chtest.Count(t, s.Conn, "SELECT uniqExact(id) FROM events WHERE cluster = @c AND derived_by = @r",
		ch.Named("c", cluster), ch.Named("r", rule))
}

func ids(evs []*datamodels.HealthEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.GetId()
	}
	sort.Strings(out)
	return out
}
