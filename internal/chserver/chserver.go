// Package chserver runs a local clickhouse-server from the installed binary
// with a generated config: loopback only, every path under one directory.
// `faultline dev` uses it for its history database, and internal/testenv
// for the test servers.
package chserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
)

// BinEnv names the environment variable that overrides the binary lookup.
const BinEnv = "FAULTLINE_CLICKHOUSE_BIN"

// InstallHint says how to install the server on these machines.
const InstallHint = "install it with `sudo apt-get install -y clickhouse-server clickhouse-client` " +
	"(or `scripts/testenv/install.sh clickhouse`), or set " + BinEnv + " to a clickhouse-server binary"

// ErrNotInstalled is returned when no ClickHouse server binary is found.
var ErrNotInstalled = errors.New("no clickhouse-server binary found; " + InstallHint)

// FindBinary returns the server binary and the arguments that select the
// server mode: $FAULTLINE_CLICKHOUSE_BIN, else clickhouse-server or the
// multi-call clickhouse binary on PATH or in /usr/sbin, /usr/bin.
func FindBinary() (path string, modeArgs []string, err error) {
	mode := func(p string) []string {
		if filepath.Base(p) == "clickhouse" {
			return []string{"server"}
		}
		return nil
	}
	if b := os.Getenv(BinEnv); b != "" {
		if !isExecutable(b) {
			return "", nil, fmt.Errorf("%s=%s is not an executable file: %w", BinEnv, b, ErrNotInstalled)
		}
		return b, mode(b), nil
	}
	for _, name := range []string{"clickhouse-server", "clickhouse"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, mode(p), nil
		}
		for _, dir := range []string{"/usr/sbin", "/usr/bin"} {
			if p := filepath.Join(dir, name); isExecutable(p) {
				return p, mode(p), nil
			}
		}
	}
	return "", nil, ErrNotInstalled
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// configXML is a minimal server config: loopback only, no interserver
// port, every path inside {{dir}}. The <yandex> root works on 18.16 and on
// current servers.
const configXML = `<?xml version="1.0"?>
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
    <default_session_timeout>60</default_session_timeout>
</yandex>
`

// usersXML has the default user, without a password, from loopback only.
const usersXML = `<?xml version="1.0"?>
<yandex>
    <profiles>
        <default>
            <max_memory_usage>2000000000</max_memory_usage>
            <load_balancing>random</load_balancing>
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

// WriteConfig writes config.xml and users.xml into dir for a server on
// 127.0.0.1 with the given native (tcp) and HTTP ports, creates the
// directories the config names, and returns the config.xml path.
func WriteConfig(dir string, tcpPort, httpPort int) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for _, d := range []string{"log", "data", "tmp", "user_files", "format_schemas"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o750); err != nil {
			return "", fmt.Errorf("clickhouse dir: %w", err)
		}
	}
	conf := strings.NewReplacer("{{dir}}", dir, "{{tcp}}", strconv.Itoa(tcpPort), "{{http}}", strconv.Itoa(httpPort)).Replace(configXML)
	path := filepath.Join(dir, "config.xml")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return "", fmt.Errorf("clickhouse config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.xml"), []byte(usersXML), 0o644); err != nil {
		return "", fmt.Errorf("clickhouse users config: %w", err)
	}
	return path, nil
}

// Options configure Start.
type Options struct {
	// Dir holds the config, data and logs. Required.
	Dir string
	// TCPPort is the native-protocol port on 127.0.0.1; 0 picks a free one.
	// Default 0.
	TCPPort int
	// HTTPPort is the HTTP port on 127.0.0.1; 0 picks a free one. Default 0.
	HTTPPort int
	// ReadyTimeout bounds the wait for the server to answer. Default 60s.
	ReadyTimeout time.Duration
	// Log receives start and stop messages. Default slog.Default().
	Log *slog.Logger
}

// Server is a running clickhouse-server child process.
type Server struct {
	addr string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  *slog.Logger
	once sync.Once
}

// Start writes the config under opts.Dir, starts the server (its output
// goes to Dir/log/stdout.log) and waits until it answers a native Ping.
// The server dies with this process (Linux parent-death signal); Stop ends
// it gracefully.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.Dir == "" {
		return nil, errors.New("chserver: Dir is required")
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 60 * time.Second
	}
	bin, modeArgs, err := FindBinary()
	if err != nil {
		return nil, err
	}
	for _, p := range []*int{&opts.TCPPort, &opts.HTTPPort} {
		if *p != 0 {
			continue
		}
		// The kernel may offer the same free port twice in a row.
		for *p == 0 || opts.TCPPort == opts.HTTPPort {
			if *p, err = freePort(); err != nil {
				return nil, err
			}
		}
	}
	cfgPath, err := WriteConfig(opts.Dir, opts.TCPPort, opts.HTTPPort)
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(filepath.Join(filepath.Dir(cfgPath), "log", "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("clickhouse log: %w", err)
	}
	cmd := exec.Command(bin, append(modeArgs, "--config-file="+cfgPath)...)
	cmd.Dir = filepath.Dir(cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s := &Server{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(opts.TCPPort)), cmd: cmd, done: make(chan struct{}), log: opts.Log}
	go func() {
		s.err = cmd.Wait()
		logf.Close()
		close(s.done)
	}()
	began := time.Now()
	if err := s.waitReady(ctx, opts.ReadyTimeout); err != nil {
		s.Stop()
		return nil, fmt.Errorf("clickhouse-server (%s, logs in %s): %w", bin, filepath.Join(opts.Dir, "log"), err)
	}
	opts.Log.Info("clickhouse server started", "addr", s.addr, "dir", opts.Dir, "bin", bin, "took", time.Since(began).Round(time.Millisecond))
	return s, nil
}

func (s *Server) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		select {
		case <-s.done:
			return fmt.Errorf("exited before it was ready: %v", s.err)
		default:
		}
		conn, err := ch.Open(&ch.Options{Addr: []string{s.addr}, Protocol: ch.Native, DialTimeout: time.Second})
		if err == nil {
			pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
			err = conn.Ping(pctx)
			pcancel()
			conn.Close()
			if err == nil {
				return nil
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w (last error: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Addr is the native-protocol address, 127.0.0.1:port.
func (s *Server) Addr() string { return s.addr }

// Pid is the server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Done is closed when the server process exits.
func (s *Server) Done() <-chan struct{} { return s.done }

// Stop sends SIGTERM, waits up to 30 s for the exit, then kills the server.
// It is safe to call more than once.
func (s *Server) Stop() {
	s.once.Do(func() {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.done
		}
		s.log.Info("clickhouse server stopped", "addr", s.addr)
	})
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
