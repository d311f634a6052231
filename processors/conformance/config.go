package conformance

import (
	"flag"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
)

// Role is the role's name (--role=conformance).
const Role = events.RoleConformance

// Topics are what the role consumes: the accepted events, of which it
// keeps the NodeConformance reports.
var Topics = []string{events.TopicEvents}

// Kubernetes names the role writes.
const (
	// TaintDrift is the PreferNoSchedule taint of a drifted node; its value
	// is the node's conformance group (GroupLabelValue).
	TaintDrift = "faultline.io/conformance-drift"
	// LabelGroup names the conformance group a drifted node drifted from
	// (its pool: GroupValue).
	LabelGroup = "faultline.io/conformance-group"
	// AnnotationState is the role's state on a drifted node (JSON State).
	AnnotationState = "faultline.io/conformance-state"
	// AnnotationApproved is set by an operator on a sensitive node after
	// remediation: its value is the fingerprint (or a prefix of at least
	// 12 hex digits) the operator approves; the node is un-drained once
	// it reports that fingerprint and it is the expected one.
	AnnotationApproved = "faultline.io/conformance-approved"
)

// Check names of the derived events the role produces.
const (
	// CheckDriftSensitive: a sensitive node drifted (fatal: the quarantine
	// path cordons, taints and drains it); its healthy event un-drains.
	CheckDriftSensitive = "NodeConformanceDrift"
	// CheckDriftTimeout: a node stayed drifted past its timeout (fatal,
	// CONTACT_SUPPORT); lifted by an operator, or by the role's healthy
	// event when the group comes to expect the very fingerprint the node
	// drifted with (a rolling upgrade whose majority flipped).
	CheckDriftTimeout = "NodeConformanceDriftTimeout"
	// Agent is the derived events' agent.
	Agent = "faultline-conformance"
)

// Baseline is a conformance group's configured expected fingerprint.
type Baseline struct {
	// Cluster is the group's cluster (required).
	Cluster string `toml:"cluster"`
	// Pool is the group's node pool (the pool label's value); "" for
	// the nodes without the label (or every node when no pool label is
	// configured). The baseline applies to each hardware group of the
	// pool (HardwareLabels).
	Pool string `toml:"pool"`
	// Fingerprint is the expected fingerprint (64 hex digits).
	Fingerprint string `toml:"fingerprint"`
}

// NotifierConfig is the remediation notifier ([conformance.notifier]).
type NotifierConfig struct {
	// URL is the PATCH target, with {node} and {xname} replaced by the
	// node's name and its xname (XnameLabel, else the node name), e.g.
	// "https://smd.example/hsm/v2/State/Components/{xname}". "" disables
	// the notifier. Default "".
	URL string `toml:"url"`
	// XnameLabel is the node label holding the node's xname. Default
	// "openchami.io/xname".
	XnameLabel string `toml:"xname_label"`
	// TokenFile holds a bearer token sent with each call (re-read each
	// call). Default none.
	TokenFile string `toml:"token_file"`
	// Timeout bounds one call. Default 10s.
	Timeout time.Duration `toml:"timeout"`
	// Attempts is how many times a notification is tried. Default 8.
	Attempts int `toml:"attempts"`
	// MinBackoff and MaxBackoff bound the exponential backoff between
	// attempts. Default 1s and 5m.
	MinBackoff time.Duration `toml:"min_backoff"`
	MaxBackoff time.Duration `toml:"max_backoff"`
	// Queue is how many notifications may wait; past it a notification
	// is recorded as failed instead of blocking the role. Default 10000.
	Queue int `toml:"queue"`
}

// Config is the role's configuration ([conformance], flags --conformance.*).
type Config struct {
	// PoolLabel is the node label whose value is the node pool: groups are
	// per cluster and pool. "" (or a node without it): the cluster is the
	// group. Default "faultline.io/node-pool".
	PoolLabel string `toml:"pool_label"`
	// HardwareLabels are node labels whose values split each pool's group
	// by hardware identity: nodes of another GPU or server model (other
	// BIOS, VBIOS, NIC firmware by design) never drift against each
	// other. A node groups by the labels of these it carries; none (or no
	// kubeconfig): by pool alone; one lacking a label another node of its
	// pool carries is undecided (its hardware not known yet). The value of
	// nvidia.com/gpu.product counts without GPU Feature Discovery's
	// "-SHARED" and "-MIG-<profile>" suffixes (same hardware). Default
	// nvidia.com/gpu.product,
	// nvidia.com/gpu.machine (GPU Feature Discovery) and
	// node.kubernetes.io/instance-type; empty: by pool alone.
	HardwareLabels []string `toml:"hardware_labels"`
	// SensitiveLabel is "key=value" marking sensitive nodes (drained at
	// once on drift, un-drained only after re-verification and approval).
	// Default "faultline.io/sensitive=true".
	SensitiveLabel string `toml:"sensitive_label"`
	// Staleness: a node whose latest report is older is unknown. Default
	// 13h (two missed 6-hourly reports, plus an hour).
	Staleness time.Duration `toml:"staleness"`
	// DriftRemediationTimeout: a node drifted this long is escalated to a
	// fatal event. Default 24h.
	DriftRemediationTimeout time.Duration `toml:"drift_remediation_timeout"`
	// SensitiveTimeout is DriftRemediationTimeout for sensitive nodes.
	// Default 4h.
	SensitiveTimeout time.Duration `toml:"sensitive_timeout"`
	// SweepInterval is how often each cluster's groups are evaluated.
	// Default 1m.
	SweepInterval time.Duration `toml:"sweep_interval"`
	// Baselines are the groups' configured expected fingerprints; a group
	// without one expects its majority's.
	Baselines []Baseline `toml:"baselines"`
	// Notifier tells the infrastructure (OpenCHAMI SMD) of drift.
	Notifier NotifierConfig `toml:"notifier"`
	// BatchTimeout bounds one batch of reports. Default 30s.
	BatchTimeout time.Duration `toml:"batch_timeout"`

	sensKey, sensVal string
	baseline         map[string]string
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		PoolLabel:               "faultline.io/node-pool",
		HardwareLabels:          []string{"nvidia.com/gpu.product", "nvidia.com/gpu.machine", "node.kubernetes.io/instance-type"},
		SensitiveLabel:          "faultline.io/sensitive=true",
		Staleness:               13 * time.Hour,
		DriftRemediationTimeout: 24 * time.Hour,
		SensitiveTimeout:        4 * time.Hour,
		SweepInterval:           time.Minute,
		BatchTimeout:            30 * time.Second,
		Notifier: NotifierConfig{XnameLabel: "openchami.io/xname", Timeout: 10 * time.Second, Attempts: 8,
			MinBackoff: time.Second, MaxBackoff: 5 * time.Minute, Queue: 10000},
	}
}

// RegisterFlags adds the flags under prefix ("conformance."); baselines
// are set in the TOML file.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.PoolLabel, prefix+"pool-label", c.PoolLabel, "node label naming the node pool (conformance groups are per cluster and pool)")
	fs.Func(prefix+"hardware-labels", "comma-separated node labels whose values split each pool's conformance group by hardware (default "+strings.Join(c.HardwareLabels, ",")+"; empty: by pool alone)", func(v string) error {
		c.HardwareLabels = nil
		for _, l := range strings.Split(v, ",") {
			if l = strings.TrimSpace(l); l != "" {
				c.HardwareLabels = append(c.HardwareLabels, l)
			}
		}
		return nil
	})
	fs.StringVar(&c.SensitiveLabel, prefix+"sensitive-label", c.SensitiveLabel, "key=value label of sensitive nodes")
	fs.DurationVar(&c.Staleness, prefix+"staleness", c.Staleness, "a node whose latest report is older is unknown")
	fs.DurationVar(&c.DriftRemediationTimeout, prefix+"drift-remediation-timeout", c.DriftRemediationTimeout, "drifted this long: escalated to a fatal event")
	fs.DurationVar(&c.SensitiveTimeout, prefix+"sensitive-timeout", c.SensitiveTimeout, "drift remediation timeout of sensitive nodes")
	fs.DurationVar(&c.SweepInterval, prefix+"sweep-interval", c.SweepInterval, "how often each cluster's conformance groups are evaluated")
	fs.DurationVar(&c.BatchTimeout, prefix+"batch-timeout", c.BatchTimeout, "bound of one batch of reports")
	n := &c.Notifier
	p := prefix + "notifier."
	fs.StringVar(&n.URL, p+"url", n.URL, "remediation notifier PATCH URL ({node}, {xname}); empty disables it")
	fs.StringVar(&n.XnameLabel, p+"xname-label", n.XnameLabel, "node label holding the node's xname")
	fs.StringVar(&n.TokenFile, p+"token-file", n.TokenFile, "bearer token file of the notifier")
	fs.DurationVar(&n.Timeout, p+"timeout", n.Timeout, "bound of one notifier call")
	fs.IntVar(&n.Attempts, p+"attempts", n.Attempts, "tries of one notification")
	fs.DurationVar(&n.MinBackoff, p+"min-backoff", n.MinBackoff, "first backoff between notifier tries")
	fs.DurationVar(&n.MaxBackoff, p+"max-backoff", n.MaxBackoff, "longest backoff between notifier tries")
	fs.IntVar(&n.Queue, p+"queue", n.Queue, "notifications that may wait before new ones are recorded as failed")
}

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Validate names the first bad key with the given prefix ("conformance.").
func (c *Config) Validate(prefix string) error {
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"staleness", c.Staleness}, {"drift_remediation_timeout", c.DriftRemediationTimeout}, {"sensitive_timeout", c.SensitiveTimeout},
		{"sweep_interval", c.SweepInterval}, {"batch_timeout", c.BatchTimeout}} {
		if d.v <= 0 {
			return fmt.Errorf("%s%s: must be positive, got %v", prefix, d.key, d.v)
		}
	}
	c.sensKey, c.sensVal = "", ""
	if c.SensitiveLabel != "" {
		k, v, ok := strings.Cut(c.SensitiveLabel, "=")
		if !ok || k == "" {
			return fmt.Errorf("%ssensitive_label: want key=value, got %q", prefix, c.SensitiveLabel)
		}
		// A key or value no node can carry never matches: sensitive
		// nodes would drift without being drained.
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("%ssensitive_label: key %q: %s", prefix, k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return fmt.Errorf("%ssensitive_label: value %q: %s", prefix, v, strings.Join(errs, "; "))
		}
		c.sensKey, c.sensVal = k, v
	}
	if c.PoolLabel != "" {
		if errs := validation.IsQualifiedName(c.PoolLabel); len(errs) > 0 {
			return fmt.Errorf("%spool_label: %q is not a label key: %s", prefix, c.PoolLabel, strings.Join(errs, "; "))
		}
	}
	seen := map[string]bool{}
	for i, l := range c.HardwareLabels {
		switch {
		case len(validation.IsQualifiedName(l)) > 0:
			return fmt.Errorf("%shardware_labels[%d]: %q is not a label key: %s", prefix, i, l, strings.Join(validation.IsQualifiedName(l), "; "))
		case l == c.PoolLabel:
			return fmt.Errorf("%shardware_labels[%d]: %q is pool_label", prefix, i, l)
		case seen[l]:
			return fmt.Errorf("%shardware_labels[%d]: %q listed twice", prefix, i, l)
		}
		seen[l] = true
	}
	c.baseline = map[string]string{}
	for i, b := range c.Baselines {
		key := fmt.Sprintf("%sbaselines[%d]", prefix, i)
		switch {
		case b.Cluster == "":
			return fmt.Errorf("%s.cluster: required", key)
		case !events.IsClusterName(b.Cluster):
			return fmt.Errorf("%s.cluster: %q is not a cluster name (lower-case letters, digits, '-' and '.', at most 63 characters): no report would match it", key, b.Cluster)
		case !hex64.MatchString(b.Fingerprint):
			return fmt.Errorf("%s.fingerprint: want 64 lower-case hex digits (a SHA-256), got %q", key, b.Fingerprint)
		// A pool no node can be in: the baseline would never apply and its
		// group would fall back to the majority without a word.
		case b.Pool != "" && c.PoolLabel == "":
			return fmt.Errorf("%s.pool: %q set but %spool_label is empty: no node is in a pool", key, b.Pool, prefix)
		case b.Pool != "" && len(validation.IsValidLabelValue(b.Pool)) > 0:
			return fmt.Errorf("%s.pool: %q is not a label value: %s", key, b.Pool, strings.Join(validation.IsValidLabelValue(b.Pool), "; "))
		}
		g := groupKey(b.Cluster, b.Pool)
		if _, dup := c.baseline[g]; dup {
			return fmt.Errorf("%s: a second baseline for group %s", key, g)
		}
		c.baseline[g] = b.Fingerprint
	}
	n := c.Notifier
	p := prefix + "notifier."
	if n.URL != "" {
		filled := strings.NewReplacer("{node}", "n", "{xname}", "x").Replace(n.URL)
		u, err := url.Parse(filled)
		switch {
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
			return fmt.Errorf("%surl: want an http(s) URL, got %q", p, n.URL)
		case strings.ContainsAny(filled, "{}"):
			return fmt.Errorf("%surl: only {node} and {xname} are replaced, got %q", p, n.URL)
		case filled == n.URL:
			return fmt.Errorf("%surl: must name the node with {node} or {xname}, got %q", p, n.URL)
		}
	}
	if n.TokenFile != "" {
		if _, err := config.ReadSecret(n.TokenFile, ""); err != nil {
			return fmt.Errorf("%stoken_file: %w", p, err)
		}
	}
	switch {
	case n.Timeout <= 0:
		return fmt.Errorf("%stimeout: must be positive, got %v", p, n.Timeout)
	case n.Attempts < 1:
		return fmt.Errorf("%sattempts: must be at least 1, got %d", p, n.Attempts)
	case n.MinBackoff <= 0 || n.MaxBackoff < n.MinBackoff:
		return fmt.Errorf("%smin_backoff: must be positive and at most max_backoff, got %v and %v", p, n.MinBackoff, n.MaxBackoff)
	case n.Queue < 1:
		return fmt.Errorf("%squeue: must be at least 1, got %d", p, n.Queue)
	}
	return nil
}

// groupKey names a conformance group: "cluster" or "cluster/pool".
func groupKey(cluster, pool string) string {
	if pool == "" {
		return cluster
	}
	return cluster + "/" + pool
}

// Pipeline returns the runner settings of the role's consumer: reports are
// written to ClickHouse in bulk.
func (c Config) Pipeline() pipeline.Config {
	return pipeline.Config{Role: Role, Topics: Topics, BatchTimeout: c.BatchTimeout, Linger: 200 * time.Millisecond, MergePartitions: true}
}
