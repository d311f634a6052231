package testenv

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Cluster names (remote_servers) of a ClickHouseCluster.
const (
	// ClusterSharded has every server as a shard of its own (one replica
	// each): a row lives on exactly one server.
	ClusterSharded = "sharded"
	// ClusterReplicated has one shard with every server as a replica: a
	// row lives on every server. Tables must use a ZooKeeper path without
	// the {shard} macro (it differs per server), e.g.
	// /clickhouse/tables/one/{database}/{table}.
	ClusterReplicated = "replicated"
)

// ClickHouseCluster is several clickhouse-servers (Debian's 18.16 here)
// sharing one ZooKeeper, each with remote_servers defining ClusterSharded
// and ClusterReplicated over all of them, distributed DDL (ON CLUSTER),
// an interserver HTTP port for replica fetches, and the macros shard (01,
// 02, …) and replica (r1, r2, …), one value per server.
//
// Measured on the 2-core machine: ZooKeeper ready in 1-3 s, each server in
// 0.2-0.5 s; two servers and ZooKeeper use ~250 MB.
type ClickHouseCluster struct {
	// ZooKeeper is the cluster's coordination service.
	ZooKeeper *ZooKeeper
	// Nodes are the servers, in the order remote_servers lists them.
	Nodes []*ClickHouse
}

// StartClickHouseCluster starts ZooKeeper and n ClickHouse servers on free
// 127.0.0.1 ports and waits until every server answers. They stop when the
// test ends; a node can be Stopped and Started again (same ports, data).
func StartClickHouseCluster(tb testing.TB, n int) *ClickHouseCluster {
	tb.Helper()
	if n < 1 {
		tb.Fatalf("testenv: a ClickHouse cluster needs at least one server, got %d", n)
	}
	zk := StartZooKeeper(tb)
	type ports struct{ tcp, http, inter int }
	ps := make([]ports, n)
	for i := range ps {
		p := freePorts(tb, 3)
		ps[i] = ports{p[0], p[1], p[2]}
	}
	var sharded, replicated strings.Builder
	for _, p := range ps {
		fmt.Fprintf(&sharded, `
            <shard>
                <internal_replication>true</internal_replication>
                <replica><host>127.0.0.1</host><port>%d</port></replica>
            </shard>`, p.tcp)
		fmt.Fprintf(&replicated, `
                <replica><host>127.0.0.1</host><port>%d</port></replica>`, p.tcp)
	}
	c := &ClickHouseCluster{ZooKeeper: zk, Nodes: make([]*ClickHouse, n)}
	began := time.Now()
	for i, p := range ps {
		cfg := fmt.Sprintf(`<?xml version="1.0"?>
<yandex>
    <interserver_http_host>127.0.0.1</interserver_http_host>
    <interserver_http_port>%d</interserver_http_port>
    <zookeeper>
        <node><host>127.0.0.1</host><port>%s</port></node>
        <session_timeout_ms>10000</session_timeout_ms>
    </zookeeper>
    <distributed_ddl>
        <path>/clickhouse/task_queue/ddl</path>
    </distributed_ddl>
    <remote_servers>
        <%s>%s
        </%s>
        <%s>
            <shard>
                <internal_replication>true</internal_replication>%s
            </shard>
        </%s>
    </remote_servers>
    <macros>
        <shard>%02d</shard>
        <replica>r%d</replica>
    </macros>
</yandex>
`, p.inter, zk.addr[strings.LastIndexByte(zk.addr, ':')+1:], ClusterSharded, sharded.String(), ClusterSharded,
			ClusterReplicated, replicated.String(), ClusterReplicated, i+1, i+1)
		c.Nodes[i] = startClickHouse(tb, fmt.Sprintf("clickhouse-%d", i+1), p.tcp, p.http, map[string]string{"cluster.xml": cfg})
	}
	for _, node := range c.Nodes {
		c.waitZooKeeper(tb, node)
	}
	tb.Logf("testenv: clickhouse cluster of %d servers ready in %s (clusters %q and %q)", n, time.Since(began).Round(time.Millisecond), ClusterSharded, ClusterReplicated)
	return c
}

// waitZooKeeper waits until node has a ZooKeeper session (its DDL worker
// needs one for ON CLUSTER). ClickHouse 18.16 can crash (SIGSEGV in the
// DDL worker) when its first ZooKeeper connection fails, as it may when a
// loaded machine starves the ZooKeeper JVM: a node that exits meanwhile is
// started again (twice at most), its error log shown.
func (c *ClickHouseCluster) waitZooKeeper(tb testing.TB, node *ClickHouse) {
	tb.Helper()
	restarts := 0
	deadline := time.Now().Add(90 * time.Second)
	for {
		_, err := node.HTTPQuery("", "SELECT count() FROM system.zookeeper WHERE path = '/'")
		if err == nil {
			return
		}
		if !node.proc.running() {
			errLog := &process{logPath: filepath.Join(node.proc.dir, "log", "clickhouse-server.err.log")}
			tb.Logf("testenv: %s exited (%v) before its ZooKeeper session was up; last lines of its error log:\n%s",
				node.proc.name, node.proc.exitErr(), errLog.logTail(30))
			if restarts++; restarts > 2 {
				tb.Fatalf("testenv: %s keeps exiting before it reaches ZooKeeper %s", node.proc.name, c.ZooKeeper.addr)
			}
			node.Start()
			continue
		}
		if time.Now().After(deadline) {
			tb.Fatalf("testenv: %s has no ZooKeeper session after 90 s: %v", node.proc.name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Addrs returns the native-protocol addresses of the servers.
func (c *ClickHouseCluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr()
	}
	return out
}
