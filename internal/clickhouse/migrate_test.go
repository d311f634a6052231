package clickhouse_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/clickhouse/chtest"
	"github.com/faultline/faultline/sql"
)

func TestSplitStatements(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"one", "SELECT 1", []string{"SELECT 1"}},
		{"two with trailing", "SELECT 1;\nSELECT 2;\n", []string{"SELECT 1", "SELECT 2"}},
		{"semicolon in string", "SELECT 'a;b'; SELECT 2", []string{"SELECT 'a;b'", "SELECT 2"}},
		{"escaped quote", `SELECT 'it\'s;'; SELECT 2`, []string{`SELECT 'it\'s;'`, "SELECT 2"}},
		{"line comment", "-- x; y\nSELECT 1; -- z;\n", []string{"SELECT 1"}},
		{"block comment", "/* a; b */ SELECT 1", []string{"SELECT 1"}},
		{"comments only", "-- nothing\n/* here */\n;", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := clickhouse.SplitStatements(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(got, "|") != strings.Join(tt.want, "|") || len(got) != len(tt.want) {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
	if _, err := clickhouse.SplitStatements("SELECT 'open"); err == nil {
		t.Fatal("unterminated quote accepted")
	}
}

func TestLoadMigrationsRefuses(t *testing.T) {
	ok := &fstest.MapFile{Data: []byte("SELECT 1")}
	tests := []struct {
		name     string
		files    fstest.MapFS
		wantFile string
		wantErr  string
	}{
		{"bad name", fstest.MapFS{"m/1_x.sql": ok}, "1_x.sql", "NNNN_lowercase_name.sql"},
		{"duplicate version", fstest.MapFS{"m/0001_a.sql": ok, "m/0001_b.sql": ok}, "0001_b.sql", "also used by 0001_a.sql"},
		{"empty", fstest.MapFS{"m/0001_a.sql": {Data: []byte("-- nothing")}}, "0001_a.sql", "no SQL statements"},
		{"unterminated", fstest.MapFS{"m/0001_a.sql": {Data: []byte("SELECT 'x")}}, "0001_a.sql", "unterminated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := clickhouse.LoadMigrations(tt.files, "m")
			me, ok := errors.AsType[*clickhouse.MigrationError](err)
			if !ok || me.File != tt.wantFile || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want a MigrationError for %s containing %q", err, tt.wantFile, tt.wantErr)
			}
		})
	}
}

// TestEmbeddedMigrations checks the shipped files load.
func TestEmbeddedMigrations(t *testing.T) {
	migs, err := clickhouse.LoadMigrations(sql.Migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	if len(migs) < 3 || migs[0].Version != 1 {
		t.Fatalf("migrations = %+v", migs)
	}
}

func TestMigrate(t *testing.T) {
	srv := chtest.Start(t) // applies the shipped migrations: the fresh case
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.Default()

	t.Run("fresh", func(t *testing.T) {
		for _, table := range []string{"events", "actions", "conformance", clickhouse.MigrationsTable} {
			if n := chtest.Count(t, srv.Conn, "SELECT count() FROM system.tables WHERE database = ? AND name = ?", srv.Config.Database, table); n != 1 {
				t.Errorf("table %s: %d", table, n)
			}
		}
		migs, _ := clickhouse.LoadMigrations(sql.Migrations, "migrations")
		if n := chtest.Count(t, srv.Conn, "SELECT uniqExact(version) FROM "+clickhouse.MigrationsTable); n != uint64(len(migs)) {
			t.Errorf("recorded %d migrations, want %d", n, len(migs))
		}
	})
	t.Run("reapply is a no-op", func(t *testing.T) {
		migs, _ := clickhouse.LoadMigrations(sql.Migrations, "migrations")
		before := chtest.Count(t, srv.Conn, "SELECT count() FROM "+clickhouse.MigrationsTable)
		done, err := clickhouse.Migrate(ctx, srv.Conn, migs, log)
		if err != nil || len(done) != 0 {
			t.Fatalf("applied %d, err %v", len(done), err)
		}
		if after := chtest.Count(t, srv.Conn, "SELECT count() FROM "+clickhouse.MigrationsTable); after != before {
			t.Fatalf("migrations table grew from %d to %d rows", before, after)
		}
	})
	t.Run("broken file refused", func(t *testing.T) {
		cfg := srv.Config
		cfg.Database = "broken"
		_, err := clickhouse.SetupFS(ctx, cfg, os.DirFS("testdata"), "broken", log)
		me, ok := errors.AsType[*clickhouse.MigrationError](err)
		if !ok || me.File != "0002_broken.sql" || me.Statement != 2 {
			t.Fatalf("err = %v, want migration 0002_broken.sql statement 2", err)
		}
		if !strings.Contains(err.Error(), "0002_broken.sql") || !strings.Contains(err.Error(), "DateTime64") {
			t.Errorf("error %q does not name the file and the server's reason", err)
		}
		conn, err := clickhouse.Open(ctx, cfg, log)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// 0001 is recorded, 0002 is not, so a fixed file is applied next time.
		applied, err := clickhouse.AppliedMigrations(ctx, conn)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := applied[1]; !ok || len(applied) != 1 {
			t.Fatalf("applied = %v, want only 0001", applied)
		}
	})
	// 18.16 has no ADD COLUMN IF NOT EXISTS: an ALTER that only adds
	// columns and finds them there (the statement ran, its record was lost)
	// counts as applied; any other failure still stops the migration.
	t.Run("added columns rerun", func(t *testing.T) {
		cfg := srv.Config
		cfg.Database = "columns"
		table := fstest.MapFS{"m/0001_t.sql": {Data: []byte("CREATE TABLE IF NOT EXISTS t (a String) ENGINE = MergeTree() ORDER BY a;\n" +
			"ALTER TABLE t\n    ADD COLUMN b String,\n    ADD COLUMN c String")}}
		if _, err := clickhouse.SetupFS(ctx, cfg, table, "m", log); err != nil {
			t.Fatal(err)
		}
		table["m/0002_again.sql"] = &fstest.MapFile{Data: []byte("ALTER TABLE t ADD COLUMN b String, ADD COLUMN c String")}
		if _, err := clickhouse.SetupFS(ctx, cfg, table, "m", log); err != nil {
			t.Fatalf("re-run of an applied ADD COLUMN: %v", err)
		}
		table["m/0003_mixed.sql"] = &fstest.MapFile{Data: []byte("ALTER TABLE t ADD COLUMN b String, MODIFY COLUMN c UInt8")}
		if _, err := clickhouse.SetupFS(ctx, cfg, table, "m", log); err == nil || !strings.Contains(err.Error(), "0003_mixed.sql") {
			t.Fatalf("err = %v, want 0003_mixed.sql refused", err)
		}
	})
	t.Run("changed file refused", func(t *testing.T) {
		cfg := srv.Config
		cfg.Database = "changed"
		if _, err := clickhouse.SetupFS(ctx, cfg, os.DirFS("testdata"), "good", log); err != nil {
			t.Fatal(err)
		}
		changed := fstest.MapFS{"m/0001_first.sql": {Data: []byte("CREATE TABLE IF NOT EXISTS t9 (a UInt8) ENGINE = MergeTree() ORDER BY a")}}
		_, err := clickhouse.SetupFS(ctx, cfg, changed, "m", log)
		if !errors.Is(err, clickhouse.ErrChecksumMismatch) || !strings.Contains(err.Error(), "0001_first.sql") {
			t.Fatalf("err = %v, want ErrChecksumMismatch naming 0001_first.sql", err)
		}
	})
}

func TestDropOlderThan(t *testing.T) {
	srv := chtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, month := range []string{"2025-01-15 10:00:00", "2025-02-28 23:59:59", "2025-03-01 00:00:00", "2025-04-10 00:00:00"} {
		if err := srv.Conn.Exec(ctx, "INSERT INTO events (cluster, node, id, ts, received) SELECT 'c', 'n', ?, toDateTime(?), toDateTime(?)", month, month, month); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Date(2025, 4, 15, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		age  time.Duration
		want []string // dropped
	}{
		{100 * 24 * time.Hour, nil},                         // cutoff 01-05: January still has younger rows
		{45 * 24 * time.Hour, []string{"202501", "202502"}}, // cutoff 03-01 00:00: February ends exactly there
		{44 * 24 * time.Hour, nil},                          // cutoff 03-02: March is not over
		{14 * 24 * time.Hour, []string{"202503"}},           // cutoff 04-01
	}
	for _, tt := range tests {
		got, err := clickhouse.DropOlderThan(ctx, srv.Conn, srv.Config.Database, "events", tt.age, now, slog.Default())
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Errorf("age %s: dropped %v, want %v", tt.age, got, tt.want)
		}
	}
	if n := chtest.Count(t, srv.Conn, "SELECT count() FROM events"); n != 1 {
		t.Fatalf("%d rows left, want the April one", n)
	}
}

// recent_events (filled from events by its materialized view, raw
// actionable events only) is partitioned by day: DropOlderThan drops whole
// days.
func TestDropOlderThanDays(t *testing.T) {
	srv := chtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, day := range []string{"2025-04-01 10:00:00", "2025-04-06 23:59:59", "2025-04-07 00:00:00", "2025-04-14 12:00:00"} {
		if err := srv.Conn.Exec(ctx, "INSERT INTO events (cluster, node, id, ts, received) SELECT 'c', 'n', ?, toDateTime(?), toDateTime(?)", day, day, day); err != nil {
			t.Fatal(err)
		}
	}
	// derived and STORE_ONLY events are not copied
	if err := srv.Conn.Exec(ctx, "INSERT INTO events (cluster, node, id, ts, received, derived_by, processing_strategy) SELECT 'c', 'n', id, now(), now(), d, s FROM (SELECT arrayJoin([('d', 'Rule', ''), ('s', '', 'STORE_ONLY')]) AS x, x.1 AS id, x.2 AS d, x.3 AS s)"); err != nil {
		t.Fatal(err)
	}
	if n := chtest.Count(t, srv.Conn, "SELECT count() FROM recent_events"); n != 4 {
		t.Fatalf("recent_events holds %d rows, want the 4 raw events", n)
	}
	now := time.Date(2025, 4, 15, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		age  time.Duration
		want []string // dropped
	}{
		{14 * 24 * time.Hour, nil},                             // cutoff 04-01 00:00: April 1 is not over
		{8 * 24 * time.Hour, []string{"20250401", "20250406"}}, // cutoff 04-07 00:00: April 6 ends exactly there
		{7*24*time.Hour + time.Hour, nil},                      // cutoff 04-07 23:00: April 7 is not over
		{7 * 24 * time.Hour, []string{"20250407"}},             // cutoff 04-08 00:00
	}
	for _, tt := range tests {
		got, err := clickhouse.DropOlderThan(ctx, srv.Conn, srv.Config.Database, "recent_events", tt.age, now, slog.Default())
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Errorf("age %s: dropped %v, want %v", tt.age, got, tt.want)
		}
	}
	if n := chtest.Count(t, srv.Conn, "SELECT count() FROM recent_events"); n != 1 {
		t.Fatalf("%d rows left, want the April 14 one", n)
	}
}

// TestMigrationOutlivesQueryTimeout: a migration copying existing rows
// (0004, 0005 over a real history) runs longer than query_timeout; the
// roles start with no deadline, so the pool's max_execution_time cut it
// (code 159, retried for ever by SetupWait). Migrations run unbounded.
func TestMigrationOutlivesQueryTimeout(t *testing.T) {
	srv := chtest.Start(t)
	cfg := srv.Config
	cfg.Database = "slow_migration"
	cfg.QueryTimeout = time.Second
	migs := fstest.MapFS{"m/0001_slow.sql": {Data: []byte(
		"CREATE TABLE IF NOT EXISTS slow (n UInt8) ENGINE = MergeTree ORDER BY n;\n" +
			"INSERT INTO slow SELECT sleep(2) FROM system.one;\n")}}
	// No deadline, as a role's start.
	if _, err := clickhouse.SetupFS(context.Background(), cfg, migs, "m", slog.Default()); err != nil {
		t.Fatalf("a migration longer than query_timeout: %v", err)
	}
}

// TestMigrateStatusChangesNothing: `migrate --status` creates neither the
// database nor the migrations table (a status check before the first
// `migrate --cluster` made a single-server migrations table the cluster
// migration then refused; a mistyped database name was created): on a
// database that does not exist, and on one without the migrations table,
// every migration is pending, and nothing is left behind.
func TestMigrateStatusChangesNothing(t *testing.T) {
	srv := chtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	migs, _ := clickhouse.LoadMigrations(sql.Migrations, "migrations")
	if err := srv.Conn.Exec(ctx, "CREATE DATABASE IF NOT EXISTS status_empty"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ database, says string }{
		{"status_missing", "database status_missing does not exist"},
		{"status_empty", "no migrations table in database status_empty"},
	} {
		t.Run(tc.database, func(t *testing.T) {
			cfg := srv.Config
			cfg.Database = tc.database
			var out bytes.Buffer
			if err := clickhouse.MigrateCommand(ctx, cfg, true, &out, slog.Default()); err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(out.String(), "pending  "); n != len(migs) || !strings.Contains(out.String(), tc.says) {
				t.Errorf("%d pending of %d, want all, and %q:\n%s", n, len(migs), tc.says, out.String())
			}
			if n := chtest.Count(t, srv.Conn, "SELECT count() FROM system.tables WHERE database = ?", tc.database); n != 0 {
				t.Errorf("%d tables created in %s", n, tc.database)
			}
		})
	}
	if n := chtest.Count(t, srv.Conn, "SELECT count() FROM system.databases WHERE name = 'status_missing'"); n != 0 {
		t.Error("--status created the database")
	}
	var out bytes.Buffer
	if err := clickhouse.MigrateCommand(ctx, srv.Config, true, &out, slog.Default()); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "applied  "); n != len(migs) {
		t.Errorf("migrated database: %d applied of %d:\n%s", n, len(migs), out.String())
	}
}

// alterConn is a two-host cluster on which an ALTER … ON CLUSTER ADD
// COLUMN is answered with the first host's "already exists" (code 44, the
// statement rerun) whatever the other hosts did; has says how many of the
// added columns each host has (missing: the host cannot be asked). It
// counts the migrations recorded.
type alterConn struct {
	driver.Conn
	has      map[string]uint64
	recorded int
}

func (c *alterConn) Exec(_ context.Context, q string, _ ...any) error {
	if strings.Contains(q, "ADD COLUMN") {
		return &ch.Exception{Code: 44, Message: "There was an error on [h1:9000]: Cannot add column b: column with this name already exists"}
	}
	return nil
}

func (c *alterConn) QueryRow(_ context.Context, q string, args ...any) driver.Row {
	if strings.Contains(q, "remote(") {
		n, ok := c.has[args[0].(string)]
		return countRow{n: n, ok: ok}
	}
	return engineRow{engine: "ReplicatedReplacingMergeTree"}
}

func (c *alterConn) Query(_ context.Context, q string, _ ...any) (driver.Rows, error) {
	if strings.Contains(q, "system.clusters") {
		return &hostRows{hosts: []string{"h1", "h2"}}, nil
	}
	return emptyRows{}, nil
}

func (c *alterConn) PrepareBatch(context.Context, string, ...driver.PrepareBatchOption) (driver.Batch, error) {
	return countBatch{n: &c.recorded}, nil
}

type countRow struct {
	driver.Row
	n  uint64
	ok bool
}

func (r countRow) Scan(dest ...any) error {
	if !r.ok {
		return errors.New("connection refused")
	}
	*dest[0].(*uint64) = r.n
	return nil
}

type hostRows struct {
	driver.Rows
	hosts []string
	i     int
}

func (r *hostRows) Next() bool { r.i++; return r.i <= len(r.hosts) }
func (r *hostRows) Scan(dest ...any) error {
	*dest[0].(*string), *dest[1].(*uint32) = r.hosts[r.i-1], 9000
	return nil
}
func (r *hostRows) Close() error { return nil }
func (r *hostRows) Err() error   { return nil }

type countBatch struct {
	driver.Batch
	n *int
}

func (countBatch) Append(...any) error { return nil }
func (b countBatch) Send() error       { *b.n++; return nil }
func (countBatch) Close() error        { return nil }

// On a cluster, an ALTER … ON CLUSTER ADD COLUMN rerun and answered "already
// exists" reports one host's answer only (the first error): another
// host's may have failed, or only lag behind. The columns are checked on
// every host before the migration is recorded; a host without them stops
// it, naming the file, with a transient error (SetupWait retries). A host
// that cannot be asked leaves it applied, as before the check.
func TestMigrateClusterColumnsAlreadyAdded(t *testing.T) {
	files := fstest.MapFS{
		"m/0001_t.sql": {Data: []byte("CREATE TABLE IF NOT EXISTS t (cluster String, node String) ENGINE = MergeTree() ORDER BY (cluster, node)")},
		"m/0002_b.sql": {Data: []byte("ALTER TABLE t ADD COLUMN b String")},
	}
	migs, err := clickhouse.LoadMigrations(files, "m")
	if err != nil {
		t.Fatal(err)
	}
	s := clickhouse.Schema{Cluster: "c", Database: "d", ZooKeeperPath: clickhouse.DefaultZooKeeperPath, ReplicaName: clickhouse.DefaultReplicaName}
	for _, tc := range []struct {
		name    string
		has     map[string]uint64
		applied bool
	}{
		{"every host has them", map[string]uint64{"h1:9000": 1, "h2:9000": 1}, true},
		{"a host lacks them", map[string]uint64{"h1:9000": 1, "h2:9000": 0}, false},
		{"a host cannot be asked", map[string]uint64{"h1:9000": 1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := &alterConn{has: tc.has}
			_, err := clickhouse.MigrateSchema(context.Background(), conn, s, migs, slog.New(slog.DiscardHandler))
			if tc.applied {
				if err != nil || conn.recorded != 2 {
					t.Fatalf("err %v, %d recorded: want both migrations applied", err, conn.recorded)
				}
				return
			}
			me, ok := errors.AsType[*clickhouse.MigrationError](err)
			if !ok || me.File != "0002_b.sql" || conn.recorded != 1 || !strings.Contains(err.Error(), "not on every host") {
				t.Fatalf("err %v, %d recorded: want 0002_b.sql refused, naming the hosts' columns", err, conn.recorded)
			}
			// A replica lagging (its DDL or replication queue behind, just
			// restarted) lacks them too: SetupWait retries until it catches up.
			if !me.Transient() {
				t.Errorf("err %v: want it transient (SetupWait retries)", err)
			}
		})
	}
}

// A replica lagging behind (just restarted, its DDL queue behind) lacks
// the columns a rerun ALTER … ON CLUSTER answered "already exists" for:
// SetupWait retries until it has them, rather than stopping the role
// during a rolling restart after a schema upgrade.
func TestSetupWaitRetriesLaggingReplica(t *testing.T) {
	files := fstest.MapFS{
		"m/0001_t.sql": {Data: []byte("CREATE TABLE IF NOT EXISTS t (cluster String, node String) ENGINE = MergeTree() ORDER BY (cluster, node)")},
		"m/0002_b.sql": {Data: []byte("ALTER TABLE t ADD COLUMN b String")},
	}
	migs, err := clickhouse.LoadMigrations(files, "m")
	if err != nil {
		t.Fatal(err)
	}
	s := clickhouse.Schema{Cluster: "c", Database: "d", ZooKeeperPath: clickhouse.DefaultZooKeeperPath, ReplicaName: clickhouse.DefaultReplicaName}
	log := slog.New(slog.DiscardHandler)
	conn := &alterConn{has: map[string]uint64{"h1:9000": 1, "h2:9000": 0}}
	tries := 0
	setup := func(ctx context.Context) (clickhouse.Conn, error) {
		if tries++; tries == 3 {
			conn.has["h2:9000"] = 1 // the replica caught up
		}
		if _, err := clickhouse.MigrateSchema(ctx, conn, s, migs, log); err != nil {
			return nil, err
		}
		return conn, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The fake has no applied migrations: 0001 is recorded at each try.
	if _, err := clickhouse.SetupWaitWith(ctx, clickhouse.Config{}, log, setup); err != nil || tries != 3 || conn.recorded != 4 {
		t.Fatalf("err %v after %d tries, %d recorded: want retried until the replica has the columns, then 0002 recorded", err, tries, conn.recorded)
	}
}
