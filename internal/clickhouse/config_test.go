package clickhouse

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"

	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/sql"
)

// TestConfigValidate: a query_timeout under a second (sent as
// max_execution_time 0, no limit) and an address whose port is no number
// are refused naming the key; a cluster name with a '-' is accepted (its
// DDL quotes it: TestClusterNameQuoted).
func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string // error substring; "" = valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"query timeout 500ms", func(c *Config) { c.QueryTimeout = 500 * time.Millisecond }, "clickhouse.query_timeout: must be 0 (none) or at least 1s, got 500ms"},
		{"query timeout 1s", func(c *Config) { c.QueryTimeout = time.Second }, ""},
		{"query timeout none", func(c *Config) { c.QueryTimeout = 0 }, ""},
		{"port not a number", func(c *Config) { c.Addr = "ch:90O0" }, `clickhouse.addr: "ch:90O0": port "90O0" is not a number`},
		{"empty port", func(c *Config) { c.Addr = "ch-0:9000,ch-1:" }, `clickhouse.addr: "ch-1:": port "" is not a number`},
		{"port out of range", func(c *Config) { c.Addr = "ch:70000" }, `port "70000"`},
		{"cluster with a hyphen", func(c *Config) { c.Cluster = "prod-ch" }, ""},
		{"cluster with a quote", func(c *Config) { c.Cluster = "a'b" }, "clickhouse.cluster:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.edit(&c)
			err := c.Validate("clickhouse.")
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestQueryTimeoutSetting: max_execution_time is query_timeout rounded up
// to whole seconds (1.5s was 1).
func TestQueryTimeoutSetting(t *testing.T) {
	for _, tc := range []struct {
		timeout time.Duration
		want    any // nil: not set
	}{
		{1500 * time.Millisecond, 2},
		{time.Second, 1},
		{1900 * time.Millisecond, 2},
		{60 * time.Second, 60},
		{0, nil},
	} {
		c := DefaultConfig()
		c.QueryTimeout = tc.timeout
		o, err := c.options("faultline", discard())
		if err != nil {
			t.Fatal(err)
		}
		if got := o.Settings["max_execution_time"]; got != tc.want {
			t.Errorf("query_timeout %s: max_execution_time %v, want %v", tc.timeout, got, tc.want)
		}
	}
}

// TestClusterNameQuoted: every ON CLUSTER and Distributed(…) of a cluster
// schema quotes the cluster name, so one with a '-' parses.
func TestClusterNameQuoted(t *testing.T) {
	s := Schema{Cluster: "a-b", Database: "faultline", ZooKeeperPath: DefaultZooKeeperPath, ReplicaName: DefaultReplicaName}
	for _, stmt := range clusterStatements(t, s) {
		if strings.Contains(stmt, "ON CLUSTER") && !strings.Contains(stmt, "ON CLUSTER 'a-b'") {
			t.Errorf("unquoted cluster: %s", stmt)
		}
		if strings.Contains(stmt, "Distributed(") && !strings.Contains(stmt, "Distributed('a-b', ") {
			t.Errorf("unquoted cluster: %s", stmt)
		}
	}
}

// clusterStatements is every statement faultline sends ON CLUSTER for
// schema s: the database, the migrations table, the translated
// migrations, a retention drop.
func clusterStatements(t *testing.T, s Schema) []string {
	t.Helper()
	migs, err := LoadMigrations(sql.Migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	cms, err := s.ForCluster(migs)
	if err != nil {
		t.Fatal(err)
	}
	out := []string{
		"CREATE DATABASE IF NOT EXISTS " + s.Database + onClusterClause(s.Cluster),
		s.migrationsTableDDL(),
		"ALTER TABLE " + s.Database + ".events_local" + onClusterClause(s.Cluster) + " DROP PARTITION 202401",
	}
	for _, m := range cms {
		out = append(out, m.Statements...)
	}
	return out
}

// TestClusterNameQuotedParses: ClickHouse 18.16 parses every ON CLUSTER
// statement of a cluster named with a '-' (the cluster is unknown to the
// server: any error but a syntax error). Unquoted, each was code 62.
func TestClusterNameQuotedParses(t *testing.T) {
	srv := testenv.StartClickHouse(t)
	c := withDB(DefaultConfig(), "default")
	c.Addr, c.Password = srv.Addr(), config.Secret{}
	ctx := context.Background()
	conn, err := Open(ctx, c, discard())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	s := Schema{Cluster: "a-b", Database: "faultline", ZooKeeperPath: DefaultZooKeeperPath, ReplicaName: DefaultReplicaName}
	for _, stmt := range clusterStatements(t, s) {
		err := conn.Exec(ctx, stmt)
		if exc, ok := errors.AsType[*ch.Exception](err); ok && exc.Code == 62 {
			t.Errorf("syntax error: %v\n%s", err, stmt)
		} else if err == nil {
			t.Errorf("ran without the cluster: %s", stmt)
		}
	}
}

// hungListener accepts connections and never answers: a server whose
// port is open and whose process is stuck.
func hungListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, conn)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// TestOpenSkipsHungAddress: with a first address that accepts and never
// answers, connections (plaintext and TLS) go to the healthy second one.
// Before, the first took the whole dial_timeout and the second failed.
func TestOpenSkipsHungAddress(t *testing.T) {
	srv := testenv.StartClickHouseTLS(t)
	hung := hungListener(t)
	for _, tc := range []struct {
		name, addr string
		tls        TLSConfig
	}{
		{"plaintext", srv.Addr(), TLSConfig{}},
		{"tls", srv.SecureAddr, TLSConfig{Enabled: true, CAFile: srv.CA.File}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := withDB(DefaultConfig(), "default")
			c.Addr, c.Password, c.TLS = hung+","+tc.addr, config.Secret{}, tc.tls
			c.DialTimeout = time.Second
			opts, err := c.options("default", discard())
			if err != nil {
				t.Fatal(err)
			}
			opts.ConnMaxLifetime = 10 * time.Millisecond // a ping 50ms later dials again
			conn, err := ch.Open(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			for i := range 2 {
				time.Sleep(50 * time.Millisecond)
				ctx, cancel := context.WithTimeout(context.Background(), c.connectTimeout())
				err := conn.Ping(ctx)
				cancel()
				if err != nil {
					t.Fatalf("ping %d past the hung address: %v", i, err)
				}
			}
			conn2, err := Open(context.Background(), c, discard())
			if err != nil {
				t.Fatalf("Open past the hung address: %v", err)
			}
			conn2.Close()
		})
	}
}

// TestPasswordFileReread: the password is read at every connect (the
// pool's DialStrategy), so a password_file rotated in place reaches the next
// connection without a restart; before, it was read once at Open and every
// new connection after a rotation failed with code 193 (Wrong password).
// The strategy is called as the driver calls it, with a dial that records
// the options it is given (a real pool with a short ConnMaxLifetime, to
// force a new connection, hung in clickhouse-go's Close).
func TestPasswordFileReread(t *testing.T) {
	pwFile := filepath.Join(t.TempDir(), "password")
	setFile := func(pw string) {
		if err := os.WriteFile(pwFile+".tmp", []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(pwFile+".tmp", pwFile); err != nil {
			t.Fatal(err)
		}
	}
	c := withDB(DefaultConfig(), "default")
	c.Addr, c.Username, c.PasswordFile = "127.0.0.1:1", "rot", pwFile
	setFile("one")
	opts, err := c.options("default", discard())
	if err != nil {
		t.Fatal(err)
	}
	if opts.Auth.Password != "" {
		t.Fatalf("the shared options hold the password")
	}
	dialed := func() string {
		t.Helper()
		var got string
		_, err := opts.DialStrategy(context.Background(), 1, opts, func(_ context.Context, _ string, o *ch.Options) (ch.DialResult, error) {
			got = o.Auth.Password
			return ch.DialResult{}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if pw := dialed(); pw != "one" {
		t.Fatalf("first connect with password %q, want one", pw)
	}
	setFile("two")
	if pw := dialed(); pw != "two" {
		t.Fatalf("connect after the file was rotated with password %q, want two", pw)
	}
}
