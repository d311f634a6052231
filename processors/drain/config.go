package drain

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/requeue"
)

// TopicRequeue carries drains still in progress back to the drain role
// after Config.PollInterval (see processors/requeue).
const TopicRequeue = "faultline.drain.requeue"

// TopicSlow is the drain role's slow lane (requeue.Lane): the drains of a
// cluster whose API writes take longer than Config.SlowCluster.
const TopicSlow = "faultline.drain.slow"

// Mode is how the pods a rule selects are drained.
type Mode string

// Drain modes.
const (
	// ModeImmediate evicts through the Eviction API, retrying PDB refusals
	// with backoff, and gives up after the rule's timeout.
	ModeImmediate Mode = "Immediate"
	// ModeAllowCompletion evicts nothing: it waits for the pods to finish
	// (phase Succeeded or Failed, or deleted by their owner) and gives up
	// after the rule's timeout.
	ModeAllowCompletion Mode = "AllowCompletion"
	// ModeDeleteAfterTimeout evicts like Immediate and, once the rule's
	// timeout has passed since the drain first saw the pod, deletes what
	// is left with grace period 0 (PDBs no longer hold it).
	ModeDeleteAfterTimeout Mode = "DeleteAfterTimeout"
)

func (m Mode) valid() bool {
	return m == ModeImmediate || m == ModeAllowCompletion || m == ModeDeleteAfterTimeout
}

// EmptyDir policies.
const (
	// EmptyDirEvict drains pods with emptyDir volumes like any other (their
	// local data is lost, as with kubectl drain --delete-emptydir-data).
	EmptyDirEvict = "evict"
	// EmptyDirSkip leaves pods with emptyDir volumes running; the drain
	// lists them as skipped.
	EmptyDirSkip = "skip"
)

// Rule picks the mode of the pods whose namespace matches Namespace and
// whose labels match Selector. The first matching rule wins; pods no rule
// matches get Config.Mode.
type Rule struct {
	// Namespace is a regular expression matched against the whole
	// namespace name; "" matches every namespace.
	Namespace string `toml:"namespace"`
	// Selector is a label selector on the pod ("app=trainer,tier!=x"); ""
	// matches every pod.
	Selector string `toml:"selector"`
	// Mode of the matched pods.
	Mode Mode `toml:"mode"`
	// Timeout overrides the mode's timeout (Config.EvictionTimeout,
	// CompletionTimeout or DeleteAfter); 0 keeps it.
	Timeout time.Duration `toml:"timeout"`

	ns  *regexp.Regexp
	sel labels.Selector
}

// Config is the drain role's configuration (flags "drain.*").
type Config struct {
	// SystemNamespaces is a regular expression of namespaces whose pods are
	// never touched, matched against the whole namespace name, as a rule's
	// Namespace is ("kube-system|monitoring" does not match
	// "ml-monitoring-x"). It must match kube-system, kube-public and
	// kube-node-lease (Validate). Default
	// `^(kube-system|kube-public|kube-node-lease|faultline(-.*)?)$`.
	SystemNamespaces string `toml:"system_namespaces"`
	// Mode is the mode of pods no rule matches. Default Immediate.
	Mode Mode `toml:"mode"`
	// Rules pick modes per namespace pattern and pod label; first match wins.
	Rules []Rule `toml:"rules"`
	// EvictionTimeout: an Immediate pod still there this long after the
	// drain first saw it (its start, for the pods there then) is given up
	// (the drain ends gave_up). Default 10m.
	EvictionTimeout time.Duration `toml:"eviction_timeout"`
	// CompletionTimeout: an AllowCompletion pod still running this long
	// after the drain first saw it is given up. Default 24h.
	CompletionTimeout time.Duration `toml:"completion_timeout"`
	// DeleteAfter: a DeleteAfterTimeout pod still there this long after the
	// drain first saw it is deleted with grace period 0 (a refused delete
	// tried again after the pod's backoff); still there EvictionTimeout
	// after that, it is given up. Default 30m.
	DeleteAfter time.Duration `toml:"delete_after"`
	// GracePeriod of evictions, in whole seconds; negative uses each pod's
	// own. Default -1s.
	GracePeriod time.Duration `toml:"grace_period"`
	// SkipWaitForDeleteTimeout: a pod whose DeletionTimestamp is more than
	// this in the past counts as gone, in every mode, and the drain stops
	// waiting for it; the drain's actions name it (kubectl drain's
	// --skip-wait-for-delete-timeout). The DeletionTimestamp is the time of
	// the delete plus the grace period, when the kubelet kills what is
	// left; a pod still there long after is on a node whose kubelet is not
	// finishing it (dead, hung), the node that most needs the remediation
	// the drain leads to. Keep it below EvictionTimeout, or an Immediate
	// drain of such a node gives up first. 0 waits for every pod
	// (kubectl's default). Default 5m.
	SkipWaitForDeleteTimeout time.Duration `toml:"skip_wait_for_delete_timeout"`
	// EmptyDir is "evict" or "skip". Default "evict".
	EmptyDir string `toml:"empty_dir"`
	// PollInterval is the longest a drain in progress waits to be looked
	// at again; a young drain is looked at sooner, after a quarter of its
	// age but at least 1s (pollDelay), and a step that made calls after
	// 1s. Default 5s.
	PollInterval time.Duration `toml:"poll_interval"`
	// PDBBackoff is the first wait before an eviction refused by a PDB
	// (429) is tried again; it doubles up to MaxPDBBackoff. Default 5s.
	PDBBackoff time.Duration `toml:"pdb_backoff"`
	// MaxPDBBackoff caps PDBBackoff's doubling; a running drain whose
	// write the apiserver refuses for good is looked at again this often.
	// Default 1m.
	MaxPDBBackoff time.Duration `toml:"max_pdb_backoff"`
	// Workers bounds the nodes handled at once per batch. Default 64.
	Workers int `toml:"workers"`
	// BatchTimeout bounds one batch: the calls it makes on its nodes'
	// pods. Default 2m.
	BatchTimeout time.Duration `toml:"batch_timeout"`
	// PodWorkers bounds the API calls in flight for one node. Default 16.
	PodWorkers int `toml:"pod_workers"`
	// GPUAnnotations are the pod annotation keys read for the GPU UUIDs a
	// pod uses (comma- or space-separated values), in order; the
	// NVIDIA_VISIBLE_DEVICES env of the pod's containers is read after them.
	// Default ["faultline.io/gpu-uuids"].
	GPUAnnotations []string `toml:"gpu_annotations"`
	// MaxTriggerAge: a quarantine decided (the action's timestamp) longer
	// ago than this, first read now, starts no drain and joins none
	// (recorded as a skipped drain, counted in
	// faultline_drain_stale_triggers_total): a consumer group with no
	// committed offset (first start, offsets expired after the broker's
	// offsets.retention.minutes) reads the actions topic of days ago, and
	// a node quarantined now was drained — and remediated — for an
	// earlier episode's fault. A drain in progress (its requeued record)
	// goes on whatever its age. A partition the group has no committed
	// offset for is read from this far back (pipeline.Config.StartWithin).
	// 0: no limit. Default 6h.
	MaxTriggerAge time.Duration `toml:"max_trigger_age"`
	// SlowCluster: a cluster whose API writes take longer than this on
	// average, with other clusters served beside it, has its drains
	// stepped on the role's slow lane (TopicSlow, a second consumer
	// group), so its slowness holds only its own drains (requeue.Lane);
	// a write in flight for twice this long counts before it is
	// answered, the batch's steps there abandoned and handed to the lane.
	// 0: never. Default 500ms.
	SlowCluster time.Duration `toml:"slow_cluster"`
	// Identity names this processor on nodes. Default "faultline-drain/<hostname>".
	Identity string `toml:"identity"`

	sys *regexp.Regexp
}

// kubeNamespaces are the namespaces Config.SystemNamespaces must match:
// Kubernetes' own.
var kubeNamespaces = []string{"kube-system", "kube-public", "kube-node-lease"}

// DefaultSystemNamespaces is the default of Config.SystemNamespaces.
const DefaultSystemNamespaces = `^(kube-system|kube-public|kube-node-lease|faultline(-.*)?)$`

// DefaultGPUAnnotation is the pod annotation faultline reads for the GPU
// UUIDs a pod uses (see README.md: the NVIDIA device plugin writes no pod
// annotation; the kubelet PodResources API knows the assignment).
const DefaultGPUAnnotation = "faultline.io/gpu-uuids"

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	if host == "" {
		host = "unknown"
	}
	return Config{
		SystemNamespaces:         DefaultSystemNamespaces,
		Mode:                     ModeImmediate,
		EvictionTimeout:          10 * time.Minute,
		CompletionTimeout:        24 * time.Hour,
		DeleteAfter:              30 * time.Minute,
		GracePeriod:              -time.Second,
		SkipWaitForDeleteTimeout: 5 * time.Minute,
		EmptyDir:                 EmptyDirEvict,
		PollInterval:             5 * time.Second,
		PDBBackoff:               5 * time.Second,
		MaxPDBBackoff:            time.Minute,
		Workers:                  64,
		BatchTimeout:             2 * time.Minute,
		PodWorkers:               16,
		GPUAnnotations:           []string{DefaultGPUAnnotation},
		MaxTriggerAge:            6 * time.Hour,
		SlowCluster:              500 * time.Millisecond,
		Identity:                 "faultline-drain/" + host,
	}
}

// RegisterFlags adds the config's flags with the given prefix ("drain.").
// --<prefix>rules takes "MODE[,namespace=REGEX][,selector=SEL][,timeout=DUR]"
// and may be repeated, each adding one of Rules (selectors with commas must
// be set in the TOML file); --<prefix>rule is its deprecated spelling.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.SystemNamespaces, prefix+"system-namespaces", c.SystemNamespaces, "regular expression of namespaces never drained, matched against the whole name")
	fs.Func(prefix+"mode", "mode of pods no rule matches: Immediate, AllowCompletion or DeleteAfterTimeout (default Immediate)", func(s string) error {
		c.Mode = Mode(s)
		return nil
	})
	fs.Func(prefix+"rules", "adds a drain rule MODE[,namespace=REGEX][,selector=KEY=VAL][,timeout=DUR] (REGEX matches the whole name; none: every namespace); repeatable, first match wins", func(s string) error {
		r, err := ParseRule(s)
		if err != nil {
			return err
		}
		c.Rules = append(c.Rules, r)
		return nil
	})
	config.Alias(fs, prefix+"rule", prefix+"rules")
	fs.DurationVar(&c.EvictionTimeout, prefix+"eviction-timeout", c.EvictionTimeout, "Immediate: give a pod up this long after the drain first saw it")
	fs.DurationVar(&c.CompletionTimeout, prefix+"completion-timeout", c.CompletionTimeout, "AllowCompletion: give a pod up this long after the drain first saw it")
	fs.DurationVar(&c.DeleteAfter, prefix+"delete-after", c.DeleteAfter, "DeleteAfterTimeout: force-delete a pod left this long after the drain first saw it")
	fs.DurationVar(&c.GracePeriod, prefix+"grace-period", c.GracePeriod, "grace period of evictions (negative: the pod's own)")
	fs.DurationVar(&c.SkipWaitForDeleteTimeout, prefix+"skip-wait-for-delete-timeout", c.SkipWaitForDeleteTimeout, "stop waiting for a pod whose DeletionTimestamp is more than this in the past (0: wait for every pod)")
	fs.StringVar(&c.EmptyDir, prefix+"empty-dir", c.EmptyDir, "pods with emptyDir volumes: evict or skip")
	fs.DurationVar(&c.PollInterval, prefix+"poll-interval", c.PollInterval, "the longest a drain in progress waits to be looked at again (a young one: a quarter of its age, at least 1s)")
	fs.DurationVar(&c.PDBBackoff, prefix+"pdb-backoff", c.PDBBackoff, "first wait before retrying an eviction a PDB refused")
	fs.DurationVar(&c.MaxPDBBackoff, prefix+"max-pdb-backoff", c.MaxPDBBackoff, "cap of the PDB retry backoff")
	fs.DurationVar(&c.BatchTimeout, prefix+"batch-timeout", c.BatchTimeout, "bound of one batch (more than 1s: a batch may hold that long for a requeued item)")
	fs.IntVar(&c.Workers, prefix+"workers", c.Workers, "nodes drained concurrently per batch")
	fs.IntVar(&c.PodWorkers, prefix+"pod-workers", c.PodWorkers, "API calls in flight per node")
	fs.DurationVar(&c.MaxTriggerAge, prefix+"max-trigger-age", c.MaxTriggerAge, "a quarantine decided longer ago than this, first read now, starts or joins no drain (0: no limit)")
	fs.Func(prefix+"gpu-annotations", "comma-separated pod annotation keys holding the pod's GPU UUIDs (default "+DefaultGPUAnnotation+")", func(s string) error {
		c.GPUAnnotations = nil
		for _, k := range strings.Split(s, ",") {
			if k = strings.TrimSpace(k); k != "" {
				c.GPUAnnotations = append(c.GPUAnnotations, k)
			}
		}
		return nil
	})
	fs.DurationVar(&c.SlowCluster, prefix+"slow-cluster", c.SlowCluster, "a cluster whose API writes take longer than this on average has its drains stepped on the slow lane (0: never)")
	fs.StringVar(&c.Identity, prefix+"identity", c.Identity, "processor identity written on nodes")
}

// ParseRule parses the --drain.rules form "MODE[,namespace=REGEX][,selector=SEL][,timeout=DUR]".
func ParseRule(s string) (Rule, error) {
	parts := strings.Split(s, ",")
	r := Rule{Mode: Mode(strings.TrimSpace(parts[0]))}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok {
			return Rule{}, fmt.Errorf("drain rule %q: %q is not key=value", s, p)
		}
		switch k {
		case "namespace":
			r.Namespace = v
		case "selector":
			r.Selector = v
		case "timeout":
			d, err := time.ParseDuration(v)
			if err != nil {
				return Rule{}, fmt.Errorf("drain rule %q: timeout: %w", s, err)
			}
			r.Timeout = d
		default:
			return Rule{}, fmt.Errorf("drain rule %q: unknown key %q (namespace, selector, timeout)", s, k)
		}
	}
	return r, nil
}

// Validate names the first bad key, with the given prefix ("drain."), and
// compiles the patterns and selectors.
func (c *Config) Validate(prefix string) error {
	// Anchored as the rules' namespaces are: unanchored, a pattern
	// matched any namespace containing one of its names.
	re, err := regexp.Compile("^(?:" + c.SystemNamespaces + ")$")
	if err != nil {
		return fmt.Errorf("%ssystem_namespaces: %w", prefix, err)
	}
	if c.SystemNamespaces == "" {
		return fmt.Errorf("%ssystem_namespaces: required (kube-system must never be drained)", prefix)
	}
	// A pattern naming only the operator's own namespaces ("monitoring")
	// drained coredns, the CNI's controllers and the like from every
	// quarantined node.
	var missing []string
	for _, ns := range kubeNamespaces {
		if !re.MatchString(ns) {
			missing = append(missing, ns)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%ssystem_namespaces: %q does not match %s, which must never be drained; add them, e.g. %q",
			prefix, c.SystemNamespaces, strings.Join(missing, ", "), "^(kube-system|kube-public|kube-node-lease|"+c.SystemNamespaces+")$")
	}
	c.sys = re
	if !c.Mode.valid() {
		return fmt.Errorf("%smode: %q is not Immediate, AllowCompletion or DeleteAfterTimeout", prefix, c.Mode)
	}
	for i := range c.Rules {
		r := &c.Rules[i]
		key := fmt.Sprintf("%srules[%d]", prefix, i)
		if !r.Mode.valid() {
			return fmt.Errorf("%s.mode: %q is not Immediate, AllowCompletion or DeleteAfterTimeout", key, r.Mode)
		}
		ns := r.Namespace
		if ns == "" {
			// Every namespace, as documented: "^(?:)$" matched none.
			ns = ".*"
		}
		if r.ns, err = regexp.Compile("^(?:" + ns + ")$"); err != nil {
			return fmt.Errorf("%s.namespace: %w", key, err)
		}
		if r.sel, err = labels.Parse(r.Selector); err != nil {
			return fmt.Errorf("%s.selector: %w", key, err)
		}
		if r.Timeout < 0 {
			return fmt.Errorf("%s.timeout: must not be negative, got %v", key, r.Timeout)
		}
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{
		{"eviction_timeout", c.EvictionTimeout}, {"completion_timeout", c.CompletionTimeout},
		{"delete_after", c.DeleteAfter}, {"poll_interval", c.PollInterval},
		{"pdb_backoff", c.PDBBackoff}, {"max_pdb_backoff", c.MaxPDBBackoff},
	} {
		if d.v <= 0 {
			return fmt.Errorf("%s%s: must be positive, got %v", prefix, d.key, d.v)
		}
	}
	if c.GracePeriod >= 0 && c.GracePeriod%time.Second != 0 {
		// The Eviction API takes whole seconds: 500ms became grace 0, the
		// pods killed at once.
		return fmt.Errorf("%sgrace_period: must be a whole number of seconds (or negative: the pod's own), got %v", prefix, c.GracePeriod)
	}
	if c.SkipWaitForDeleteTimeout < 0 {
		return fmt.Errorf("%sskip_wait_for_delete_timeout: must not be negative (0 disables), got %v", prefix, c.SkipWaitForDeleteTimeout)
	}
	if c.EmptyDir != EmptyDirEvict && c.EmptyDir != EmptyDirSkip {
		return fmt.Errorf("%sempty_dir: %q is not %q or %q", prefix, c.EmptyDir, EmptyDirEvict, EmptyDirSkip)
	}
	if c.Workers < 1 {
		return fmt.Errorf("%sworkers: must be at least 1, got %d", prefix, c.Workers)
	}
	if c.BatchTimeout <= 0 {
		return fmt.Errorf("%sbatch_timeout: must be positive, got %v", prefix, c.BatchTimeout)
	}
	if c.PodWorkers < 1 {
		return fmt.Errorf("%spod_workers: must be at least 1, got %d", prefix, c.PodWorkers)
	}
	if c.MaxTriggerAge < 0 {
		return fmt.Errorf("%smax_trigger_age: must not be negative (0: no limit), got %v", prefix, c.MaxTriggerAge)
	}
	if c.SlowCluster < 0 {
		return fmt.Errorf("%sslow_cluster: must not be negative (0: never), got %v", prefix, c.SlowCluster)
	}
	if c.Identity == "" {
		return fmt.Errorf("%sidentity: required", prefix)
	}
	return nil
}

// timeout is the mode's timeout for a rule (nil: the default mode).
func (c *Config) timeout(m Mode, r *Rule) time.Duration {
	if r != nil && r.Timeout > 0 {
		return r.Timeout
	}
	switch m {
	case ModeAllowCompletion:
		return c.CompletionTimeout
	case ModeDeleteAfterTimeout:
		return c.DeleteAfter
	default:
		return c.EvictionTimeout
	}
}

// Pipeline returns the runner settings of the role's consumer. A
// partition the group has no committed offset for is read from
// MaxTriggerAge back, not from the topic's start: nothing older would
// start a drain (the requeue topic's records go round every few seconds).
func (c Config) Pipeline() pipeline.Config {
	return pipeline.Config{Role: Role, Topics: Topics, BatchTimeout: c.BatchTimeout, FetchMaxWait: requeue.FetchMaxWait,
		StartWithin: c.MaxTriggerAge}
}
