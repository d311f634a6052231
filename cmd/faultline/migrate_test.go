package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/internal/testenv"
)

// TestMigrateCluster runs `faultline migrate --cluster NAME` against two
// ClickHouse servers: the schema is applied ON CLUSTER, --status lists it
// from the other server, and a single-server run on that database is
// refused naming the key.
func TestMigrateCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ZooKeeper and two ClickHouse servers")
	}
	c := testenv.StartClickHouseCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	addrs := strings.Join(c.Addrs(), ",")
	var out bytes.Buffer
	if err := run(ctx, []string{"migrate", "--cluster", testenv.ClusterSharded, "--clickhouse.addr", addrs}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "applied 0001_events.sql") || !strings.Contains(out.String(), "cluster sharded schema up to date") {
		t.Fatalf("migrate --cluster printed:\n%s", out.String())
	}
	// The migrations table is replicated: the other server lists what
	// ran once its replica caught up (--status reads, it does not wait).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out.Reset()
		if err := run(ctx, []string{"migrate", "--status", "--cluster", testenv.ClusterSharded, "--clickhouse.addr", c.Nodes[1].Addr()}, &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out.String(), "applied  0001_events.sql") && !strings.Contains(out.String(), "pending") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("migrate --status on the other server printed:\n%s", out.String())
		}
	}
	// The Distributed table answers on both servers.
	for _, n := range c.Nodes {
		if _, err := n.HTTPQuery("faultline", "SELECT count() FROM events"); err != nil {
			t.Fatalf("%s: %v", n.Addr(), err)
		}
	}
	err := run(ctx, []string{"migrate", "--clickhouse.addr", addrs}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "clickhouse.cluster: database faultline was migrated ON CLUSTER") {
		t.Fatalf("single-server migrate of a cluster database: %v", err)
	}
}
