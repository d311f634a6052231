package correlate_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/clickhouse/chtest"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestRoleThroughKafka runs the store and correlate roles as
// `faultline process --role=store,correlate` does (processors.Run, a kfake
// broker, a real ClickHouse): raw Xid 31 events produced to the events topic
// give no verdict below the RepeatedXID31OnSameGPU threshold and exactly one
// derived event at it, which comes back through the events topic and is
// stored like any other event.
func TestRoleThroughKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a real ClickHouse server")
	}
	const (
		rule    = "RepeatedXID31OnSameGPU"
		cluster = "role-kafka"
		node    = "node-1"
	)
	srv := chtest.Start(t)
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, kafka.PipelineTopics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers, kcfg.Partitions, kcfg.ReplicationFactor = strings.Join(kc.ListenAddrs(), ","), 3, 1

	pcfg := processors.DefaultConfig()
	pcfg.Roles = "store,correlate"
	pcfg.ClickHouse.Addr, pcfg.ClickHouse.Database, pcfg.ClickHouse.Password = srv.Config.Addr, srv.Config.Database, srv.Config.Password
	pcfg.Store.BatchRecords, pcfg.Store.BatchLinger = 100, 50*time.Millisecond
	pcfg.Correlate.BatchRecords, pcfg.Correlate.BatchLinger = 100, 50*time.Millisecond
	// Sweep often, so a sweep that wrongly re-derived or recovered the
	// standing verdict would show within the test.
	pcfg.Correlate.SweepInterval = 500 * time.Millisecond
	if err := pcfg.Validate(); err != nil {
		t.Fatal(err)
	}

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	reg := prometheus.NewRegistry()
	done := make(chan error, 1)
	go func() {
		done <- processors.Run(ctx, pcfg, processors.Deps{Log: log, Registry: reg, Kafka: kcfg, Metrics: pipeline.NewMetrics(reg)})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("processors.Run: %v", err)
		}
	}()

	cl, err := kafka.NewClient(kcfg, log, kgo.ConsumeTopics(events.TopicEvents), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	var raw []string
	produce := func(at time.Time) {
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
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		defer pcancel()
		r := &kgo.Record{Topic: events.TopicEvents, Key: events.Key(cluster, node), Value: b, Timestamp: at}
		if err := cl.ProduceSync(pctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		raw = append(raw, ev.GetId())
	}
	// settled waits until both roles' groups have committed the whole
	// events topic (every record handled, its outputs produced).
	settled := func() {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
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
	var derived []*datamodels.HealthEvent
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
		for int64(seen) < total {
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			fs := cl.PollFetches(pctx)
			pcancel()
			if pctx.Err() != nil && fs.NumRecords() == 0 {
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
				if string(r.Key) != cluster+"/"+node {
					t.Errorf("derived event keyed %q, want %q", r.Key, cluster+"/"+node)
				}
				derived = append(derived, ev)
			}
		}
	}

	// One Xid 31: below the threshold of 2.
	now := time.Now().UTC().Add(-time.Minute)
	produce(now)
	settled()
	drain()
	if len(derived) != 0 {
		t.Fatalf("derived before the threshold: %v", derived)
	}

	// The second one crosses it.
	produce(now.Add(10 * time.Second))
	deadline := time.Now().Add(20 * time.Second)
	for len(derived) == 0 && time.Now().Before(deadline) {
		settled()
		drain()
	}
	if len(derived) == 0 {
		t.Fatal("no derived event at the threshold")
	}
	// Let the derived event itself go through both roles, and a few
	// sweeps run: still exactly one.
	time.Sleep(2 * time.Second)
	settled()
	drain()
	if len(derived) != 1 {
		t.Fatalf("%d derived events, want 1: %v", len(derived), derived)
	}
	d := derived[0]
	if d.GetDerivedBy() != rule || d.GetCluster() != cluster || d.GetNodeName() != node {
		t.Errorf("derived by %q for %s/%s, want %s for %s/%s", d.GetDerivedBy(), d.GetCluster(), d.GetNodeName(), rule, cluster, node)
	}
	if d.GetRecommendedAction() != datamodels.RecommendedAction_RUN_DCGMEUD || d.GetIsFatal() || d.GetIsHealthy() {
		t.Errorf("derived action %s fatal %v healthy %v, want RUN_DCGMEUD, not fatal, unhealthy", d.GetRecommendedAction(), d.GetIsFatal(), d.GetIsHealthy())
	}
	if d.GetId() == "" || len(d.GetCauseIds()) == 0 {
		t.Errorf("derived id %q causeIds %v", d.GetId(), d.GetCauseIds())
	}
	for _, c := range d.GetCauseIds() {
		if c != raw[0] && c != raw[1] {
			t.Errorf("cause %s is not one of the produced events %v", c, raw)
		}
	}
	if len(d.GetCauseIds()) != 2 {
		t.Errorf("causeIds %v, want both produced events %v", d.GetCauseIds(), raw)
	}

	// Stored like any other event (the store wrote it before committing).
	if n := chtest.Count(t, srv.Conn, "SELECT uniqExact(id) FROM events WHERE cluster = @c AND derived_by = @r",
		ch.Named("c", cluster), ch.Named("r", rule)); n != 1 {
		t.Errorf("%d derived events stored, want 1", n)
	}
	if n := chtest.Count(t, srv.Conn, "SELECT uniqExact(id) FROM events WHERE cluster = @c AND id = @id AND node = @n",
		ch.Named("c", cluster), ch.Named("id", d.GetId()), ch.Named("n", node)); n != 1 {
		t.Errorf("derived event %s not stored", d.GetId())
	}
	if n := chtest.Count(t, srv.Conn, "SELECT uniqExact(id) FROM events WHERE cluster = @c AND derived_by = ''",
		ch.Named("c", cluster)); n != 2 {
		t.Errorf("%d raw events stored, want 2", n)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
