package clickhouse_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/clickhouse/chtest"
)

// flakyConn is a server with an empty migrations table on which the first
// migration statement fails with err, fails times; everything else
// succeeds. It counts the migration statements run and the migrations
// recorded.
type flakyConn struct {
	driver.Conn
	err      error
	fails    int
	execs    int
	recorded int
}

func (c *flakyConn) Exec(_ context.Context, q string, _ ...any) error {
	if strings.Contains(q, clickhouse.MigrationsTable) {
		return nil // the migrations table's CREATE TABLE IF NOT EXISTS
	}
	c.execs++
	if c.execs <= c.fails {
		return c.err
	}
	return nil
}

func (c *flakyConn) Query(context.Context, string, ...any) (driver.Rows, error) {
	return emptyRows{}, nil
}

func (c *flakyConn) PrepareBatch(context.Context, string, ...driver.PrepareBatchOption) (driver.Batch, error) {
	return recordBatch{c: c}, nil
}

func (c *flakyConn) Close() error { return nil }

type emptyRows struct{ driver.Rows }

func (emptyRows) Next() bool   { return false }
func (emptyRows) Close() error { return nil }
func (emptyRows) Err() error   { return nil }

type recordBatch struct {
	driver.Batch
	c *flakyConn
}

func (recordBatch) Append(...any) error { return nil }
func (b recordBatch) Send() error       { b.c.recorded++; return nil }
func (recordBatch) Close() error        { return nil }

// A migration statement that fails because the server went away (a
// ClickHouse restart mid-file during an upgrade) or timed out (an ON
// CLUSTER ALTER past distributed_ddl_task_timeout) is retried by
// SetupWait like an unreachable server: the statements are idempotent.
// One the server refuses stops start-up at once, naming the file.
func TestSetupWaitRetriesTransientMigrationFailure(t *testing.T) {
	files := fstest.MapFS{"m/0001_t.sql": {Data: []byte("CREATE TABLE IF NOT EXISTS t (a String) ENGINE = MergeTree() ORDER BY a")}}
	migs, err := clickhouse.LoadMigrations(files, "m")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	tests := []struct {
		name  string
		err   error
		retry bool
	}{
		{"connection lost", fmt.Errorf("read data: failed to read block name: %w", io.EOF), true},
		{"connection reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{"distributed DDL timeout", &ch.Exception{Code: 159, Name: "DB::Exception", Message: "Watching task is executing longer than distributed_ddl_task_timeout"}, true},
		{"syntax error", &ch.Exception{Code: 62, Name: "DB::Exception", Message: "Syntax error"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			conn := &flakyConn{err: tt.err, fails: 1}
			setup := func(ctx context.Context) (clickhouse.Conn, error) {
				if _, err := clickhouse.MigrateSchema(ctx, conn, clickhouse.Schema{}, migs, log); err != nil {
					return nil, err
				}
				return conn, nil
			}
			got, err := clickhouse.SetupWaitWith(ctx, clickhouse.Config{}, log, setup)
			if tt.retry {
				if err != nil || got == nil || conn.execs != 2 || conn.recorded != 1 {
					t.Fatalf("err %v after %d runs, %d recorded: want the statement retried and the migration recorded", err, conn.execs, conn.recorded)
				}
				return
			}
			me, ok := errors.AsType[*clickhouse.MigrationError](err)
			if !ok || me.File != "0001_t.sql" || me.Statement != 1 || conn.execs != 1 || conn.recorded != 0 {
				t.Fatalf("err %v after %d runs, %d recorded: want a MigrationError for 0001_t.sql statement 1 at once", err, conn.execs, conn.recorded)
			}
		})
	}
}

func TestMigrationErrorTransient(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"EOF", io.EOF, true},
		{"unexpected EOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"broken pipe", fmt.Errorf("send data: connection broken (EPIPE): %w", syscall.EPIPE), true},
		{"statement deadline", fmt.Errorf("exec: %w", context.DeadlineExceeded), true},
		{"acquire timeout", ch.ErrAcquireConnTimeout, true},
		{"DDL timeout, columns not checked", fmt.Errorf("%w (checking the columns on every host: host down)", &ch.Exception{Code: 159}), true},
		{"too many queries", &ch.Exception{Code: 202}, true},
		{"ZooKeeper lost", &ch.Exception{Code: 999}, true},
		{"syntax error", &ch.Exception{Code: 62}, false},
		{"unknown table", &ch.Exception{Code: 60}, false},
		{"column type", &ch.Exception{Code: 44, Message: "Cannot convert"}, false},
		{"checksum mismatch", fmt.Errorf("%w: applied 2025-01-01T00:00:00Z as 0001_a.sql", clickhouse.ErrChecksumMismatch), false},
		{"bad file", errors.New("no SQL statements"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (&clickhouse.MigrationError{File: "0001_a.sql", Err: tt.err}).Transient(); got != tt.want {
				t.Errorf("Transient() = %v for %v, want %v", got, tt.err, tt.want)
			}
		})
	}
}

// A clickhouse.cluster the server does not know (CREATE DATABASE … ON
// CLUSTER refused: code 170 on 18.16, 701 CLUSTER_DOESNT_EXIST on current
// ClickHouse) is retried: during a joint rollout the cluster's definition
// (remote_servers) may still be on its way, or one server behind
// clickhouse.addr not reloaded yet. It is logged at ERROR naming
// clickhouse.cluster, so that a typo is seen.
func TestSetupWaitRetriesUnknownCluster(t *testing.T) {
	for _, code := range []int32{170, 701} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			var buf strings.Builder
			log := slog.New(slog.NewTextHandler(&buf, nil))
			calls := 0
			setup := func(context.Context) (clickhouse.Conn, error) {
				if calls++; calls == 1 {
					return nil, fmt.Errorf("create database d: %w", &ch.Exception{Code: code, Message: "Requested cluster 'c' not found"})
				}
				return &flakyConn{}, nil
			}
			if _, err := clickhouse.SetupWaitWith(context.Background(), clickhouse.Config{Cluster: "c"}, log, setup); err != nil || calls != 2 {
				t.Fatalf("err %v after %d tries: want a retry", err, calls)
			}
			if out := buf.String(); !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "clickhouse.cluster") {
				t.Fatalf("logged %q, want an ERROR naming clickhouse.cluster", out)
			}
		})
	}
}

// On a real server (18.16 in the testenv), an unknown cluster is retried
// until ctx ends, logged at ERROR naming clickhouse.cluster.
func TestSetupWaitUnknownClusterServer(t *testing.T) {
	srv := chtest.Start(t)
	cfg := srv.Config
	cfg.Cluster = "nosuch_cluster"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var buf syncBuf
	_, err := clickhouse.SetupWait(ctx, cfg, slog.New(slog.NewTextHandler(&buf, nil)))
	if err == nil || ctx.Err() == nil {
		t.Fatalf("err %v (ctx %v): want SetupWait to retry until ctx ends", err, ctx.Err())
	}
	if out := buf.String(); !strings.Contains(out, "level=ERROR") || !strings.Contains(out, `clickhouse.cluster=nosuch_cluster`) {
		t.Fatalf("logged %q, want an ERROR naming clickhouse.cluster", out)
	}
}

// syncBuf is a strings.Builder safe for the logger's writes.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// modeConn is a server whose migrations table has engine.
type modeConn struct {
	driver.Conn
	engine string
}

func (c *modeConn) Exec(context.Context, string, ...any) error { return nil }

func (c *modeConn) QueryRow(context.Context, string, ...any) driver.Row {
	return engineRow{engine: c.engine}
}

func (c *modeConn) Close() error { return nil }

type engineRow struct {
	driver.Row
	engine string
}

func (r engineRow) Scan(dest ...any) error { *dest[0].(*string) = r.engine; return nil }
func (engineRow) Err() error               { return nil }

// A database migrated for the other kind of schema (single server or
// cluster) stops SetupWait with checkMode's error naming clickhouse.cluster.
func TestSetupWaitStopsOnWrongMode(t *testing.T) {
	files := fstest.MapFS{"m/0001_t.sql": {Data: []byte("CREATE TABLE IF NOT EXISTS t (a String) ENGINE = MergeTree() ORDER BY a")}}
	migs, err := clickhouse.LoadMigrations(files, "m")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := &modeConn{engine: "ReplicatedReplacingMergeTree"}
	setup := func(ctx context.Context) (clickhouse.Conn, error) {
		if _, err := clickhouse.MigrateSchema(ctx, conn, clickhouse.Schema{Database: "d"}, migs, log); err != nil {
			return nil, err
		}
		return conn, nil
	}
	_, err = clickhouse.SetupWaitWith(ctx, clickhouse.Config{}, log, setup)
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "clickhouse.cluster: database d was migrated ON CLUSTER") {
		t.Fatalf("err %v (ctx %v): want SetupWait to stop at once with the mode error", err, ctx.Err())
	}
}

// A refused login is retried (a password rotation may be under way) but
// logged at ERROR: it needs an operator, a server starting does not.
func TestSetupWaitLogsRefusedLoginAtError(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want string
	}{
		{"wrong password", fmt.Errorf("clickhouse ping: %w", &ch.Exception{Code: 516, Message: "Authentication failed"}), "level=ERROR"},
		{"server down", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, "level=WARN"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var buf strings.Builder
			log := slog.New(slog.NewTextHandler(&buf, nil))
			calls := 0
			setup := func(context.Context) (clickhouse.Conn, error) {
				if calls++; calls == 1 {
					return nil, tt.err
				}
				return &flakyConn{}, nil
			}
			if _, err := clickhouse.SetupWaitWith(context.Background(), clickhouse.Config{}, log, setup); err != nil || calls != 2 {
				t.Fatalf("err %v after %d tries: want a retry", err, calls)
			}
			if !strings.Contains(buf.String(), tt.want+` msg="clickhouse not ready; retrying"`) {
				t.Fatalf("logged %q, want %s", buf.String(), tt.want)
			}
		})
	}
}
