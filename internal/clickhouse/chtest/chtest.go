// Package chtest gives tests a real ClickHouse server (internal/testenv)
// with faultline's schema applied — or, with FAULTLINE_TEST_CLICKHOUSE_CLUSTER
// set, a cluster of two servers with the cluster schema, so a package's
// tests run unchanged on top of Distributed tables.
package chtest

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/internal/testenv"
)

// ClusterEnv selects the schema Start applies: unset, a single server;
// "sharded", two servers, each a shard (testenv.ClusterSharded);
// "replicated", two servers, replicas of one shard
// (testenv.ClusterReplicated).
const ClusterEnv = "FAULTLINE_TEST_CLICKHOUSE_CLUSTER"

// Server is a ClickHouse server started for a test, with faultline's
// migrations applied to Config.Database.
type Server struct {
	// ClickHouse is the server (on a cluster, its first server: Stop and
	// Start act on that one).
	*testenv.ClickHouse
	// Cluster is set when the schema is on a cluster.
	Cluster *testenv.ClickHouseCluster
	// Config reaches the server's faultline database (on a cluster, every
	// server, first one first).
	Config clickhouse.Config
	// Conn is a connection to it, closed when the test ends.
	Conn clickhouse.Conn
}

// Start starts a server (or, with ClusterEnv set, a two-server cluster)
// and applies the migrations.
func Start(tb testing.TB) *Server {
	tb.Helper()
	if topo := os.Getenv(ClusterEnv); topo != "" {
		return StartCluster(tb, topo)
	}
	ch := testenv.StartClickHouse(tb)
	cfg := clickhouse.DefaultConfig()
	cfg.Addr = ch.Addr()
	return setup(tb, &Server{ClickHouse: ch, Config: cfg})
}

// StartCluster starts ZooKeeper and two ClickHouse servers and applies the
// cluster schema ON CLUSTER topology (testenv.ClusterSharded or
// testenv.ClusterReplicated). Config.Addr lists both servers.
func StartCluster(tb testing.TB, topology string) *Server {
	tb.Helper()
	if topology != testenv.ClusterSharded && topology != testenv.ClusterReplicated {
		tb.Fatalf("chtest: cluster topology %q: want %s or %s", topology, testenv.ClusterSharded, testenv.ClusterReplicated)
	}
	c := testenv.StartClickHouseCluster(tb, 2)
	cfg := clickhouse.DefaultConfig()
	cfg.Addr = strings.Join(c.Addrs(), ",")
	cfg.Cluster = topology
	if topology == testenv.ClusterReplicated {
		// The servers' {shard} macros differ; here they are one shard.
		cfg.ZooKeeperPath = "/clickhouse/tables/one/{database}/{table}"
	}
	return setup(tb, &Server{ClickHouse: c.Nodes[0], Cluster: c, Config: cfg})
}

func setup(tb testing.TB, s *Server) *Server {
	tb.Helper()
	s.Config.Password = config.Secret{}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := clickhouse.Setup(ctx, s.Config, slog.Default())
	if err != nil {
		tb.Fatalf("chtest: %v", err)
	}
	tb.Cleanup(func() { conn.Close() })
	s.Conn = conn
	return s
}

// Count runs a query returning one unsigned number.
func Count(tb testing.TB, conn clickhouse.Conn, query string, args ...any) uint64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n uint64
	if err := conn.QueryRow(ctx, query, args...).Scan(&n); err != nil {
		tb.Fatalf("chtest: %s: %v", query, err)
	}
	return n
}
