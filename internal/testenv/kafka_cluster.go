package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// KafkaCluster is several Kafka brokers forming one KRaft cluster, started
// by StartKafkaCluster: every broker is also a controller (a quorum of n
// voters, so a majority must run for metadata to change), or with
// KafkaControllers(k) only the last k.
//
// Measured on the 2-core machine (load 3-8): three brokers ready 15-30 s
// after exec (they start together), ~300 MB RSS each with a 384 MB heap; a
// killed broker is fenced by the others after 3 s
// (broker.session.timeout.ms).
type KafkaCluster struct {
	// Brokers are the brokers, node.id 1..n in order.
	Brokers []*Kafka
}

// KafkaClusterDefaults are the broker settings StartKafkaCluster writes for
// n brokers (before any KafkaBrokerConfig): the fleet's replication
// (factor min(3, n), min.insync.replicas min(2, n), internal topics too),
// no unclean leader election, and short failure detection so a test sees
// a broker's loss in seconds.
func KafkaClusterDefaults(n int) map[string]string {
	rf, isr := fmt.Sprint(min(3, n)), fmt.Sprint(min(2, n))
	return map[string]string{
		"default.replication.factor":                       rf,
		"min.insync.replicas":                              isr,
		"offsets.topic.replication.factor":                 rf,
		"transaction.state.log.replication.factor":         rf,
		"transaction.state.log.min.isr":                    isr,
		"share.coordinator.state.topic.replication.factor": rf,
		"share.coordinator.state.topic.min.isr":            isr,
		"unclean.leader.election.enable":                   "false",
		"broker.session.timeout.ms":                        "3000",
		"broker.heartbeat.interval.ms":                     "500",
		"replica.lag.time.max.ms":                          "5000",
		"controller.quorum.election.timeout.ms":            "1000",
		"controller.quorum.fetch.timeout.ms":               "2000",
	}
}

// StartKafkaCluster starts n brokers (KafkaClusterDefaults, a 384 MB heap
// each, then opts) on free 127.0.0.1 ports, all at once (a KRaft quorum
// forms only when a majority runs), and waits until every broker lists all
// n. They stop when the test ends. KafkaSecure is not supported here.
func StartKafkaCluster(tb testing.TB, n int, opts ...KafkaOption) *KafkaCluster {
	tb.Helper()
	if n < 1 {
		tb.Fatalf("testenv: a Kafka cluster needs at least one broker, got %d", n)
	}
	cfg := kafkaConfig{autoCreate: true, partitions: 6, heap: "384m", props: KafkaClusterDefaults(n)}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.secure {
		tb.Fatalf("testenv: StartKafkaCluster does not support KafkaSecure")
	}
	controllers := cfg.controllers
	if controllers <= 0 || controllers > n {
		controllers = n
	}
	type ports struct{ port, ctrl int }
	ps := make([]ports, n)
	var voters []string
	for i := range ps {
		p := freePorts(tb, 2)
		ps[i] = ports{p[0], p[1]}
		if i >= n-controllers {
			voters = append(voters, fmt.Sprintf("%d@127.0.0.1:%d", i+1, p[1]))
		}
	}
	// Without the KRaft template every broker is formatted with this id.
	clusterID := newClusterID(tb)
	c := &KafkaCluster{}
	for i, p := range ps {
		node := kafkaNode{id: i + 1, port: p.port, ctrlPort: p.ctrl, voters: strings.Join(voters, ","), name: fmt.Sprintf("kafka-%d", i+1),
			brokerOnly: i < n-controllers}
		c.Brokers = append(c.Brokers, newKafka(tb, cfg, node, nil, clusterID))
	}
	began := time.Now()
	for _, k := range c.Brokers {
		k.launch()
	}
	for _, k := range c.Brokers {
		k.waitReady()
	}
	c.waitBrokers(tb, n, 90*time.Second)
	tb.Logf("testenv: kafka cluster of %d brokers ready in %s (%s)", n, time.Since(began).Round(time.Millisecond), c.Addrs())
	return c
}

// waitBrokers waits until a metadata request lists want brokers.
func (c *KafkaCluster) waitBrokers(tb testing.TB, want int, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.running()...), kgo.RetryTimeout(time.Second))
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			var bs kadm.BrokerDetails
			bs, err = kadm.NewClient(cl).ListBrokers(ctx)
			cancel()
			cl.Close()
			if err == nil && len(bs) == want {
				return
			}
			if err == nil {
				err = fmt.Errorf("%d brokers listed", len(bs))
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("testenv: kafka cluster: %d brokers not listed after %s: %v", want, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// running returns the addresses of the brokers whose process runs.
func (c *KafkaCluster) running() []string {
	var out []string
	for _, k := range c.Brokers {
		if k.proc.running() {
			out = append(out, k.addr)
		}
	}
	return out
}

// Addrs returns the brokers' addresses, comma-separated (a seed list).
func (c *KafkaCluster) Addrs() string {
	out := make([]string, len(c.Brokers))
	for i, k := range c.Brokers {
		out[i] = k.addr
	}
	return strings.Join(out, ",")
}

// Client returns a franz-go client seeded with every broker plus opts,
// closed when the test ends.
func (c *KafkaCluster) Client(tb testing.TB, opts ...kgo.Opt) *kgo.Client {
	tb.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(strings.Split(c.Addrs(), ",")...)}, opts...)...)
	if err != nil {
		tb.Fatalf("testenv: kafka client: %v", err)
	}
	tb.Cleanup(cl.Close)
	return cl
}

// Admin returns an admin client for the cluster, closed when the test ends.
func (c *KafkaCluster) Admin(tb testing.TB) *kadm.Client {
	tb.Helper()
	return kadm.NewClient(c.Client(tb))
}

// Restore starts every broker that was stopped or killed (all at once) and
// waits until the cluster lists them all again.
func (c *KafkaCluster) Restore(tb testing.TB) {
	tb.Helper()
	var started []*Kafka
	for _, k := range c.Brokers {
		if !k.proc.running() {
			k.launch()
			started = append(started, k)
		}
	}
	for _, k := range started {
		k.waitReady()
	}
	if len(started) > 0 {
		c.waitBrokers(tb, len(c.Brokers), 90*time.Second)
	}
}
