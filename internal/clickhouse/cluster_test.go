package clickhouse_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/analytics"
	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/internal/history"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/store"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
	sqlfiles "github.com/faultline/faultline/sql"
)

var update = flag.Bool("update", false, "rewrite testdata/cluster_schema.sql from the translation (review the diff!)")

// TestClusterTranslation holds the cluster schema to the single-server
// files: the translation of the shipped migrations is the golden file
// testdata/cluster_schema.sql (regenerate with -update and review), and
// statements the translation does not know are refused, naming the file
// and statement — a new migration cannot silently drift.
func TestClusterTranslation(t *testing.T) {
	migs, err := clickhouse.LoadMigrations(sqlfiles.Migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	s := clickhouse.Schema{Cluster: "fleet", Database: "faultline", ZooKeeperPath: clickhouse.DefaultZooKeeperPath, ReplicaName: clickhouse.DefaultReplicaName}
	cms, err := s.ForCluster(migs)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i, m := range cms {
		if m.Checksum != migs[i].Checksum || m.File != migs[i].File {
			t.Errorf("%s: the cluster migration must keep the file's name and checksum", m.File)
		}
		fmt.Fprintf(&b, "-- %s\n", m.File)
		for _, st := range m.Statements {
			b.WriteString(st + ";\n")
		}
	}
	golden := filepath.Join("testdata", "cluster_schema.sql")
	if *update {
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if b.String() != string(want) {
		t.Errorf("the cluster translation of sql/migrations changed; review and run go test -run TestClusterTranslation -update:\n%s", b.String())
	}
	// Every table of the files is a Replicated local table plus a
	// Distributed one; every view reads and writes local tables.
	all := b.String()
	for _, table := range []string{"events", "actions", "conformance", "recent_events", "derived_events"} {
		for _, want := range []string{
			"CREATE TABLE IF NOT EXISTS faultline." + table + "_local ON CLUSTER 'fleet'",
			"ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/faultline/" + table + "_local', '{replica}')",
			"CREATE TABLE IF NOT EXISTS faultline." + table + " ON CLUSTER 'fleet' AS faultline." + table + "_local ENGINE = Distributed('fleet', faultline, " + table + "_local, cityHash64(cluster, node))",
		} {
			if !strings.Contains(all, want) {
				t.Errorf("translation lacks %q", want)
			}
		}
	}
	for _, want := range []string{
		"CREATE MATERIALIZED VIEW IF NOT EXISTS faultline.recent_events_mv ON CLUSTER 'fleet' TO faultline.recent_events_local AS SELECT",
		"FROM faultline.events_local\nWHERE derived_by = '' AND processing_strategy != 'STORE_ONLY'",
		"ALTER TABLE faultline.events_local ON CLUSTER 'fleet' ADD COLUMN submitter_name String",
		"DROP TABLE IF EXISTS faultline.events ON CLUSTER 'fleet'",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("translation lacks %q", want)
		}
	}
	single, err := clickhouse.Schema{Database: "faultline"}.ForCluster(migs)
	if err != nil || len(single) != len(migs) || !slices.Equal(single[0].Statements, migs[0].Statements) {
		t.Errorf("a single-server schema must apply the files as written (err %v)", err)
	}

	refused := []struct {
		name, sql, want string
	}{
		{"no shard columns", "CREATE TABLE IF NOT EXISTS t (a String) ENGINE = MergeTree() ORDER BY a", "no cluster and node String columns"},
		{"plain view", "CREATE VIEW IF NOT EXISTS v AS SELECT 1", "only CREATE TABLE IF NOT EXISTS"},
		{"not idempotent", "CREATE TABLE t (cluster String, node String) ENGINE = MergeTree() ORDER BY node", "only CREATE TABLE IF NOT EXISTS"},
		{"partition op", "ALTER TABLE events DROP PARTITION 202401", "only ADD, DROP and MODIFY COLUMN"},
		{"unknown alter", "ALTER TABLE nowhere ADD COLUMN x String", "no earlier migration creates"},
		{"view of unknown", "CREATE MATERIALIZED VIEW IF NOT EXISTS v TO events AS SELECT * FROM elsewhere", "reads elsewhere"},
		{"other engine", "CREATE TABLE IF NOT EXISTS t (cluster String, node String) ENGINE = Log", "only CREATE TABLE IF NOT EXISTS"},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			fs := fstest.MapFS{
				"m/0001_base.sql":  {Data: []byte("CREATE TABLE IF NOT EXISTS events (cluster String, node String, id String) ENGINE = ReplacingMergeTree() ORDER BY (cluster, node, id)")},
				"m/0002_thing.sql": {Data: []byte("SELECT 1;\n" + tt.sql)},
			}
			ms, err := clickhouse.LoadMigrations(fs, "m")
			if err != nil {
				t.Fatal(err)
			}
			ms[1].Statements = ms[1].Statements[1:] // the statement under test is the first
			_, err = s.ForCluster(ms)
			me, ok := errors.AsType[*clickhouse.MigrationError](err)
			if !ok || me.File != "0002_thing.sql" || me.Statement != 1 || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want 0002_thing.sql statement 1 refused with %q", err, tt.want)
			}
		})
	}
}

// TestCluster applies the cluster schema to two ClickHouse 18.16 servers
// sharing a ZooKeeper, as ClusterSharded (each server a shard) and as
// ClusterReplicated (both servers replicas of one shard), and checks that
// it is the single-server schema, that rows written through either server
// are read from both and live on the shard of their node, that the views
// copy per shard, that retention drops partitions on every server, and that
// a server killed mid-stream loses nothing.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ZooKeeper and two ClickHouse servers")
	}
	c := testenv.StartClickHouseCluster(t, 2)
	n1, n2 := c.Nodes[0].Addr(), c.Nodes[1].Addr()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	t.Run("schema", func(t *testing.T) {
		ctx := ctxFor(t, 3*time.Minute)
		cl := clusterConfig(testenv.ClusterSharded, "cl_schema", n1, n2)
		var out bytes.Buffer
		// A status check first, without the cluster: it creates nothing the
		// cluster migration would then refuse as a single-server schema.
		plain := cl
		plain.Cluster = ""
		if err := clickhouse.MigrateCommand(ctx, plain, true, &out, log); err != nil || !strings.Contains(out.String(), "database cl_schema does not exist") {
			t.Fatalf("status before migrating: %v\n%s", err, out.String())
		}
		out.Reset()
		if err := clickhouse.MigrateCommand(ctx, cl, false, &out, log); err != nil {
			t.Fatal(err)
		}
		migs, _ := clickhouse.LoadMigrations(sqlfiles.Migrations, "migrations")
		if !strings.Contains(out.String(), fmt.Sprintf("cluster sharded schema up to date (%d migrations, %d applied now)", len(migs), len(migs))) {
			t.Errorf("migrate printed:\n%s", out.String())
		}
		out.Reset()
		cl2 := cl
		cl2.Addr = n2 // the other server sees the record: nothing to do
		if err := clickhouse.MigrateCommand(ctx, cl2, false, &out, log); err != nil || !strings.Contains(out.String(), "0 applied now") {
			t.Fatalf("second migrate through the other server: %v\n%s", err, out.String())
		}
		out.Reset()
		if err := clickhouse.MigrateCommand(ctx, cl2, true, &out, log); err != nil || strings.Count(out.String(), "applied  ") != len(migs) {
			t.Fatalf("status through the other server: %v\n%s", err, out.String())
		}
		if err := clickhouse.MigrateCommand(ctx, plain, true, io.Discard, log); err == nil || !strings.Contains(err.Error(), "migrated ON CLUSTER") {
			t.Fatalf("status without the cluster: %v", err)
		}
		single := clickhouse.DefaultConfig()
		single.Addr, single.Database = n1, "cl_single"
		sconn, err := clickhouse.Setup(ctx, single, log)
		if err != nil {
			t.Fatal(err)
		}
		defer sconn.Close()

		describe := func(conn clickhouse.Conn, db, table string) (cols, keys string) {
			t.Helper()
			rows, err := conn.Query(ctx, `SELECT name, type FROM system.columns WHERE database = ? AND table = ? ORDER BY name`, db, table)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			for rows.Next() {
				var n, ty string
				if err := rows.Scan(&n, &ty); err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(&b, "%s %s, ", n, ty)
			}
			rows.Close()
			var engine, pk, sk, prim string
			if err := conn.QueryRow(ctx, `SELECT engine, partition_key, sorting_key, primary_key FROM system.tables WHERE database = ? AND name = ?`, db, table).Scan(&engine, &pk, &sk, &prim); err != nil {
				t.Fatalf("%s.%s: %v", db, table, err)
			}
			return b.String(), strings.Join([]string{strings.TrimPrefix(engine, "Replicated"), pk, sk, prim}, " | ")
		}
		for _, addr := range []string{n1, n2} {
			ncfg := cl
			ncfg.Addr = addr
			conn, err := clickhouse.Open(ctx, ncfg, log)
			if err != nil {
				t.Fatal(err)
			}
			for _, table := range clickhouse.RetainedTables {
				wantCols, wantKeys := describe(sconn, "cl_single", table)
				localCols, localKeys := describe(conn, "cl_schema", table+clickhouse.LocalSuffix)
				distCols, _ := describe(conn, "cl_schema", table)
				if localCols != wantCols || distCols != wantCols {
					t.Errorf("%s on %s: columns differ from the single-server schema:\nsingle:      %s\nlocal:       %s\ndistributed: %s", table, addr, wantCols, localCols, distCols)
				}
				if localKeys != wantKeys {
					t.Errorf("%s on %s: engine and keys %q, single-server %q", table, addr, localKeys, wantKeys)
				}
			}
			for _, table := range clickhouse.RecentTables {
				want, _ := describe(sconn, "cl_single", table)
				if got, _ := describe(conn, "cl_schema", table+clickhouse.LocalSuffix); got != want {
					t.Errorf("%s on %s: columns %s, single-server %s", table, addr, got, want)
				}
			}
			var views uint64
			if err := conn.QueryRow(ctx, `SELECT count() FROM system.tables WHERE database = 'cl_schema' AND engine = 'MaterializedView' AND like(create_table_query, '%_local%')`).Scan(&views); err != nil || views != 2 {
				t.Errorf("%s: %d materialized views over local tables (err %v), want 2", addr, views, err)
			}
			var recorded uint64
			if err := conn.QueryRow(ctx, `SELECT uniqExact(version) FROM cl_schema.`+clickhouse.MigrationsTable).Scan(&recorded); err != nil || recorded != uint64(len(migs)) {
				t.Errorf("%s: %d migrations recorded (err %v), want %d", addr, recorded, err, len(migs))
			}
			conn.Close()
		}
		// A database of one kind is not taken for the other.
		wrong := single
		wrong.Cluster = testenv.ClusterSharded
		if _, err := clickhouse.Setup(ctx, wrong, log); err == nil || !strings.Contains(err.Error(), "clickhouse.cluster: database cl_single was migrated for a single server") {
			t.Errorf("cluster config on a single-server database: %v", err)
		}
		wrong = cl
		wrong.Cluster = ""
		if _, err := clickhouse.Setup(ctx, wrong, log); err == nil || !strings.Contains(err.Error(), "clickhouse.cluster: database cl_schema was migrated ON CLUSTER") {
			t.Errorf("single-server config on a cluster database: %v", err)
		}
	})

	t.Run("added columns checked on every host", func(t *testing.T) {
		// What a migration falls back on when an ALTER ON CLUSTER is left
		// unanswered by a host (18.16's DDL worker race).
		ctx := ctxFor(t, time.Minute)
		cl := clusterConfig(testenv.ClusterSharded, "cl_schema", n1, n2)
		conn := openOne(t, cl, log)
		defer conn.Close()
		s := clickhouse.Schema{Cluster: testenv.ClusterSharded, Database: "cl_schema"}
		for _, c := range []struct {
			stmt, src string
			want      bool
		}{
			{"ALTER TABLE cl_schema.events_local ON CLUSTER sharded ADD COLUMN submitter_name String, ADD COLUMN submitter_role String",
				"ALTER TABLE events ADD COLUMN submitter_name String, ADD COLUMN submitter_role String", true},
			{"ALTER TABLE cl_schema.events_local ON CLUSTER sharded ADD COLUMN submitter_name String, ADD COLUMN not_there String",
				"ALTER TABLE events ADD COLUMN submitter_name String, ADD COLUMN not_there String", false},
		} {
			got, err := clickhouse.ColumnsOnEveryHost(ctx, conn, s, c.stmt, c.src)
			if err != nil || got != c.want {
				t.Errorf("%s: %v (err %v), want %v", c.src, got, err, c.want)
			}
		}
	})

	t.Run("sharded writes and reads", func(t *testing.T) {
		ctx := ctxFor(t, 3*time.Minute)
		via1 := setupCluster(t, clusterConfig(testenv.ClusterSharded, "cl_sharded", n1, n2), log)
		via2 := setupCluster(t, clusterConfig(testenv.ClusterSharded, "cl_sharded", n2, n1), log)
		evs := clusterEvents(0, 600)
		half := len(evs) / 2
		// Through the first server, through the second, and a third again
		// through the second (a store retry writes its batch twice).
		writeEvents(t, store.New(via1, log, nil), evs[:half])
		writeEvents(t, store.New(via2, log, nil), evs[half:])
		writeEvents(t, store.New(via2, log, nil), evs[:half/3])
		raw, derived := kinds(evs)
		for name, conn := range map[string]clickhouse.Conn{"first": via1, "second": via2} {
			for q, want := range map[string]int{
				"SELECT uniqExact(id) FROM events":                          len(evs),
				"SELECT count() FROM (SELECT id FROM events LIMIT 1 BY id)": len(evs),
				"SELECT uniqExact(id) FROM recent_events":                   raw,
				"SELECT uniqExact(id) FROM derived_events":                  derived,
			} {
				if got := count(t, conn, q); got != uint64(want) {
					t.Errorf("through the %s server: %s = %d, want %d", name, q, got, want)
				}
			}
		}
		// Both servers answer an analytics query the same.
		qs, _ := analytics.Builtin()
		params := map[string]string{"since": "2026-01-01", "until": "2026-01-02"}
		r1, err1 := analytics.Run(ctx, via1, qs["events_per_day"], params, time.Now())
		r2, err2 := analytics.Run(ctx, via2, qs["events_per_day"], params, time.Now())
		if err1 != nil || err2 != nil || fmt.Sprint(r1.Rows) != fmt.Sprint(r2.Rows) || len(r1.Rows) != 20 {
			t.Errorf("events_per_day through the two servers: %v %v\n%v\n%v", err1, err2, r1, r2)
		}
		// The gateway's history pages through them newest first, each once
		// (a node's events are on one shard with their retried copies).
		var want []string
		for j := 580; j >= 0; j -= 20 {
			want = append(want, fmt.Sprintf("ev-%06d", j))
		}
		for name, conn := range map[string]clickhouse.Conn{"first": via1, "second": via2} {
			h := history.New(conn, log)
			req := &faultlinev1.ListEventsRequest{Node: "node-00", Limit: 4}
			var got []string
			for range 20 {
				resp, err := h.ListEvents(ctx, "alpha", req)
				if err != nil {
					t.Fatal(err)
				}
				for _, ev := range resp.GetEvents() {
					got = append(got, ev.GetId())
				}
				if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
					break
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("history through the %s server, 4 a page:\ngot  %v\nwant %v", name, got, want)
			}
		}
		// Each node's events (and their retried copies) are on one shard,
		// and each shard's view copied its own rows.
		shard := func(addr, q string) []string {
			conn := openOne(t, clusterConfig(testenv.ClusterSharded, "cl_sharded", addr), log)
			defer conn.Close()
			rows, err := conn.Query(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var out []string
			for rows.Next() {
				var s string
				if err := rows.Scan(&s); err != nil {
					t.Fatal(err)
				}
				out = append(out, s)
			}
			return out
		}
		nodes1 := shard(n1, "SELECT DISTINCT concat(cluster, '/', node) FROM events_local")
		nodes2 := shard(n2, "SELECT DISTINCT concat(cluster, '/', node) FROM events_local")
		if len(nodes1) == 0 || len(nodes2) == 0 || len(nodes1)+len(nodes2) != 20 {
			t.Errorf("nodes per shard: %v and %v, want 20 split over both", nodes1, nodes2)
		}
		for _, n := range nodes1 {
			if slices.Contains(nodes2, n) {
				t.Errorf("node %s has events on both shards", n)
			}
		}
		dups := shard(n1, "SELECT toString(count() - uniqExact(id)) FROM events_local")[0] + "+" + shard(n2, "SELECT toString(count() - uniqExact(id)) FROM events_local")[0]
		if dups == "0+0" {
			t.Errorf("no retried copies found on the shards (%s): the retry was not written", dups)
		}
		for _, addr := range []string{n1, n2} {
			if stray := shard(addr, "SELECT id FROM recent_events_local WHERE id NOT IN (SELECT id FROM events_local)"); len(stray) > 0 {
				t.Errorf("%s: recent_events rows whose events are on another shard: %v", addr, stray)
			}
		}

		// Retention drops a partition on every shard through the
		// Distributed table's name.
		old := clusterEvents(10000, 40)
		for _, ev := range old {
			ev.ReceivedTimestamp = timestamppb.New(time.Date(2025, 1, 10, 0, 0, 0, 0, time.UTC))
		}
		writeEvents(t, store.New(via1, log, nil), old)
		dropped, err := clickhouse.DropOlderThan(ctx, via1, "cl_sharded", "events", 90*24*time.Hour, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), log)
		if err != nil || !slices.Equal(dropped, []string{"202501"}) {
			t.Fatalf("dropped %v (err %v), want 202501", dropped, err)
		}
		for _, addr := range []string{n1, n2} {
			if left := shard(addr, "SELECT toString(count()) FROM events_local WHERE toYYYYMM(received) = 202501")[0]; left != "0" {
				t.Errorf("%s: %s rows of 202501 left after retention", addr, left)
			}
		}
		if got := count(t, via2, "SELECT uniqExact(id) FROM events"); got != uint64(len(evs)) {
			t.Errorf("retention took %d rows of the current month", uint64(len(evs))-got)
		}
	})

	t.Run("replica killed mid-stream", func(t *testing.T) {
		ctx := ctxFor(t, 4*time.Minute)
		cfg := clusterConfig(testenv.ClusterReplicated, "cl_repl", n1, n2)
		cfg.ZooKeeperPath = "/clickhouse/tables/one/{database}/{table}"
		cfg.DialTimeout = 2 * time.Second
		conn := setupCluster(t, cfg, log)
		h := store.New(conn, log, nil)
		const batches, per = 30, 20
		evs := clusterEvents(0, batches*per)
		raw, _ := kinds(evs)
		// The writer streams batches as the pipeline would (a failed batch
		// is retried, never skipped: its offsets are not committed) while
		// the first server is killed mid-stream and started again later.
		var written atomic.Int32
		var retried int
		done := make(chan error, 1)
		go func() {
			for b := range batches {
				for try := 0; ; try++ {
					_, err := h.Handle(ctx, records(evs[b*per:(b+1)*per]))
					if err == nil {
						break
					}
					retried++
					if try > 100 || ctx.Err() != nil {
						done <- fmt.Errorf("batch %d: %w", b, err)
						return
					}
					time.Sleep(200 * time.Millisecond)
				}
				written.Add(1)
			}
			done <- nil
		}()
		waitFor := func(n int32) {
			for written.Load() < n {
				time.Sleep(5 * time.Millisecond)
			}
		}
		waitFor(8)
		c.Nodes[0].Kill()
		t.Logf("killed %s after %d batches", n1, written.Load())
		waitFor(20)
		c.Nodes[0].Start()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		t.Logf("%d batch retries while %s was down", retried, n1)
		// Each server has every row once it caught up.
		caught := time.Now()
		defer func() {
			t.Logf("replicas caught up %s after the last batch", time.Since(caught).Round(10*time.Millisecond))
		}()
		for _, addr := range []string{n1, n2} {
			one := openOne(t, cfg, log, addr)
			deadline := time.Now().Add(90 * time.Second)
			for {
				ev, rec := count(t, one, "SELECT uniqExact(id) FROM events_local"), count(t, one, "SELECT uniqExact(id) FROM recent_events_local")
				if ev == uint64(len(evs)) && rec == uint64(raw) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s holds %d events and %d recent_events, want %d and %d", addr, ev, rec, len(evs), raw)
				}
				time.Sleep(500 * time.Millisecond)
			}
			if got := count(t, one, "SELECT uniqExact(id) FROM events"); got != uint64(len(evs)) {
				t.Errorf("%s reads %d events through the Distributed table, want %d", addr, got, len(evs))
			}
			one.Close()
		}
	})
}

// clusterConfig reaches database db on the cluster topology through addrs
// (in order).
func clusterConfig(topology, db string, addrs ...string) clickhouse.Config {
	cfg := clickhouse.DefaultConfig()
	cfg.Addr, cfg.Database, cfg.Cluster, cfg.Password = strings.Join(addrs, ","), db, topology, config.Secret{}
	return cfg
}

func setupCluster(t *testing.T, cfg clickhouse.Config, log *slog.Logger) clickhouse.Conn {
	t.Helper()
	conn, err := clickhouse.Setup(ctxFor(t, 3*time.Minute), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// openOne opens cfg's database on one server only (addr, or cfg.Addr).
func openOne(t *testing.T, cfg clickhouse.Config, log *slog.Logger, addr ...string) clickhouse.Conn {
	t.Helper()
	if len(addr) > 0 {
		cfg.Addr = addr[0]
	}
	conn, err := clickhouse.Open(ctxFor(t, time.Minute), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func count(t *testing.T, conn clickhouse.Conn, q string) uint64 {
	t.Helper()
	var n uint64
	if err := conn.QueryRow(ctxFor(t, time.Minute), q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// clusterEvents returns n events of 20 nodes in two clusters: raw Xids,
// every 7th derived, every 11th STORE_ONLY.
func clusterEvents(from, n int) []*datamodels.HealthEvent {
	base := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	out := make([]*datamodels.HealthEvent, n)
	for i := range n {
		j := from + i
		ts := timestamppb.New(base.Add(time.Duration(j) * time.Second))
		ev := &datamodels.HealthEvent{
			Version: 1, Agent: "test", ComponentClass: "GPU", CheckName: "SysLogsXIDError",
			IsFatal: true, Message: fmt.Sprintf("event %d", j), ErrorCode: []string{"XID-79"},
			EntitiesImpacted:   []*datamodels.Entity{{EntityType: "GPU", EntityValue: fmt.Sprintf("GPU-%d", j%8)}},
			GeneratedTimestamp: ts, ReceivedTimestamp: ts,
			NodeName: fmt.Sprintf("node-%02d", j%10), Cluster: []string{"alpha", "beta"}[j/10%2], Id: fmt.Sprintf("ev-%06d", j),
		}
		switch {
		case j%7 == 0:
			ev.DerivedBy, ev.CheckName = "RepeatedXIDOnSameGPU", "RepeatedXIDOnSameGPU"
		case j%11 == 0:
			ev.ProcessingStrategy = datamodels.ProcessingStrategy_STORE_ONLY
		}
		out[i] = ev
	}
	return out
}

// kinds counts the raw actionable events (recent_events copies them) and
// the derived ones (derived_events copies them).
func kinds(evs []*datamodels.HealthEvent) (raw, derived int) {
	for _, ev := range evs {
		switch {
		case ev.GetDerivedBy() != "":
			derived++
		case ev.GetProcessingStrategy() != datamodels.ProcessingStrategy_STORE_ONLY:
			raw++
		}
	}
	return raw, derived
}

func records(evs []*datamodels.HealthEvent) []*kgo.Record {
	recs := make([]*kgo.Record, len(evs))
	for i, ev := range evs {
		v, err := events.Marshal(ev)
		if err != nil {
			panic(err)
		}
		recs[i] = &kgo.Record{Topic: events.TopicEvents, Key: events.Key(ev.GetCluster(), ev.GetNodeName()), Value: v}
	}
	return recs
}

func writeEvents(t *testing.T, h *store.Handler, evs []*datamodels.HealthEvent) {
	t.Helper()
	res, err := h.Handle(ctxFor(t, time.Minute), records(evs))
	if err != nil || len(res.Dead) > 0 {
		t.Fatalf("store: %v %v", err, res.Dead)
	}
}
