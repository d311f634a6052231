package checks

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/faultline/faultline/agents/preflight/report"
)

// Config is the one typed configuration of `faultline-preflight check`
// (TOML via --config, then flags named --section.key-name). The webhook
// renders the values that differ from these defaults as flags on the init
// containers it injects (see RenderFlags).
type Config struct {
	// NodeName is stamped on every event (default $NODE_NAME, which the
	// webhook sets from spec.nodeName; required).
	NodeName string `toml:"node_name"`
	// Pod is the pod this check runs in (default from $POD_NAME,
	// $POD_NAMESPACE, $POD_UID, set by the webhook from the downward API).
	Pod PodConfig `toml:"pod"`
	// Timeout bounds one check (default 300s, ADR-026's checkTimeout);
	// the gang wait of nccl-allreduce has its own, gang.timeout.
	Timeout time.Duration `toml:"timeout"`
	// ProcessingStrategy is EXECUTE_REMEDIATION (default) or STORE_ONLY:
	// with STORE_ONLY the events are only stored and a failed check exits 0
	// so the pod starts anyway.
	ProcessingStrategy string `toml:"processing_strategy"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `toml:"log_level"`

	report.Config
	Metrics MetricsConfig `toml:"metrics"`
	Kube    KubeConfig    `toml:"kube"`
	DCGM    DCGMConfig    `toml:"dcgm"`
	NCCL    NCCLConfig    `toml:"nccl"`
	Gang    GangConfig    `toml:"gang"`
}

// PodConfig names the pod the check runs in.
type PodConfig struct {
	Name      string `toml:"name"`
	Namespace string `toml:"namespace"`
	UID       string `toml:"uid"`
}

// MetricsConfig is where a check's metrics go: init containers live too
// briefly to be scraped, so they are pushed (Prometheus Pushgateway) and/or
// written for node_exporter's textfile collector.
type MetricsConfig struct {
	// Pushgateway is the Pushgateway URL ("" off, the default).
	Pushgateway string `toml:"pushgateway"`
	// Textfile is a file to write the metrics to in the text format ("" off).
	Textfile string `toml:"textfile"`
}

// KubeConfig is the check's (optional) access to the Kubernetes API: the
// node's instance-type label for the NCCL topology, and a Kubernetes Event
// on the pod when the check fails.
type KubeConfig struct {
	// Kubeconfig is a kubeconfig file ("" uses the pod's service account
	// when running in a cluster; outside one the API is not used).
	Kubeconfig string `toml:"kubeconfig"`
	// Events creates a Warning Event on the pod when the check fails
	// (default true; needs events create in the pod's namespace).
	Events bool `toml:"events"`
}

// DCGMConfig configures dcgm-diag.
type DCGMConfig struct {
	// HostengineAddr is the DCGM hostengine Service (default
	// "dcgm-hostengine.nvsentinel.svc:5555").
	HostengineAddr string `toml:"hostengine_addr"`
	// DiagLevel is dcgmi diag -r: 1 (quick, seconds, default) to 4. The
	// check's timeout must cover the level's run: at least 2m for level 2,
	// 15m for 3 and 1h for 4 (it also bounds the other checks).
	DiagLevel int `toml:"diag_level"`
	// Format is the output dcgmi is asked for: "table" (default) or "json"
	// (-j). Both DCGM 3.x and 4.x layouts are read either way.
	Format string `toml:"format"`
	// Dcgmi and NvidiaSMI are the executables (default "dcgmi",
	// "nvidia-smi" from PATH).
	Dcgmi     string `toml:"dcgmi"`
	NvidiaSMI string `toml:"nvidia_smi"`
}

// NCCLConfig configures nccl-loopback and nccl-allreduce.
type NCCLConfig struct {
	// AllReducePerf is nccl-tests' all_reduce_perf (default from PATH).
	AllReducePerf string `toml:"all_reduce_perf"`
	// LoopbackArgs are its arguments; {gpus} is replaced by the number of
	// GPUs (default "-b 8 -e 256M -f 2 -g {gpus}", ADR-026's command).
	LoopbackArgs string `toml:"loopback_args"`
	// LoopbackThresholdGBps is the least bus bandwidth (GB/s) at the
	// largest message size (default 10).
	LoopbackThresholdGBps float64 `toml:"loopback_threshold_gbps"`
	// AllreduceThresholdGBps is the same for the gang-wide test (default 5).
	AllreduceThresholdGBps float64 `toml:"allreduce_threshold_gbps"`
	// Torchrun is PyTorch's launcher (default from PATH).
	Torchrun string `toml:"torchrun"`
	// AllreduceCommand is the gang-wide command; {torchrun}, {nnodes},
	// {gpus}, {rank}, {master_addr}, {master_port} and {script} (the
	// benchmark shipped in the binary) are replaced (default ADR-026's
	// torchrun invocation).
	AllreduceCommand string `toml:"allreduce_command"`
	// MasterPort is torchrun's rendezvous port on rank 0 (default 29500).
	MasterPort int `toml:"master_port"`
	// AllreduceBytes is the benchmark's message size (default 4 GiB).
	AllreduceBytes int64 `toml:"allreduce_bytes"`
	// TopologyDir holds the built-in NCCL topology files (default
	// "/opt/faultline-preflight/nccl-topologies").
	TopologyDir string `toml:"topology_dir"`
	// InstanceTypeLabel is the node label naming the instance type
	// (default "node.kubernetes.io/instance-type").
	InstanceTypeLabel string `toml:"instance_type_label"`
	// InstanceTypes maps instance types to files in TopologyDir (default
	// ADR-026's map).
	InstanceTypes map[string]string `toml:"instance_types"`
	// TopologyFallback lets NCCL detect the topology itself when the pod
	// brought no NCCL_TOPO_FILE and the instance type is unknown (default
	// true); false makes that a configuration error.
	TopologyFallback bool `toml:"topology_fallback"`
}

// GangConfig configures nccl-allreduce's wait for its gang.
type GangConfig struct {
	// Dir is where the gang ConfigMap is mounted (default "/etc/preflight").
	Dir string `toml:"dir"`
	// Timeout bounds the wait for every peer (default 600s); expiring is
	// reported as non-fatal.
	Timeout time.Duration `toml:"timeout"`
	// PollInterval is how often Dir is read (default 2s).
	PollInterval time.Duration `toml:"poll_interval"`
	// MarkerDir is the pod-local directory (an emptyDir the webhook mounts
	// there) where a non-zero exit of nccl-allreduce leaves a marker for
	// its reruns in the pod (default "/run/faultline-preflight").
	MarkerDir string `toml:"marker_dir"`
}

// diagLevelRun is how long dcgmi diag -r runs at each level: timeout may
// not be shorter. NVIDIA's dcgmi diag reference
// (docs.nvidia.com/datacenter/dcgm/latest/reference/command-line-reference/dcgmi/dcgmi-diag.html)
// gives level 1 "normally lasting seconds", level 2 "approximately two
// minutes", level 3 "approximately 15 minutes" and level 4 only as
// "extended, longer-running"; its floor is an hour, the least of the
// 1–2 hours earlier DCGM user guides gave for it. A longer run (more
// GPUs, older DCGM) needs more than the floor.
var diagLevelRun = map[int]struct {
	d     time.Duration
	about string
}{
	2: {2 * time.Minute, "2m"},
	3: {15 * time.Minute, "15m"},
	4: {time.Hour, "1h"},
}

// DefaultInstanceTypes is ADR-026's instance-type → topology-file map.
func DefaultInstanceTypes() map[string]string {
	return map[string]string{
		"Standard_ND96isr_H100_v5":  "azure-ndv5.xml",
		"Standard_ND96amsr_A100_v4": "azure-ndv4.xml",
		"p5.48xlarge":               "aws-p5.48xlarge.xml",
		"a3-megagpu-8g":             "gcp-a3-mega.xml",
	}
}

// DefaultAllreduceCommand is ADR-026's torchrun invocation.
const DefaultAllreduceCommand = "{torchrun} --nnodes={nnodes} --nproc_per_node={gpus} --node_rank={rank} --master_addr={master_addr} --master_port={master_port} {script}"

// DefaultConfig returns the defaults documented on the fields.
func DefaultConfig() Config {
	return Config{
		Timeout:            300 * time.Second,
		ProcessingStrategy: "EXECUTE_REMEDIATION",
		LogLevel:           "info",
		Config:             report.DefaultConfig(),
		Kube:               KubeConfig{Events: true},
		DCGM: DCGMConfig{HostengineAddr: "dcgm-hostengine.nvsentinel.svc:5555", DiagLevel: 1, Format: "table",
			Dcgmi: "dcgmi", NvidiaSMI: "nvidia-smi"},
		NCCL: NCCLConfig{AllReducePerf: "all_reduce_perf", LoopbackArgs: "-b 8 -e 256M -f 2 -g {gpus}",
			LoopbackThresholdGBps: 10, AllreduceThresholdGBps: 5, Torchrun: "torchrun",
			AllreduceCommand: DefaultAllreduceCommand, MasterPort: 29500, AllreduceBytes: 4 << 30,
			TopologyDir: "/opt/faultline-preflight/nccl-topologies", InstanceTypeLabel: "node.kubernetes.io/instance-type",
			InstanceTypes: DefaultInstanceTypes(), TopologyFallback: true},
		Gang: GangConfig{Dir: "/etc/preflight", Timeout: 600 * time.Second, PollInterval: 2 * time.Second,
			MarkerDir: "/run/faultline-preflight"},
	}
}

// WithEnv fills the fields the downward API provides.
func (c *Config) WithEnv(getenv func(string) string) {
	c.NodeName = getenv("NODE_NAME")
	c.Pod = PodConfig{Name: getenv("POD_NAME"), Namespace: getenv("POD_NAMESPACE"), UID: getenv("POD_UID")}
}

// mapFlag is a "k=v,k2=v2" flag.
type mapFlag struct{ m *map[string]string }

func (f mapFlag) String() string {
	if f.m == nil || *f.m == nil {
		return ""
	}
	keys := slices.Sorted(maps.Keys(*f.m))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + (*f.m)[k]
	}
	return strings.Join(parts, ",")
}

func (f mapFlag) Set(s string) error {
	out := map[string]string{}
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" || v == "" {
			return fmt.Errorf("%q is not key=value", p)
		}
		out[k] = v
	}
	*f.m = out
	return nil
}

// RegisterFlags adds every key as a --section.key-name flag bound to c.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "node name stamped on events (default $NODE_NAME)")
	fs.StringVar(&c.Pod.Name, "pod.name", c.Pod.Name, "this pod's name (default $POD_NAME)")
	fs.StringVar(&c.Pod.Namespace, "pod.namespace", c.Pod.Namespace, "this pod's namespace (default $POD_NAMESPACE)")
	fs.StringVar(&c.Pod.UID, "pod.uid", c.Pod.UID, "this pod's UID (default $POD_UID)")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "the check's time limit")
	fs.StringVar(&c.ProcessingStrategy, "processing-strategy", c.ProcessingStrategy, "EXECUTE_REMEDIATION or STORE_ONLY (failed checks then exit 0)")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn, error")
	c.Config.RegisterFlags(fs)
	fs.StringVar(&c.Metrics.Pushgateway, "metrics.pushgateway", c.Metrics.Pushgateway, "Prometheus Pushgateway URL for the check's metrics")
	fs.StringVar(&c.Metrics.Textfile, "metrics.textfile", c.Metrics.Textfile, "file to write the check's metrics to (node_exporter textfile collector)")
	fs.StringVar(&c.Kube.Kubeconfig, "kube.kubeconfig", c.Kube.Kubeconfig, "kubeconfig (default: the pod's service account in a cluster)")
	fs.BoolVar(&c.Kube.Events, "kube.events", c.Kube.Events, "create a Warning Event on the pod when the check fails")
	fs.StringVar(&c.DCGM.HostengineAddr, "dcgm.hostengine-addr", c.DCGM.HostengineAddr, "DCGM hostengine address (dcgmi --host)")
	fs.IntVar(&c.DCGM.DiagLevel, "dcgm.diag-level", c.DCGM.DiagLevel, "dcgmi diag -r level, 1-4")
	fs.StringVar(&c.DCGM.Format, "dcgm.format", c.DCGM.Format, "dcgmi output to read: table or json")
	fs.StringVar(&c.DCGM.Dcgmi, "dcgm.dcgmi", c.DCGM.Dcgmi, "dcgmi executable")
	fs.StringVar(&c.DCGM.NvidiaSMI, "dcgm.nvidia-smi", c.DCGM.NvidiaSMI, "nvidia-smi executable")
	fs.StringVar(&c.NCCL.AllReducePerf, "nccl.all-reduce-perf", c.NCCL.AllReducePerf, "nccl-tests all_reduce_perf executable")
	fs.StringVar(&c.NCCL.LoopbackArgs, "nccl.loopback-args", c.NCCL.LoopbackArgs, "all_reduce_perf arguments ({gpus} = GPU count)")
	fs.Float64Var(&c.NCCL.LoopbackThresholdGBps, "nccl.loopback-threshold-gbps", c.NCCL.LoopbackThresholdGBps, "least loopback bus bandwidth, GB/s")
	fs.Float64Var(&c.NCCL.AllreduceThresholdGBps, "nccl.allreduce-threshold-gbps", c.NCCL.AllreduceThresholdGBps, "least gang-wide bus bandwidth, GB/s")
	fs.StringVar(&c.NCCL.Torchrun, "nccl.torchrun", c.NCCL.Torchrun, "torchrun executable")
	fs.StringVar(&c.NCCL.AllreduceCommand, "nccl.allreduce-command", c.NCCL.AllreduceCommand, "gang-wide command template")
	fs.IntVar(&c.NCCL.MasterPort, "nccl.master-port", c.NCCL.MasterPort, "torchrun rendezvous port")
	fs.Int64Var(&c.NCCL.AllreduceBytes, "nccl.allreduce-bytes", c.NCCL.AllreduceBytes, "gang-wide benchmark message size")
	fs.StringVar(&c.NCCL.TopologyDir, "nccl.topology-dir", c.NCCL.TopologyDir, "directory of built-in NCCL topology files")
	fs.StringVar(&c.NCCL.InstanceTypeLabel, "nccl.instance-type-label", c.NCCL.InstanceTypeLabel, "node label naming the instance type")
	fs.Var(mapFlag{&c.NCCL.InstanceTypes}, "nccl.instance-types", "instance type=topology file, comma-separated")
	fs.BoolVar(&c.NCCL.TopologyFallback, "nccl.topology-fallback", c.NCCL.TopologyFallback, "let NCCL detect the topology when none is known")
	fs.StringVar(&c.Gang.Dir, "gang.dir", c.Gang.Dir, "where the gang ConfigMap is mounted")
	fs.DurationVar(&c.Gang.Timeout, "gang.timeout", c.Gang.Timeout, "longest wait for every peer")
	fs.DurationVar(&c.Gang.PollInterval, "gang.poll-interval", c.Gang.PollInterval, "how often the gang files are read")
	fs.StringVar(&c.Gang.MarkerDir, "gang.marker-dir", c.Gang.MarkerDir, "pod-local directory of the marker a failed nccl-allreduce leaves")
}

// Validate names the first bad key.
func (c *Config) Validate() error {
	if c.NodeName == "" {
		return errors.New("node_name: must be set (--node-name or NODE_NAME)")
	}
	if err := c.Config.Validate(); err != nil {
		return err
	}
	return c.ValidateSettings()
}

// ValidateSettings checks every key except the node name and the files the
// gateway keys name (the token, certificates), which exist only inside the
// check containers: what the webhook can check before it renders the
// configuration as flags.
func (c *Config) ValidateSettings() error {
	if err := c.Gateway.ValidateSettings(); err != nil {
		return err
	}
	if err := c.Spool.Validate(); err != nil {
		return err
	}
	if err := c.ValidateRelaySocket(); err != nil {
		return err
	}
	if c.Timeout <= 0 {
		return errors.New("timeout: must be positive")
	}
	if c.ProcessingStrategy != "EXECUTE_REMEDIATION" && c.ProcessingStrategy != "STORE_ONLY" {
		return fmt.Errorf("processing_strategy: %q is not EXECUTE_REMEDIATION or STORE_ONLY", c.ProcessingStrategy)
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.LogLevel) {
		return fmt.Errorf("log_level: %q is not debug, info, warn or error", c.LogLevel)
	}
	if strings.TrimSpace(c.DCGM.HostengineAddr) == "" {
		// dcgmi diag --host "" never reaches a hostengine: every GPU pod
		// would stay in Init:Error on a non-fatal DCGM_DIAG_ERROR.
		return errors.New("dcgm.hostengine_addr: required (the DCGM hostengine, host:port)")
	}
	if c.DCGM.DiagLevel < 1 || c.DCGM.DiagLevel > 4 {
		return fmt.Errorf("dcgm.diag_level: %d is not 1..4", c.DCGM.DiagLevel)
	}
	if floor := diagLevelRun[c.DCGM.DiagLevel]; c.Timeout < floor.d {
		// Every run would time out: a non-fatal PREFLIGHT_CHECK_TIMEOUT,
		// exit 1, and the kubelet rerunning the init container for ever,
		// every GPU pod held in Init:Error on healthy nodes.
		return fmt.Errorf("timeout: %s is shorter than dcgm.diag_level %d's run (~%s); raise timeout to at least %s",
			c.Timeout, c.DCGM.DiagLevel, floor.about, floor.d)
	}
	if c.DCGM.Format != "table" && c.DCGM.Format != "json" {
		return fmt.Errorf("dcgm.format: %q is not table or json", c.DCGM.Format)
	}
	// A NaN threshold would pass every bandwidth: no comparison with NaN
	// is true.
	for _, kv := range []struct {
		key string
		v   float64
	}{{"loopback_threshold_gbps", c.NCCL.LoopbackThresholdGBps}, {"allreduce_threshold_gbps", c.NCCL.AllreduceThresholdGBps}} {
		if math.IsNaN(kv.v) || math.IsInf(kv.v, 0) || kv.v < 0 {
			return fmt.Errorf("nccl.%s: must be a finite number not below 0, got %v", kv.key, kv.v)
		}
	}
	if c.NCCL.MasterPort < 1 || c.NCCL.MasterPort > 65535 {
		return fmt.Errorf("nccl.master_port: %d is not a port", c.NCCL.MasterPort)
	}
	if c.NCCL.AllreduceBytes < 4 {
		return fmt.Errorf("nccl.allreduce_bytes: must be at least 4 (one float32 element), got %d", c.NCCL.AllreduceBytes)
	}
	if !strings.Contains(c.NCCL.AllreduceCommand, "{") && c.NCCL.AllreduceCommand == "" {
		return errors.New("nccl.allreduce_command: must be set")
	}
	for k, v := range c.NCCL.InstanceTypes {
		if v == "" || v == "." || v == ".." || strings.ContainsAny(v, "/\\") {
			return fmt.Errorf("nccl.instance_types: %s = %q: a file name in nccl.topology_dir, not a path", k, v)
		}
	}
	if c.Gang.Timeout <= 0 {
		return errors.New("gang.timeout: must be positive")
	}
	if c.Gang.PollInterval <= 0 {
		return errors.New("gang.poll_interval: must be positive")
	}
	if !strings.HasPrefix(c.Gang.MarkerDir, "/") {
		return fmt.Errorf("gang.marker_dir: %q is not an absolute path", c.Gang.MarkerDir)
	}
	return nil
}

// RenderFlags returns the flags that set, on a default Config, the values
// c has: the arguments the webhook gives an injected init container.
// Flags that name the node or pod are left out (the container gets them
// from the downward API).
func RenderFlags(c Config) []string {
	def := DefaultConfig()
	defFS := flag.NewFlagSet("default", flag.ContinueOnError)
	def.RegisterFlags(defFS)
	fs := flag.NewFlagSet("render", flag.ContinueOnError)
	c.RegisterFlags(fs)
	skip := map[string]bool{"node-name": true, "pod.name": true, "pod.namespace": true, "pod.uid": true}
	var out []string
	fs.VisitAll(func(f *flag.Flag) {
		if skip[f.Name] {
			return
		}
		d := defFS.Lookup(f.Name)
		if d != nil && d.Value.String() == f.Value.String() {
			return
		}
		out = append(out, "--"+f.Name+"="+f.Value.String())
	})
	sort.Strings(out)
	return out
}
