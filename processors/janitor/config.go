package janitor

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/faultline/faultline/agents/localaction"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
)

// Config is the [janitor] section. README.md has every key with its
// default.
type Config struct {
	// Identity names this janitor on the resources it works (in the state
	// annotation). Default "faultline-janitor/<hostname>".
	Identity string `toml:"identity"`
	// LeaderElection: of the janitors serving a cluster, only the holder of
	// its Lease (LeaseName in LeaseNamespace) works it, so that two
	// replicas (a standby, a rollout) never count the concurrency limits
	// twice. Default true; false: every janitor works every cluster it
	// serves (run one).
	LeaderElection bool `toml:"leader_election"`
	// LeaseNamespace holds each cluster's Lease, and the maintenance
	// monitor's state (MaintenanceStateName). Default "faultline".
	LeaseNamespace string `toml:"lease_namespace"`
	// LeaseDuration: how long a Lease not renewed keeps the other
	// janitors waiting (its holder renews it every two fifteenths of it,
	// and stops working the cluster once two thirds pass without a
	// renewal). Default 15s.
	LeaseDuration time.Duration `toml:"lease_duration"`
	// Workers per cluster: resources worked at once. Default 16.
	Workers int `toml:"workers"`
	// MaxConcurrent bounds the operations in progress (signal sent, not yet
	// complete) per cluster. 0: no limit. Default 10.
	MaxConcurrent int `toml:"max_concurrent"`
	// MaxConcurrentPerRack bounds them per rack (RackLabel's value) within
	// a cluster. 0: no limit. Default 2.
	MaxConcurrentPerRack int `toml:"max_concurrent_per_rack"`
	// MaxConcurrentPerProvider bounds them per provider within a cluster
	// (a BMC network, a cloud account's API). 0: no limit. Default 0.
	MaxConcurrentPerProvider int `toml:"max_concurrent_per_provider"`
	// RackLabel is the node label that names its rack. Default
	// "faultline.io/rack"; a node without it counts as its own rack.
	RackLabel string `toml:"rack_label"`
	// Cooldown is the least time between two operations on one node. 0:
	// none. Default 30m.
	Cooldown time.Duration `toml:"cooldown"`
	// RequireDrained: act only on a node faultline quarantined (label
	// faultline.io/quarantined=true) and drained (label faultline.io/drain
	// succeeded or gave_up), unless the resource's spec.force is true.
	// Default true.
	RequireDrained bool `toml:"require_drained"`
	// RebootTimeout: a rebooted node must come back Ready with a new boot
	// ID within it, else NodeReady=False/Timeout; a node that reports no
	// boot ID within it of the resource's creation gets no signal
	// (NoBootID). Default 30m.
	RebootTimeout time.Duration `toml:"reboot_timeout"`
	// ForceAfter: a graceful reboot that has not taken the node down
	// (NotReady or a new boot ID) within it is followed by a forced one,
	// on providers that have one (Redfish ForceRestart). 0: never. Default 10m.
	ForceAfter time.Duration `toml:"force_after"`
	// HungAfter: a rebooted node down (NotReady) with its old boot ID for
	// this long while its machine is on — a shutdown that hung — is
	// followed by a forced reboot, once, on providers that can tell the
	// machine's power (Redfish). Set it above the machines' slowest
	// shutdown, POST and boot together: a forced reset starts a POST over.
	// 0: never. Default 15m.
	HungAfter time.Duration `toml:"hung_after"`
	// TerminateTimeout bounds a TerminateNode. Default 30m.
	TerminateTimeout time.Duration `toml:"terminate_timeout"`
	// GPUResetTimeout bounds a GPUReset. Default 10m.
	GPUResetTimeout time.Duration `toml:"gpu_reset_timeout"`
	// MaxQueueAge: a resource whose signal was not recorded within it of
	// its creation (it waited for a slot, the cooldown, a boot ID, or the
	// janitor was down) is never started: SignalSent=False/QueueTimeout
	// (a GPUReset: Complete=True/QueueTimeout). Keep it below the remediate
	// role's queue_timeout, which fails a resource not started by then.
	// 0: no bound. Default 6h.
	MaxQueueAge time.Duration `toml:"max_queue_age"`
	// PollInterval is how often an operation in progress is looked at
	// besides the node's own updates. Default 5s.
	PollInterval time.Duration `toml:"poll_interval"`
	// DeleteNodeOnTerminate deletes the Node object once the provider has
	// terminated the machine (bare metal has no cloud controller to do
	// it). Default true.
	DeleteNodeOnTerminate bool `toml:"delete_node_on_terminate"`
	// NodeEvents records each signal sent and each operation's end as a
	// Kubernetes Event on its node (Warning for a failure, a refusal, and
	// a signal that followed the node's own keys), which `kubectl describe
	// node` shows. Best effort: an Event not created stops nothing.
	// Default true.
	NodeEvents bool `toml:"node_events"`
	// EventNamespace is where node Events are created. Default "default",
	// where Kubernetes records node events.
	EventNamespace string `toml:"event_namespace"`
	// DefaultProvider serves nodes no label, annotation or providerID
	// prefix maps. Default "" (such a node fails with NoProvider).
	DefaultProvider string `toml:"default_provider"`
	// ProviderIDPrefixes map a node's spec.providerID prefix to a provider:
	// "prefix=provider". Default ["aws://=aws"].
	ProviderIDPrefixes []string `toml:"provider_id_prefixes"`
	// Redfish configures the redfish provider.
	Redfish RedfishConfig `toml:"redfish"`
	// AWS configures the aws provider and the maintenance monitor.
	AWS AWSConfig `toml:"aws"`
	// Local configures the node-local provider.
	Local LocalConfig `toml:"local"`
}

// RedfishConfig is [janitor.redfish].
type RedfishConfig struct {
	// SecretNamespace holds the BMC credential Secrets (keys username,
	// password). Default "faultline".
	SecretNamespace string `toml:"secret_namespace"`
	// DefaultSecret is the Secret of a node without the
	// faultline.io/bmc-secret annotation. Default "bmc-credentials".
	DefaultSecret string `toml:"default_secret"`
	// CAFile is the PEM bundle BMC certificates are checked against.
	// Default: the system roots.
	CAFile string `toml:"ca_file"`
	// InsecureSkipVerify skips the BMC certificate check. Default false.
	InsecureSkipVerify bool `toml:"insecure_skip_verify"`
	// Session: log in through the SessionService (X-Auth-Token) when the
	// BMC refuses HTTP basic auth, which is tried first (it holds none of
	// the BMC's few session slots). Default true; false: basic auth only.
	Session bool `toml:"session"`
	// TerminateAction is the ComputerSystem.Reset type of a TerminateNode:
	// ForceOff (default) or PowerCycle (terminate-and-reimage setups whose
	// boot device reinstalls the machine).
	TerminateAction string `toml:"terminate_action"`
	// Timeout bounds one BMC request. Default 30s.
	Timeout time.Duration `toml:"timeout"`
	// AllowedNetworks are the networks (CIDRs; a bare address is its
	// own) a node's BMC address (faultline.io/bmc-address, which the
	// node's kubelet may edit) must be in: every address its host name
	// resolves to, and the address of every connection. Default none:
	// every BMC address is refused (BMCAddressNotAllowed), no credential
	// is read or sent.
	AllowedNetworks []string `toml:"allowed_networks"`
	// AllowedSecrets are the Secrets a node's faultline.io/bmc-secret
	// annotation may name (an entry ending in "*" is a prefix:
	// "bmc-rack-*"). Default none: a node's annotation naming any Secret
	// but default_secret is refused (BMCSecretNotAllowed), nothing read.
	AllowedSecrets []string `toml:"allowed_secrets"`
	// LabelsOnly takes a node's BMC only from the node-restriction.kubernetes.io/
	// labels (faultline-bmc-host, -port, -system, -secret), which no kubelet
	// may set or change with the NodeRestriction admission plugin on: a node
	// with faultline.io/bmc-address and not the labels is refused
	// (BMCAnnotationNotAllowed), and a BMC with several systems is not
	// searched for the node's own status.nodeInfo.systemUUID (name the
	// system's label). It also stops the node's own faultline.io/janitor-provider
	// picking its provider (see Config.providerName). Default false: a node
	// without the labels is still served by its annotations (which its
	// kubelet may edit: it can name another BMC in allowed_networks), each
	// such signal counted in faultline_janitor_node_named_total.
	LabelsOnly bool `toml:"labels_only"`
	// AllowHTTP follows a faultline.io/bmc-address with the http scheme,
	// which sends the BMC's credentials (often default_secret, shared by
	// the fleet) in cleartext to whoever receives on that address; the
	// node's kubelet may write the annotation. Default false: such an
	// address is refused (BMCHTTPNotAllowed), nothing read or sent. The
	// labels are always HTTPS.
	AllowHTTP bool `toml:"allow_http"`
}

// AWSConfig is [janitor.aws].
type AWSConfig struct {
	// Region is the EC2 region of a node whose providerID names none.
	// Default "us-east-1".
	Region string `toml:"region"`
	// Endpoint overrides the EC2 endpoint (tests: moto). Default the SDK's.
	Endpoint string `toml:"endpoint"`
	// MaintenanceRegions are the regions whose scheduled events the
	// maintenance monitor polls. Default none (monitor off).
	MaintenanceRegions []string `toml:"maintenance_regions"`
	// MaintenanceInterval is how often they are polled. Default 5m.
	MaintenanceInterval time.Duration `toml:"maintenance_interval"`
	// MaintenanceCluster is the cluster stamped on maintenance events.
	// Default "" (the monitor needs it when regions are set).
	MaintenanceCluster string `toml:"maintenance_cluster"`
	// Timeout bounds one try of an EC2 request (the SDK tries up to
	// three times). Default 30s.
	Timeout time.Duration `toml:"timeout"`
}

// LocalConfig is [janitor.local].
type LocalConfig struct {
	// Port of the agent's local action endpoint on the node's
	// InternalIP. Default 9477.
	Port int `toml:"port"`
	// SigningKeyFile holds the Ed25519 private key (PEM PRIVATE KEY,
	// PKCS #8: `openssl genpkey -algorithm ed25519`) every request to an
	// agent is signed with; agents hold its public key
	// (local_actions.verify_key_file). Read at start and for every
	// request. Required for the local provider; default none.
	SigningKeyFile string `toml:"signing_key_file"`
	// TokenFile was the bearer token shared by every node's agent;
	// removed. Set: an error naming signing_key_file.
	TokenFile string `toml:"token_file" chart:"-"`
	// Timeout bounds one request (the agent answers within 5 s, with
	// in_progress while a reset runs). Default 2m.
	Timeout time.Duration `toml:"timeout"`
	// AllowedNetworks are the networks (CIDRs) an agent's address must
	// be in. Default none: a node's faultline.io/agent-address annotation
	// (which its kubelet may edit) is refused (AgentAddressNotAllowed) and
	// its InternalIP used; set, the annotation and the InternalIP alike
	// must be in it (every resolved address, every connection).
	AllowedNetworks []string `toml:"allowed_networks"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		Identity: "faultline-janitor/" + host, LeaderElection: true, LeaseNamespace: "faultline", LeaseDuration: 15 * time.Second,
		Workers: 16, MaxConcurrent: 10, MaxConcurrentPerRack: 2,
		RackLabel: "faultline.io/rack", Cooldown: 30 * time.Minute, RequireDrained: true,
		RebootTimeout: 30 * time.Minute, ForceAfter: 10 * time.Minute, HungAfter: 15 * time.Minute, TerminateTimeout: 30 * time.Minute,
		GPUResetTimeout: 10 * time.Minute, MaxQueueAge: 6 * time.Hour, PollInterval: 5 * time.Second, DeleteNodeOnTerminate: true,
		NodeEvents: true, EventNamespace: "default",
		ProviderIDPrefixes: []string{"aws://=aws"},
		Redfish: RedfishConfig{SecretNamespace: "faultline", DefaultSecret: "bmc-credentials", Session: true,
			TerminateAction: "ForceOff", Timeout: 30 * time.Second},
		AWS:   AWSConfig{Region: "us-east-1", MaintenanceInterval: 5 * time.Minute, Timeout: 30 * time.Second},
		Local: LocalConfig{Port: 9477, Timeout: 2 * time.Minute},
	}
}

// RegisterFlags adds the flags under prefix ("janitor.").
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.Identity, prefix+"identity", c.Identity, "janitor identity written on resources")
	fs.BoolVar(&c.LeaderElection, prefix+"leader-election", c.LeaderElection, "work a cluster only while holding its Lease (one janitor of several works it)")
	fs.StringVar(&c.LeaseNamespace, prefix+"lease-namespace", c.LeaseNamespace, "namespace of each cluster's janitor Lease")
	fs.DurationVar(&c.LeaseDuration, prefix+"lease-duration", c.LeaseDuration, "how long an unrenewed Lease keeps the other janitors waiting")
	fs.IntVar(&c.Workers, prefix+"workers", c.Workers, "resources worked at once per cluster")
	fs.IntVar(&c.MaxConcurrent, prefix+"max-concurrent", c.MaxConcurrent, "operations in progress per cluster (0: no limit)")
	fs.IntVar(&c.MaxConcurrentPerRack, prefix+"max-concurrent-per-rack", c.MaxConcurrentPerRack, "operations in progress per rack (0: no limit)")
	fs.IntVar(&c.MaxConcurrentPerProvider, prefix+"max-concurrent-per-provider", c.MaxConcurrentPerProvider, "operations in progress per provider and cluster (0: no limit)")
	fs.StringVar(&c.RackLabel, prefix+"rack-label", c.RackLabel, "node label naming its rack")
	fs.DurationVar(&c.Cooldown, prefix+"cooldown", c.Cooldown, "least time between two operations on one node")
	fs.BoolVar(&c.RequireDrained, prefix+"require-drained", c.RequireDrained, "act only on nodes faultline quarantined and drained unless the resource says force")
	fs.DurationVar(&c.RebootTimeout, prefix+"reboot-timeout", c.RebootTimeout, "time for a rebooted node to come back Ready with a new boot ID")
	fs.DurationVar(&c.ForceAfter, prefix+"force-after", c.ForceAfter, "forced reboot after a graceful one did not take the node down (0: never)")
	fs.DurationVar(&c.HungAfter, prefix+"hung-after", c.HungAfter, "forced reboot of a node down with its old boot ID this long while its machine is on (0: never)")
	fs.DurationVar(&c.TerminateTimeout, prefix+"terminate-timeout", c.TerminateTimeout, "time bound of a TerminateNode")
	fs.DurationVar(&c.GPUResetTimeout, prefix+"gpu-reset-timeout", c.GPUResetTimeout, "time bound of a GPUReset")
	fs.DurationVar(&c.MaxQueueAge, prefix+"max-queue-age", c.MaxQueueAge, "a resource not started this long after its creation is never started (0: no bound)")
	fs.DurationVar(&c.PollInterval, prefix+"poll-interval", c.PollInterval, "how often an operation in progress is looked at")
	fs.BoolVar(&c.DeleteNodeOnTerminate, prefix+"delete-node-on-terminate", c.DeleteNodeOnTerminate, "delete the Node object once its machine is terminated")
	fs.BoolVar(&c.NodeEvents, prefix+"node-events", c.NodeEvents, "record signals and operations' ends as Events on their nodes")
	fs.StringVar(&c.EventNamespace, prefix+"event-namespace", c.EventNamespace, "namespace of node Events")
	fs.StringVar(&c.DefaultProvider, prefix+"default-provider", c.DefaultProvider, "provider of nodes nothing else maps (redfish, aws, local)")
	fs.Func(prefix+"provider-id-prefixes", "comma-separated providerID-prefix=provider (replaces the default)", func(s string) error {
		c.ProviderIDPrefixes = nil
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				c.ProviderIDPrefixes = append(c.ProviderIDPrefixes, p)
			}
		}
		return nil
	})
	r := &c.Redfish
	fs.StringVar(&r.SecretNamespace, prefix+"redfish.secret-namespace", r.SecretNamespace, "namespace of the BMC credential Secrets")
	fs.StringVar(&r.DefaultSecret, prefix+"redfish.default-secret", r.DefaultSecret, "BMC credential Secret of nodes without faultline.io/bmc-secret")
	fs.StringVar(&r.CAFile, prefix+"redfish.ca-file", r.CAFile, "PEM CA bundle for BMC certificates")
	fs.BoolVar(&r.InsecureSkipVerify, prefix+"redfish.insecure-skip-verify", r.InsecureSkipVerify, "skip the BMC certificate check")
	fs.BoolVar(&r.Session, prefix+"redfish.session", r.Session, "log in through the BMC's SessionService when it refuses basic auth (tried first)")
	fs.StringVar(&r.TerminateAction, prefix+"redfish.terminate-action", r.TerminateAction, "Reset type of a TerminateNode: ForceOff or PowerCycle")
	fs.DurationVar(&r.Timeout, prefix+"redfish.timeout", r.Timeout, "timeout of one BMC request")
	fs.Func(prefix+"redfish.allowed-networks", "comma-separated CIDRs a node's BMC address must be in (default none: every BMC address refused)", listFlag(&r.AllowedNetworks))
	fs.BoolVar(&r.LabelsOnly, prefix+"redfish.labels-only", r.LabelsOnly, "take a node's BMC only from its node-restriction.kubernetes.io/faultline-bmc-* labels (kubelets cannot set them), never from its annotations, and its provider not from its own faultline.io/janitor-provider")
	fs.BoolVar(&r.AllowHTTP, prefix+"redfish.allow-http", r.AllowHTTP, "follow a faultline.io/bmc-address with the http scheme (BMC credentials sent in cleartext); default refused")
	fs.Func(prefix+"redfish.allowed-secrets", "comma-separated Secrets (name, or prefix*) a node's faultline.io/bmc-secret may name (default none: only default_secret)", listFlag(&r.AllowedSecrets))
	a := &c.AWS
	fs.StringVar(&a.Region, prefix+"aws.region", a.Region, "EC2 region of nodes whose providerID names none")
	fs.StringVar(&a.Endpoint, prefix+"aws.endpoint", a.Endpoint, "EC2 endpoint override")
	fs.Func(prefix+"aws.maintenance-regions", "comma-separated regions whose scheduled events become HealthEvents", func(s string) error {
		a.MaintenanceRegions = nil
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				a.MaintenanceRegions = append(a.MaintenanceRegions, p)
			}
		}
		return nil
	})
	fs.DurationVar(&a.MaintenanceInterval, prefix+"aws.maintenance-interval", a.MaintenanceInterval, "how often scheduled events are polled")
	fs.StringVar(&a.MaintenanceCluster, prefix+"aws.maintenance-cluster", a.MaintenanceCluster, "cluster stamped on maintenance events")
	fs.DurationVar(&a.Timeout, prefix+"aws.timeout", a.Timeout, "timeout of one try of an EC2 request")
	l := &c.Local
	fs.IntVar(&l.Port, prefix+"local.port", l.Port, "port of the agent's local action endpoint")
	fs.StringVar(&l.SigningKeyFile, prefix+"local.signing-key-file", l.SigningKeyFile, "PEM Ed25519 private key the requests to agents are signed with")
	fs.DurationVar(&l.Timeout, prefix+"local.timeout", l.Timeout, "timeout of one agent request")
	fs.Func(prefix+"local.allowed-networks", "comma-separated CIDRs an agent's address must be in (default none: faultline.io/agent-address refused, the InternalIP used)", listFlag(&l.AllowedNetworks))
}

// listFlag sets *dst to a comma-separated list (replacing the default).
func listFlag(dst *[]string) func(string) error {
	return func(s string) error {
		*dst = nil
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				*dst = append(*dst, p)
			}
		}
		return nil
	}
}

// Providers are the provider names.
var Providers = []string{ProviderRedfish, ProviderAWS, ProviderLocal}

// Validate names the first bad key, with the given prefix ("janitor.").
func (c Config) Validate(prefix string) error {
	switch {
	case c.Identity == "":
		return fmt.Errorf("%sidentity: must not be empty", prefix)
	case (c.LeaderElection || len(c.AWS.MaintenanceRegions) > 0) && len(validation.IsDNS1123Label(c.LeaseNamespace)) > 0:
		return fmt.Errorf("%slease_namespace: %q is not a namespace (needed by leader_election and aws.maintenance_regions): %s", prefix, c.LeaseNamespace, strings.Join(validation.IsDNS1123Label(c.LeaseNamespace), "; "))
	case c.LeaderElection && c.LeaseDuration < 3*time.Second:
		// Renewed every two fifteenths of it, each try bounded by the
		// API server's answer: shorter, a slow answer loses the Lease.
		return fmt.Errorf("%slease_duration: must be at least 3s (needed by leader_election), got %v", prefix, c.LeaseDuration)
	case c.Workers < 1:
		return fmt.Errorf("%sworkers: must be at least 1, got %d", prefix, c.Workers)
	case c.MaxConcurrent < 0:
		return fmt.Errorf("%smax_concurrent: must not be negative, got %d", prefix, c.MaxConcurrent)
	case c.MaxConcurrentPerRack < 0:
		return fmt.Errorf("%smax_concurrent_per_rack: must not be negative, got %d", prefix, c.MaxConcurrentPerRack)
	case c.MaxConcurrentPerProvider < 0:
		return fmt.Errorf("%smax_concurrent_per_provider: must not be negative, got %d", prefix, c.MaxConcurrentPerProvider)
	case c.MaxConcurrentPerRack > 0 && len(validation.IsQualifiedName(c.RackLabel)) > 0:
		// No node carries such a label: each would be its own rack, and
		// the per-rack limit would limit nothing.
		return fmt.Errorf("%srack_label: %q is not a label key (needed by max_concurrent_per_rack): %s", prefix, c.RackLabel, strings.Join(validation.IsQualifiedName(c.RackLabel), "; "))
	case c.Cooldown < 0:
		return fmt.Errorf("%scooldown: must not be negative, got %v", prefix, c.Cooldown)
	case c.RebootTimeout <= 0:
		return fmt.Errorf("%sreboot_timeout: must be positive, got %v", prefix, c.RebootTimeout)
	case c.ForceAfter < 0:
		return fmt.Errorf("%sforce_after: must not be negative, got %v", prefix, c.ForceAfter)
	case c.HungAfter < 0:
		return fmt.Errorf("%shung_after: must not be negative, got %v", prefix, c.HungAfter)
	case c.TerminateTimeout <= 0:
		return fmt.Errorf("%sterminate_timeout: must be positive, got %v", prefix, c.TerminateTimeout)
	case c.GPUResetTimeout <= 0:
		return fmt.Errorf("%sgpu_reset_timeout: must be positive, got %v", prefix, c.GPUResetTimeout)
	case c.MaxQueueAge < 0:
		return fmt.Errorf("%smax_queue_age: must not be negative, got %v", prefix, c.MaxQueueAge)
	case c.PollInterval <= 0:
		return fmt.Errorf("%spoll_interval: must be positive, got %v", prefix, c.PollInterval)
	case c.NodeEvents && len(validation.IsDNS1123Label(c.EventNamespace)) > 0:
		return fmt.Errorf("%sevent_namespace: %q is not a namespace (needed by node_events): %s", prefix, c.EventNamespace, strings.Join(validation.IsDNS1123Label(c.EventNamespace), "; "))
	case c.DefaultProvider != "" && !slices.Contains(Providers, c.DefaultProvider):
		return fmt.Errorf("%sdefault_provider: %q is not a provider (%s)", prefix, c.DefaultProvider, strings.Join(Providers, ", "))
	}
	for i, p := range c.ProviderIDPrefixes {
		pre, name, ok := strings.Cut(p, "=")
		if !ok || pre == "" || !slices.Contains(Providers, name) {
			return fmt.Errorf("%sprovider_id_prefixes[%d]: want prefix=provider with provider one of %s, got %q", prefix, i, strings.Join(Providers, ", "), p)
		}
	}
	switch c.Redfish.TerminateAction {
	case "ForceOff", "PowerCycle":
	default:
		return fmt.Errorf("%sredfish.terminate_action: want ForceOff or PowerCycle, got %q", prefix, c.Redfish.TerminateAction)
	}
	if c.Redfish.Timeout <= 0 {
		return fmt.Errorf("%sredfish.timeout: must be positive, got %v", prefix, c.Redfish.Timeout)
	}
	if c.Redfish.CAFile != "" {
		if _, err := os.Stat(c.Redfish.CAFile); err != nil {
			return fmt.Errorf("%sredfish.ca_file: %w", prefix, err)
		}
	}
	if _, err := parseNetworks(prefix+"redfish.allowed_networks", c.Redfish.AllowedNetworks); err != nil {
		return err
	}
	if len(c.Redfish.AllowedNetworks) == 0 && c.usesProvider(ProviderRedfish) {
		return fmt.Errorf("%sredfish.allowed_networks: required: the redfish provider is configured (default_provider or provider_id_prefixes), "+
			"and a BMC address outside it is refused (the node's own annotation names it): list the BMC networks", prefix)
	}
	for i, s := range c.Redfish.AllowedSecrets {
		name, isPrefix := strings.CutSuffix(s, "*")
		if strings.Contains(name, "*") || !isPrefix && len(validation.IsDNS1123Subdomain(name)) > 0 {
			return fmt.Errorf("%sredfish.allowed_secrets[%d]: %q is not a Secret name or a prefix ending in *", prefix, i, s)
		}
	}
	if _, err := parseNetworks(prefix+"local.allowed_networks", c.Local.AllowedNetworks); err != nil {
		return err
	}
	if c.AWS.Timeout <= 0 {
		return fmt.Errorf("%saws.timeout: must be positive, got %v", prefix, c.AWS.Timeout)
	}
	if c.AWS.MaintenanceInterval <= 0 {
		return fmt.Errorf("%saws.maintenance_interval: must be positive, got %v", prefix, c.AWS.MaintenanceInterval)
	}
	if len(c.AWS.MaintenanceRegions) > 0 && c.AWS.MaintenanceCluster == "" {
		return fmt.Errorf("%saws.maintenance_cluster: must be set when aws.maintenance_regions is", prefix)
	}
	if c.AWS.MaintenanceCluster != "" && !events.IsClusterName(c.AWS.MaintenanceCluster) {
		return fmt.Errorf("%saws.maintenance_cluster: %q is not a cluster name (lower-case letters, digits, '-' and '.', at most 63 characters)", prefix, c.AWS.MaintenanceCluster)
	}
	if c.Local.Port < 1 || c.Local.Port > 65535 {
		return fmt.Errorf("%slocal.port: want 1-65535, got %d", prefix, c.Local.Port)
	}
	if c.Local.Timeout <= 0 {
		return fmt.Errorf("%slocal.timeout: must be positive, got %v", prefix, c.Local.Timeout)
	}
	if c.Local.TokenFile != "" {
		return fmt.Errorf("%slocal.token_file: removed (agents no longer take the bearer token every node held); "+
			"set %slocal.signing_key_file to the Ed25519 key whose public key the agents verify (processors/janitor/README.md, \"local\")", prefix, prefix)
	}
	if c.Local.SigningKeyFile != "" {
		if _, err := localaction.LoadSigningKey(c.Local.SigningKeyFile); err != nil {
			return fmt.Errorf("%slocal.signing_key_file: %w", prefix, err)
		}
	} else if c.usesProvider(ProviderLocal) {
		return fmt.Errorf("%slocal.signing_key_file: required: the local provider is configured (default_provider or provider_id_prefixes) and signs every request", prefix)
	}
	return nil
}

// Pipeline returns the runner settings of the role contract. The janitor
// consumes no topic (it watches its resources in the clusters and
// produces actions), so Topics is empty and Open registers no consumer.
func (c Config) Pipeline() pipeline.Config {
	return pipeline.Config{Role: Role, Topics: Topics}
}

// usesProvider: the provider serves nodes by configuration (not only by a
// node's own annotation or label).
func (c Config) usesProvider(name string) bool {
	if c.DefaultProvider == name {
		return true
	}
	return slices.ContainsFunc(c.ProviderIDPrefixes, func(p string) bool { _, n, _ := strings.Cut(p, "="); return n == name })
}

// providerForPrefix returns the provider of a providerID, "" when no
// prefix maps it.
func (c Config) providerForPrefix(providerID string) string {
	best, bestLen := "", 0
	for _, p := range c.ProviderIDPrefixes {
		pre, name, _ := strings.Cut(p, "=")
		if strings.HasPrefix(providerID, pre) && len(pre) > bestLen {
			best, bestLen = name, len(pre)
		}
	}
	return best
}
