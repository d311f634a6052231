package testenv

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ZooKeeperVersion is the org.apache.zookeeper:zookeeper release install.sh
// fetches from Maven Central; keep them in step.
const ZooKeeperVersion = "3.9.4"

// ZooKeeper is a standalone ZooKeeper server (for replicated ClickHouse:
// ON CLUSTER DDL and Replicated* tables) started by StartZooKeeper.
//
// Measured on the 2-core machine: ready 1-3 s after exec (C1 JIT, 128 MB
// heap), ~70 MB RSS.
type ZooKeeper struct {
	tb   testing.TB
	addr string
	proc *process

	closeOnce sync.Once
}

// zookeeperLibs returns $FAULTLINE_ZOOKEEPER_LIBS, else the cache
// directory of ZooKeeperVersion, else of any cached version.
func zookeeperLibs() (string, bool) {
	return cachedLibs("FAULTLINE_ZOOKEEPER_LIBS", "zookeeper", ZooKeeperVersion, "zookeeper-[0-9]*.jar")
}

// StartZooKeeper starts a standalone ZooKeeper on a free 127.0.0.1 port with
// its data in the test's temporary directory, and waits until it answers
// the "srvr" four-letter command as a running standalone server. It is stopped when the test ends.
func StartZooKeeper(tb testing.TB) *ZooKeeper {
	tb.Helper()
	libs, ok := zookeeperLibs()
	if !ok {
		missing(tb, "zookeeper", "no ZooKeeper jars in "+libs)
	}
	java, ok := javaBin()
	if !ok {
		missing(tb, "zookeeper", "no java binary (set FAULTLINE_JAVA or install Java 17)")
	}
	dir := tb.TempDir()
	data := filepath.Join(dir, "data")
	mkdirs(tb, data)
	port := freePort(tb)
	cfg := fmt.Sprintf(`tickTime=1000
initLimit=10
syncLimit=5
dataDir=%s
clientPort=%d
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat
`, data, port)
	cfgPath := filepath.Join(dir, "zoo.cfg")
	writeFile(tb, cfgPath, []byte(cfg), 0o644)
	g := newGroup(tb)
	z := &ZooKeeper{
		tb:   tb,
		addr: fmt.Sprintf("127.0.0.1:%d", port),
		proc: g.add(&process{
			name: "zookeeper",
			path: java,
			args: []string{"-Xmx128m", "-Xms16m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:-UsePerfData",
				"-Dorg.slf4j.simpleLogger.defaultLogLevel=info", "-Dzookeeper.admin.enableServer=false",
				"-cp", filepath.Join(libs, "*"), "org.apache.zookeeper.server.ZooKeeperServerMain", cfgPath},
			dir:     dir,
			logPath: filepath.Join(dir, "zookeeper.log"),
		}),
	}
	tb.Cleanup(z.Close)
	z.Start()
	return z
}

// Addr returns the client address, host:port.
func (z *ZooKeeper) Addr() string { return z.addr }

// Start starts the server again after Stop, on the same port and data.
func (z *ZooKeeper) Start() {
	z.tb.Helper()
	if err := z.proc.start(); err != nil {
		z.tb.Fatalf("testenv: %v", err)
	}
	began := time.Now()
	if err := waitReady(z.proc, 60*time.Second, z.ruok); err != nil {
		z.tb.Fatalf("testenv: %v\n%s", err, z.proc.logTail(60))
	}
	z.tb.Logf("testenv: zookeeper ready on %s in %s", z.addr, time.Since(began).Round(time.Millisecond))
}

// ruok succeeds once the server serves requests: "srvr" reports its mode.
// ("ruok" answers imok before the server has loaded its database, and a
// ClickHouse 18.16 whose first ZooKeeper session fails that way may crash.)
func (z *ZooKeeper) ruok(ctx context.Context) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", z.addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := conn.Write([]byte("srvr")); err != nil {
		return err
	}
	b, _ := io.ReadAll(bufio.NewReader(conn))
	if !strings.Contains(string(b), "Mode: standalone") {
		return fmt.Errorf("srvr answered %q", b)
	}
	return nil
}

// Stop shuts the server down (SIGTERM, then SIGKILL after 30 s).
func (z *ZooKeeper) Stop() { z.proc.stop(syscall.SIGTERM, 30*time.Second) }

// Close stops the server for good; safe to call more than once.
func (z *ZooKeeper) Close() {
	z.closeOnce.Do(func() { z.proc.stop(syscall.SIGKILL, 10*time.Second) })
}
