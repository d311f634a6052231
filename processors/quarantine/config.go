package quarantine

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/faultline/faultline/processors/pipeline"
)

// TopicRetry held the records of every cluster that was unreachable when
// its records were handled, before each cluster had its own (RetryTopic);
// the retry consumer still reads it.
const TopicRetry = "faultline.quarantine.retry"

// RetryTopic is the topic of cluster's records deferred while it was
// unreachable; the role's own retry consumer applies them once the
// cluster answers again (see Handler). Each cluster has its own, so a
// cluster down for hours holds only its own records (the retry batch
// fails and is held, pipeline/held.go), never another cluster's behind
// them. A name that is not a DNS label (lower-case letters, digits, '-';
// Kafka's '.' and '_' collide in its metric names) is named by a hash.
func RetryTopic(cluster string) string {
	if len(validation.IsDNS1123Label(cluster)) == 0 {
		return TopicRetry + "." + cluster
	}
	sum := sha256.Sum256([]byte(cluster))
	return TopicRetry + ".h" + hex.EncodeToString(sum[:8])
}

// RetryTopics are the topics the retry consumer reads: the clusters' own,
// and TopicRetry.
func RetryTopics(clusters []string) []string {
	topics := []string{TopicRetry}
	for _, c := range clusters {
		topics = append(topics, RetryTopic(c))
	}
	return topics
}

// Config is the quarantine role's configuration (flags "quarantine.*").
type Config struct {
	// Rules is a rule file (NVSentinel fault-quarantine TOML); "" uses the
	// shipped DefaultRules.
	Rules string `toml:"rules"`
	// OptOutLabel is "key=value": nodes with this label are never
	// quarantined, not even by an operator's quarantineOverrides.force
	// (remove the label first). Default
	// "faultline.io/quarantine=disabled".
	OptOutLabel string `toml:"opt_out_label"`
	// Workers bounds the nodes handled at once per batch. Default 64.
	Workers int `toml:"workers"`
	// ClusterWait is how long a batch keeps retrying a cluster whose API
	// fails before deferring that cluster's records to its RetryTopic
	// (other clusters' records are not held up). One that cannot be
	// reached at all (connection refused) is deferred at once, unless it
	// answers a probe of its /readyz. Default 3s.
	ClusterWait time.Duration `toml:"cluster_wait"`
	// SlowCluster: a cluster whose API writes (its requests that change
	// something) take longer than this on average (clusters.Gate.Slow)
	// has its records deferred to its RetryTopic, as one that fails is,
	// so its slowness holds only its own work: a batch waits for its
	// slowest node, and a cordon costs several requests in turn (the
	// breaker's ConfigMap, the node's status and spec), so one API server
	// answering in seconds would hold every other cluster's cordons
	// several times as long. Its retry consumer applies them at the pace
	// it answers. A write in flight for twice this long counts before it
	// is answered: the batch abandons the cluster's requests and defers
	// its records. Only where the role serves more than one cluster:
	// alone, a slow cluster holds no one else's work. 0: never. Default
	// 500ms.
	SlowCluster time.Duration `toml:"slow_cluster"`
	// RetryWait is how long the retry consumer waits for a cluster in one
	// batch before failing the batch (it is then retried within a second;
	// a cluster that cannot be reached is probed instead). Default 10s.
	RetryWait time.Duration `toml:"retry_wait"`
	// NodeEvents: create a Kubernetes Event on the node for non-fatal
	// unhealthy events. Default true.
	NodeEvents bool `toml:"node_events"`
	// EventNamespace is where node Events are created. Default "default".
	EventNamespace string `toml:"event_namespace"`
	// NodeEventInterval: a node gets at most one Event of a reason per
	// interval (later ones are merged: counted, recorded as a skipped
	// action, not created), so a node's stream of warnings costs one API
	// call, not one per event. 0: an Event per event. Default 1m.
	NodeEventInterval time.Duration `toml:"node_event_interval"`
	// NodeEventQPS: node Events are created in the background at most this
	// many a second per cluster, out of the cluster's client QPS, so they
	// never delay a cordon; a full queue (1,024) drops them. Default 10.
	NodeEventQPS float64 `toml:"node_event_qps"`
	// RepeatWriteInterval: another occurrence of a fault that already
	// stands, deciding nothing new, rewrites the node's state (its last
	// occurrence and event ids) at most once per interval; the others are
	// decided from the node watch without a request, so a GPU repeating a
	// fatal Xid many times a second does not spend the client's QPS that
	// the next node's cordon needs. 0: every occurrence is written.
	// Default 10s.
	RepeatWriteInterval time.Duration `toml:"repeat_write_interval"`
	// FlapThreshold: a fault (a check on an entity) that began this many
	// times within FlapWindow, counting occurrences after recoveries, is
	// flapping: its recovery does not lift it until its entity has stayed
	// healthy for StabilizationWindow. 2 to 8; 0 disables (every recovery
	// lifts at once). Default 3 (the NIC monitor's "3+ link flaps in 10
	// min").
	FlapThreshold int `toml:"flap_threshold"`
	// FlapWindow is the window FlapThreshold counts in; the onsets of a
	// lifted fault are kept on the node's state annotation this long. 0
	// disables. Default 10m.
	FlapWindow time.Duration `toml:"flap_window"`
	// StabilizationWindow is how long a flapping fault's entity must stay
	// healthy before the fault is lifted (by the role's sweep; a new
	// occurrence meanwhile cancels the lift). 0 disables. Default 30m.
	StabilizationWindow time.Duration `toml:"stabilization_window"`
	// RecoveryMemory is how long a lifted fault's recovery is remembered on
	// the node (AnnotationRecovered): meanwhile an occurrence of the fault
	// generated no later than that recovery (a late or repeated copy) does
	// not quarantine the node again. 0: not remembered. Default 1h.
	RecoveryMemory time.Duration `toml:"recovery_memory"`
	// MaxEventAge: an unhealthy event the gateway received longer ago than
	// this is not acted on (recorded as a skipped quarantine, counted in
	// faultline_quarantine_stale_events_total): a consumer group with no
	// committed offset (first start, offsets expired after the broker's
	// offsets.retention.minutes, a renamed group) reads the topic from its
	// start, and its week of faults were of machines long repaired. The
	// age is the gateway's receivedTimestamp, not the agent's generated
	// time: an agent offline for a day sends its spooled faults with a
	// fresh received time, and they act. Recoveries are decided whatever
	// their age (lifting is the safe direction). A partition the group
	// has no committed offset for is read from this far back
	// (pipeline.Config.StartWithin), not from its start. 0: no limit.
	// Default 6h.
	MaxEventAge time.Duration `toml:"max_event_age"`
	// Identity names this processor in annotations and Events.
	// Default "faultline-quarantine/<hostname>".
	Identity string `toml:"identity"`
	// BatchTimeout bounds one batch (main and retry consumer); records not
	// done by then are deferred (main) or retried (retry). Default 2m.
	BatchTimeout time.Duration `toml:"batch_timeout"`
	// MaxPollRecords bounds the records fetched per poll. Default 2000.
	MaxPollRecords int `toml:"max_poll_records"`
	// RetryMaxPollRecords bounds the records the retry consumer fetches
	// per poll. Its batches wait for a troubled cluster's requests —
	// seconds each on a slow API server (SlowCluster) — so what it
	// drains is about a batch's records per that wait: at 2,000 a batch,
	// a cluster answering in 1.5 s fell behind its own share of 1,000
	// events/s. Default 20000.
	RetryMaxPollRecords int `toml:"retry_max_poll_records"`
	// RuleCostLimit bounds the CEL cost of one rule expression on one
	// event; past it the expression fails (counted in
	// faultline_quarantine_rule_errors_total, logged) and its rule set
	// does not match. Default DefaultRuleCostLimit.
	RuleCostLimit uint64 `toml:"rule_cost_limit"`
	// Breaker is the circuit breaker.
	Breaker BreakerConfig `toml:"breaker"`
}

// Pipeline returns the runner settings of the role's consumer (the retry
// consumer takes the same, with its own Role and Topics). A partition the
// group has no committed offset for is read from MaxEventAge back, not
// from the topic's start: nothing older would be acted on.
func (c Config) Pipeline() pipeline.Config {
	return pipeline.Config{Role: Role, Topics: Topics, BatchTimeout: c.BatchTimeout, MaxPollRecords: c.MaxPollRecords,
		StartWithin: c.MaxEventAge}
}

// BreakerConfig configures the per-cluster circuit breaker.
type BreakerConfig struct {
	// Enabled turns the breaker on. Default true.
	Enabled bool `toml:"enabled"`
	// MaxPercent of a cluster's GPU nodes faultline may newly quarantine
	// within Window. Default 10.
	MaxPercent float64 `toml:"max_percent"`
	// Window is the sliding window. Default 10m.
	Window time.Duration `toml:"window"`
	// MinHealthy is the floor of schedulable GPU nodes. Default 0.
	MinHealthy int `toml:"min_healthy"`
	// AutoClose closes an open breaker once Window has passed since it
	// opened; otherwise an operator closes it. Default true.
	AutoClose bool `toml:"auto_close"`
	// GPUNodeSelector selects the cluster's GPU nodes (a label selector);
	// "" counts every node. Default "".
	GPUNodeSelector string `toml:"gpu_node_selector"`
	// Namespace and Name of the breaker's ConfigMap in each cluster.
	// Default "default" / "faultline-quarantine-breaker".
	Namespace string `toml:"namespace"`
	Name      string `toml:"name"`
	// NodeCountTTL is how long a node count is reused. Default 10s.
	NodeCountTTL time.Duration `toml:"node_count_ttl"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	if host == "" {
		host = "unknown"
	}
	return Config{
		OptOutLabel:         "faultline.io/quarantine=disabled",
		Workers:             64,
		ClusterWait:         3 * time.Second,
		RetryWait:           10 * time.Second,
		SlowCluster:         500 * time.Millisecond,
		NodeEvents:          true,
		EventNamespace:      "default",
		NodeEventInterval:   time.Minute,
		NodeEventQPS:        10,
		RepeatWriteInterval: 10 * time.Second,
		FlapThreshold:       3,
		FlapWindow:          10 * time.Minute,
		StabilizationWindow: 30 * time.Minute,
		RecoveryMemory:      time.Hour,
		MaxEventAge:         6 * time.Hour,
		Identity:            "faultline-quarantine/" + host,
		BatchTimeout:        2 * time.Minute,
		MaxPollRecords:      2000,
		RetryMaxPollRecords: 20000,
		RuleCostLimit:       DefaultRuleCostLimit,
		Breaker: BreakerConfig{
			Enabled:      true,
			MaxPercent:   10,
			Window:       10 * time.Minute,
			AutoClose:    true,
			Namespace:    "default",
			Name:         "faultline-quarantine-breaker",
			NodeCountTTL: 10 * time.Second,
		},
	}
}

// RegisterFlags adds the config's flags with the given prefix ("quarantine.").
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.Rules, prefix+"rules", c.Rules, "quarantine rule file (TOML); empty: the shipped default rule sets")
	fs.StringVar(&c.OptOutLabel, prefix+"opt-out-label", c.OptOutLabel, "key=value label that exempts a node from quarantine")
	fs.IntVar(&c.Workers, prefix+"workers", c.Workers, "nodes handled concurrently per batch")
	fs.DurationVar(&c.ClusterWait, prefix+"cluster-wait", c.ClusterWait, "how long a batch retries a cluster whose API fails before deferring its records (one that cannot be reached: at once)")
	fs.DurationVar(&c.SlowCluster, prefix+"slow-cluster", c.SlowCluster, "a cluster whose API writes take longer than this on average has its records deferred to its retry topic (0: never)")
	fs.DurationVar(&c.RetryWait, prefix+"retry-wait", c.RetryWait, "how long the retry consumer waits for a cluster per batch")
	fs.BoolVar(&c.NodeEvents, prefix+"node-events", c.NodeEvents, "create a Kubernetes Event on the node for non-fatal events")
	fs.StringVar(&c.EventNamespace, prefix+"event-namespace", c.EventNamespace, "namespace of node Events")
	fs.Float64Var(&c.NodeEventQPS, prefix+"node-event-qps", c.NodeEventQPS, "node Events created per second per cluster, in the background")
	fs.DurationVar(&c.NodeEventInterval, prefix+"node-event-interval", c.NodeEventInterval, "at most one node Event of a reason per node per interval (0: one per event)")
	fs.DurationVar(&c.RepeatWriteInterval, prefix+"repeat-write-interval", c.RepeatWriteInterval, "a standing fault's repeat occurrences rewrite the node at most once per interval (0: every occurrence)")
	fs.IntVar(&c.FlapThreshold, prefix+"flap-threshold", c.FlapThreshold, "a fault begun this many times within flap-window is flapping: its recovery waits for stabilization-window (0: off)")
	fs.DurationVar(&c.FlapWindow, prefix+"flap-window", c.FlapWindow, "window flap-threshold counts in (0: off)")
	fs.DurationVar(&c.StabilizationWindow, prefix+"stabilization-window", c.StabilizationWindow, "how long a flapping fault must stay healthy before it is lifted (0: off)")
	fs.DurationVar(&c.RecoveryMemory, prefix+"recovery-memory", c.RecoveryMemory, "how long a lifted fault's recovery is remembered: an occurrence generated before it does not quarantine again (0: off)")
	fs.DurationVar(&c.MaxEventAge, prefix+"max-event-age", c.MaxEventAge, "unhealthy events received by the gateway longer ago than this are recorded as skipped, not acted on (0: no limit)")
	fs.StringVar(&c.Identity, prefix+"identity", c.Identity, "processor identity written on nodes")
	fs.DurationVar(&c.BatchTimeout, prefix+"batch-timeout", c.BatchTimeout, "bound of one batch")
	fs.IntVar(&c.MaxPollRecords, prefix+"max-poll-records", c.MaxPollRecords, "records fetched per poll")
	fs.IntVar(&c.RetryMaxPollRecords, prefix+"retry-max-poll-records", c.RetryMaxPollRecords, "records the retry consumer fetches per poll")
	fs.Uint64Var(&c.RuleCostLimit, prefix+"rule-cost-limit", c.RuleCostLimit, "CEL cost one rule expression may spend on one event")
	b := &c.Breaker
	p := prefix + "breaker."
	fs.BoolVar(&b.Enabled, p+"enabled", b.Enabled, "enable the circuit breaker")
	fs.Float64Var(&b.MaxPercent, p+"max-percent", b.MaxPercent, "max percent of a cluster's GPU nodes quarantined within the window")
	fs.DurationVar(&b.Window, p+"window", b.Window, "breaker sliding window")
	fs.IntVar(&b.MinHealthy, p+"min-healthy", b.MinHealthy, "floor of schedulable GPU nodes")
	fs.BoolVar(&b.AutoClose, p+"auto-close", b.AutoClose, "close an open breaker after the window (else manual)")
	fs.StringVar(&b.GPUNodeSelector, p+"gpu-node-selector", b.GPUNodeSelector, "label selector of GPU nodes (empty: all nodes)")
	fs.StringVar(&b.Namespace, p+"namespace", b.Namespace, "namespace of the breaker ConfigMap")
	fs.StringVar(&b.Name, p+"name", b.Name, "name of the breaker ConfigMap")
	fs.DurationVar(&b.NodeCountTTL, p+"node-count-ttl", b.NodeCountTTL, "how long a node count is reused")
}

// Validate names the first bad key, with the given prefix ("quarantine.").
// The rule file itself is checked when the role starts (Compile).
func (c Config) Validate(prefix string) error {
	if _, _, err := c.optOut(); err != nil {
		return fmt.Errorf("%sopt_out_label: %w", prefix, err)
	}
	if c.Workers < 1 {
		return fmt.Errorf("%sworkers: must be at least 1, got %d", prefix, c.Workers)
	}
	if c.ClusterWait <= 0 {
		return fmt.Errorf("%scluster_wait: must be positive, got %v", prefix, c.ClusterWait)
	}
	if c.RetryWait <= 0 {
		return fmt.Errorf("%sretry_wait: must be positive, got %v", prefix, c.RetryWait)
	}
	if c.SlowCluster < 0 {
		return fmt.Errorf("%sslow_cluster: must not be negative (0: never), got %v", prefix, c.SlowCluster)
	}
	if q := c.NodeEventQPS; c.NodeEvents && (math.IsNaN(q) || math.IsInf(q, 0) || q <= 0) {
		return fmt.Errorf("%snode_event_qps: must be a finite number above 0 when node_events is on, got %v", prefix, c.NodeEventQPS)
	}
	if c.NodeEventInterval < 0 {
		return fmt.Errorf("%snode_event_interval: must not be negative, got %v", prefix, c.NodeEventInterval)
	}
	if c.RepeatWriteInterval < 0 {
		return fmt.Errorf("%srepeat_write_interval: must not be negative, got %v", prefix, c.RepeatWriteInterval)
	}
	if c.FlapThreshold != 0 && (c.FlapThreshold < 2 || c.FlapThreshold > maxOnsets) {
		return fmt.Errorf("%sflap_threshold: must be 0 (off) or 2 to %d, got %d", prefix, maxOnsets, c.FlapThreshold)
	}
	if c.FlapWindow < 0 {
		return fmt.Errorf("%sflap_window: must not be negative, got %v", prefix, c.FlapWindow)
	}
	if c.StabilizationWindow < 0 {
		return fmt.Errorf("%sstabilization_window: must not be negative, got %v", prefix, c.StabilizationWindow)
	}
	if c.RecoveryMemory < 0 {
		return fmt.Errorf("%srecovery_memory: must not be negative, got %v", prefix, c.RecoveryMemory)
	}
	if c.MaxEventAge < 0 {
		return fmt.Errorf("%smax_event_age: must not be negative (0: no limit), got %v", prefix, c.MaxEventAge)
	}
	if c.NodeEvents && c.EventNamespace == "" {
		return fmt.Errorf("%sevent_namespace: required when node_events is on", prefix)
	}
	if c.BatchTimeout <= c.ClusterWait || c.BatchTimeout <= c.RetryWait {
		return fmt.Errorf("%sbatch_timeout: must exceed cluster_wait and retry_wait, got %v", prefix, c.BatchTimeout)
	}
	if c.RetryMaxPollRecords < 1 {
		return fmt.Errorf("%sretry_max_poll_records: must be at least 1, got %d", prefix, c.RetryMaxPollRecords)
	}
	if c.MaxPollRecords < 1 {
		return fmt.Errorf("%smax_poll_records: must be at least 1, got %d", prefix, c.MaxPollRecords)
	}
	if c.Identity == "" {
		return fmt.Errorf("%sidentity: required", prefix)
	}
	if c.RuleCostLimit == 0 {
		return fmt.Errorf("%srule_cost_limit: must be positive", prefix)
	}
	b, p := c.Breaker, prefix+"breaker."
	if !b.Enabled {
		return nil
	}
	if math.IsNaN(b.MaxPercent) || b.MaxPercent <= 0 || b.MaxPercent > 100 {
		return fmt.Errorf("%smax_percent: must be in (0, 100], got %v", p, b.MaxPercent)
	}
	if b.Window <= 0 {
		return fmt.Errorf("%swindow: must be positive, got %v", p, b.Window)
	}
	if b.MinHealthy < 0 {
		return fmt.Errorf("%smin_healthy: must not be negative, got %d", p, b.MinHealthy)
	}
	if _, err := labels.Parse(b.GPUNodeSelector); err != nil {
		return fmt.Errorf("%sgpu_node_selector: %w", p, err)
	}
	if errs := validation.IsDNS1123Label(b.Namespace); len(errs) > 0 {
		return fmt.Errorf("%snamespace: %s", p, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(b.Name); len(errs) > 0 {
		return fmt.Errorf("%sname: %s", p, strings.Join(errs, "; "))
	}
	if b.NodeCountTTL <= 0 {
		return fmt.Errorf("%snode_count_ttl: must be positive, got %v", p, b.NodeCountTTL)
	}
	return nil
}

// Flap is the flapping policy of FlapThreshold, FlapWindow and
// StabilizationWindow (disabled when any is 0).
func (c Config) Flap() FlapPolicy {
	return FlapPolicy{Threshold: c.FlapThreshold, Window: c.FlapWindow, Stabilization: c.StabilizationWindow}
}

// sweepInterval is how often the stabilization sweep looks for faults
// whose window passed: a tenth of the window, between 100ms and 30s; 30s
// when flapping is off (it only forgets remembered recoveries then).
func (c Config) sweepInterval() time.Duration {
	if !c.Flap().Enabled() {
		return 30 * time.Second
	}
	return min(max(c.StabilizationWindow/10, 100*time.Millisecond), 30*time.Second)
}

// optOut splits OptOutLabel; an empty one disables the opt-out.
func (c Config) optOut() (string, string, error) {
	if c.OptOutLabel == "" {
		return "", "", nil
	}
	k, v, ok := strings.Cut(c.OptOutLabel, "=")
	if !ok {
		return "", "", fmt.Errorf("want key=value, got %q", c.OptOutLabel)
	}
	if errs := validation.IsQualifiedName(k); len(errs) > 0 {
		return "", "", fmt.Errorf("key %q: %s", k, strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
		return "", "", fmt.Errorf("value %q: %s", v, strings.Join(errs, "; "))
	}
	return k, v, nil
}
