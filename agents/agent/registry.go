package agent

import (
	"context"
	"log/slog"
	"time"

	"github.com/faultline/faultline/agents/check"
	"github.com/faultline/faultline/agents/conformance"
	"github.com/faultline/faultline/agents/csp"
	"github.com/faultline/faultline/agents/fabric"
	"github.com/faultline/faultline/agents/gpu"
	"github.com/faultline/faultline/agents/kmsg"
	"github.com/faultline/faultline/agents/nic"
	"github.com/faultline/faultline/agents/topology"
)

// CheckSpec registers one check with the agent.
//
// How to add a check (kmsg, fabric, gpu, ...):
//
//  1. Give the check a config type with defaults, RegisterFlags(fs, prefix)
//     (each flag its TOML key under the section's prefix, "_" written "-":
//     --kmsg.state-dir for kmsg.state_dir) and Validate() error
//     naming "<section>.<key>", and add it as a field of Config with a
//     `toml:"<name>"` tag; set its default in DefaultConfig and call its
//     RegisterFlags in Config.RegisterFlags.
//  2. Add one line to registry below.
//  3. For an operator subcommand (`faultline-agent kmsg parse [FILE]`), add one
//     entry to the command table in agents/cmd/faultline-agent/main.go.
//
// The runner then calls the check on its schedule, each call with its own
// deadline and panic recovery, records faultline_agent_check_success{check}
// and friends, stamps nodeName, agent, generatedTimestamp and
// processingStrategy where the check left them empty, and spools the events.
type CheckSpec struct {
	// Name is the name used in Config.Checks, metrics and logs.
	Name string
	// Interval and Timeout give the schedule and per-call deadline;
	// IntervalKey is the interval's key, for Config.Validate's error (the
	// interval must be positive: it is the check's ticker, which panics on
	// 0 and takes every check down).
	IntervalKey string
	Interval    func(*Config) time.Duration
	Timeout     func(*Config) time.Duration
	// Validate checks the check's section (only when enabled); may be nil.
	Validate func(*Config) error
	// New builds the check. An error stops the agent at start (a hard
	// dependency missing, like the NIC check's GPU metadata).
	New func(cfg *Config, log *slog.Logger) (check.Check, error)
	// Reports lists the checkNames of the check's events that NVSentinel's
	// monitors report too (from the same facts); while the check runs, the
	// relay stores those monitors' events only (relay.Config.Own).
	Reports []string
}

// registry is the explicit list of checks the agent can run.
var registry = []CheckSpec{
	{
		Name:        "csp",
		IntervalKey: "csp.poll_interval",
		Interval:    func(c *Config) time.Duration { return c.CSP.PollInterval },
		Timeout:     func(c *Config) time.Duration { return c.CSP.PollInterval },
		Validate:    func(c *Config) error { return c.CSP.Validate() },
		New:         func(c *Config, log *slog.Logger) (check.Check, error) { return csp.New(c.CSP, log), nil },
	},
	{
		Name:        "nic",
		IntervalKey: "nic.state_polling_interval",
		Interval:    func(c *Config) time.Duration { return c.NIC.PollInterval },
		Timeout:     func(c *Config) time.Duration { return c.NIC.PollInterval },
		Validate:    func(c *Config) error { return c.NIC.Validate() },
		New: func(c *Config, log *slog.Logger) (check.Check, error) {
			return nic.New(c.NIC, nic.Options{Logger: log})
		},
		// NVSentinel's NIC monitor (link-state design, §5)
		Reports: []string{nic.InfiniBandStateCheck, nic.InfiniBandDegradationCheck, nic.EthernetStateCheck, nic.EthernetDegradationCheck},
	},
	{
		Name:        "kmsg",
		IntervalKey: "kmsg.poll_interval",
		Interval:    func(c *Config) time.Duration { return c.Kmsg.PollInterval },
		Timeout:     func(c *Config) time.Duration { return c.Kmsg.PollInterval },
		Validate:    func(c *Config) error { return c.Kmsg.Validate() },
		New: func(c *Config, log *slog.Logger) (check.Check, error) {
			k := c.Kmsg
			k.Logger = log
			// GPU UUIDs by PCI address from the topology metadata, when present.
			if m, err := topology.Load(c.NIC.MetadataPath); err == nil {
				t := kmsg.StaticTopology{GPUs: map[string]string{}}
				for _, g := range m.GPUs {
					if g.PCIAddress != "" && g.UUID != "" {
						t.GPUs[g.PCIAddress] = g.UUID
					}
				}
				k.Parser.Topology = t
			}
			// NVSwitch port → GPU (nvidia-smi nvlink -R): an SXid names the
			// GPU of its access port (issue 17).
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if links, err := fabric.CollectSwitchLinks(ctx, nil, c.Fabric.NvidiaSMI); err != nil {
				log.Warn("kmsg: no NVSwitch port map", "err", err)
			} else if len(links) > 0 {
				t, _ := k.Parser.Topology.(kmsg.StaticTopology)
				t.SwitchLinks = links
				k.Parser.Topology = t
			}
			return kmsg.New(k)
		},
		// NVSentinel's syslog-health-monitor
		Reports: []string{kmsg.CheckXID, kmsg.CheckSXID, kmsg.CheckFallenOff, kmsg.CheckNIC},
	},
	{
		Name:        "fabric",
		IntervalKey: "fabric.poll_interval",
		Interval:    func(c *Config) time.Duration { return c.Fabric.PollInterval },
		Timeout:     func(c *Config) time.Duration { return c.Fabric.PollInterval },
		Validate:    func(c *Config) error { return c.Fabric.Validate() },
		New: func(c *Config, log *slog.Logger) (check.Check, error) {
			f := c.Fabric
			f.Logger = log
			if f.MetadataPath == "" {
				f.MetadataPath = c.NIC.MetadataPath // the node's known GPUs
			}
			return fabric.New(f)
		},
	},
	{
		Name:        "gpu",
		IntervalKey: "gpu.poll_interval",
		Interval:    func(c *Config) time.Duration { return c.GPU.PollInterval },
		Timeout:     func(c *Config) time.Duration { return c.GPU.PollInterval },
		Validate:    func(c *Config) error { return c.GPU.Validate() },
		New: func(c *Config, log *slog.Logger) (check.Check, error) {
			g := c.GPU
			g.Logger = log
			if g.Expected == nil && c.NIC.MetadataPath != "" {
				g.Expected = func() []gpu.GPU { return expectedGPUs(c.NIC.MetadataPath) }
			}
			return gpu.New(g)
		},
	},
	{
		// Reports at start, every conformance.interval (sooner after a
		// partial collection: check.Retrier), and on request
		// (Agent.Trigger: SIGUSR1, POST /checks/conformance/run).
		Name:        "conformance",
		IntervalKey: "conformance.interval",
		Interval:    func(c *Config) time.Duration { return c.Conformance.Interval },
		Timeout:     func(c *Config) time.Duration { return c.Conformance.Timeout },
		Validate:    func(c *Config) error { return c.Conformance.Validate() },
		New: func(c *Config, log *slog.Logger) (check.Check, error) {
			return conformance.New(c.Conformance, log)
		},
	},
}

// reportedBy maps the checkNames the enabled checks report that
// NVSentinel's monitors report too to the check that reports them.
func reportedBy(checks []string) map[string]string {
	own := map[string]string{}
	for _, name := range checks {
		if sp := spec(name); sp != nil {
			for _, cn := range sp.Reports {
				own[cn] = name
			}
		}
	}
	return own
}

// CheckNames lists the registered checks.
func CheckNames() []string {
	out := make([]string, len(registry))
	for i, s := range registry {
		out[i] = s.Name
	}
	return out
}

func spec(name string) *CheckSpec {
	for i := range registry {
		if registry[i].Name == name {
			return &registry[i]
		}
	}
	return nil
}

// expectedGPUs are the node's GPUs of the GPU metadata at path, read at
// every poll (the collector may rewrite it); none when it does not read.
func expectedGPUs(path string) []gpu.GPU {
	m, err := topology.Load(path)
	if err != nil {
		return nil
	}
	out := make([]gpu.GPU, 0, len(m.GPUs))
	for _, g := range m.GPUs {
		out = append(out, gpu.GPU{Index: g.GPUID, UUID: g.UUID, PCI: g.PCIAddress})
	}
	return out
}
