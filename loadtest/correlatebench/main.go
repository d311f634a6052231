// Command correlatebench measures how many events per second one correlate
// replica handles with all shipped rules enabled over a large history.
//
// It fills the events and actions tables of a ClickHouse database with a
// synthetic history generated server-side (INSERT ... SELECT FROM numbers,
// so 10 million rows take seconds, not minutes), runs one sweep first (as
// the role does every correlate.sweep_interval: it starts the verdicts of
// the sweep-onset rules, such as NICPortDrop, so their triggers are
// evaluated), then hands batches of new events for the same nodes to
// correlate.Handler.Handle — the role's whole per-batch work: CEL triggers,
// one window query per rule, the standing verdict lookups — timing only
// that, and stores each batch afterwards as the store role would.
//
// Two phases, reported separately:
//
//   - no-skip: Handler.EvaluateAll, every trigger's window query runs, also
//     those a standing verdict makes pointless (the worst case);
//   - steady: the role as shipped, continuing the same stream, skipping
//     what cannot change a standing verdict.
//
// Each phase reports, per rule, the triggers evaluated and skipped, and
// fails when a rule was never evaluated (the mix covers every shipped
// rule); steady prints a warning line for a rule triggered but never
// decided (every trigger skipped by a standing verdict). Usage (without -clickhouse.addr it starts a ClickHouse server in a
// temporary directory):
//
//	go run ./loadtest/correlatebench -history 10000000 -events 100000
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/chserver"
	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/loadtest/machine"
	"github.com/faultline/faultline/processors/correlate"
	"github.com/faultline/faultline/processors/store"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "correlatebench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	cfg := clickhouse.DefaultConfig()
	cfg.Addr = ""
	cfg.Database = "correlatebench"
	fs := flag.NewFlagSet("correlatebench", flag.ContinueOnError)
	cfg.RegisterFlags(fs, "clickhouse.")
	history := fs.Int("history", 10_000_000, "events in the history (generated when the table holds fewer)")
	n := fs.Int("events", 100_000, "events to correlate in each phase (no-skip, then steady)")
	batch := fs.Int("batch", correlate.DefaultConfig().BatchRecords, "events per batch (default: the role's correlate.batch_records)")
	nodes := fs.Int("nodes", 2000, "nodes (per cluster, 4 clusters)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the correlation to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	fmt.Println(machine.Stamp("correlatebench: history %d, %d events per phase, batches of %d", *history, *n, *batch))
	if cfg.Addr == "" {
		dir, err := os.MkdirTemp("", "correlatebench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		srv, err := chserver.Start(ctx, chserver.Options{Dir: filepath.Join(dir, "clickhouse"), Log: log})
		if err != nil {
			return err
		}
		defer srv.Stop()
		cfg.Addr = srv.Addr()
	}
	cfg.QueryTimeout = 0
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
		// per node: NIC state downs/ups, link_downed increases, Xids
		// (including 74 and 45, which NVSwitchSXidGPUXid joins with SXids),
		// NVSwitch SXids; plus remediation actions. Every event carries
		// its node's machine (machineOf), as the agents stamp it.
		q := fmt.Sprintf(`INSERT INTO events (cluster, node, check, entity, ts, ts_ms, id, received, received_ms, agent, component_class,
    is_fatal, is_healthy, message, recommended_action, error_codes, entities.type, entities.value, metadata.key, metadata.value,
    processing_strategy, derived_by)
SELECT
    concat('c', toString(n %% 4)) AS cluster,
    concat('node-', toString(intDiv(n, 4) %% %d)) AS node,
    ['InfiniBandStateCheck', 'InfiniBandStateCheck', 'InfiniBandDegradationCheck', 'SysLogsXIDError', 'SysLogsSXIDError'][n %% 5 + 1] AS check,
    multiIf(n %% 5 < 3, concat('NIC=mlx5_', toString(intDiv(n, 20) %% 8), ',NICPort=1'), n %% 5 = 3, concat('PCI=0000:1', toString(intDiv(n, 20) %% 8), ':00,GPU=GPU-', toString(intDiv(n, 20) %% 8)), 'NVSwitch=nvswitch0,GPU=GPU-' || toString(intDiv(n, 20) %% 8)) AS entity,
    toDateTime(%d - (n * 7919) %% 604800) AS ts,
    toUInt16(n %% 1000) AS ts_ms,
    concat('h-', toString(n)) AS id,
    ts AS received, ts_ms AS received_ms,
    'bench' AS agent, multiIf(n %% 5 < 3, 'NIC', n %% 5 = 3, 'GPU', 'NVSwitch') AS component_class,
    toUInt8(n %% 5 != 1) AS is_fatal,
    toUInt8(n %% 5 = 1) AS is_healthy,
    'history' AS message, 'NONE' AS recommended_action,
    multiIf(n %% 5 = 2, ['link_downed'], n %% 5 = 3, [concat('XID-', toString([48, 31, 79, 13, 74, 45][n %% 6 + 1]))], n %% 5 = 4, ['SXID-12028'], emptyArrayString()) AS error_codes,
    multiIf(n %% 5 < 3, ['NIC', 'NICPort'], n %% 5 = 3, ['PCI', 'GPU'], ['NVSwitch', 'GPU']) AS et,
    multiIf(n %% 5 < 3, [concat('mlx5_', toString(intDiv(n, 20) %% 8)), '1'], n %% 5 = 3, [concat('0000:1', toString(intDiv(n, 20) %% 8), ':00'), concat('GPU-', toString(intDiv(n, 20) %% 8))], ['nvswitch0', concat('GPU-', toString(intDiv(n, 20) %% 8))]) AS ev,
    ['count', 'delta', 'faultline.io/system-uuid'] AS mk,
    ['1', '1', concat('4c4c4544-000', toString(n %% 4), '-0000-0000-', toString(100000000000 + intDiv(n, 4) %% %d))] AS mv,
    'EXECUTE_REMEDIATION' AS processing_strategy, '' AS derived_by
FROM (SELECT number AS n FROM system.numbers LIMIT %d)`, *nodes, now.Unix(), *nodes, *history)
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
	if err := checkHistory(ctx, conn, now); err != nil {
		return err
	}
	rules, err := correlate.LoadRules("")
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	h := correlate.New(conn, rules, time.Now, 2*time.Minute, log, correlate.NewMetrics(reg))
	h.SetStoreProgress(correlate.StoredBeforeNext) // each batch is stored before the next (below)
	st := store.New(conn, log, store.NewMetrics(nil))
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

	// The sweep first, as the role runs it on start and every
	// sweep_interval: it starts the sweep-onset verdicts (NICPortDrop,
	// FabricIncident) whose later events the batches then evaluate.
	t0 := time.Now()
	swept, err := h.Sweep(ctx)
	if err != nil {
		return err
	}
	if _, err := st.Handle(ctx, swept); err != nil {
		return err
	}
	fmt.Println(machine.Stamp("sweep over %d rows: %s, %d derived", have, time.Since(t0).Round(time.Millisecond), len(swept)))

	b := &bench{h: h, st: st, reg: reg, rng: rand.New(rand.NewPCG(1, 2)), nodes: *nodes, at: now}
	var failed []string
	for _, phase := range []struct {
		name string
		all  bool
	}{{"no-skip", true}, {"steady", false}} {
		h.EvaluateAll = phase.all
		res, err := b.phase(ctx, phase.name, phase.all, *n, *batch)
		if err != nil {
			return err
		}
		failed = append(failed, res...)
	}
	t0 = time.Now()
	swept, err = h.Sweep(ctx)
	if err != nil {
		return err
	}
	fmt.Println(machine.Stamp("sweep after the phases: %s, %d derived", time.Since(t0).Round(time.Millisecond), len(swept)))
	if len(failed) > 0 {
		return fmt.Errorf("rules never triggered or never queried: %s", strings.Join(failed, ", "))
	}
	return nil
}

type bench struct {
	h     *correlate.Handler
	st    *store.Handler
	reg   *prometheus.Registry
	rng   *rand.Rand
	nodes int
	at    time.Time
}

// phase correlates n events in batches and prints the rate and, per rule,
// the triggers evaluated and skipped; it returns the rules the mix never
// triggered, and with all (Handler.EvaluateAll) those never queried.
func (b *bench) phase(ctx context.Context, name string, all bool, n, batch int) ([]string, error) {
	before := counters(b.reg)
	var (
		handled, derived int
		busy             time.Duration
	)
	for handled < n {
		recs := make([]*kgo.Record, 0, batch)
		for range batch {
			b.at = b.at.Add(time.Duration(b.rng.IntN(20)) * time.Millisecond)
			recs = append(recs, record(b.rng, b.nodes, b.at))
		}
		t0 := time.Now()
		res, err := b.h.Handle(ctx, recs)
		if err != nil {
			return nil, err
		}
		took := time.Since(t0)
		busy += took
		derived += len(res.Out)
		fmt.Printf("  %s batch %d: %d events in %s (%.0f/s), %d derived\n", name, handled/batch+1, len(recs), took.Round(time.Millisecond), float64(len(recs))/took.Seconds(), len(res.Out))
		if _, err := b.st.Handle(ctx, append(recs, res.Out...)); err != nil {
			return nil, err
		}
		handled += len(recs)
	}
	after := counters(b.reg)
	fmt.Println(machine.Stamp("%s: correlated %d events in batches of %d: %.0f events/s (handle time %s, %d derived)",
		name, handled, batch, float64(handled)/busy.Seconds(), busy.Round(time.Millisecond), derived))
	var never []string
	for _, r := range ruleNames(b.h) {
		ev := after[r+"/evaluated"] - before[r+"/evaluated"]
		sk := after[r+"/skipped"] - before[r+"/skipped"]
		q := after[r+"/value-queries"] - before[r+"/value-queries"]
		qs := after[r+"/value-seconds"] - before[r+"/value-seconds"]
		cq := after[r+"/causes-queries"] - before[r+"/causes-queries"]
		cs := after[r+"/causes-seconds"] - before[r+"/causes-seconds"]
		skipped := "skipped"
		if all {
			skipped = "queried anyway, not decided"
		}
		fmt.Printf("  %-24s triggers %7.0f: decided %7.0f, %s %7.0f; value queries %3.0f (%.2fs), cause queries %3.0f (%.2fs)\n",
			r, ev+sk, ev, skipped, sk, q, qs, cq, cs)
		failed, warning := judge(all, ev, sk, q)
		if failed {
			never = append(never, name+":"+r)
		}
		if warning != "" {
			fmt.Printf("  warning: %s %s: %s\n", name, r, warning)
		}
	}
	return never, nil
}

// judge is a rule's outcome in a phase from its triggers decided (ev)
// and skipped (sk) and its value queries (q): failed when the mix never
// triggered it, or with all (EvaluateAll) never queried it; a warning
// when it was triggered but never decided without all — a sweep-onset
// rule whose standing verdict skips every trigger does that rightly, but
// the phase's rate then holds none of its window queries.
func judge(all bool, ev, sk, q float64) (failed bool, warning string) {
	failed = ev+sk == 0 || (all && q == 0)
	if !all && ev == 0 && sk > 0 {
		warning = fmt.Sprintf("%.0f triggers, none decided (all skipped by a standing verdict): none of its window queries is in this phase's rate", sk)
	}
	return failed, warning
}

func ruleNames(h *correlate.Handler) []string {
	rules, _ := correlate.LoadRules("")
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = r.Name
	}
	return out
}

// counters reads the role's trigger counters and query histograms by
// rule: "<rule>/evaluated", "<rule>/skipped", "<rule>/<pass>-queries",
// "<rule>/<pass>-seconds".
func counters(reg *prometheus.Registry) map[string]float64 {
	out := map[string]float64{}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			switch mf.GetName() {
			case "faultline_correlate_triggers_total":
				out[l["rule"]+"/"+l["outcome"]] += m.GetCounter().GetValue()
			case "faultline_correlate_query_seconds":
				out[l["rule"]+"/"+l["pass"]+"-queries"] += float64(m.GetHistogram().GetSampleCount())
				out[l["rule"]+"/"+l["pass"]+"-seconds"] += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}

// record is one new event (or, 1 in 50, a remediation action) for a random
// node of the history: the mix of the history, so most trigger a rule.
func record(rng *rand.Rand, nodes int, at time.Time) *kgo.Record {
	ci, ni := rng.IntN(4), rng.IntN(nodes)
	cluster, node := "c"+strconv.Itoa(ci), "node-"+strconv.Itoa(ni)
	k := rng.IntN(50)
	if k == 0 {
		a := &faultlinev1.Action{Id: events.NewID(), Cluster: cluster, Node: node, Role: "remediate", Kind: "remediate", Outcome: "applied", Timestamp: timestamppb.New(at)}
		b, _ := events.MarshalAction(a)
		return &kgo.Record{Topic: events.TopicActions, Key: events.Key(cluster, node), Value: b, Timestamp: at}
	}
	dev := strconv.Itoa(rng.IntN(8))
	ev := &datamodels.HealthEvent{Version: 1, Id: events.NewID(), Cluster: cluster, NodeName: node, Agent: "bench",
		GeneratedTimestamp: timestamppb.New(at), ReceivedTimestamp: timestamppb.New(at),
		Metadata: map[string]string{"count": "1", events.MetaSystemUUID: machineOf(ci, ni)}}
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
	case 3:
		ev.CheckName, ev.ComponentClass, ev.IsFatal = "SysLogsSXIDError", "NVSwitch", true
		ev.ErrorCode = []string{"SXID-12028"}
		ev.EntitiesImpacted = []*datamodels.Entity{{EntityType: "NVSwitch", EntityValue: "nvswitch0"}, {EntityType: "GPU", EntityValue: "GPU-" + dev}}
	default:
		ev.CheckName, ev.ComponentClass, ev.IsFatal = "SysLogsXIDError", "GPU", true
		ev.ErrorCode = []string{"XID-" + []string{"48", "31", "79", "13", "74", "45"}[rng.IntN(6)]}
		ev.EntitiesImpacted = []*datamodels.Entity{{EntityType: "PCI", EntityValue: "0000:1" + dev + ":00"}, {EntityType: "GPU", EntityValue: "GPU-" + dev}}
	}
	b, _ := events.Marshal(ev)
	return &kgo.Record{Topic: events.TopicEvents, Key: events.Key(cluster, node), Value: b, Timestamp: at}
}

// machineOf is the system UUID of node ni of cluster ci, as the history's
// events carry it.
func machineOf(ci, ni int) string {
	return fmt.Sprintf("4c4c4544-000%d-0000-0000-%d", ci, 100000000000+ni)
}

// checkHistory verifies the load: every event of the history lies in the
// 7 days before now, inside the windows the rules read, and names its
// node's machine as the batches' events do (machineOf).
func checkHistory(ctx context.Context, conn clickhouse.Conn, now time.Time) error {
	var outside uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM events WHERE ts > @now OR ts <= @now - 604800",
		ch.Named("now", now)).Scan(&outside); err != nil {
		return fmt.Errorf("check the history: %w", err)
	}
	if outside > 0 {
		return fmt.Errorf("check the history: %d events outside the 7 days before %s", outside, now.Format(time.RFC3339))
	}
	rows, err := conn.Query(ctx, `SELECT DISTINCT toUInt8(substring(cluster, 2)), toUInt32(substring(node, 6)),
    metadata.value[indexOf(metadata.key, 'faultline.io/system-uuid')] FROM events LIMIT 100`)
	if err != nil {
		return fmt.Errorf("check the history: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			ci      uint8
			ni      uint32
			machine string
		)
		if err := rows.Scan(&ci, &ni, &machine); err != nil {
			return fmt.Errorf("check the history: %w", err)
		}
		if want := machineOf(int(ci), int(ni)); machine != want {
			return fmt.Errorf("check the history: node c%d/node-%d names machine %q, its batches' events %q", ci, ni, machine, want)
		}
	}
	return rows.Err()
}
