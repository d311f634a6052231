package testenv

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/faultline/faultline/internal/chserver"
)

// ClickHouse is a clickhouse-server started by StartClickHouse (Debian's
// 18.16.1 here; any later server takes the same config).
//
// Measured on a 2-core machine: ready (native Ping succeeds) 0.2-0.4 s after
// exec, a graceful Stop ~1 s, ~80 MB RSS when idle.
type ClickHouse struct {
	tb       testing.TB
	addr     string
	httpAddr string
	proc     *process

	closeOnce sync.Once
}

// clickhouseUsersOverride makes idle connections notice a shutdown within
// 1 s instead of poll_interval's default 10 s, so Stop takes ~1 s, not 10.
const clickhouseUsersOverride = `<?xml version="1.0"?>
<yandex>
    <profiles>
        <default>
            <poll_interval>1</poll_interval>
        </default>
    </profiles>
</yandex>
`

// StartClickHouse starts clickhouse-server on free 127.0.0.1 ports (native
// and HTTP) with its data in the test's temporary directory, and waits until
// a native-protocol Ping succeeds. It is stopped when the test ends.
func StartClickHouse(tb testing.TB) *ClickHouse {
	tb.Helper()
	Server(tb, "a ClickHouse server", nil) // -short
	ps := freePorts(tb, 2)
	return startClickHouse(tb, "clickhouse", ps[0], ps[1], nil)
}

// startClickHouse starts a server on the given native and HTTP ports with
// extra config.d files (name -> XML; the server merges them into the
// config internal/chserver writes).
func startClickHouse(tb testing.TB, name string, tcp, http int, configD map[string]string) *ClickHouse {
	tb.Helper()
	bin, modeArgs, err := chserver.FindBinary()
	if err != nil {
		missing(tb, "clickhouse", "no clickhouse-server binary; set FAULTLINE_CLICKHOUSE_BIN")
	}
	dir := tb.TempDir()
	// The config is the one `faultline dev` runs with (internal/chserver).
	cfgPath, err := chserver.WriteConfig(dir, tcp, http)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	// Test-only overrides, merged by the server from the .d directories.
	mkdirs(tb, filepath.Join(dir, "users.d"), filepath.Join(dir, "config.d"))
	writeFile(tb, filepath.Join(dir, "users.d", "testenv.xml"), []byte(clickhouseUsersOverride), 0o644)
	for file, xml := range configD {
		writeFile(tb, filepath.Join(dir, "config.d", file), []byte(xml), 0o644)
	}

	g := newGroup(tb)
	c := &ClickHouse{
		tb:       tb,
		addr:     fmt.Sprintf("127.0.0.1:%d", tcp),
		httpAddr: fmt.Sprintf("127.0.0.1:%d", http),
		proc: g.add(&process{
			name:    name,
			path:    bin,
			args:    append(modeArgs, "--config-file="+cfgPath),
			dir:     dir,
			logPath: filepath.Join(dir, "log", "clickhouse-stdout.log"),
		}),
	}
	tb.Cleanup(c.Close)
	c.Start()
	return c
}

// Addr returns the native-protocol address, host:port.
func (c *ClickHouse) Addr() string { return c.addr }

// HTTPAddr returns the HTTP interface address, host:port. clickhouse-go's
// HTTP protocol does not work against 18.16; this is for curl-style checks.
func (c *ClickHouse) HTTPAddr() string { return c.httpAddr }

// Start starts the server again after Stop, on the same ports and data
// directory, and waits until it answers Ping.
func (c *ClickHouse) Start() {
	c.tb.Helper()
	if err := c.proc.start(); err != nil {
		c.tb.Fatalf("testenv: %v", err)
	}
	began := time.Now()
	if err := waitReady(c.proc, 60*time.Second, c.ping); err != nil {
		c.tb.Fatalf("testenv: %v\n%s", err, c.proc.logTail(60))
	}
	c.tb.Logf("testenv: %s ready on %s in %s (dir %s)", c.proc.name, c.addr, time.Since(began).Round(time.Millisecond), c.proc.dir)
}

func (c *ClickHouse) ping(ctx context.Context) error {
	conn, err := c.open()
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Ping(ctx)
}

func (c *ClickHouse) open() (clickhouse.Conn, error) {
	return clickhouse.Open(&clickhouse.Options{
		Addr:        []string{c.addr},
		Protocol:    clickhouse.Native,
		Auth:        clickhouse.Auth{Database: "default", Username: "default"},
		DialTimeout: 5 * time.Second,
	})
}

// Stop shuts the server down gracefully (SIGTERM, waiting for the exit;
// after 60 s it is killed).
func (c *ClickHouse) Stop() {
	c.tb.Helper()
	began := time.Now()
	c.proc.stop(syscall.SIGTERM, 60*time.Second)
	c.tb.Logf("testenv: %s stopped in %s", c.proc.name, time.Since(began).Round(time.Millisecond))
}

// Kill kills the server with SIGKILL, as a crash would.
func (c *ClickHouse) Kill() { c.proc.stop(syscall.SIGKILL, 10*time.Second) }

// Close stops the server for good. It is called by the test cleanup and is
// safe to call more than once.
func (c *ClickHouse) Close() {
	c.closeOnce.Do(func() { c.proc.stop(syscall.SIGKILL, 10*time.Second) })
}

// DB returns a native-protocol connection (user default, database default)
// that has answered Ping; it is closed when the test ends.
func (c *ClickHouse) DB(tb testing.TB) clickhouse.Conn {
	tb.Helper()
	conn, err := c.open()
	if err != nil {
		tb.Fatalf("testenv: clickhouse open: %v", err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := conn.Ping(ctx); err != nil {
		tb.Fatalf("testenv: clickhouse ping %s: %v", c.addr, err)
	}
	return conn
}
