package webhook

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"path"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/faultline/faultline/agents/preflight/checks"
	"github.com/faultline/faultline/agents/preflight/injection"
	"github.com/faultline/faultline/internal/unixsock"
)

// SystemNamespaces are never mutated, whatever the configuration says.
var SystemNamespaces = []string{"kube-system", "kube-public", "kube-node-lease"}

// Config is the one typed configuration of `faultline-preflight webhook`
// (TOML via --config, then --section.key-name flags). Its [check] section
// is the check runners' configuration, rendered as flags on the injected
// init containers.
type Config struct {
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `toml:"log_level"`

	Webhook    ServerConfig        `toml:"webhook"`
	TLS        TLSConfig           `toml:"tls"`
	Kube       KubeConfig          `toml:"kube"`
	Namespaces NamespacesConfig    `toml:"namespaces"`
	GPU        injection.Detection `toml:"gpu"`
	Network    injection.Detection `toml:"network"`
	NCCL       NCCLConfig          `toml:"nccl"`
	Gang       GangConfig          `toml:"gang"`
	Inject     InjectConfig        `toml:"inject"`
	// Checks are the checks to inject, in order (default dcgm-diag and
	// nccl-loopback, ADR-026's defaults). The --checks flag selects
	// built-in checks by name.
	Checks []injection.CheckSpec `toml:"checks"`
	// Check configures the built-in checks (rendered as their flags).
	Check checks.Config `toml:"check"`
}

// ServerConfig is the admission server and its MutatingWebhookConfiguration.
type ServerConfig struct {
	// Listen is the TLS address the API server calls (default ":8443").
	Listen string `toml:"listen"`
	// MetricsAddr serves /metrics over plain HTTP (default ":9090"; ""
	// off).
	MetricsAddr string `toml:"metrics_addr"`
	// Path is the admission path (default "/mutate-pod").
	Path string `toml:"path"`
	// ConfigurationName is the MutatingWebhookConfiguration (default
	// "faultline-preflight").
	ConfigurationName string `toml:"configuration_name"`
	// Name is the webhook entry in it (default "preflight.faultline.io").
	Name string `toml:"name"`
	// ManageConfiguration makes the server create and keep the whole
	// webhook entry (rules, namespace selector, failure policy, timeout,
	// caBundle) from this configuration (default true); false only keeps
	// its caBundle, for a configuration deployed otherwise.
	ManageConfiguration bool `toml:"manage_configuration"`
	// OwnerClusterRole, when set (with manage_configuration), is a
	// ClusterRole the configuration is owned by (an ownerReference, added
	// to an existing one too): deleting the ClusterRole (helm uninstall,
	// the chart's preflight turned off) has the garbage collector delete
	// the configuration, which would otherwise stay, call a Service gone
	// and, with failure_policy Fail, refuse every pod of the opted-in
	// namespaces. The chart names its webhook ClusterRole. Needs get on it;
	// while it cannot be read the configuration is not created.
	OwnerClusterRole string `toml:"owner_cluster_role"`
	// FailurePolicy is Fail (default: a pod is not created while the
	// webhook cannot answer) or Ignore (it is created without checks).
	// Errors inside the webhook follow the same policy.
	FailurePolicy string `toml:"failure_policy"`
	// Timeout is the API server's timeout for a call, 1s..30s (default 5s).
	Timeout time.Duration `toml:"timeout"`
	// ServiceName, ServiceNamespace and ServicePort locate the webhook
	// Service (defaults "faultline-preflight", $POD_NAMESPACE else
	// "faultline", 443).
	ServiceName      string `toml:"service_name"`
	ServiceNamespace string `toml:"service_namespace"`
	ServicePort      int    `toml:"service_port"`
	// URL, when set, is called instead of the Service (out-of-cluster
	// webhooks, tests).
	URL string `toml:"url"`
	// Resync is how often the configuration and certificate are checked
	// again (default 5m).
	Resync time.Duration `toml:"resync"`
	// MaxBodyBytes bounds one AdmissionReview (default 4 MiB).
	MaxBodyBytes int64 `toml:"max_body_bytes"`
}

// TLSConfig is the serving certificate.
type TLSConfig struct {
	// Mode is "self-signed" (default: a CA and a serving certificate kept
	// in a Secret, renewed before expiry, the CA patched into the
	// webhook's caBundle) or "files" (cert-manager or another issuer
	// writes CertFile/KeyFile, re-read when they change; CAFile, if set,
	// becomes the caBundle).
	Mode string `toml:"mode"`
	// SecretName holds the self-signed CA and certificate (default
	// "faultline-preflight-webhook-tls", in the service namespace).
	SecretName string `toml:"secret_name"`
	// DNSNames and IPAddresses are added to the certificate's names (the
	// Service's names are always in it).
	DNSNames    []string `toml:"dns_names"`
	IPAddresses []string `toml:"ip_addresses"`
	// Validity and RenewBefore of the self-signed serving certificate
	// (defaults 8760h and 720h).
	Validity    time.Duration `toml:"validity"`
	RenewBefore time.Duration `toml:"renew_before"`
	CertFile    string        `toml:"cert_file"`
	KeyFile     string        `toml:"key_file"`
	CAFile      string        `toml:"ca_file"`
}

// KubeConfig is the API access.
type KubeConfig struct {
	// Kubeconfig ("" = in-cluster).
	Kubeconfig string `toml:"kubeconfig"`
	// QPS and Burst of the client (defaults 20, 40).
	QPS   float32 `toml:"qps"`
	Burst int     `toml:"burst"`
}

// NamespacesConfig selects the namespaces whose pods get checks.
type NamespacesConfig struct {
	// Include are the opted-in namespaces (required).
	Include []string `toml:"include"`
	// Exclude are never mutated (default the faultline and nvsentinel
	// namespaces); SystemNamespaces and the webhook's own namespace are
	// always excluded.
	Exclude []string `toml:"exclude"`
}

// NCCLConfig is what the webhook copies for the NCCL checks.
type NCCLConfig struct {
	// EnvPatterns are globs of variables copied from the pod's containers
	// (default "NCCL_*", "UCX_*", "OMPI_*").
	EnvPatterns []string `toml:"env_patterns"`
}

// GangConfig selects gang discovery and the controller.
type GangConfig struct {
	// Methods are tried in order: workloadRef, volcano, kueue, labels
	// (default ["workloadRef"]).
	Methods []string `toml:"methods"`
	// IDLabel and SizeLabel are the labels method's labels.
	IDLabel   string `toml:"id_label"`
	SizeLabel string `toml:"size_label"`
	// VolcanoAnnotations are the volcano method's annotation keys.
	VolcanoAnnotations []string `toml:"volcano_annotations"`
	// Controller runs the gang ConfigMap controller in this process
	// (default true).
	Controller bool `toml:"controller"`
	// Workers of the controller (default 2).
	Workers int `toml:"workers"`
	// MountPath of the gang ConfigMap in the checks (default
	// "/etc/preflight"; must match check.gang.dir).
	MountPath string `toml:"mount_path"`
}

// InjectConfig is what the injected containers share.
type InjectConfig struct {
	// Image is the checks' default image (default
	// "ghcr.io/faultline/faultline-preflight:latest").
	Image string `toml:"image"`
	// ImagePullPolicy (default IfNotPresent).
	ImagePullPolicy string `toml:"image_pull_policy"`
	// StateHostPath is the node directory of the checks' spool (default
	// "/var/lib/faultline-preflight").
	StateHostPath string `toml:"state_host_path"`
	// TokenSecret is the Secret, in each opted-in namespace, holding the
	// gateway token under key "token" (default "faultline-preflight-token";
	// "" mounts none). Legacy: every node's checks send with it, so it is
	// a cluster-wide credential that anyone who can create a pod in an
	// opted-in namespace can read; use RelaySocket.
	TokenSecret string `toml:"token_secret"`
	// RelaySocket is the node agent's relay socket on the nodes (the
	// agent's nvsentinel_socket, e.g. "/run/faultline-agent/agent.sock";
	// default "": off). When set, its directory is mounted (hostPath,
	// DirectoryOrCreate, read-only) into the checks, which send through the
	// agent with its node-bound credential; TokenSecret must be "" and no
	// spool is mounted.
	RelaySocket string `toml:"relay_socket"`
	// RelaySocketGroup is the numeric group of that socket (the agent's
	// nvsentinel_socket_group), added to each injected pod's
	// supplementalGroups so that checks of any UID can connect (default 0:
	// none added).
	RelaySocketGroup int64 `toml:"relay_socket_group"`
}

// validateRelay checks the relay keys: a socket path the checks can dial,
// no token beside it, a group only with it; checkSocket is
// check.relay_socket, which the injection sets.
func (c InjectConfig) validateRelay(checkSocket string) error {
	if checkSocket != "" {
		return errors.New("check.relay_socket: set by the webhook from inject.relay_socket; leave it empty")
	}
	if c.RelaySocket == "" {
		if c.RelaySocketGroup != 0 {
			return errors.New("inject.relay_socket_group: set, but inject.relay_socket is off")
		}
		return nil
	}
	if !path.IsAbs(c.RelaySocket) || path.Clean(c.RelaySocket) != c.RelaySocket || path.Dir(c.RelaySocket) == "/" {
		return fmt.Errorf("inject.relay_socket: %q is not a clean absolute path of a socket in a directory other than / (the directory is mounted into the checks)", c.RelaySocket)
	}
	if len(injection.RelaySocketPath(c.RelaySocket)) > unixsock.MaxPath {
		return fmt.Errorf("inject.relay_socket: the checks' path of it, %q, is longer than a unix socket's may be", injection.RelaySocketPath(c.RelaySocket))
	}
	if c.TokenSecret != "" {
		return fmt.Errorf("inject.token_secret: %q is set with inject.relay_socket: the checks send through the agent; set it to \"\" (the token is a cluster-wide credential in tenants' namespaces)", c.TokenSecret)
	}
	if c.RelaySocketGroup < 0 || c.RelaySocketGroup > math.MaxInt32 {
		return fmt.Errorf("inject.relay_socket_group: %d is not a group id", c.RelaySocketGroup)
	}
	return nil
}

// DefaultConfig returns the defaults documented on the fields.
func DefaultConfig() Config {
	c := Config{
		LogLevel: "info",
		Webhook: ServerConfig{Listen: ":8443", MetricsAddr: ":9090", Path: "/mutate-pod", ConfigurationName: "faultline-preflight",
			Name: "preflight.faultline.io", ManageConfiguration: true, FailurePolicy: "Fail", Timeout: 5 * time.Second,
			ServiceName: "faultline-preflight", ServiceNamespace: "faultline", ServicePort: 443, Resync: 5 * time.Minute,
			MaxBodyBytes: 4 << 20},
		TLS:        TLSConfig{Mode: "self-signed", SecretName: "faultline-preflight-webhook-tls", Validity: 8760 * time.Hour, RenewBefore: 720 * time.Hour},
		Kube:       KubeConfig{QPS: 20, Burst: 40},
		Namespaces: NamespacesConfig{Exclude: []string{"faultline", "nvsentinel"}},
		GPU:        injection.Detection{ResourceNames: []string{"nvidia.com/gpu"}},
		Network:    injection.Detection{ResourceNames: []string{"nvidia.com/mlnxnics"}},
		NCCL:       NCCLConfig{EnvPatterns: []string{"NCCL_*", "UCX_*", "OMPI_*"}},
		Gang:       GangConfig{Methods: []string{"workloadRef"}, Controller: true, Workers: 2, MountPath: "/etc/preflight"},
		Inject: InjectConfig{Image: "ghcr.io/faultline/faultline-preflight:latest", ImagePullPolicy: "IfNotPresent",
			StateHostPath: "/var/lib/faultline-preflight", TokenSecret: "faultline-preflight-token"},
		Checks: []injection.CheckSpec{{Name: checks.DCGMDiag}, {Name: checks.NCCLLoopback}},
		Check:  checks.DefaultConfig(),
	}
	return c
}

// listFlag is a comma-separated list flag.
type listFlag struct{ p *[]string }

func (f listFlag) String() string {
	if f.p == nil {
		return ""
	}
	return strings.Join(*f.p, ",")
}

func (f listFlag) Set(s string) error {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	*f.p = out
	return nil
}

// RegisterFlags adds every key as a --section.key-name flag bound to c;
// the runner settings as --check.<runner flag>.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn, error")
	w := &c.Webhook
	fs.StringVar(&w.Listen, "webhook.listen", w.Listen, "TLS address the API server calls")
	fs.StringVar(&w.MetricsAddr, "webhook.metrics-addr", w.MetricsAddr, "plain-HTTP /metrics address; empty disables")
	fs.StringVar(&w.Path, "webhook.path", w.Path, "admission path")
	fs.StringVar(&w.ConfigurationName, "webhook.configuration-name", w.ConfigurationName, "MutatingWebhookConfiguration name")
	fs.StringVar(&w.Name, "webhook.name", w.Name, "webhook entry name")
	fs.BoolVar(&w.ManageConfiguration, "webhook.manage-configuration", w.ManageConfiguration, "create and keep the webhook entry (false: keep only its caBundle)")
	fs.StringVar(&w.OwnerClusterRole, "webhook.owner-cluster-role", w.OwnerClusterRole, "ClusterRole the configuration is owned by (deleted with it); empty: none")
	fs.StringVar(&w.FailurePolicy, "webhook.failure-policy", w.FailurePolicy, "Fail or Ignore")
	fs.DurationVar(&w.Timeout, "webhook.timeout", w.Timeout, "API server timeout for a call, 1s..30s")
	fs.StringVar(&w.ServiceName, "webhook.service-name", w.ServiceName, "webhook Service name")
	fs.StringVar(&w.ServiceNamespace, "webhook.service-namespace", w.ServiceNamespace, "webhook Service namespace")
	fs.IntVar(&w.ServicePort, "webhook.service-port", w.ServicePort, "webhook Service port")
	fs.StringVar(&w.URL, "webhook.url", w.URL, "call this URL instead of the Service")
	fs.DurationVar(&w.Resync, "webhook.resync", w.Resync, "how often the configuration and certificate are checked again")
	fs.Int64Var(&w.MaxBodyBytes, "webhook.max-body-bytes", w.MaxBodyBytes, "largest AdmissionReview")
	t := &c.TLS
	fs.StringVar(&t.Mode, "tls.mode", t.Mode, "self-signed or files")
	fs.StringVar(&t.SecretName, "tls.secret-name", t.SecretName, "Secret of the self-signed CA and certificate")
	fs.Var(listFlag{&t.DNSNames}, "tls.dns-names", "extra certificate DNS names, comma-separated")
	fs.Var(listFlag{&t.IPAddresses}, "tls.ip-addresses", "extra certificate IP addresses, comma-separated")
	fs.DurationVar(&t.Validity, "tls.validity", t.Validity, "self-signed certificate validity")
	fs.DurationVar(&t.RenewBefore, "tls.renew-before", t.RenewBefore, "renew the self-signed certificate this long before expiry")
	fs.StringVar(&t.CertFile, "tls.cert-file", t.CertFile, "serving certificate (mode files)")
	fs.StringVar(&t.KeyFile, "tls.key-file", t.KeyFile, "serving key (mode files)")
	fs.StringVar(&t.CAFile, "tls.ca-file", t.CAFile, "CA written to the caBundle (mode files)")
	fs.StringVar(&c.Kube.Kubeconfig, "kube.kubeconfig", c.Kube.Kubeconfig, "kubeconfig (default in-cluster)")
	fs.Func("kube.qps", "client QPS", func(s string) error {
		var f float32
		_, err := fmt.Sscan(s, &f)
		c.Kube.QPS = f
		return err
	})
	fs.IntVar(&c.Kube.Burst, "kube.burst", c.Kube.Burst, "client burst")
	fs.Var(listFlag{&c.Namespaces.Include}, "namespaces.include", "opted-in namespaces, comma-separated")
	fs.Var(listFlag{&c.Namespaces.Exclude}, "namespaces.exclude", "never-mutated namespaces, comma-separated")
	fs.Var(listFlag{&c.GPU.ResourceNames}, "gpu.resource-names", "GPU extended resources")
	fs.Var(listFlag{&c.GPU.DeviceClasses}, "gpu.device-classes", "GPU DRA DeviceClasses")
	fs.Var(listFlag{&c.Network.ResourceNames}, "network.resource-names", "network-device extended resources")
	fs.Var(listFlag{&c.Network.DeviceClasses}, "network.device-classes", "network-device DRA DeviceClasses")
	fs.Var(listFlag{&c.NCCL.EnvPatterns}, "nccl.env-patterns", "globs of variables copied into NCCL checks")
	fs.Var(listFlag{&c.Gang.Methods}, "gang.methods", "gang discovery methods in order: workloadRef, volcano, kueue, labels")
	fs.StringVar(&c.Gang.IDLabel, "gang.id-label", c.Gang.IDLabel, "labels method: label naming the gang")
	fs.StringVar(&c.Gang.SizeLabel, "gang.size-label", c.Gang.SizeLabel, "labels method: label giving the gang's size")
	fs.Var(listFlag{&c.Gang.VolcanoAnnotations}, "gang.volcano-annotations", "volcano method: annotation keys")
	fs.BoolVar(&c.Gang.Controller, "gang.controller", c.Gang.Controller, "run the gang ConfigMap controller")
	fs.IntVar(&c.Gang.Workers, "gang.workers", c.Gang.Workers, "controller workers")
	fs.StringVar(&c.Gang.MountPath, "gang.mount-path", c.Gang.MountPath, "where checks find the gang ConfigMap")
	fs.StringVar(&c.Inject.Image, "inject.image", c.Inject.Image, "default image of the checks")
	fs.StringVar(&c.Inject.ImagePullPolicy, "inject.image-pull-policy", c.Inject.ImagePullPolicy, "Always, IfNotPresent or Never")
	fs.StringVar(&c.Inject.StateHostPath, "inject.state-host-path", c.Inject.StateHostPath, "node directory of the checks' spool")
	fs.StringVar(&c.Inject.TokenSecret, "inject.token-secret", c.Inject.TokenSecret, "Secret (per namespace) with the gateway token; empty mounts none (legacy: a cluster-wide credential)")
	fs.StringVar(&c.Inject.RelaySocket, "inject.relay-socket", c.Inject.RelaySocket, "the node agent's relay socket on the nodes: checks send through it (no token)")
	fs.Int64Var(&c.Inject.RelaySocketGroup, "inject.relay-socket-group", c.Inject.RelaySocketGroup, "numeric group of the relay socket, added to the pods' supplementalGroups (0: none)")
	fs.Func("checks", "built-in checks to inject, comma-separated (dcgm-diag,nccl-loopback,nccl-allreduce)", func(s string) error {
		c.Checks = nil
		for _, n := range strings.Split(s, ",") {
			if n = strings.TrimSpace(n); n != "" {
				c.Checks = append(c.Checks, injection.CheckSpec{Name: n})
			}
		}
		return nil
	})
	// The runner's flags, under "check.".
	sub := flag.NewFlagSet("check", flag.ContinueOnError)
	c.Check.RegisterFlags(sub)
	sub.VisitAll(func(f *flag.Flag) {
		switch f.Name {
		case "node-name", "pod.name", "pod.namespace", "pod.uid":
			return
		}
		fs.Var(f.Value, "check."+f.Name, f.Usage)
	})
}

// Validate names the first bad key.
func (c *Config) Validate() error {
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.LogLevel) {
		return fmt.Errorf("log_level: %q is not debug, info, warn or error", c.LogLevel)
	}
	w := c.Webhook
	if w.Listen == "" {
		return errors.New("webhook.listen: must be set")
	}
	if !strings.HasPrefix(w.Path, "/") {
		return fmt.Errorf("webhook.path: %q does not start with /", w.Path)
	}
	if w.FailurePolicy != "Fail" && w.FailurePolicy != "Ignore" {
		return fmt.Errorf("webhook.failure_policy: %q is not Fail or Ignore", w.FailurePolicy)
	}
	if w.Timeout < time.Second || w.Timeout > 30*time.Second || w.Timeout%time.Second != 0 {
		return fmt.Errorf("webhook.timeout: %s is not a whole number of seconds in 1s..30s", w.Timeout)
	}
	if w.ConfigurationName == "" || w.Name == "" || !strings.Contains(w.Name, ".") {
		return errors.New("webhook.name: must be a fully qualified name (with a dot), and webhook.configuration_name set")
	}
	if w.URL == "" && (w.ServiceName == "" || w.ServiceNamespace == "") {
		return errors.New("webhook.service_name: service name and namespace must be set (or webhook.url)")
	}
	if w.URL != "" && !strings.HasPrefix(w.URL, "https://") {
		return fmt.Errorf("webhook.url: %q is not https://", w.URL)
	}
	if w.ServicePort < 1 || w.ServicePort > 65535 {
		return fmt.Errorf("webhook.service_port: %d is not a port", w.ServicePort)
	}
	if w.Resync <= 0 {
		return errors.New("webhook.resync: must be positive")
	}
	if w.MaxBodyBytes < 64<<10 {
		return fmt.Errorf("webhook.max_body_bytes: %d is below 64 KiB", w.MaxBodyBytes)
	}
	switch c.TLS.Mode {
	case "self-signed":
		if c.TLS.SecretName == "" {
			return errors.New("tls.secret_name: must be set in mode self-signed")
		}
		if c.TLS.Validity < time.Hour || c.TLS.RenewBefore <= 0 || c.TLS.RenewBefore >= c.TLS.Validity {
			return errors.New("tls.renew_before: must be positive and below tls.validity (at least 1h)")
		}
		for _, k := range [][2]string{{"cert_file", c.TLS.CertFile}, {"key_file", c.TLS.KeyFile}, {"ca_file", c.TLS.CAFile}} {
			if k[1] != "" {
				return fmt.Errorf("tls.%s: set, but tls.mode is self-signed", k[0])
			}
		}
	case "files":
		if c.TLS.CertFile == "" || c.TLS.KeyFile == "" {
			return errors.New("tls.cert_file: tls.cert_file and tls.key_file are required in mode files")
		}
	default:
		return fmt.Errorf("tls.mode: %q is not self-signed or files", c.TLS.Mode)
	}
	if q := float64(c.Kube.QPS); math.IsNaN(q) || math.IsInf(q, 0) || q <= 0 {
		return fmt.Errorf("kube.qps: must be a finite number above 0, got %v", c.Kube.QPS)
	}
	if c.Kube.Burst < 1 {
		return fmt.Errorf("kube.burst: must be at least 1, got %d", c.Kube.Burst)
	}
	if len(c.Namespaces.Include) == 0 {
		return errors.New("namespaces.include: no namespace opted in (preflight checks are opt-in per namespace)")
	}
	for _, ns := range c.Namespaces.Include {
		if slices.Contains(SystemNamespaces, ns) || slices.Contains(c.Namespaces.Exclude, ns) || ns == w.ServiceNamespace {
			return fmt.Errorf("namespaces.include: %q is a system, excluded or the webhook's own namespace", ns)
		}
	}
	if len(c.GPU.ResourceNames) == 0 && len(c.GPU.DeviceClasses) == 0 {
		return errors.New("gpu.resource_names: no GPU resource name or device class configured")
	}
	for _, p := range c.NCCL.EnvPatterns {
		if _, err := path.Match(p, ""); err != nil {
			return fmt.Errorf("nccl.env_patterns: %q: %v", p, err)
		}
	}
	for _, m := range c.Gang.Methods {
		switch m {
		case "workloadRef", "volcano", "kueue":
		case "labels":
			if c.Gang.IDLabel == "" || c.Gang.SizeLabel == "" {
				return errors.New("gang.id_label: the labels method needs gang.id_label and gang.size_label")
			}
		default:
			return fmt.Errorf("gang.methods: %q is not workloadRef, volcano, kueue or labels", m)
		}
	}
	if c.Gang.Workers < 1 {
		return errors.New("gang.workers: must be at least 1")
	}
	if c.Gang.MountPath != c.Check.Gang.Dir {
		return fmt.Errorf("gang.mount_path: %q differs from check.gang.dir %q (the checks would not find the gang)", c.Gang.MountPath, c.Check.Gang.Dir)
	}
	if d := path.Clean(c.Check.Gang.MarkerDir); d == path.Clean(c.Gang.MountPath) || d == injection.StateMountPath || d == injection.TokenMountPath || d == injection.RelayMountPath {
		return fmt.Errorf("check.gang.marker_dir: %q is where another of the checks' volumes is mounted", c.Check.Gang.MarkerDir)
	}
	if c.Inject.Image == "" {
		return errors.New("inject.image: must be set")
	}
	if !slices.Contains([]string{"Always", "IfNotPresent", "Never"}, c.Inject.ImagePullPolicy) {
		return fmt.Errorf("inject.image_pull_policy: %q is not Always, IfNotPresent or Never", c.Inject.ImagePullPolicy)
	}
	if err := c.Inject.validateRelay(c.Check.RelaySocket); err != nil {
		return err
	}
	if !strings.HasPrefix(c.Inject.StateHostPath, "/") {
		return fmt.Errorf("inject.state_host_path: %q is not an absolute path", c.Inject.StateHostPath)
	}
	if !strings.HasPrefix(c.Check.Spool.Dir, injection.StateMountPath+"/") && c.Check.Spool.Dir != injection.StateMountPath {
		return fmt.Errorf("check.spool.dir: %q is not under %s, where the node directory is mounted", c.Check.Spool.Dir, injection.StateMountPath)
	}
	seen := map[string]bool{}
	for i, s := range c.Checks {
		if s.Name == "" || seen[s.Name] {
			return fmt.Errorf("checks[%d].name: empty or repeated %q", i, s.Name)
		}
		seen[s.Name] = true
		builtin := slices.Contains(checks.Names(), s.Name)
		if !builtin && (s.Image == "" || len(s.Command)+len(s.Args) == 0) {
			return fmt.Errorf("checks[%d] (%s): a third-party check needs image and command or args", i, s.Name)
		}
		// Its init container is "preflight-<name>", a DNS-1123 label the
		// API server checks after the patch: every mutated pod would fail.
		if len(validation.IsDNS1123Label(injection.ContainerPrefix+s.Name)) > 0 {
			return fmt.Errorf("checks[%d].name: %q must be lower-case letters, digits and '-', end in a letter or digit, and be at most %d characters (its init container is %q)",
				i, s.Name, validation.DNS1123LabelMaxLength-len(injection.ContainerPrefix), injection.ContainerPrefix+s.Name)
		}
	}
	if err := c.Check.ValidateSettings(); err != nil {
		return fmt.Errorf("check.%w", err)
	}
	return nil
}
