package agent

import (
	"errors"
	"flag"
	"fmt"
	"github.com/faultline/faultline/agents/csp"
	"github.com/faultline/faultline/agents/localaction"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/faultline/faultline/agents/conformance"
	"github.com/faultline/faultline/agents/fabric"
	"github.com/faultline/faultline/agents/gpu"
	"github.com/faultline/faultline/agents/hostzone"
	"github.com/faultline/faultline/agents/kmsg"
	"github.com/faultline/faultline/agents/nic"
	"github.com/faultline/faultline/agents/podres"
	"github.com/faultline/faultline/agents/relay"
	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// Config is the agent's one typed configuration: a TOML file (--config)
// overridden by flags. Each check's section is a field here (see
// registry.go for how to add one).
type Config struct {
	// NodeName is stamped on every event (default $NODE_NAME; required).
	NodeName string `toml:"node_name"`
	// Checks lists the enabled checks by registry name (default ["nic"]);
	// empty runs none, which needs NVSentinelSocket.
	Checks []string `toml:"checks"`
	// ProcessingStrategy is EXECUTE_REMEDIATION (default), STORE_ONLY or STORE_AND_ANALYSE,
	// stamped on events that do not set one.
	ProcessingStrategy string `toml:"processing_strategy"`
	// MetricsAddr serves /metrics and /healthz (default "127.0.0.1:2112",
	// loopback only; "" off). To let Prometheus scrape it, listen on the
	// node's address, e.g. "[$(HOST_IP)]:2112" with HOST_IP from the
	// Kubernetes downward API (status.hostIP); see agents/README.md.
	MetricsAddr string `toml:"metrics_addr"`
	// MinTriggerInterval is the least time between a check's run (its
	// start or end) or accepted request and the next request to run it
	// through POST /checks/<name>/run on MetricsAddr (default 1m; no more
	// than the check's own interval); a request closer than that is
	// refused 429 with Retry-After. 0: none refused. SIGUSR1 is not
	// limited.
	MinTriggerInterval time.Duration `toml:"min_trigger_interval"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `toml:"log_level"`
	// PodResourcesSocket is the kubelet's pod-resources socket, read to
	// attach the pods holding an event's GPUs to the event (default
	// podres.DefaultSocket; "" off). A socket that cannot be read (missing
	// at start, the kubelet restarting) is read again at each use: events
	// go without GPU pods meanwhile, and a local GPU reset is refused.
	// "" with local actions on: GPU resets do not check for pods (logged).
	PodResourcesSocket string `toml:"pod_resources_socket"`
	// NVSentinelSocket, when set, serves NVSentinel's PlatformConnector on
	// this unix socket for NVSentinel's health monitors on the node, and
	// relays their events through the spool (agents/relay; default off).
	// Their containers dial /var/run/nvsentinel.sock.
	NVSentinelSocket string `toml:"nvsentinel_socket"`
	// NVSentinelSocketGroup is the group (name or numeric id) of that
	// socket, created mode 0660 (default: the agent's group).
	NVSentinelSocketGroup string `toml:"nvsentinel_socket_group"`
	// TimeZone is the host's time zone, the zone of the log times the
	// fabric check (FM's and NVLSM's logs) and the kmsg check's file
	// source (syslog's "Jan _2 15:04:05") read without one: "host"
	// (default: read from TimeZoneFile), or a zone name ("UTC", an IANA
	// name such as "America/Chicago"; Go's zone database is built in).
	// A host zone that cannot be read is UTC, with a warning at start.
	TimeZone string `toml:"time_zone"`
	// TimeZoneFile is the host's /etc/localtime as the agent sees it
	// (default "/etc/localtime"; the chart's init container copies it out
	// of the host's /etc, hostzone.Copy). Missing in an existing
	// directory: the host is on UTC.
	TimeZoneFile string `toml:"time_zone_file"`
	// MachineSysfs is the sysfs the machine's system UUID is read from, at start
	// (class/dmi/id/product_uuid, what the kubelet reports as the Node's
	// status.nodeInfo.systemUUID; default "/sys"), and stamped on every
	// event (events.MetaSystemUUID): a Node object kept across a machine
	// swap then tells the earlier machine's late events apart. The file
	// is root's alone: a non-root agent stamps none.
	MachineSysfs string `toml:"machine_sysfs"`

	Gateway GatewayConfig `toml:"gateway"`
	Spool   SpoolConfig   `toml:"spool"`
	// LocalActions is the endpoint the janitor asks for a reboot or a GPU
	// reset of this node (agents/localaction; off by default).
	LocalActions localaction.Config `toml:"local_actions"`

	// Check sections.
	NIC    nic.Config    `toml:"nic"`
	Kmsg   kmsg.Config   `toml:"kmsg"`
	Fabric fabric.Config `toml:"fabric"`
	GPU    gpu.Config    `toml:"gpu"`
	// CSP is the cloud maintenance check (GCP metadata server).
	CSP csp.Config `toml:"csp"`
	// Conformance is the conformance fingerprint check (agents/conformance).
	Conformance conformance.Config `toml:"conformance"`
}

// GatewayConfig is how the agent reaches the gateway.
type GatewayConfig struct {
	// Addr is the gateway's gRPC address (default "127.0.0.1:50051").
	Addr string `toml:"addr"`
	// TokenFile holds the bearer token (default
	// "/var/run/secrets/faultline/token"); re-read before every send so a
	// rotated token is picked up. Never logged. "" sends no token, which
	// needs a client certificate (CertFile) instead.
	TokenFile string `toml:"token_file"`
	// Insecure sends to the gateway without TLS: the bearer token and
	// every event travel in clear. Default false (TLS 1.2 or later,
	// verifying the gateway's certificate). Meant for a gateway on the same
	// host or a test; the agent logs a warning at start and exports
	// faultline_agent_gateway_insecure 1.
	Insecure bool `toml:"insecure"`
	// CAFile is a PEM bundle to verify the gateway (default: system roots).
	CAFile string `toml:"ca_file"`
	// ServerName overrides the TLS server name (default: from Addr).
	ServerName string `toml:"server_name"`
	// CertFile and KeyFile are a PEM client certificate and key presented
	// to the gateway (mutual TLS; a gateway may bind the certificate's CN
	// to the node). Both or neither; re-read when they change so a
	// renewed certificate is used. Default none.
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
	// Timeout bounds one SubmitEvents call (default 10s).
	Timeout time.Duration `toml:"timeout"`
	// BatchSize is the most events per SubmitEvents call (default 500);
	// a call also carries at most 2 MiB of events, whatever their number,
	// and half as much after each refusal as larger than the gateway's
	// gateway.max_body_bytes, until the spool is empty.
	BatchSize int `toml:"batch_size"`
	// MaxBackoff caps the retry backoff (default 30s).
	MaxBackoff time.Duration `toml:"max_backoff"`
}

// ValidateSettings checks the gateway keys without reading the files they
// name, naming the first bad one: the address, the TLS keys against
// Insecure, a client certificate and key together, that a token file or a
// client certificate authenticates, the timeout, batch size and backoff
// cap. It is what faultline-preflight's webhook can check of the keys it
// renders for check containers (the files exist only inside them).
func (g GatewayConfig) ValidateSettings() error {
	if g.Addr == "" {
		return errors.New("gateway.addr: must be set")
	}
	if g.Insecure {
		for _, kv := range [][2]string{{"ca_file", g.CAFile}, {"server_name", g.ServerName}, {"cert_file", g.CertFile}, {"key_file", g.KeyFile}} {
			if kv[1] != "" {
				return fmt.Errorf("gateway.%s: set, but gateway.insecure is true (no TLS)", kv[0])
			}
		}
	}
	switch {
	case g.CertFile == "" && g.KeyFile != "":
		return errors.New("gateway.cert_file: required with gateway.key_file")
	case g.KeyFile == "" && g.CertFile != "":
		return errors.New("gateway.key_file: required with gateway.cert_file")
	case g.TokenFile == "" && g.CertFile == "":
		return errors.New("gateway.token_file: must be set (or gateway.cert_file, to authenticate with a client certificate)")
	case g.Timeout <= 0:
		return fmt.Errorf("gateway.timeout: must be positive, got %v", g.Timeout)
	case g.BatchSize < 1 || g.BatchSize > 10000:
		return fmt.Errorf("gateway.batch_size: must be in 1..10000, got %d", g.BatchSize)
	case g.MaxBackoff < 100*time.Millisecond:
		return fmt.Errorf("gateway.max_backoff: must be at least 100ms, got %v", g.MaxBackoff)
	}
	return nil
}

// Validate is ValidateSettings, then the TLS files named must load. It is
// exported for other senders that reuse GatewayConfig under a [gateway]
// section, such as faultline-preflight's check runners.
func (g GatewayConfig) Validate() error {
	if err := g.ValidateSettings(); err != nil || g.Insecure {
		return err
	}
	_, _, err := g.tlsConfig()
	return err
}

// SpoolConfig is the on-disk spool (see Spool for the full policy).
type SpoolConfig struct {
	// Dir holds the segments (default "/var/lib/faultline-agent/spool").
	Dir string `toml:"dir"`
	// MaxBytes caps unsent bytes (default 64 MiB).
	MaxBytes int64 `toml:"max_bytes"`
}

// DefaultConfig returns the defaults documented on the fields.
func DefaultConfig() Config {
	return Config{
		Checks:             []string{"nic"},
		ProcessingStrategy: "EXECUTE_REMEDIATION",
		MetricsAddr:        "127.0.0.1:2112",
		MinTriggerInterval: time.Minute,
		LogLevel:           "info",
		PodResourcesSocket: podres.DefaultSocket,
		TimeZone:           hostzone.Host,
		TimeZoneFile:       hostzone.DefaultFile,
		MachineSysfs:       "/sys",
		Gateway: GatewayConfig{Addr: "127.0.0.1:50051", TokenFile: "/var/run/secrets/faultline/token",
			Timeout: 10 * time.Second, BatchSize: 500, MaxBackoff: 30 * time.Second},
		Spool:        SpoolConfig{Dir: "/var/lib/faultline-agent/spool", MaxBytes: 64 << 20},
		NIC:          nic.DefaultConfig(),
		Kmsg:         kmsg.DefaultConfig(),
		Fabric:       fabric.DefaultConfig(),
		GPU:          gpu.DefaultConfig(),
		LocalActions: localaction.DefaultConfig(),
		CSP:          csp.DefaultConfig(),
		Conformance:  conformance.DefaultConfig(),
	}
}

// RegisterFlags binds the flags to c (after TOML, so flags win). Every
// flag is named after its TOML key (--gateway.token-file for
// gateway.token_file); the earlier spellings (--gateway, --token-file,
// --spool-dir, --kmsg-source, ...) still work, deprecated.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "node name stamped on events (default $NODE_NAME)")
	fs.Func("checks", "comma-separated checks to run (default nic); registered: "+strings.Join(CheckNames(), ","), func(s string) error {
		c.Checks = nil
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				c.Checks = append(c.Checks, p)
			}
		}
		return nil
	})
	fs.StringVar(&c.ProcessingStrategy, "processing-strategy", c.ProcessingStrategy, "EXECUTE_REMEDIATION, STORE_ONLY or STORE_AND_ANALYSE")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", c.MetricsAddr, "address of /metrics and /healthz, empty to disable")
	fs.DurationVar(&c.MinTriggerInterval, "min-trigger-interval", c.MinTriggerInterval, "least time between a check's last run or request and a POST /checks/<name>/run (0: no limit)")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn, error")
	fs.StringVar(&c.PodResourcesSocket, "pod-resources-socket", c.PodResourcesSocket, "kubelet pod-resources socket, to attach the pods of an event's GPUs; empty to disable")
	fs.StringVar(&c.NVSentinelSocket, "nvsentinel-socket", c.NVSentinelSocket, "serve NVSentinel's PlatformConnector on this unix socket and relay its events (default off)")
	fs.StringVar(&c.NVSentinelSocketGroup, "nvsentinel-socket-group", c.NVSentinelSocketGroup, "group (name or id) of the NVSentinel socket, created mode 0660 (default the agent's group)")
	fs.StringVar(&c.TimeZone, "time-zone", c.TimeZone, "the host's time zone, of log times printed without one: host (read from --time-zone-file) or a zone name (UTC, America/Chicago)")
	fs.StringVar(&c.TimeZoneFile, "time-zone-file", c.TimeZoneFile, "the host's /etc/localtime as the agent sees it")
	fs.StringVar(&c.MachineSysfs, "machine-sysfs", c.MachineSysfs, "sysfs to read the machine's system UUID from (class/dmi/id/product_uuid), stamped on every event")
	c.Gateway.RegisterFlags(fs, "gateway.")
	c.Spool.RegisterFlags(fs, "spool.")
	c.NIC.RegisterFlags(fs, "nic.")
	c.Kmsg.RegisterFlags(fs, "kmsg.")
	c.Fabric.RegisterFlags(fs, "fabric.")
	c.GPU.RegisterFlags(fs, "gpu.")
	c.LocalActions.RegisterFlags(fs, "local-actions.")
	c.CSP.RegisterFlags(fs, "csp.")
	c.Conformance.RegisterFlags(fs, "conformance.")
	// The spellings before flags were named after their TOML keys.
	for old, cur := range map[string]string{"gateway": "gateway.addr", "token-file": "gateway.token-file",
		"gateway-insecure": "gateway.insecure", "ca-file": "gateway.ca-file", "server-name": "gateway.server-name",
		"cert-file": "gateway.cert-file", "key-file": "gateway.key-file", "spool-dir": "spool.dir", "spool-max-bytes": "spool.max-bytes"} {
		config.Alias(fs, old, cur)
	}
}

// RegisterFlags adds the gateway keys' flags under prefix ("gateway.").
func (g *GatewayConfig) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&g.Addr, prefix+"addr", g.Addr, "gateway gRPC address")
	fs.StringVar(&g.TokenFile, prefix+"token-file", g.TokenFile, "bearer token file")
	fs.BoolVar(&g.Insecure, prefix+"insecure", g.Insecure, "send to the gateway WITHOUT TLS: the token and events travel in clear; for a local or test gateway only")
	fs.StringVar(&g.CAFile, prefix+"ca-file", g.CAFile, "PEM CA bundle for the gateway")
	fs.StringVar(&g.ServerName, prefix+"server-name", g.ServerName, "name to verify in the gateway's certificate (default: from --"+prefix+"addr)")
	fs.StringVar(&g.CertFile, prefix+"cert-file", g.CertFile, "PEM client certificate for the gateway, mutual TLS")
	fs.StringVar(&g.KeyFile, prefix+"key-file", g.KeyFile, "PEM key of the client certificate")
	fs.DurationVar(&g.Timeout, prefix+"timeout", g.Timeout, "bound of one SubmitEvents call")
	fs.IntVar(&g.BatchSize, prefix+"batch-size", g.BatchSize, "most events per SubmitEvents call")
	fs.DurationVar(&g.MaxBackoff, prefix+"max-backoff", g.MaxBackoff, "cap of the retry backoff")
}

// RegisterFlags adds the spool keys' flags under prefix ("spool.").
func (s *SpoolConfig) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&s.Dir, prefix+"dir", s.Dir, "spool directory")
	fs.Int64Var(&s.MaxBytes, prefix+"max-bytes", s.MaxBytes, "spool capacity in bytes")
}

// Validate names the first bad key.
func (c *Config) Validate() error {
	if c.NodeName == "" {
		return errors.New("node_name: must be set (or NODE_NAME, or --node-name)")
	}
	if len(c.Checks) == 0 && c.NVSentinelSocket == "" {
		return errors.New("checks: no check enabled, and nvsentinel_socket is off: the agent would have nothing to report")
	}
	if c.NVSentinelSocketGroup != "" && c.NVSentinelSocket == "" {
		return errors.New("nvsentinel_socket_group: set, but nvsentinel_socket is off")
	}
	for i, n := range c.Checks {
		if spec(n) == nil {
			return fmt.Errorf("checks: unknown check %q (registered: %s)", n, strings.Join(CheckNames(), ", "))
		}
		if slices.Contains(c.Checks[:i], n) {
			return fmt.Errorf("checks: %q listed twice (each check runs once)", n)
		}
	}
	if _, ok := datamodels.ProcessingStrategy_value[c.ProcessingStrategy]; !ok || c.ProcessingStrategy == "UNSPECIFIED" {
		return fmt.Errorf("processing_strategy: %q is not EXECUTE_REMEDIATION, STORE_ONLY or STORE_AND_ANALYSE", c.ProcessingStrategy)
	}
	if c.MinTriggerInterval < 0 {
		return fmt.Errorf("min_trigger_interval: must not be negative, got %v", c.MinTriggerInterval)
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.LogLevel) {
		return fmt.Errorf("log_level: %q is not debug, info, warn or error", c.LogLevel)
	}
	if err := hostzone.Validate(c.TimeZone); err != nil {
		return fmt.Errorf("time_zone: %q is not host or a zone name (UTC, America/Chicago): %w", c.TimeZone, err)
	}
	if err := c.Gateway.Validate(); err != nil {
		return err
	}
	if c.Spool.Dir == "" {
		return errors.New("spool.dir: must be set")
	}
	if c.Spool.MaxBytes < 64<<10 {
		return fmt.Errorf("spool.max_bytes: %d is below 64 KiB", c.Spool.MaxBytes)
	}
	if c.NVSentinelSocket != "" && c.Spool.MaxBytes < relay.MinSpoolBytes {
		return fmt.Errorf("spool.max_bytes: %d is below %d (5 MiB), the least that holds the largest call nvsentinel_socket takes from an NVSentinel monitor", c.Spool.MaxBytes, relay.MinSpoolBytes)
	}
	if err := c.LocalActions.Validate("local_actions."); err != nil {
		return err
	}
	for _, s := range registry {
		if !slices.Contains(c.Checks, s.Name) {
			continue
		}
		if d := s.Interval(c); d <= 0 {
			return fmt.Errorf("%s: must be positive, got %v", s.IntervalKey, d)
		}
		if s.Validate != nil {
			if err := s.Validate(c); err != nil {
				return err
			}
		}
	}
	return nil
}

// LoadConfig builds the configuration from defaults, the TOML file named by
// --config (unknown keys are an error naming them), then flags, and
// validates it (internal/config.Load, as every faultline binary). getenv
// supplies NODE_NAME. Errors and --help go to stderr.
func LoadConfig(name string, args []string, getenv func(string) string) (Config, error) {
	return loadConfig(name, args, getenv, os.Stderr)
}

func loadConfig(name string, args []string, getenv func(string) string, out io.Writer) (Config, error) {
	cfg := DefaultConfig()
	cfg.NodeName = getenv("NODE_NAME")
	if _, err := config.Load(name, args, &cfg, cfg.RegisterFlags, cfg.Validate, out, config.NoArgs(), config.Moved(map[string]string{
		"gateway.tls": "TLS is on by default; for plaintext set gateway.insecure = true",
	})); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// hostZone resolves time_zone for the checks that read log times
// printed without a zone (fabric, kmsg's file source), unless their
// config already names a zone.
func (c *Config) hostZone(log *slog.Logger) {
	if !slices.Contains(c.Checks, "fabric") && !(slices.Contains(c.Checks, "kmsg") && c.Kmsg.Source == kmsg.SourceFile) {
		return
	}
	loc, err := hostzone.Location(c.TimeZone, c.TimeZoneFile)
	if err != nil {
		log.Warn("host time zone not known: reading log times printed without a zone as UTC", "time_zone", c.TimeZone, "time_zone_file", c.TimeZoneFile, "err", err)
	} else {
		log.Info("host time zone", "zone", loc.String(), "time_zone", c.TimeZone)
	}
	if c.Fabric.Location == nil {
		c.Fabric.Location = loc
	}
	if c.Kmsg.Parser.Location == nil {
		c.Kmsg.Parser.Location = loc
	}
}
