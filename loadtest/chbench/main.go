// Command chbench measures faultline's ClickHouse history on this machine:
//
//	chbench store  [flags]   events/s the store role drains from a real Kafka
//	                         broker into ClickHouse, beside the raw franz-go
//	                         consumer's rate from the same broker (the ceiling)
//	chbench window [flags]   p50/p99 of internal/history's ListEvents called
//	                         in this process over the events table (what
//	                         GET /v1/events?node= and a cluster's newest page
//	                         run, without the HTTP, auth and JSON) and of
//	                         each correlation rule's per-batch work (its
//	                         queries over recent_events and derived_events),
//	                         over a generated history as inserted (no
//	                         OPTIMIZE, no waiting for merges)
//
// Without --clickhouse.addr it starts a local server (internal/chserver) in
// a temporary directory; without --kafka the store benchmark starts a real
// Kafka broker (internal/testenv). Every figure is printed with the
// machine's cores and load. Results are in loadtest/RESULTS.md.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/metrics"
	"runtime/pprof"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/chserver"
	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/history"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/loadtest/machine"
	"github.com/faultline/faultline/loadtest/standalone"
	"github.com/faultline/faultline/processors/correlate"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/store"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
	"github.com/faultline/faultline/schemas/validate"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "chbench:", err)
		os.Exit(1)
	}
}

type opts struct {
	ch          clickhouse.Config
	kafka       string
	kcfg        kafka.Config // TLS and SASL of --kafka
	partitions  int
	events      int
	st          store.Config
	queries     int
	ruleQueries int
	nodes       int
	days        int
	keep        bool
	chPid       int
	// store: metadata bytes added to every event (64 entries at most,
	// 2,048 bytes each: the largest an event may carry), and whether the
	// runner overlaps its rounds (as shipped).
	metadataBytes int
	overlap       bool
}

var cpuSeconds = machine.CPUSeconds

func run(ctx context.Context, args []string) error {
	if len(args) == 0 || (args[0] != "store" && args[0] != "window") {
		return errors.New("usage: chbench store|window [flags]")
	}
	mode := args[0]
	o := opts{ch: clickhouse.DefaultConfig(), st: store.DefaultConfig(), kcfg: kafka.DefaultConfig()}
	o.ch.Addr = ""
	o.ch.Database = "chbench"
	o.ch.QueryTimeout = 0 // generating a 10M-event history takes minutes
	fs := flag.NewFlagSet("chbench "+mode, flag.ContinueOnError)
	o.ch.RegisterFlags(fs, "clickhouse.")
	o.st.RegisterFlags(fs, "store.")
	fs.StringVar(&o.kafka, "kafka", "", "Kafka brokers (empty: start a real broker with internal/testenv)")
	o.kcfg.RegisterSecurityFlags(fs, "kafka.")
	fs.IntVar(&o.partitions, "partitions", 6, "partitions of the events topic")
	fs.IntVar(&o.metadataBytes, "metadata-bytes", 0, "store: metadata values added to every event, in bytes (2,048 per entry, 64 entries at most)")
	fs.BoolVar(&o.overlap, "overlap", store.DefaultConfig().Pipeline().Overlap, "store: the next batch decoded while the last is written (default as shipped at this GOMEMLIMIT)")
	fs.IntVar(&o.events, "events", 0, "events to store (store: default 1000000) or to generate (window: default 10000000)")
	fs.IntVar(&o.queries, "queries", 2000, "window: history API calls")
	fs.IntVar(&o.ruleQueries, "rule-queries", 200, "window: one-event batches per correlation rule")
	fs.IntVar(&o.nodes, "nodes", 4000, "window: nodes in the generated fleet (two clusters)")
	fs.IntVar(&o.days, "days", 30, "window: days the generated history spans")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the benchmark to this file")
	fs.BoolVar(&o.keep, "keep", false, "keep the generated data (window: reuse it when the row count matches)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if o.kafka != "" {
		o.kcfg.Brokers = o.kafka
		if err := o.kcfg.Validate("kafka."); err != nil {
			return err
		}
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if o.ch.Addr == "" {
		dir, err := os.MkdirTemp("", "chbench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		srv, err := chserver.Start(ctx, chserver.Options{Dir: filepath.Join(dir, "clickhouse"), Log: log})
		if err != nil {
			return err
		}
		defer srv.Stop()
		o.ch.Addr = srv.Addr()
		o.chPid = srv.Pid()
	}
	conn, err := clickhouse.Setup(ctx, o.ch, log)
	if err != nil {
		return err
	}
	defer conn.Close()
	var version string
	_ = conn.QueryRow(ctx, "SELECT version()").Scan(&version)
	fmt.Println(machine.Stamp("clickhouse %s at %s", version, o.ch.Addr))
	if mode == "store" {
		if o.events == 0 {
			o.events = 1_000_000
		}
		return benchStore(ctx, conn, o, log)
	}
	if o.events == 0 {
		o.events = 10_000_000
	}
	return benchWindow(ctx, conn, o)
}

// benchEvent is a typical agent event (~400 bytes encoded).
func benchEvent(i int, now time.Time) *datamodels.HealthEvent {
	node := fmt.Sprintf("gpu-node-%04d", i%2000)
	ts := timestamppb.New(now.Add(-time.Duration(i%86400) * time.Second))
	if i%2 == 0 {
		return &datamodels.HealthEvent{
			Version: 1, Agent: "faultline-agent", ComponentClass: "NIC", CheckName: "InfiniBandStateCheck",
			IsHealthy: i%4 == 0, Message: fmt.Sprintf("port mlx5_%d:1 state DOWN (phys_state LinkDown)", i%8),
			RecommendedAction:  datamodels.RecommendedAction_NONE,
			EntitiesImpacted:   []*datamodels.Entity{{EntityType: "NIC", EntityValue: fmt.Sprintf("mlx5_%d", i%8)}, {EntityType: "NICPort", EntityValue: "1"}},
			Metadata:           map[string]string{"link_layer": "InfiniBand", "rate": "400 Gb/sec (4X NDR)", "role": "compute"},
			GeneratedTimestamp: ts, ReceivedTimestamp: ts, NodeName: node, Cluster: "bench",
			ProcessingStrategy: datamodels.ProcessingStrategy_EXECUTE_REMEDIATION, Id: events.NewID(),
		}
	}
	return &datamodels.HealthEvent{
		Version: 1, Agent: "faultline-agent", ComponentClass: "GPU", CheckName: "SysLogsXIDError",
		IsFatal: true, Message: "NVRM: Xid (PCI:0000:17:00): 79, pid=1234, GPU has fallen off the bus.",
		RecommendedAction: datamodels.RecommendedAction_RESTART_BM, ErrorCode: []string{"XID-79"},
		EntitiesImpacted:   []*datamodels.Entity{{EntityType: "GPU", EntityValue: fmt.Sprintf("GPU-%08x-0000-0000-0000-%012d", i%8, i%8)}},
		Metadata:           map[string]string{"gpu_index": fmt.Sprint(i % 8), "driver_version": "535.104.05", "pci": "0000:17:00.0"},
		GeneratedTimestamp: ts, ReceivedTimestamp: ts, NodeName: node, Cluster: "bench",
		ProcessingStrategy: datamodels.ProcessingStrategy_EXECUTE_REMEDIATION, Id: events.NewID(),
	}
}

func benchStore(ctx context.Context, conn clickhouse.Conn, o opts, log *slog.Logger) error {
	if err := conn.Exec(ctx, "TRUNCATE TABLE IF EXISTS events"); err != nil {
		return err
	}
	brokers := o.kafka
	if brokers == "" {
		tb := standalone.New("chbench")
		defer tb.Close()
		k := testenv.StartKafka(tb, testenv.KafkaPartitions(o.partitions))
		brokers = k.Addr()
		fmt.Println(machine.Stamp("kafka %s broker at %s (internal/testenv)", testenv.KafkaVersion, brokers))
	}
	kcfg := kafka.DefaultConfig()
	if o.kafka != "" {
		kcfg = o.kcfg // with its TLS and SASL
	}
	kcfg.Brokers, kcfg.Partitions, kcfg.ReplicationFactor = brokers, o.partitions, -1
	batchMax := int32(4 << 20)
	if o.metadataBytes > 0 {
		batchMax = 1_000_000 // the broker's message.max.bytes: large events hardly compress
	}
	cl, err := kafka.NewClient(kcfg, log, kgo.ProducerBatchMaxBytes(batchMax), kgo.MaxBufferedRecords(100000))
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := kafka.EnsureTopics(ctx, cl, kcfg, kafka.PipelineTopics...); err != nil {
		return err
	}
	// Produce the backlog first, so the measure is the store's drain rate.
	began := time.Now()
	now := time.Now().UTC()
	var bytes int
	errc := make(chan error, 1)
	// Hex of random bytes, which compress little, as real values do: a
	// repeated letter shrank so far on the wire that a fetch held many
	// times the byte bound, and the bound measured nothing.
	pad := make([]byte, validate.MaxMetadataVal/2)
	for i := range o.events {
		ev := benchEvent(i, now)
		for k, room := 0, validate.MaxMetadata-len(ev.Metadata); k*2*len(pad) < o.metadataBytes && k < room; k++ {
			_, _ = rand.Read(pad)
			ev.Metadata[fmt.Sprintf("pad-%02d", k)] = hex.EncodeToString(pad)
		}
		v, _ := events.Marshal(ev)
		bytes += len(v)
		cl.Produce(ctx, &kgo.Record{Topic: events.TopicEvents, Key: events.Key(ev.Cluster, ev.NodeName), Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case errc <- err:
				default:
				}
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	select {
	case err := <-errc:
		return fmt.Errorf("produce: %w", err)
	default:
	}
	fmt.Println(machine.Stamp("produced %d events (%d bytes each on average) in %s", o.events, bytes/o.events, time.Since(began).Round(time.Millisecond)))

	// The ceiling: the raw franz-go consumer reading the same backlog
	// from the same broker, decoding nothing.
	rawCl, err := kafka.NewClient(kcfg, log, kgo.ConsumeTopics(events.TopicEvents), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return err
	}
	began = time.Now()
	for got := 0; got < o.events; {
		fs := rawCl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			rawCl.Close()
			return fmt.Errorf("raw consume: %w", err)
		}
		got += fs.NumRecords()
	}
	rawCl.Close()
	rawRate := float64(o.events) / time.Since(began).Seconds()
	fmt.Println(machine.Stamp("raw franz-go consumer (ceiling): %d events in %s: %.0f events/s", o.events, time.Since(began).Round(time.Millisecond), rawRate))

	reg := prometheus.NewRegistry()
	m := store.NewMetrics(reg)
	h := store.New(conn, log, m)
	pc := o.st.Pipeline()
	pc.Role = "store"
	pc.Group = fmt.Sprintf("chbench-%d", time.Now().UnixNano())
	pc.Overlap = o.overlap
	r := pipeline.NewRunner(pc, kcfg, h, log, pipeline.NewMetrics(reg))
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	cpu0, chCPU0 := cpuSeconds(os.Getpid()), cpuSeconds(o.chPid)
	began = time.Now()
	go func() { done <- r.Run(rctx) }()
	var n, peakLive uint64
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	for n < uint64(o.events) {
		if metrics.Read(live); live[0].Value.Kind() == metrics.KindUint64 {
			peakLive = max(peakLive, live[0].Value.Uint64())
		}
		select {
		case <-ctx.Done():
			cancel()
			return ctx.Err()
		case err := <-done:
			return fmt.Errorf("runner stopped: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		if err := conn.QueryRow(ctx, "SELECT count() FROM events").Scan(&n); err != nil {
			return err
		}
	}
	took := time.Since(began)
	cpu1, chCPU1 := cpuSeconds(os.Getpid()), cpuSeconds(o.chPid)
	cancel()
	<-done
	if o.chPid != 0 {
		goCPU, chCPU := cpu1-cpu0, chCPU1-chCPU0
		fmt.Printf("  CPU: store process %.2fs, clickhouse-server %.2fs => %.1f us per event, %.0f events per CPU-second (%.0f events/s on 2 idle cores)\n",
			goCPU, chCPU, (goCPU+chCPU)/float64(n)*1e6, float64(n)/(goCPU+chCPU), 2*float64(n)/(goCPU+chCPU))
	}
	if mfs, err := reg.Gather(); err == nil {
		for _, mf := range mfs {
			for _, mm := range mf.GetMetric() {
				if hh := mm.GetHistogram(); hh != nil && hh.GetSampleCount() > 0 {
					fmt.Printf("  %s: %d observations, mean %.3fs\n", mf.GetName(), hh.GetSampleCount(), hh.GetSampleSum()/float64(hh.GetSampleCount()))
				}
			}
		}
	}
	fmt.Println(machine.Stamp("stored %d events in %s: %.0f events/s = %.2f of the raw consumer's %.0f/s (batch_records=%d, batch_linger=%s, overlap=%t, partitions=%d, kafka %s)",
		n, took.Round(time.Millisecond), float64(n)/took.Seconds(), float64(n)/took.Seconds()/rawRate, rawRate, o.st.BatchRecords, o.st.BatchLinger, o.overlap, o.partitions, brokers))
	fmt.Printf("  peak live Go heap while storing: %.0f MiB (after a collection; the producer's client idle)\n", float64(peakLive)/(1<<20))
	var rows, bytesOnDisk uint64
	_ = conn.QueryRow(ctx, "SELECT sum(rows), sum(bytes_on_disk) FROM system.parts WHERE database = currentDatabase() AND table = 'events' AND active").Scan(&rows, &bytesOnDisk)
	if rows > 0 {
		fmt.Println(machine.Stamp("events table on disk: %d rows, %.1f bytes per event (as inserted)", rows, float64(bytesOnDisk)/float64(rows)))
	}
	return nil
}

// genSQL generates the history inside ClickHouse: {n} events over {nodes}
// nodes of two clusters and {days} days; per node 8 GPUs and 8 NIC ports.
// 40% link state events (a quarter healthy), 10% link_downed counter
// events, 20% fatal XIDs, 30% other GPU checks. In received order, as the
// store inserts them: event number i of {total} is received at
// {start} + i*{span}/{total}, so each insert holds the next stretch of the
// span and a part covers the time its rows arrived in, as in production
// (scattering every insert over the whole span, as before 2026-12-04,
// gave every part all 30 days).
const genSQL = `INSERT INTO events (cluster, node, check, entity, ts, ts_ms, id, received, received_ms, agent,
	component_class, is_fatal, is_healthy, message, recommended_action, error_codes, entities.type, entities.value,
	metadata.key, metadata.value, processing_strategy)
SELECT
	concat('cluster-', toString(nd % 2)) AS cluster,
	concat('gpu-node-', toString(nd)) AS node,
	['InfiniBandStateCheck', 'InfiniBandStateCheck', 'InfiniBandStateCheck', 'InfiniBandStateCheck',
	 'InfiniBandDegradationCheck', 'SysLogsXIDError', 'SysLogsXIDError', 'GpuThermalCheck', 'GpuEccCheck', 'GpuPowerCheck'][k + 1] AS check,
	if(k < 5, concat('NIC=mlx5_', toString(dev), ',NICPort=1'), concat('GPU=GPU-', toString(dev))) AS entity,
	toDateTime({start} + intDiv(number * {span}, {total})) AS ts,
	toUInt16(r % 1000) AS ts_ms,
	toString(generateUUIDv4()) AS id,
	ts AS received,
	ts_ms AS received_ms,
	'faultline-agent' AS agent,
	if(k < 5, 'NIC', 'GPU') AS component_class,
	toUInt8(k IN (5, 6)) AS is_fatal,
	toUInt8(k < 4 AND r % 4 = 0) AS is_healthy,
	multiIf(k < 4, concat('Port mlx5_', toString(dev), ' port 1: state ', if(k < 4 AND r % 4 = 0, 'ACTIVE, phys_state LinkUp', 'DOWN, phys_state Disabled')),
		k = 4, concat('mlx5_', toString(dev), ' port 1: link_downed counter +1 (', toString(r % 97), ')'),
		k IN (5, 6), concat('NVRM: Xid (PCI:0000:', toString(16 + dev), ':00): 79, pid=', toString(r % 65536), ', GPU has fallen off the bus.'),
		concat('GPU ', toString(dev), ' ', ['temperature 71 C within range', 'ECC SBE count 0', 'power draw 412 W within cap'][k - 6])) AS message,
	if(k IN (5, 6), 'RESTART_BM', 'NONE') AS recommended_action,
	if(k IN (5, 6), ['XID-79'], emptyArrayString()) AS error_codes,
	if(k < 5, ['NIC', 'NICPort'], ['GPU']) AS ` + "`entities.type`" + `,
	if(k < 5, [concat('mlx5_', toString(dev)), '1'], [concat('GPU-', toString(dev))]) AS ` + "`entities.value`" + `,
	['role'] AS ` + "`metadata.key`" + `,
	['compute'] AS ` + "`metadata.value`" + `,
	'EXECUTE_REMEDIATION' AS processing_strategy
FROM
(
	SELECT number, intHash64(number) AS r, r % {nodes} AS nd, intDiv(r, 7919) % 10 AS k, intDiv(r, 104729) % 8 AS dev
	FROM system.numbers LIMIT {n}
)`

func benchWindow(ctx context.Context, conn clickhouse.Conn, o opts) error {
	span := o.days * 86400
	// The history ends now, so rule windows at "now" read a full window.
	start := time.Now().UTC().Truncate(time.Second).Add(-time.Duration(span) * time.Second)
	var have uint64
	_ = conn.QueryRow(ctx, "SELECT count() FROM events").Scan(&have)
	if have != uint64(o.events) || !o.keep {
		for _, t := range []string{"events", "recent_events", "derived_events"} {
			if err := conn.Exec(ctx, "TRUNCATE TABLE IF EXISTS "+t); err != nil {
				return err
			}
		}
		// In inserts of 1M rows (the store writes 50k at a time; one
		// 10M INSERT outlasts the client's read timeout on a busy machine).
		began := time.Now()
		for off := 0; off < o.events; off += 1_000_000 {
			q := strings.NewReplacer("{n}", fmt.Sprintf("%d, %d", off, min(1_000_000, o.events-off)), "{nodes}", fmt.Sprint(o.nodes), "{start}", fmt.Sprint(start.Unix()), "{span}", fmt.Sprint(span), "{total}", fmt.Sprint(o.events)).Replace(genSQL)
			if err := conn.Exec(ctx, q); err != nil {
				return fmt.Errorf("generate: %w", err)
			}
		}
		fmt.Println(machine.Stamp("generated %d events over %d nodes and %d days in %s", o.events, o.nodes, o.days, time.Since(began).Round(time.Millisecond)))
	} else {
		fmt.Printf("reusing %d generated events\n", have)
	}
	// As inserted: no OPTIMIZE, no waiting for the background merges.
	for _, t := range []string{"events", "recent_events"} {
		var parts, rows, bytesOnDisk uint64
		_ = conn.QueryRow(ctx, "SELECT count(), sum(rows), sum(bytes_on_disk) FROM system.parts WHERE database = currentDatabase() AND table = ? AND active", t).Scan(&parts, &rows, &bytesOnDisk)
		per := 0.0
		if rows > 0 {
			per = float64(bytesOnDisk) / float64(rows)
		}
		fmt.Println(machine.Stamp("%s table: %d rows in %d active parts, %.1f MiB on disk, %.1f bytes per event", t, rows, parts, float64(bytesOnDisk)/(1<<20), per))
	}

	seed := uint64(1)
	rnd := func(n int) int { // xorshift, deterministic
		seed ^= seed << 13
		seed ^= seed >> 7
		seed ^= seed << 17
		return int(seed % uint64(n))
	}
	report := func(what string, lat []time.Duration, extra string) {
		if len(lat) == 0 { // --queries or --rule-queries 0
			return
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		pct := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))] }
		fmt.Println(machine.Stamp("%-32s %5d calls: p50 %s  p90 %s  p99 %s  max %s%s", what, len(lat),
			pct(0.50).Round(10*time.Microsecond), pct(0.90).Round(10*time.Microsecond), pct(0.99).Round(10*time.Microsecond), lat[len(lat)-1].Round(10*time.Microsecond), extra))
	}

	// What the history API's GET /v1/events?node= runs: history.ListEvents
	// over the events table (the default page), called in this process —
	// no HTTP, auth or JSON, and the labels say so.
	hist := history.New(conn, slog.New(slog.NewTextHandler(io.Discard, nil)))
	lat := make([]time.Duration, 0, o.queries)
	var returned int
	for i := 0; i < o.queries+50; i++ {
		nd := rnd(o.nodes)
		t0 := time.Now()
		resp, err := hist.ListEvents(ctx, fmt.Sprintf("cluster-%d", nd%2), &faultlinev1.ListEventsRequest{Node: fmt.Sprintf("gpu-node-%d", nd)})
		d := time.Since(t0)
		if err != nil {
			return fmt.Errorf("history: %w", err)
		}
		if i >= 50 { // the first 50 warm up
			lat = append(lat, d)
			returned += len(resp.Events)
		}
	}
	report("internal/history ListEvents (in-process; no HTTP/auth/JSON)", lat, fmt.Sprintf("  (%.1f events per page)", float64(returned)/float64(len(lat))))

	// A cluster's newest page, no node (what GET /v1/events runs): 20
	// calls, the first 2 warm up.
	lat, returned = lat[:0], 0
	for i := range 22 {
		t0 := time.Now()
		resp, err := hist.ListEvents(ctx, fmt.Sprintf("cluster-%d", i%2), &faultlinev1.ListEventsRequest{})
		d := time.Since(t0)
		if err != nil {
			return fmt.Errorf("history without a node: %w", err)
		}
		if i >= 2 {
			lat = append(lat, d)
			returned += len(resp.Events)
		}
	}
	report("internal/history ListEvents, no node (in-process; no HTTP/auth/JSON)", lat, fmt.Sprintf("  (%.1f events per page)", float64(returned)/float64(len(lat))))

	// The rules: one correlate handler per rule, a one-event batch per
	// call at the current time (Handle: the standing verdicts from
	// derived_events, the window query over recent_events), every trigger
	// evaluated.
	rules, err := correlate.LoadRules("")
	if err != nil {
		return err
	}
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, r := range rules {
		h := correlate.New(conn, []*correlate.Rule{r}, time.Now, 2*time.Minute, discard, nil)
		h.EvaluateAll = true
		h.SetStoreProgress(correlate.StoredBeforeNext) // one trigger per call, none of them a window's
		lat := lat[:0]
		for i := 0; i < o.ruleQueries+10; i++ {
			nd := rnd(o.nodes)
			rec := windowTrigger(r.Name, fmt.Sprintf("cluster-%d", nd%2), fmt.Sprintf("gpu-node-%d", nd), rnd(8), time.Now())
			t0 := time.Now()
			if _, err := h.Handle(ctx, []*kgo.Record{rec}); err != nil {
				return fmt.Errorf("rule %s: %w", r.Name, err)
			}
			if i >= 10 {
				lat = append(lat, time.Since(t0))
			}
		}
		report("rule "+r.Name, lat, "")
	}
	if !o.keep {
		return conn.Exec(ctx, "TRUNCATE TABLE IF EXISTS events")
	}
	return nil
}

// windowTrigger is one event (or action) that triggers the rule for a
// node and device of the generated history.
func windowTrigger(rule, cluster, node string, dev int, at time.Time) *kgo.Record {
	key := events.Key(cluster, node)
	if rule == "MultipleRemediations" {
		a := &faultlinev1.Action{Id: events.NewID(), Cluster: cluster, Node: node, Role: "remediate", Kind: "remediate", Outcome: "applied", Timestamp: timestamppb.New(at)}
		b, _ := events.MarshalAction(a)
		return &kgo.Record{Topic: events.TopicActions, Key: key, Value: b, Timestamp: at}
	}
	ev := &datamodels.HealthEvent{Version: 1, Id: events.NewID(), Cluster: cluster, NodeName: node, Agent: "faultline-agent",
		GeneratedTimestamp: timestamppb.New(at), ReceivedTimestamp: timestamppb.New(at), Metadata: map[string]string{"count": "1"}}
	switch rule {
	case "RepeatedXIDOnSameGPU", "RepeatedXID31OnSameGPU", "NVSwitchSXidGPUXid":
		code := map[string]string{"RepeatedXIDOnSameGPU": "XID-79", "RepeatedXID31OnSameGPU": "XID-31", "NVSwitchSXidGPUXid": "XID-74"}[rule]
		ev.CheckName, ev.ComponentClass, ev.IsFatal, ev.ErrorCode = "SysLogsXIDError", "GPU", true, []string{code}
		ev.EntitiesImpacted = []*datamodels.Entity{{EntityType: "GPU", EntityValue: fmt.Sprintf("GPU-%d", dev)}}
	default: // the NIC rules and FabricIncident: a port going down
		ev.CheckName, ev.ComponentClass, ev.IsFatal = "InfiniBandStateCheck", "NIC", true
		ev.EntitiesImpacted = []*datamodels.Entity{{EntityType: "NIC", EntityValue: fmt.Sprintf("mlx5_%d", dev)}, {EntityType: "NICPort", EntityValue: "1"}}
	}
	b, _ := events.Marshal(ev)
	return &kgo.Record{Topic: events.TopicEvents, Key: key, Value: b, Timestamp: at}
}
