// Command chbench measures faultline's ClickHouse history on this machine:
//
//	chbench store  [flags]   rows/s the store role sustains into ClickHouse
//	chbench window [flags]   p50/p99 of the correlation window queries over a
//	                         generated history (10 million events by default)
//
// Without --clickhouse.addr it starts a local server (internal/chserver) in
// a temporary directory; without --kafka the store benchmark uses an
// in-process kfake broker. Results are in sql/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/analytics"
	"github.com/faultline/faultline/internal/chserver"
	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/store"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
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
	ch         clickhouse.Config
	kafka      string
	kcfg       kafka.Config // TLS and SASL of --kafka
	partitions int
	events     int
	st         store.Config
	queries    int
	nodes      int
	days       int
	keep       bool
	chPid      int
}

// cpuSeconds is the user+system CPU time of a process (0 when unknown).
func cpuSeconds(pid int) float64 {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	var utime, stime float64
	fmt.Sscan(f[11], &utime)
	fmt.Sscan(f[12], &stime)
	return (utime + stime) / 100 // USER_HZ
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 || (args[0] != "store" && args[0] != "window") {
		return errors.New("usage: chbench store|window [flags]")
	}
	mode := args[0]
	o := opts{ch: clickhouse.DefaultConfig(), st: store.DefaultConfig(), kcfg: kafka.DefaultConfig()}
	o.ch.Addr = ""
	o.ch.Database = "chbench"
	fs := flag.NewFlagSet("chbench "+mode, flag.ContinueOnError)
	o.ch.RegisterFlags(fs, "clickhouse.")
	o.st.RegisterFlags(fs, "store.")
	fs.StringVar(&o.kafka, "kafka", "", "Kafka brokers (empty: in-process kfake)")
	o.kcfg.RegisterSecurityFlags(fs, "kafka.")
	fs.IntVar(&o.partitions, "partitions", 6, "partitions of the events topic")
	fs.IntVar(&o.events, "events", 0, "events to store (store: default 1000000) or to generate (window: default 10000000)")
	fs.IntVar(&o.queries, "queries", 2000, "window: queries of each kind")
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
	fmt.Printf("clickhouse %s at %s\n", version, o.ch.Addr)
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
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(o.partitions), kafka.PipelineTopics...))
		if err != nil {
			return err
		}
		defer c.Close()
		brokers = strings.Join(c.ListenAddrs(), ",")
	}
	kcfg := kafka.DefaultConfig()
	if o.kafka != "" {
		kcfg = o.kcfg // with its TLS and SASL
	}
	kcfg.Brokers, kcfg.Partitions, kcfg.ReplicationFactor = brokers, o.partitions, -1
	cl, err := kafka.NewClient(kcfg, log, kgo.ProducerBatchMaxBytes(4<<20), kgo.MaxBufferedRecords(100000))
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
	for i := range o.events {
		ev := benchEvent(i, now)
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
	fmt.Printf("produced %d events (%d bytes each on average) in %s\n", o.events, bytes/o.events, time.Since(began).Round(time.Millisecond))

	reg := prometheus.NewRegistry()
	m := store.NewMetrics(reg)
	h := store.New(conn, log, m)
	pc := o.st.Pipeline()
	pc.Role = "store"
	pc.Group = fmt.Sprintf("chbench-%d", time.Now().UnixNano())
	r := pipeline.NewRunner(pc, kcfg, h, log, pipeline.NewMetrics(reg))
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	cpu0, chCPU0 := cpuSeconds(os.Getpid()), cpuSeconds(o.chPid)
	began = time.Now()
	go func() { done <- r.Run(rctx) }()
	var n uint64
	for n < uint64(o.events) {
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
	fmt.Printf("stored %d events in %s: %.0f events/s (batch_records=%d, batch_linger=%s, partitions=%d, kafka=%s)\n",
		n, took.Round(time.Millisecond), float64(n)/took.Seconds(), o.st.BatchRecords, o.st.BatchLinger, o.partitions, map[bool]string{true: "kfake in-process", false: o.kafka}[o.kafka == ""])
	return nil
}

// genSQL generates the history inside ClickHouse: {n} events over {nodes}
// nodes of two clusters and {days} days; per node 8 GPUs and 8 NIC ports.
// 40% link state events (a quarter healthy), 10% link_downed counter
// events, 20% fatal XIDs, 30% other GPU checks.
const genSQL = `INSERT INTO events (cluster, node, check, entity, ts, ts_ms, id, received, received_ms, agent,
	component_class, is_fatal, is_healthy, message, recommended_action, error_codes, entities.type, entities.value,
	metadata.key, metadata.value, processing_strategy)
SELECT
	concat('cluster-', toString(nd % 2)) AS cluster,
	concat('gpu-node-', toString(nd)) AS node,
	['InfiniBandStateCheck', 'InfiniBandStateCheck', 'InfiniBandStateCheck', 'InfiniBandStateCheck',
	 'InfiniBandDegradationCheck', 'SysLogsXIDError', 'SysLogsXIDError', 'GpuThermalCheck', 'GpuEccCheck', 'GpuPowerCheck'][k + 1] AS check,
	if(k < 5, concat('NIC=mlx5_', toString(dev), ',NICPort=1'), concat('GPU=GPU-', toString(dev))) AS entity,
	toDateTime({start} + (r % {span})) AS ts,
	toUInt16(r % 1000) AS ts_ms,
	toString(generateUUIDv4()) AS id,
	ts AS received,
	ts_ms AS received_ms,
	'faultline-agent' AS agent,
	if(k < 5, 'NIC', 'GPU') AS component_class,
	toUInt8(k IN (5, 6)) AS is_fatal,
	toUInt8(k < 4 AND r % 4 = 0) AS is_healthy,
	concat('generated event ', toString(number)) AS message,
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
	start := time.Now().UTC().Truncate(24 * time.Hour).Add(-time.Duration(span) * time.Second)
	var have uint64
	_ = conn.QueryRow(ctx, "SELECT count() FROM events").Scan(&have)
	if have != uint64(o.events) || !o.keep {
		if err := conn.Exec(ctx, "TRUNCATE TABLE IF EXISTS events"); err != nil {
			return err
		}
		q := strings.NewReplacer("{n}", fmt.Sprint(o.events), "{nodes}", fmt.Sprint(o.nodes), "{start}", fmt.Sprint(start.Unix()), "{span}", fmt.Sprint(span)).Replace(genSQL)
		began := time.Now()
		if err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("generate: %w", err)
		}
		fmt.Printf("generated %d events over %d nodes and %d days in %s\n", o.events, o.nodes, o.days, time.Since(began).Round(time.Millisecond))
	} else {
		fmt.Printf("reusing %d generated events\n", have)
	}
	// Let background merges settle so the measure is of the steady state.
	for i := 0; i < 600; i++ {
		var merges uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM system.merges WHERE table = 'events'").Scan(&merges); err != nil || merges == 0 {
			break
		}
		time.Sleep(time.Second)
	}
	var parts, rows, bytesOnDisk uint64
	_ = conn.QueryRow(ctx, "SELECT count(), sum(rows), sum(bytes_on_disk) FROM system.parts WHERE database = currentDatabase() AND table = 'events' AND active").Scan(&parts, &rows, &bytesOnDisk)
	fmt.Printf("events table: %d rows in %d active parts, %.1f MiB on disk\n", rows, parts, float64(bytesOnDisk)/(1<<20))

	qs, err := analytics.Builtin()
	if err != nil {
		return err
	}
	seed := uint64(1)
	rnd := func(n int) int { // xorshift, deterministic
		seed ^= seed << 13
		seed ^= seed >> 7
		seed ^= seed << 17
		return int(seed % uint64(n))
	}
	kinds := []struct {
		query  string
		params func() analytics.Params
	}{
		{"link_down_window", func() analytics.Params {
			nd := rnd(o.nodes)
			return analytics.Params{"cluster": fmt.Sprintf("cluster-%d", nd%2), "node": fmt.Sprintf("gpu-node-%d", nd),
				"check": "InfiniBandStateCheck", "entity": fmt.Sprintf("NIC=mlx5_%d,NICPort=1", rnd(8)),
				"until": fmt.Sprint(start.Unix() + int64(rnd(span))), "window": "600"}
		}},
		{"xid_bursts", func() analytics.Params {
			nd := rnd(o.nodes)
			return analytics.Params{"cluster": fmt.Sprintf("cluster-%d", nd%2), "node": fmt.Sprintf("gpu-node-%d", nd),
				"check": "SysLogsXIDError", "until": fmt.Sprint(start.Unix() + int64(rnd(span))), "window": "86400"}
		}},
	}
	for _, k := range kinds {
		q := qs[k.query]
		lat := make([]time.Duration, 0, o.queries)
		var nonEmpty int
		for i := 0; i < o.queries+50; i++ {
			p := k.params()
			t0 := time.Now()
			res, err := analytics.Run(ctx, conn, q, p, time.Now())
			d := time.Since(t0)
			if err != nil {
				return err
			}
			if i < 50 {
				continue // warm-up
			}
			lat = append(lat, d)
			if len(res.Rows) > 0 && fmt.Sprint(res.Rows[0][0]) != "0" {
				nonEmpty++
			}
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		pct := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))] }
		fmt.Printf("%-17s %d queries: p50 %s  p90 %s  p99 %s  max %s  (%d with matches)\n", k.query, len(lat),
			pct(0.50).Round(10*time.Microsecond), pct(0.90).Round(10*time.Microsecond), pct(0.99).Round(10*time.Microsecond), lat[len(lat)-1].Round(10*time.Microsecond), nonEmpty)
	}
	if !o.keep {
		return conn.Exec(ctx, "TRUNCATE TABLE IF EXISTS events")
	}
	return nil
}
