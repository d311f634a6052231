// Command correlatebench measures how many events per second one correlate
// replica handles with all shipped rules enabled over a large history.
//
// It fills the events and actions tables of a ClickHouse database with a
// synthetic history generated server-side (INSERT ... SELECT FROM numbers,
// so 10 million rows take seconds, not minutes), then hands batches of new
// events for the same nodes to correlate.Handler.Handle — the role's whole
// per-batch work: CEL triggers, one window query per rule, the standing
// verdict lookups — timing only that, and stores each batch afterwards as
// the store role would. Usage (a ClickHouse server on 127.0.0.1:9000):
//
//	go run ./loadtest/correlatebench -history 10000000 -events 200000 -batch 5000
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/processors/correlate"
	"github.com/faultline/faultline/processors/store"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "correlatebench:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg := clickhouse.DefaultConfig()
	cfg.RegisterFlags(flag.CommandLine, "clickhouse.")
	history := flag.Int("history", 10_000_000, "events in the history (generated when the table holds fewer)")
	n := flag.Int("events", 200_000, "events to correlate")
	batch := flag.Int("batch", 5000, "events per batch")
	nodes := flag.Int("nodes", 2000, "nodes (per cluster, 4 clusters)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the correlation to this file")
	flag.Parse()
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	conn, err := clickhouse.Setup(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer conn.Close()
	now := time.Now().UTC().Truncate(time.Second)
	var have uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM events").Scan(&have); err != nil {
		return err
	}
	if have < uint64(*history) {
		start := time.Now()
		// 7 days of history over 4 clusters x nodes, 8 NIC ports and 8 GPUs
		// per node: NIC state downs/ups, link_downed increases, Xids, other
		// checks; plus remediation actions.
		q := fmt.Sprintf(`INSERT INTO events (cluster, node, check, entity, ts, ts_ms, id, received, received_ms, agent, component_class,
    is_fatal, is_healthy, message, recommended_action, error_codes, entities.type, entities.value, metadata.key, metadata.value,
    processing_strategy, derived_by)
SELECT
    concat('c', toString(n %% 4)) AS cluster,
    concat('node-', toString(intDiv(n, 4) %% %d)) AS node,
    ['InfiniBandStateCheck', 'InfiniBandStateCheck', 'InfiniBandDegradationCheck', 'SysLogsXIDError', 'GpuThermalWatch'][n %% 5 + 1] AS check,
    if(n %% 5 < 3, concat('NIC=mlx5_', toString(intDiv(n, 20) %% 8), ',NICPort=1'), concat('PCI=0000:1', toString(intDiv(n, 20) %% 8), ':00,GPU=GPU-', toString(intDiv(n, 20) %% 8))) AS entity,
    toDateTime(%d - (n * 7919) %% 604800) AS ts,
    toUInt16(n %% 1000) AS ts_ms,
    concat('h-', toString(n)) AS id,
    ts AS received, ts_ms AS received_ms,
    'bench' AS agent, if(n %% 5 < 3, 'NIC', 'GPU') AS component_class,
    toUInt8(n %% 5 != 1 AND n %% 5 != 4) AS is_fatal,
    toUInt8(n %% 5 = 1) AS is_healthy,
    'history' AS message, 'NONE' AS recommended_action,
    multiIf(n %% 5 = 2, ['link_downed'], n %% 5 = 3, [concat('XID-', toString([48, 31, 79, 13][n %% 4 + 1]))], emptyArrayString()) AS error_codes,
    if(n %% 5 < 3, ['NIC', 'NICPort'], ['PCI', 'GPU']) AS et,
    if(n %% 5 < 3, [concat('mlx5_', toString(intDiv(n, 20) %% 8)), '1'], [concat('0000:1', toString(intDiv(n, 20) %% 8), ':00'), concat('GPU-', toString(intDiv(n, 20) %% 8))]) AS ev,
    ['count', 'delta'] AS mk, ['1', '1'] AS mv,
    'EXECUTE_REMEDIATION' AS processing_strategy, '' AS derived_by
FROM (SELECT number AS n FROM system.numbers LIMIT %d)`, *nodes, now.Unix(), *history)
		if err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("generate history: %w", err)
		}
		aq := fmt.Sprintf(`INSERT INTO actions (cluster, node, ts, ts_ms, id, role, kind, outcome, received)
SELECT concat('c', toString(n %% 4)), concat('node-', toString(intDiv(n, 4) %% %d)), toDateTime(%d - (n * 7919) %% 604800), 0,
    concat('a-', toString(n)), 'remediate', 'remediate', 'applied', toDateTime(%d)
FROM (SELECT number AS n FROM system.numbers LIMIT %d)`, *nodes, now.Unix(), now.Unix(), *history/100)
		if err := conn.Exec(ctx, aq); err != nil {
			return fmt.Errorf("generate actions: %w", err)
		}
		fmt.Printf("history: %d events, %d actions generated in %s\n", *history, *history/100, time.Since(start).Round(time.Millisecond))
	}
	if err := conn.QueryRow(ctx, "SELECT count() FROM events").Scan(&have); err != nil {
		return err
	}
	rules, err := correlate.LoadRules("")
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	h := correlate.New(conn, rules, time.Now, 2*time.Minute, log, correlate.NewMetrics(reg))
	st := store.New(conn, log, store.NewMetrics(nil))
	rng := rand.New(rand.NewPCG(1, 2))
	var (
		handled  int
		busy     time.Duration
		derived  int
		lastTime = now
	)
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	for handled < *n {
		recs := make([]*kgo.Record, 0, *batch)
		for range *batch {
			lastTime = lastTime.Add(time.Duration(rng.IntN(20)) * time.Millisecond)
			recs = append(recs, record(rng, *nodes, lastTime))
		}
		t0 := time.Now()
		res, err := h.Handle(ctx, recs)
		if err != nil {
			return err
		}
		took := time.Since(t0)
		busy += took
		derived += len(res.Out)
		fmt.Printf("  batch %d: %d events in %s (%.0f/s), %d derived\n", handled / *batch + 1, len(recs), took.Round(time.Millisecond), float64(len(recs))/took.Seconds(), len(res.Out))
		if _, err := st.Handle(ctx, append(recs, res.Out...)); err != nil {
			return err
		}
		handled += len(recs)
	}
	t0 := time.Now()
	swept, err := h.Sweep(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("history %d rows; correlated %d events in batches of %d: %.0f events/s (handle time %s, %d derived); one sweep %s (%d derived)\n",
		have, handled, *batch, float64(handled)/busy.Seconds(), busy.Round(time.Millisecond), derived, time.Since(t0).Round(time.Millisecond), len(swept))
	mfs, err := reg.Gather()
	if err != nil {
		return err
	}
	for _, mf := range mfs {
		if mf.GetName() != "faultline_correlate_query_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			hs := m.GetHistogram()
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			fmt.Printf("  %-24s %-6s queries %4d  total %8.2fs  mean %6.3fs\n", labels["rule"], labels["pass"], hs.GetSampleCount(), hs.GetSampleSum(), hs.GetSampleSum()/float64(hs.GetSampleCount()))
		}
	}
	return nil
}

// record is one new event (or, 1 in 50, a remediation action) for a random
// node of the history: the mix of the history, so most trigger a rule.
func record(rng *rand.Rand, nodes int, at time.Time) *kgo.Record {
	cluster := "c" + strconv.Itoa(rng.IntN(4))
	node := "node-" + strconv.Itoa(rng.IntN(nodes))
	k := rng.IntN(50)
	if k == 0 {
		a := &faultlinev1.Action{Id: events.NewID(), Cluster: cluster, Node: node, Role: "remediate", Kind: "remediate", Outcome: "applied", Timestamp: timestamppb.New(at)}
		b, _ := events.MarshalAction(a)
		return &kgo.Record{Topic: events.TopicActions, Key: events.Key(cluster, node), Value: b, Timestamp: at}
	}
	dev := strconv.Itoa(rng.IntN(8))
	ev := &datamodels.HealthEvent{Version: 1, Id: events.NewID(), Cluster: cluster, NodeName: node, Agent: "bench",
		GeneratedTimestamp: timestamppb.New(at), ReceivedTimestamp: timestamppb.New(at), Metadata: map[string]string{"count": "1"}}
	switch k % 5 {
	case 0, 1:
		ev.CheckName, ev.ComponentClass = "InfiniBandStateCheck", "NIC"
		ev.IsHealthy = k%5 == 1
		ev.IsFatal = !ev.IsHealthy
		ev.EntitiesImpacted = []*datamodels.Entity{{EntityType: "NIC", EntityValue: "mlx5_" + dev}, {EntityType: "NICPort", EntityValue: "1"}}
	case 2:
		ev.CheckName, ev.ComponentClass, ev.IsFatal = "InfiniBandDegradationCheck", "NIC", true
		ev.ErrorCode = []string{"link_downed"}
		ev.Metadata["delta"] = "1"
		ev.EntitiesImpacted = []*datamodels.Entity{{EntityType: "NIC", EntityValue: "mlx5_" + dev}, {EntityType: "NICPort", EntityValue: "1"}}
	default:
		ev.CheckName, ev.ComponentClass, ev.IsFatal = "SysLogsXIDError", "GPU", true
		ev.ErrorCode = []string{"XID-" + []string{"48", "31", "79", "13"}[rng.IntN(4)]}
		ev.EntitiesImpacted = []*datamodels.Entity{{EntityType: "PCI", EntityValue: "0000:1" + dev + ":00"}, {EntityType: "GPU", EntityValue: "GPU-" + dev}}
	}
	b, _ := events.Marshal(ev)
	return &kgo.Record{Topic: events.TopicEvents, Key: events.Key(cluster, node), Value: b, Timestamp: at}
}
