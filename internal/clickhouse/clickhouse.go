// Package clickhouse connects faultline binaries to ClickHouse over the
// native protocol (clickhouse-go v2; its HTTP mode does not work against the
// 18.16 server the tests use), applies the versioned schema migrations of
// sql/migrations, and enforces retention by dropping old partitions.
package clickhouse

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/internal/tlsclient"
)

// Conn is a native-protocol ClickHouse connection pool.
type Conn = driver.Conn

// PasswordEnv is the environment variable read for the password when
// neither password_file nor password_env is set.
const PasswordEnv = "FAULTLINE_CLICKHOUSE_PASSWORD"

// Config is how a binary reaches ClickHouse.
type Config struct {
	// Addr is the native-protocol address, host:port, or a comma-separated
	// list of them: connections go to the first that answers, and move on
	// when it stops (on a cluster, list a server of each shard's replicas,
	// or a load balancer). Default 127.0.0.1:9000.
	Addr string `toml:"addr"`
	// Database holds faultline's tables; migrations create it. Default "faultline".
	Database string `toml:"database"`
	// Username. Default "default".
	Username string `toml:"username"`
	// PasswordFile is a file holding the password (surrounding white
	// space trimmed), read at every connect. Default none.
	PasswordFile string `toml:"password_file"`
	// PasswordEnv names an environment variable holding the password,
	// read at every connect. Default none.
	PasswordEnv string `toml:"password_env"`
	// Password is the password when neither PasswordFile nor PasswordEnv
	// is set: DefaultConfig reads $FAULTLINE_CLICKHOUSE_PASSWORD into it,
	// and a program may set it (a test, faultline dev for its local
	// server). It is never a config value or a flag, and never printed
	// (config.Secret).
	Password config.Secret `toml:"-"`
	// DialTimeout bounds connecting to one address (TCP, TLS and the
	// handshake); a connection tries each address of Addr in turn, so it
	// may take DialTimeout times their number. Default 5s.
	DialTimeout time.Duration `toml:"dial_timeout"`
	// QueryTimeout is the server-side max_execution_time of every query,
	// in whole seconds (rounded up; 0: none, else at least 1s). Default 60s.
	QueryTimeout time.Duration `toml:"query_timeout"`
	// MaxOpenConns bounds the connection pool. Default 8.
	MaxOpenConns int `toml:"max_open_conns"`
	// Compression of the native protocol blocks: lz4 or none. Default lz4.
	Compression string `toml:"compression"`
	// Cluster is the name (remote_servers) of the ClickHouse cluster the
	// schema lives on: migrations create Replicated tables ON CLUSTER and
	// Distributed tables over them (internal/clickhouse/cluster.go), and
	// inserts wait until each shard has its rows (insert_distributed_sync).
	// "" is a single server. Default "".
	Cluster string `toml:"cluster"`
	// ZooKeeperPath is each replicated table's path in ZooKeeper when
	// Cluster is set: faultline fills in {database} and {table}, the
	// servers their macros (e.g. {shard}). Default
	// "/clickhouse/tables/{shard}/{database}/{table}".
	ZooKeeperPath string `toml:"zookeeper_path"`
	// ReplicaName is each replica's name when Cluster is set, unique among
	// a shard's replicas: usually a server macro. Default "{replica}".
	ReplicaName string `toml:"replica_name"`
	// TLS is TLS to the servers (flags --clickhouse.tls.*). Default off.
	TLS TLSConfig `toml:"tls"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Addr:         "127.0.0.1:9000",
		Database:     "faultline",
		Username:     "default",
		Password:     config.NewSecret(strings.TrimSpace(os.Getenv(PasswordEnv))),
		DialTimeout:  5 * time.Second,
		QueryTimeout: 60 * time.Second,
		MaxOpenConns: 8,
		Compression:  "lz4",

		ZooKeeperPath: DefaultZooKeeperPath,
		ReplicaName:   DefaultReplicaName,
	}
}

// RegisterFlags adds the config's flags with the given prefix ("clickhouse.").
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.Addr, prefix+"addr", c.Addr, "ClickHouse native-protocol address (host:port, or a comma-separated list tried in order)")
	fs.StringVar(&c.Database, prefix+"database", c.Database, "ClickHouse database of faultline's tables")
	fs.StringVar(&c.Username, prefix+"username", c.Username, "ClickHouse user")
	fs.StringVar(&c.PasswordFile, prefix+"password-file", c.PasswordFile, "file holding the ClickHouse password")
	fs.StringVar(&c.PasswordEnv, prefix+"password-env", c.PasswordEnv, "environment variable holding the ClickHouse password (default: $"+PasswordEnv+" when set)")
	fs.DurationVar(&c.DialTimeout, prefix+"dial-timeout", c.DialTimeout, "ClickHouse connect timeout, per address (a list is tried in turn)")
	fs.DurationVar(&c.QueryTimeout, prefix+"query-timeout", c.QueryTimeout, "server-side limit of one ClickHouse query, whole seconds rounded up (0: none, else at least 1s)")
	fs.IntVar(&c.MaxOpenConns, prefix+"max-open-conns", c.MaxOpenConns, "ClickHouse connection pool size")
	fs.StringVar(&c.Compression, prefix+"compression", c.Compression, "ClickHouse native block compression: lz4 or none")
	fs.StringVar(&c.Cluster, prefix+"cluster", c.Cluster, "ClickHouse cluster (remote_servers name) of the schema: Replicated tables ON CLUSTER and Distributed tables over them; empty: one server")
	fs.StringVar(&c.ZooKeeperPath, prefix+"zookeeper-path", c.ZooKeeperPath, "ZooKeeper path of each replicated table ({database} and {table} filled in by faultline, macros by the servers)")
	fs.StringVar(&c.ReplicaName, prefix+"replica-name", c.ReplicaName, "replica name of each replicated table (a server macro)")
	c.TLS.RegisterFlags(fs, prefix+"tls.", "ClickHouse (the secure native port, usually 9440)")
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Addrs splits Addr.
func (c Config) Addrs() []string {
	var out []string
	for _, a := range strings.Split(c.Addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// Validate names the first bad key.
func (c Config) Validate(prefix string) error {
	addrs := c.Addrs()
	if len(addrs) == 0 {
		return fmt.Errorf("%saddr: at least one host:port is required", prefix)
	}
	for _, a := range addrs {
		_, port, err := net.SplitHostPort(a)
		if err != nil {
			return fmt.Errorf("%saddr: %q is not host:port: %w", prefix, a, err)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%saddr: %q: port %q is not a number from 1 to 65535", prefix, a, port)
		}
	}
	if !identRE.MatchString(c.Database) {
		return fmt.Errorf("%sdatabase: %q is not a plain identifier", prefix, c.Database)
	}
	if strings.TrimSpace(c.Username) == "" {
		return fmt.Errorf("%susername: must not be empty", prefix)
	}
	if c.DialTimeout <= 0 {
		return fmt.Errorf("%sdial_timeout: must be positive, got %s", prefix, c.DialTimeout)
	}
	if c.QueryTimeout < 0 {
		return fmt.Errorf("%squery_timeout: must not be negative, got %s", prefix, c.QueryTimeout)
	}
	if c.QueryTimeout > 0 && c.QueryTimeout < time.Second {
		// max_execution_time is whole seconds, and 0 is no limit.
		return fmt.Errorf("%squery_timeout: must be 0 (none) or at least 1s, got %s", prefix, c.QueryTimeout)
	}
	if c.MaxOpenConns < 1 {
		return fmt.Errorf("%smax_open_conns: must be at least 1, got %d", prefix, c.MaxOpenConns)
	}
	if c.Compression != "lz4" && c.Compression != "none" {
		return fmt.Errorf("%scompression: want lz4 or none, got %q", prefix, c.Compression)
	}
	if c.Cluster != "" {
		if !clusterNameRE.MatchString(c.Cluster) {
			return fmt.Errorf("%scluster: %q is not a cluster name (letters, digits, _ and -, starting with a letter or _)", prefix, c.Cluster)
		}
		if !strings.Contains(c.ZooKeeperPath, "{table}") || !strings.HasPrefix(c.ZooKeeperPath, "/") || strings.ContainsAny(c.ZooKeeperPath, "'\\") {
			return fmt.Errorf("%szookeeper_path: %q must be an absolute path containing {table} (each table needs its own), without quotes", prefix, c.ZooKeeperPath)
		}
		if strings.TrimSpace(c.ReplicaName) == "" || strings.ContainsAny(c.ReplicaName, "'\\") {
			return fmt.Errorf("%sreplica_name: %q must be a non-empty name without quotes, usually {replica}", prefix, c.ReplicaName)
		}
	}
	if err := c.TLS.Validate(prefix + "tls."); err != nil {
		return err
	}
	_, err := c.password(prefix)
	return err
}

// password returns the password: read from the file or variable named,
// else Password. Errors name the key, never the value.
func (c Config) password(prefix string) (config.Secret, error) {
	if c.PasswordFile == "" && c.PasswordEnv == "" {
		return c.Password, nil
	}
	s, err := config.ReadSecret(c.PasswordFile, c.PasswordEnv)
	if err != nil {
		key := "password_file"
		if c.PasswordFile == "" {
			key = "password_env"
		}
		return config.Secret{}, fmt.Errorf("%s%s: %w", prefix, key, err)
	}
	return s, nil
}

// clusterNameRE is what a cluster name may be: it is spliced into ON
// CLUSTER '…' and Distributed('…', …) as a string literal (quoted: a bare
// name with '-' is a syntax error), so it holds no quote.
var clusterNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]*$`)

// String describes the config without the password.
func (c Config) String() string {
	return fmt.Sprintf("clickhouse://%s@%s/%s", c.Username, c.Addr, c.Database)
}

func (c Config) options(database string, log *slog.Logger) (*ch.Options, error) {
	if _, err := c.password("clickhouse."); err != nil {
		return nil, err
	}
	settings := ch.Settings{}
	if c.QueryTimeout > 0 {
		// Whole seconds, rounded up: 1.5s is 2, never 1 (nor 0, no limit).
		settings["max_execution_time"] = int((c.QueryTimeout + time.Second - 1) / time.Second)
	}
	if c.Cluster != "" {
		// An insert into a Distributed table returns once every shard has
		// its rows (on one replica), not once they are queued on the
		// server the client talks to: the store commits Kafka offsets after
		// it, and reads right after it see the rows.
		settings["insert_distributed_sync"] = 1
	}
	tlsConfig, err := c.TLS.Build("clickhouse.tls.")
	if err != nil {
		return nil, err
	}
	dial, err := c.TLS.Dialer("clickhouse.tls.", c.DialTimeout, log)
	if err != nil {
		return nil, err
	}
	var comp *ch.Compression
	if c.Compression == "lz4" {
		comp = &ch.Compression{Method: ch.CompressionLZ4}
	}
	return &ch.Options{
		Addr:             c.Addrs(),
		Protocol:         ch.Native,
		Auth:             ch.Auth{Database: database, Username: c.Username},
		TLS:              tlsConfig, // what the driver logs; dial connects
		DialContext:      dialContext(dial, c.DialTimeout),
		DialStrategy:     c.dialStrategy(), // sets the password, read at every connect
		DialTimeout:      c.connectTimeout(),
		MaxOpenConns:     c.MaxOpenConns,
		MaxIdleConns:     min(c.MaxOpenConns, 5),
		ConnMaxLifetime:  time.Hour,
		Settings:         settings,
		Compression:      comp,
		Logger:           slog.New(quietHandler{log.With("component", "clickhouse").Handler()}),
		ClientInfo:       ch.ClientInfo{Products: []struct{ Name, Version string }{{Name: "faultline", Version: "1"}}},
		ConnOpenStrategy: ch.ConnOpenInOrder,
	}, nil
}

// dialContext is dial as the driver's DialContext; a plaintext dial of
// timeout when TLS is off (dial nil).
func dialContext(dial tlsclient.Dial, timeout time.Duration) func(context.Context, string) (net.Conn, error) {
	if dial == nil {
		nd := &net.Dialer{Timeout: timeout}
		return func(ctx context.Context, addr string) (net.Conn, error) { return nd.DialContext(ctx, "tcp", addr) }
	}
	return func(ctx context.Context, addr string) (net.Conn, error) { return dial(ctx, "tcp", addr) }
}

// connectTimeout bounds one connection of the pool (the driver's
// DialTimeout, which covers trying every address) and Open's ping: each
// address has DialTimeout, plus a second to spare.
func (c Config) connectTimeout() time.Duration {
	return time.Duration(max(len(c.Addrs()), 1))*c.DialTimeout + time.Second
}

// dialStrategy is the driver's DialStrategy: it tries the addresses in
// order, each with its own DialTimeout (the driver's default strategy
// shares one budget among them, so a first server that accepts TCP and
// never answers left none to the healthy one after it), and reads the
// password at every connect (password_file or password_env rotated in
// place reaches the next connection without a restart).
func (c Config) dialStrategy() func(context.Context, int, *ch.Options, ch.Dial) (ch.DialResult, error) {
	return func(ctx context.Context, _ int, opt *ch.Options, dial ch.Dial) (ch.DialResult, error) {
		pw, err := c.password("clickhouse.")
		if err != nil {
			return ch.DialResult{}, err
		}
		o := *opt // the connection keeps it
		o.Auth.Password = pw.Reveal()
		o.DialTimeout = c.DialTimeout // the driver's handshake deadline
		var r ch.DialResult
		err = ch.ErrAcquireConnNoAddress
		for _, addr := range o.Addr {
			actx, cancel := context.WithTimeout(ctx, c.DialTimeout)
			r, err = dial(actx, addr, &o)
			cancel()
			if err == nil || ctx.Err() != nil {
				break
			}
		}
		return r, err
	}
}

// Open returns a connection pool to the config's database and checks it
// with a Ping. The database must exist (Migrate creates it).
func Open(ctx context.Context, c Config, log *slog.Logger) (Conn, error) {
	return open(ctx, c, c.Database, log)
}

func open(ctx context.Context, c Config, database string, log *slog.Logger) (Conn, error) {
	opts, err := c.options(database, log)
	if err != nil {
		return nil, err
	}
	conn, err := ch.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("clickhouse open %s: %w", c, err)
	}
	pctx, cancel := context.WithTimeout(ctx, c.connectTimeout())
	defer cancel()
	if err := conn.Ping(pctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("clickhouse ping %s: %w", c, err)
	}
	return conn, nil
}

// EnsureDatabase creates the config's database when it is missing (ON
// CLUSTER when the config names a cluster).
func EnsureDatabase(ctx context.Context, c Config, log *slog.Logger) error {
	conn, err := open(ctx, c, "default", log)
	if err != nil {
		return err
	}
	defer conn.Close()
	ddl := "CREATE DATABASE IF NOT EXISTS " + c.Database
	if c.Cluster != "" {
		ddl += onClusterClause(c.Cluster)
	}
	if err := conn.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("create database %s: %w", c.Database, err)
	}
	return nil
}

// quietHandler drops the driver's per-connection warning that the server
// is older than the driver supports: faultline supports 18.16 on purpose
// (see sql/README.md) and Setup logs the server version once. It lowers
// to DEBUG the driver's errors for a query its caller cancelled (a role
// stopping): the caller has the error and knows why; at ERROR they read
// as a fault in every clean shutdown.
type quietHandler struct{ slog.Handler }

func (h quietHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "unsupported clickhouse version" {
		return nil
	}
	if r.Level > slog.LevelDebug && cancelled(r) {
		if !h.Handler.Enabled(ctx, slog.LevelDebug) {
			return nil
		}
		r = r.Clone()
		r.Level = slog.LevelDebug
	}
	return h.Handler.Handle(ctx, r)
}

// cancelled reports whether the record's error is a cancelled context.
func cancelled(r slog.Record) bool {
	found := false
	r.Attrs(func(a slog.Attr) bool {
		err, ok := a.Value.Any().(error)
		found = ok && errors.Is(err, context.Canceled)
		return !found
	})
	return found
}

func (h quietHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return quietHandler{h.Handler.WithAttrs(as)}
}

func (h quietHandler) WithGroup(name string) slog.Handler {
	return quietHandler{h.Handler.WithGroup(name)}
}
