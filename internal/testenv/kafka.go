package testenv

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Kafka is a single Apache Kafka broker in KRaft combined mode
// (process.roles=broker,controller) started by StartKafka.
//
// Measured on a 2-core machine with Kafka 4.1.1 and Java 17 while other
// builds kept it busy (load 6-12): ready 9-18 s after exec, 11-22 s after a
// Kill (log recovery); a graceful Stop takes ~1-1.6 s. The log dir is
// copied from the KRaft template install.sh formats once, which saves a
// 3-7 s StorageTool JVM per broker. RSS ~310 MB with the default 512 MB heap.
type Kafka struct {
	tb      testing.TB
	addr    string
	version string
	dataDir string
	proc    *process
	sec     *KafkaSecurity // nil unless started with KafkaSecure
	nodeID  int            // its node.id

	closeOnce sync.Once
}

// kafkaConfig is what the KafkaOptions set.
type kafkaConfig struct {
	autoCreate bool
	partitions int
	heap       string
	jvmFlags   []string
	props      map[string]string
	secure     bool
	// controllers is how many brokers of a StartKafkaCluster are also
	// KRaft controllers (the last ones); 0 means all.
	controllers int
}

// KafkaOption configures StartKafka.
type KafkaOption func(*kafkaConfig)

// KafkaAutoCreateTopics sets auto.create.topics.enable. Default true.
func KafkaAutoCreateTopics(on bool) KafkaOption {
	return func(c *kafkaConfig) { c.autoCreate = on }
}

// KafkaPartitions sets num.partitions, the partition count of auto-created
// topics. Default 6.
func KafkaPartitions(n int) KafkaOption {
	return func(c *kafkaConfig) { c.partitions = n }
}

// KafkaHeap sets the broker's maximum Java heap (-Xmx). Default "512m".
func KafkaHeap(size string) KafkaOption {
	return func(c *kafkaConfig) { c.heap = size }
}

// KafkaJVMFlags appends flags to the broker's java command line; a later
// -XX flag wins, so KafkaJVMFlags("-XX:TieredStopAtLevel=4") restores the
// C2 compiler for throughput tests. Default none (C1 only, serial GC).
func KafkaJVMFlags(flags ...string) KafkaOption {
	return func(c *kafkaConfig) { c.jvmFlags = append(c.jvmFlags, flags...) }
}

// KafkaControllers makes only the last n brokers of a StartKafkaCluster
// KRaft controllers (voters; the others run process.roles=broker). With
// n = 1 the cluster's metadata outlives the loss of every other broker:
// the controller fences them and shrinks the ISRs, so min.insync.replicas
// (not a lost quorum) is what refuses writes. Default: every broker.
func KafkaControllers(n int) KafkaOption {
	return func(c *kafkaConfig) { c.controllers = n }
}

// KafkaBrokerConfig sets one server.properties key, overriding the defaults
// StartKafka writes. Default none.
func KafkaBrokerConfig(key, value string) KafkaOption {
	return func(c *kafkaConfig) { c.props[key] = value }
}

// kafkaLibs returns the directory of Kafka jars: $FAULTLINE_KAFKA_LIBS, else
// the cache directory of KafkaVersion, else of any cached version.
func kafkaLibs() (string, bool) {
	return cachedLibs("FAULTLINE_KAFKA_LIBS", "kafka", KafkaVersion, "kafka_2.13-*.jar")
}

// cachedLibs returns a directory of jars matching jarGlob: $env, else the
// cache directory of name at version, else of name's newest cached version;
// false when none holds them.
func cachedLibs(env, name, version, jarGlob string) (string, bool) {
	hasJars := func(dir string) bool {
		m, _ := filepath.Glob(filepath.Join(dir, jarGlob))
		return len(m) > 0
	}
	if d := os.Getenv(env); d != "" {
		return d, hasJars(d)
	}
	d := filepath.Join(CacheDir(), name, version, "libs")
	if hasJars(d) {
		return d, true
	}
	m, _ := filepath.Glob(filepath.Join(CacheDir(), name, "*", "libs"))
	sort.Strings(m)
	for i := len(m) - 1; i >= 0; i-- {
		if hasJars(m[i]) {
			return m[i], true
		}
	}
	return d, false
}

// javaBin returns $FAULTLINE_JAVA, else java on PATH.
func javaBin() (string, bool) {
	if j := os.Getenv("FAULTLINE_JAVA"); j != "" {
		return j, isExecutable(j)
	}
	j, err := exec.LookPath("java")
	return j, err == nil
}

// kafkaLog4j keeps the broker log useful: INFO, without the multi-hundred
// line config dumps.
const kafkaLog4j = `status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
logger.utils.name = org.apache.kafka.common.utils.AppInfoParser
logger.utils.level = WARN
`

// StartKafka starts a Kafka broker on free 127.0.0.1 ports and waits until
// it answers metadata requests. It is stopped when the test ends.
//
// Defaults: auto.create.topics.enable=true, num.partitions=6, replication
// factor 1 everywhere (offsets and transaction state topics included),
// min.insync.replicas=1, group.initial.rebalance.delay.ms=0.
func StartKafka(tb testing.TB, opts ...KafkaOption) *Kafka {
	tb.Helper()
	Server(tb, "a Kafka broker", nil) // -short
	cfg := kafkaConfig{autoCreate: true, partitions: 6, heap: "512m", props: map[string]string{}}
	for _, o := range opts {
		o(&cfg)
	}
	nports := 2
	if cfg.secure {
		nports = 4 // + SASL_SSL and SSL listeners
	}
	ps := freePorts(tb, nports)
	node := kafkaNode{id: 1, port: ps[0], ctrlPort: ps[1], voters: fmt.Sprintf("1@127.0.0.1:%d", ps[1]), name: "kafka"}
	k := newKafka(tb, cfg, node, ps[2:], "")
	k.Start()
	return k
}

// kafkaNode is one broker's place in a KRaft quorum.
type kafkaNode struct {
	id             int
	port, ctrlPort int
	voters         string // controller.quorum.voters
	name           string // of its process, in logs
	brokerOnly     bool   // process.roles=broker (no controller listener)
}

// newKafka writes the config and log dir of one broker (not started).
// clusterID is used when there is no KRaft template to copy; "" picks one.
func newKafka(tb testing.TB, cfg kafkaConfig, node kafkaNode, securePorts []int, clusterID string) *Kafka {
	tb.Helper()
	libs, ok := kafkaLibs()
	if !ok {
		missing(tb, "kafka", "no Kafka jars in "+libs)
	}
	java, ok := javaBin()
	if !ok {
		missing(tb, "kafka", "no java binary (set FAULTLINE_JAVA or install Java 17)")
	}
	dir := tb.TempDir()
	dataDir := filepath.Join(dir, "data")
	mkdirs(tb, dataDir)
	addr := fmt.Sprintf("127.0.0.1:%d", node.port)

	props := map[string]string{
		"process.roles":                                    "broker,controller",
		"node.id":                                          fmt.Sprint(node.id),
		"controller.quorum.voters":                         node.voters,
		"listeners":                                        fmt.Sprintf("PLAINTEXT://%s,CONTROLLER://127.0.0.1:%d", addr, node.ctrlPort),
		"advertised.listeners":                             "PLAINTEXT://" + addr,
		"controller.listener.names":                        "CONTROLLER",
		"inter.broker.listener.name":                       "PLAINTEXT",
		"listener.security.protocol.map":                   "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
		"log.dirs":                                         dataDir,
		"auto.create.topics.enable":                        fmt.Sprint(cfg.autoCreate),
		"num.partitions":                                   fmt.Sprint(cfg.partitions),
		"default.replication.factor":                       "1",
		"min.insync.replicas":                              "1",
		"offsets.topic.replication.factor":                 "1",
		"offsets.topic.num.partitions":                     "4",
		"transaction.state.log.replication.factor":         "1",
		"transaction.state.log.min.isr":                    "1",
		"transaction.state.log.num.partitions":             "4",
		"share.coordinator.state.topic.replication.factor": "1",
		"share.coordinator.state.topic.min.isr":            "1",
		"group.initial.rebalance.delay.ms":                 "0",
		"num.network.threads":                              "2",
		"num.io.threads":                                   "4",
		"log.segment.bytes":                                "16777216",
	}
	if node.brokerOnly {
		props["process.roles"] = "broker"
		props["listeners"] = "PLAINTEXT://" + addr
	}
	var sec *KafkaSecurity
	if cfg.secure {
		sec = secureListeners(tb, dir, props, securePorts[0], securePorts[1])
	}
	for k, v := range cfg.props {
		props[k] = v
	}
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "%s=%s\n", k, props[k])
	}
	propsPath := filepath.Join(dir, "server.properties")
	writeFile(tb, propsPath, []byte(sb.String()), 0o644)
	log4jPath := filepath.Join(dir, "log4j2.properties")
	writeFile(tb, log4jPath, []byte(kafkaLog4j), 0o644)

	jvm := append([]string{
		"-Xmx" + cfg.heap, "-Xms64m",
		// C1 only: the C2 compiler threads fight the broker for 2 cores
		// while it starts; C1 halves the start on a busy machine.
		"-XX:TieredStopAtLevel=1",
		"-XX:+UseSerialGC", "-XX:-UsePerfData", "-Xshare:auto",
		"-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile=" + log4jPath,
	}, cfg.jvmFlags...)
	jvm = append(jvm, "-cp", filepath.Join(libs, "*"))
	g := newGroup(tb)
	if !copyKRaftTemplate(tb, filepath.Join(filepath.Dir(libs), "kraft-template"), dataDir, node.id) {
		// No template from install.sh: format the log dir (once; a restart
		// keeps it).
		if clusterID == "" {
			clusterID = newClusterID(tb)
		}
		format := g.add(&process{
			name:    node.name + "-storage-format",
			path:    java,
			args:    slices.Concat(jvm, []string{"kafka.tools.StorageTool", "format", "-t", clusterID, "-c", propsPath}),
			dir:     dir,
			logPath: filepath.Join(dir, "kafka-format.log"),
		})
		if err := format.start(); err != nil {
			tb.Fatalf("testenv: %v", err)
		}
		<-format.exited()
		if format.err != nil { // set before exited() is closed
			tb.Fatalf("testenv: kafka StorageTool format: %v\n%s", format.err, format.logTail(40))
		}
	}

	k := &Kafka{
		tb:      tb,
		addr:    addr,
		version: filepath.Base(filepath.Dir(libs)),
		dataDir: dataDir,
		sec:     sec,
		nodeID:  node.id,
		proc: g.add(&process{
			name:    node.name,
			path:    java,
			args:    slices.Concat(jvm, []string{"kafka.Kafka", propsPath}),
			dir:     dir,
			logPath: filepath.Join(dir, "kafka.log"),
		}),
	}
	tb.Cleanup(k.Close)
	return k
}

// copyKRaftTemplate copies the log dir that install.sh formatted once
// (meta.properties and bootstrap.checkpoint) into dataDir for broker
// nodeID, with its own node.id and a new directory.id (the brokers of one
// cluster share the template's cluster.id), reporting false when there is
// no template.
func copyKRaftTemplate(tb testing.TB, template, dataDir string, nodeID int) bool {
	tb.Helper()
	files := []string{"meta.properties", "bootstrap.checkpoint"}
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(template, f)); err != nil {
			return false
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(template, f))
		if err != nil {
			tb.Fatalf("testenv: %v", err)
		}
		if f == "meta.properties" && nodeID != 1 {
			var out []string
			for _, line := range strings.Split(string(b), "\n") {
				switch {
				case strings.HasPrefix(line, "node.id="):
					line = fmt.Sprintf("node.id=%d", nodeID)
				case strings.HasPrefix(line, "directory.id="):
					line = "directory.id=" + newClusterID(tb)
				}
				out = append(out, line)
			}
			b = []byte(strings.Join(out, "\n"))
		}
		writeFile(tb, filepath.Join(dataDir, f), b, 0o644)
	}
	return true
}

// newClusterID returns a random KRaft cluster id: 16 bytes, URL-safe
// base64 without padding, as kafka-storage random-uuid prints.
func newClusterID(tb testing.TB) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	// A leading '-' would be read as a flag by StorageTool; clearing the top
	// bit keeps the first character in A-Za-f.
	b[0] &= 0x7f
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// Addr returns the broker's bootstrap address, host:port.
func (k *Kafka) Addr() string { return k.addr }

// Start starts the broker again after Stop or Kill, on the same port and
// with the same log dir, and waits until it is ready. Records written
// before the stop are still there.
func (k *Kafka) Start() {
	k.tb.Helper()
	k.launch()
	k.waitReady()
}

// launch starts the broker process without waiting.
func (k *Kafka) launch() {
	k.tb.Helper()
	if err := k.proc.start(); err != nil {
		k.tb.Fatalf("testenv: %v", err)
	}
}

// waitReady waits until the broker serves metadata listing itself.
func (k *Kafka) waitReady() {
	k.tb.Helper()
	began := time.Now()
	if err := waitReady(k.proc, 90*time.Second, k.ready); err != nil {
		k.tb.Fatalf("testenv: %v\n%s", err, k.proc.logTail(60))
	}
	if k.sec != nil {
		k.addSCRAMUser()
		if err := waitReady(k.proc, 60*time.Second, k.secureReady); err != nil {
			k.tb.Fatalf("testenv: %v\n%s", err, k.proc.logTail(60))
		}
	}
	k.tb.Logf("testenv: %s %s ready on %s in %s (log dir %s)", k.proc.name, k.version, k.addr, time.Since(began).Round(time.Millisecond), k.dataDir)
}

// ready succeeds once the broker lists itself (registered with the
// controller quorum and unfenced) in a metadata response.
func (k *Kafka) ready(ctx context.Context) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.addr), kgo.RetryTimeout(time.Second))
	if err != nil {
		return err
	}
	defer cl.Close()
	brokers, err := kadm.NewClient(cl).ListBrokers(ctx)
	if err != nil {
		return err
	}
	for _, b := range brokers {
		if int(b.NodeID) == k.nodeID {
			return nil
		}
	}
	return fmt.Errorf("broker %d not in the metadata it serves (%d brokers)", k.nodeID, len(brokers))
}

// Stop shuts the broker down gracefully (SIGTERM, waiting for the exit; after
// 60 s it is killed). Clients see the broker go away.
func (k *Kafka) Stop() {
	k.tb.Helper()
	began := time.Now()
	k.proc.stop(syscall.SIGTERM, 60*time.Second)
	k.tb.Logf("testenv: kafka stopped in %s", time.Since(began).Round(time.Millisecond))
}

// Pid is the broker's process id while it runs (0 otherwise), for the
// benchmarks that count its CPU time.
func (k *Kafka) Pid() int { return k.proc.pid() }

// Kill kills the broker with SIGKILL, as a crash would.
func (k *Kafka) Kill() { k.proc.stop(syscall.SIGKILL, 10*time.Second) }

// Close stops the broker for good. It is called by the test cleanup and is
// safe to call more than once.
func (k *Kafka) Close() {
	k.closeOnce.Do(func() { k.proc.stop(syscall.SIGKILL, 10*time.Second) })
}

// Client returns a franz-go client seeded with this broker plus opts; it is
// closed when the test ends.
func (k *Kafka) Client(tb testing.TB, opts ...kgo.Opt) *kgo.Client {
	tb.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(k.addr)}, opts...)...)
	if err != nil {
		tb.Fatalf("testenv: kafka client: %v", err)
	}
	tb.Cleanup(cl.Close)
	return cl
}

// Admin returns an admin client for this broker, closed when the test ends.
func (k *Kafka) Admin(tb testing.TB) *kadm.Client {
	tb.Helper()
	return kadm.NewClient(k.Client(tb))
}

// CreateTopic creates a topic with the given partition count (replication
// factor 1) and fails the test on error.
func (k *Kafka) CreateTopic(tb testing.TB, topic string, partitions int32) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := k.Admin(tb)
	resp, err := adm.CreateTopic(ctx, partitions, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		tb.Fatalf("testenv: create topic %q: %v", topic, err)
	}
	// Until every partition has a leader: a producer that learns the topic
	// earlier waits for its next metadata refresh (kgo.MetadataMinAge, 5 s
	// by default) before it sends to a partition it saw without one.
	for {
		td, err := adm.ListTopics(ctx, topic)
		if err == nil {
			err = td.Error()
		}
		if err == nil && len(td[topic].Partitions) == int(partitions) {
			led := 0
			for _, p := range td[topic].Partitions {
				if p.Err == nil && p.Leader >= 0 {
					led++
				}
			}
			if led == int(partitions) {
				return
			}
			err = fmt.Errorf("%d of %d partitions have a leader", led, partitions)
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("testenv: topic %q created, its partitions' leaders not known: %v", topic, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// GroupsSettled reports whether every group is Stable with n members,
// each holding partitions, and otherwise what it saw. The
// cooperative-sticky balancer gives a member that joins last its
// partitions in a second rebalance, after the first settled with that
// member idle: a test that counts on every replica consuming waits for this.
func GroupsSettled(ctx context.Context, adm *kadm.Client, n int, groups ...string) (bool, string) {
	gs, err := adm.DescribeGroups(ctx, groups...)
	if err != nil {
		return false, err.Error()
	}
	var seen []string
	settled := true
	for _, name := range groups {
		g, ok := gs[name]
		if !ok || g.Err != nil {
			return false, fmt.Sprintf("group %s not described: %v", name, g.Err)
		}
		consuming := 0
		for _, m := range g.Members {
			if c, ok := m.Assigned.AsConsumer(); ok && len(c.Topics) > 0 {
				consuming++
			}
		}
		settled = settled && g.State == "Stable" && len(g.Members) == n && consuming == n
		seen = append(seen, fmt.Sprintf("%s: state %s, %d members, %d consuming", name, g.State, len(g.Members), consuming))
	}
	return settled, strings.Join(seen, "; ")
}
