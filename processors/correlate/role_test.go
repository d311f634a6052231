package correlate_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/clickhouse/chtest"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestRoleThroughKafka runs two replicas of the store and correlate roles,
// each as `faultline process --role=store,correlate` does (processors.Run,
// one consumer group per role shared by the replicas), over a real Kafka
// broker and a real ClickHouse: raw Xid 31 events of several nodes produced
// to the events topic give no verdict below the RepeatedXID31OnSameGPU
// threshold and, at it — the events arriving while ClickHouse is stopped —
// exactly one derived event per node once it is back (one id, however often
// a retry or a rebalance between the replicas redelivers a batch), which
// comes back through the events topic, carries both causes and is stored
// once.
func TestRoleThroughKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("needs real Kafka and ClickHouse servers")
	}
	const (
		rule    = "RepeatedXID31OnSameGPU"
		cluster = "role-kafka"
		nodes   = 12 // their keys fall on all 4 partitions
	)
	k := testenv.StartKafka(t)
	srv := chtest.Start(t)
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers, kcfg.Partitions, kcfg.ReplicationFactor = k.Addr(), 4, 1

	pcfg := processors.DefaultConfig()
	pcfg.Roles = "store,correlate"
	pcfg.ClickHouse.Addr, pcfg.ClickHouse.Database, pcfg.ClickHouse.Password = srv.Config.Addr, srv.Config.Database, srv.Config.Password
	pcfg.Store.BatchRecords, pcfg.Store.BatchLinger = 100, 50*time.Millisecond
	pcfg.Correlate.BatchRecords, pcfg.Correlate.BatchLinger = 100, 50*time.Millisecond
	// Sweep often, so a sweep that wrongly re-derived or recovered a
	// standing verdict would show within the test.
	pcfg.Correlate.SweepInterval = 500 * time.Millisecond
	if err := pcfg.Validate(); err != nil {
		t.Fatal(err)
	}

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute) // the whole test; each step has its own deadline
	defer cancel()
	if err := kafka.CreatePipelineTopics(ctx, kcfg, log); err != nil {
		t.Fatal(err)
	}
	var (
		done []chan error
		regs []*prometheus.Registry
	)
	for range 2 {
		reg := prometheus.NewRegistry()
		regs = append(regs, reg)
		ch := make(chan error, 1)
		done = append(done, ch)
		go func() {
			ch <- processors.Run(ctx, pcfg, processors.Deps{Log: log, Registry: reg, Kafka: kcfg, Metrics: pipeline.NewMetrics(reg)})
		}()
	}
	defer func() {
		cancel()
		for _, ch := range done {
			if err := <-ch; err != nil {
				t.Errorf("processors.Run: %v", err)
			}
		}
	}()

	cl := k.Client(t, kgo.ConsumeTopics(events.TopicEvents), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	adm := kadm.NewClient(cl)

	// Both replicas are in both groups, each with partitions, before
	// anything is produced.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ready, seen := testenv.GroupsSettled(ctx, adm, 2, "faultline-store", "faultline-correlate")
		if ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the two replicas did not both join the store and correlate groups: %s", seen)
		}
	}

	raw := map[string][]string{} // node -> raw event ids
	produce := func(node string, at time.Time) {
		t.Helper()
		ev := &datamodels.HealthEvent{Version: 1, Id: events.NewID(), Agent: "faultline-agent", ComponentClass: "GPU",
			CheckName: "SysLogsXIDError", IsFatal: false, ErrorCode: []string{"XID-31"},
			Message:          "NVRM: Xid (PCI:0000:17:00): 31, pid=1234, Ch 00000010, intr 00000000. MMU Fault",
			EntitiesImpacted: []*datamodels.Entity{{EntityType: "PCI", EntityValue: "0000:17:00"}, {EntityType: "GPU", EntityValue: "GPU-1"}},
			Metadata:         map[string]string{"count": "1"},
			NodeName:         node, Cluster: cluster,
			GeneratedTimestamp: timestamppb.New(at), ReceivedTimestamp: timestamppb.New(at),
			ProcessingStrategy: datamodels.ProcessingStrategy_EXECUTE_REMEDIATION}
		b, err := events.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
		defer pcancel()
		r := &kgo.Record{Topic: events.TopicEvents, Key: events.Key(cluster, node), Value: b, Timestamp: at}
		if err := cl.ProduceSync(pctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		raw[node] = append(raw[node], ev.GetId())
	}
	// settled waits until both roles' groups have committed the whole
	// events topic (every record handled, its outputs produced).
	settled := func() {
		t.Helper()
		deadline := time.Now().Add(45 * time.Second)
		for time.Now().Before(deadline) {
			ends, err := adm.ListEndOffsets(ctx, events.TopicEvents)
			if err == nil {
				ok := true
				for _, g := range []string{"faultline-store", "faultline-correlate"} {
					committed, err := adm.FetchOffsets(ctx, g)
					if err != nil {
						ok = false
						break
					}
					ends.Each(func(o kadm.ListedOffset) {
						if o.Offset == 0 {
							return
						}
						c, found := committed.Lookup(o.Topic, o.Partition)
						if !found || c.Err != nil || c.At < o.Offset {
							ok = false
						}
					})
				}
				if ok {
					return
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatal("the store and correlate groups did not catch up with the events topic")
	}
	derived := map[string]map[string]*datamodels.HealthEvent{} // node -> id -> event
	var seen int
	// drain reads the events topic up to its end, keeping the derived events.
	drain := func() {
		t.Helper()
		ends, err := adm.ListEndOffsets(ctx, events.TopicEvents)
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
		pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
		defer pcancel()
		for int64(seen) < total {
			fs := cl.PollFetches(pctx)
			if pctx.Err() != nil {
				t.Fatalf("read %d of %d records of the events topic", seen, total)
			}
			for _, r := range fs.Records() {
				seen++
				ev, err := events.Unmarshal(r.Value)
				if err != nil {
					t.Fatalf("record %s/%d/%d: %v", r.Topic, r.Partition, r.Offset, err)
				}
				if ev.GetDerivedBy() == "" {
					continue
				}
				if string(r.Key) != cluster+"/"+ev.GetNodeName() {
					t.Errorf("derived event keyed %q, want %q", r.Key, cluster+"/"+ev.GetNodeName())
				}
				if derived[ev.GetNodeName()] == nil {
					derived[ev.GetNodeName()] = map[string]*datamodels.HealthEvent{}
				}
				derived[ev.GetNodeName()][ev.GetId()] = ev
			}
		}
	}
	nodeName := func(i int) string { return "node-" + strconv.Itoa(i) }

	// One Xid 31 per node: below the threshold of 2.
	now := time.Now().UTC().Add(-time.Minute)
	for i := range nodes {
		produce(nodeName(i), now)
	}
	settled()
	drain()
	if len(derived) != 0 {
		t.Fatalf("derived before the threshold: %v", derived)
	}

	// The second one crosses it, on every node — while ClickHouse is down:
	// neither role can finish a batch, nothing is committed, nothing lost.
	srv.Stop()
	for i := range nodes {
		produce(nodeName(i), now.Add(10*time.Second))
	}
	time.Sleep(3 * time.Second)
	drain()
	if len(derived) != 0 {
		t.Fatalf("derived while ClickHouse was down: %v", derived)
	}
	srv.Start()
	deadline := time.Now().Add(45 * time.Second)
	for len(derived) < nodes && time.Now().Before(deadline) {
		settled()
		drain()
	}
	// Let the derived events themselves go through both roles, and a few
	// sweeps run: still exactly one verdict per node.
	time.Sleep(2 * time.Second)
	settled()
	drain()
	for i := range nodes {
		node := nodeName(i)
		if len(derived[node]) != 1 {
			t.Errorf("%s: %d derived events, want 1: %v", node, len(derived[node]), derived[node])
			continue
		}
		for _, d := range derived[node] {
			if d.GetDerivedBy() != rule || d.GetCluster() != cluster {
				t.Errorf("%s: derived by %q for %s, want %s for %s", node, d.GetDerivedBy(), d.GetCluster(), rule, cluster)
			}
			if d.GetRecommendedAction() != datamodels.RecommendedAction_RUN_DCGMEUD || d.GetIsFatal() || d.GetIsHealthy() {
				t.Errorf("%s: derived action %s fatal %v healthy %v, want RUN_DCGMEUD, not fatal, unhealthy", node, d.GetRecommendedAction(), d.GetIsFatal(), d.GetIsHealthy())
			}
			want := append([]string(nil), raw[node]...)
			slices.Sort(want)
			if !slices.Equal(d.GetCauseIds(), want) {
				t.Errorf("%s: causeIds %v, want both produced events %v", node, d.GetCauseIds(), want)
			}
			// Stored like any other event (the store wrote it before committing).
			if n := chtest.Count(t, srv.Conn, "SELECT uniqExact(id) FROM events WHERE cluster = @c AND id = @id AND node = @n",
				ch.Named("c", cluster), ch.Named("id", d.GetId()), ch.Named("n", node)); n != 1 {
				t.Errorf("%s: derived event %s not stored", node, d.GetId())
			}
		}
	}
	if n := chtest.Count(t, srv.Conn, "SELECT uniqExact(id) FROM events WHERE cluster = @c AND derived_by = @r",
		ch.Named("c", cluster), ch.Named("r", rule)); n != nodes {
		t.Errorf("%d derived events stored, want %d", n, nodes)
	}
	if n := chtest.Count(t, srv.Conn, "SELECT uniqExact(id) FROM events WHERE cluster = @c AND derived_by = ''",
		ch.Named("c", cluster)); n != 2*nodes {
		t.Errorf("%d raw events stored, want %d", n, 2*nodes)
	}
	// Both replicas took part.
	for i, reg := range regs {
		if n := handled(t, reg, "correlate"); n == 0 {
			t.Errorf("replica %d correlated no records", i)
		}
	}
}

// handled is a replica's faultline_processor_records_total for the role.
func handled(t *testing.T, reg *prometheus.Registry, role string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "faultline_processor_records_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "role" && l.GetValue() == role {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
