package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// ClickHouse is a clickhouse-server started by StartClickHouse (Debian's
// 18.16.1 here; any later server takes the same config).
//
// Measured on a 2-core machine: ready (native Ping succeeds) ~1 s after exec,
// ~100 MB RSS when idle.
type ClickHouse struct {
	tb       testing.TB
	addr     string
	httpAddr string
	proc     *process

	closeOnce sync.Once
}

// clickhouseBin returns the server binary and the arguments that select the
// server mode: $FAULTLINE_CLICKHOUSE_BIN, else clickhouse-server or the
// multi-call clickhouse on PATH (or in /usr/sbin, /usr/bin).
func clickhouseBin() (path string, args []string, ok bool) {
	mode := func(p string) []string {
		if filepath.Base(p) == "clickhouse" {
			return []string{"server"}
		}
		return nil
	}
	if b := os.Getenv("FAULTLINE_CLICKHOUSE_BIN"); b != "" {
		return b, mode(b), isExecutable(b)
	}
	for _, name := range []string{"clickhouse-server", "clickhouse"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, mode(p), true
		}
		for _, dir := range []string{"/usr/sbin", "/usr/bin"} {
			if p := filepath.Join(dir, name); isExecutable(p) {
				return p, mode(p), true
			}
		}
	}
	return "clickhouse-server", nil, false
}

// clickhouseConfig is a minimal server config: loopback only, no
// interserver port, every path inside the test's directory.
const clickhouseConfig = `<?xml version="1.0"?>
<yandex>
    <logger>
        <level>information</level>
        <log>{{dir}}/log/clickhouse-server.log</log>
        <errorlog>{{dir}}/log/clickhouse-server.err.log</errorlog>
        <size>100M</size>
        <count>1</count>
        <console>true</console>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <tcp_port>{{tcp}}</tcp_port>
    <http_port>{{http}}</http_port>
    <path>{{dir}}/data/</path>
    <tmp_path>{{dir}}/tmp/</tmp_path>
    <user_files_path>{{dir}}/user_files/</user_files_path>
    <format_schema_path>{{dir}}/format_schemas/</format_schema_path>
    <users_config>{{dir}}/users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mark_cache_size>67108864</mark_cache_size>
    <uncompressed_cache_size>67108864</uncompressed_cache_size>
    <max_concurrent_queries>100</max_concurrent_queries>
    <max_connections>256</max_connections>
    <keep_alive_timeout>3</keep_alive_timeout>
    <builtin_dictionaries_reload_interval>3600</builtin_dictionaries_reload_interval>
    <max_session_timeout>3600</max_session_timeout>
    <shutdown_wait_unfinished>1</shutdown_wait_unfinished>
    <default_session_timeout>60</default_session_timeout>
</yandex>
`

// clickhouseUsers has the default user, without a password, from loopback.
const clickhouseUsers = `<?xml version="1.0"?>
<yandex>
    <profiles>
        <default>
            <max_memory_usage>2000000000</max_memory_usage>
            <load_balancing>random</load_balancing>
            <!-- idle connections notice a shutdown within 1 s, not 10 -->
            <poll_interval>1</poll_interval>
        </default>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks>
                <ip>127.0.0.1</ip>
                <ip>::1</ip>
            </networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
    <quotas>
        <default>
            <interval>
                <duration>3600</duration>
                <queries>0</queries>
                <errors>0</errors>
                <result_rows>0</result_rows>
                <read_rows>0</read_rows>
                <execution_time>0</execution_time>
            </interval>
        </default>
    </quotas>
</yandex>
`

// StartClickHouse starts clickhouse-server on free 127.0.0.1 ports (native
// and HTTP) with its data in the test's temporary directory, and waits until
// a native-protocol Ping succeeds. It is stopped when the test ends.
func StartClickHouse(tb testing.TB) *ClickHouse {
	tb.Helper()
	bin, modeArgs, ok := clickhouseBin()
	if !ok {
		missing(tb, "clickhouse", "no clickhouse-server binary; set FAULTLINE_CLICKHOUSE_BIN")
	}
	dir := tb.TempDir()
	for _, d := range []string{"log", "data", "tmp", "user_files", "format_schemas"} {
		mkdirs(tb, filepath.Join(dir, d))
	}
	tcp, http := freePort(tb), freePort(tb)
	conf := strings.NewReplacer("{{dir}}", dir, "{{tcp}}", fmt.Sprint(tcp), "{{http}}", fmt.Sprint(http)).Replace(clickhouseConfig)
	cfgPath := filepath.Join(dir, "config.xml")
	writeFile(tb, cfgPath, []byte(conf), 0o644)
	writeFile(tb, filepath.Join(dir, "users.xml"), []byte(clickhouseUsers), 0o644)

	g := newGroup(tb)
	c := &ClickHouse{
		tb:       tb,
		addr:     fmt.Sprintf("127.0.0.1:%d", tcp),
		httpAddr: fmt.Sprintf("127.0.0.1:%d", http),
		proc: g.add(&process{
			name:    "clickhouse",
			path:    bin,
			args:    append(modeArgs, "--config-file="+cfgPath),
			dir:     dir,
			logPath: filepath.Join(dir, "log", "clickhouse-stdout.log"),
		}),
	}
	tb.Cleanup(c.Close)
	began := time.Now()
	c.Start()
	tb.Logf("testenv: clickhouse ready on %s in %s (data %s)", c.addr, time.Since(began).Round(time.Millisecond), dir)
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
	if err := waitReady(c.proc, 60*time.Second, c.ping); err != nil {
		c.tb.Fatalf("testenv: %v\n%s", err, c.proc.logTail(60))
	}
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
func (c *ClickHouse) Stop() { c.proc.stop(syscall.SIGTERM, 60*time.Second) }

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
