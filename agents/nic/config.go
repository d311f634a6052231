// Package nic is the NIC link-state check of the node agent, after
// NVSentinel's NIC link-state design (docs/designs/047-link-state-detection.md
// in github.com/NVIDIA/NVSentinel; "§N" in this package's comments are its
// sections, "Appendix A" its table of fatal port counters): it discovers
// Mellanox InfiniBand and RoCE devices in sysfs, classifies each as compute, storage or management from
// the GPU metadata (NUMA gate, topology matrix, link layer, default route,
// BlueField DPUs), skips SR-IOV virtual functions, and reports one event per
// port per health boundary crossing, device disappearance, card homogeneity
// anomalies (at startup, and at run time once a card stays below its peers
// for cardHoldDown) and the fatal port counters of Appendix A.
// It persists port snapshots, known devices, counter snapshots and the boot
// id in a state file so that restarts and reboots behave as §2.2 says.
//
// Discovery uses github.com/prometheus/procfs/sysfs (InfiniBandDevice) plus
// small readers for what procfs lacks (PCI address, NUMA node, physfn,
// sriov_totalvfs, driver, net devices and operstate). Every poll after
// discovery reads only state, phys_state, operstate and the four fatal
// counters of each monitored port: procfs reads ~50 counter files per port,
// and on real mlx5 hardware each counter read is a firmware query.
package nic

import (
	"flag"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/faultline/faultline/internal/config"
)

// Sub-check names (§12.1 --checks); they are the checkName of events.
const (
	InfiniBandStateCheck       = "InfiniBandStateCheck"
	InfiniBandDegradationCheck = "InfiniBandDegradationCheck"
	EthernetStateCheck         = "EthernetStateCheck"
	EthernetDegradationCheck   = "EthernetDegradationCheck"
)

// AllChecks is the default value of Config.Checks.
var AllChecks = []string{InfiniBandStateCheck, InfiniBandDegradationCheck, EthernetStateCheck, EthernetDegradationCheck}

// Config configures the NIC check (§12.1). The zero value is not
// usable; start from DefaultConfig.
type Config struct {
	// SysfsRoot is the sysfs mount point (default "/sys"; in the DaemonSet
	// the host's /sys bind-mounted at e.g. "/nvsentinel/sys"). The design's
	// sysClassInfinibandPath and sysClassNetPath are SysfsRoot/class/infiniband
	// and SysfsRoot/class/net. A root without class/ is refused by New.
	SysfsRoot string `toml:"sysfs_root"`
	// MetadataPath is the GPU metadata file written by
	// `faultline-agent topology collect` (default
	// "/var/lib/nvsentinel/gpu_metadata.json"). Required unless
	// InclusionRegexOverride is set.
	MetadataPath string `toml:"metadata_path"`
	// StateFile is the persistent state file (default
	// "/var/run/nic_health_monitor/state.json"); "" disables persistence.
	StateFile string `toml:"state_file"`
	// BootIDPath is the kernel boot id file (default
	// "/proc/sys/kernel/random/boot_id"); with StateFile set, New refuses
	// one that is unreadable or empty.
	BootIDPath string `toml:"boot_id_path"`
	// ProcNetRoute is the host's /proc/net/route (default "/proc/net/route");
	// unreadable means no default-route exclusion.
	ProcNetRoute string `toml:"proc_net_route"`
	// PollInterval is the state polling interval (default 1s).
	PollInterval time.Duration `toml:"state_polling_interval"`
	// ExclusionRegex is a comma-separated list of regexes; matching device
	// names are dropped before classification (default
	// "^veth.*,^docker.*,^br-.*,^lo$").
	ExclusionRegex string `toml:"nic_exclusion_regex"`
	// InclusionRegexOverride, when non-empty, monitors only the device
	// names matching one of its comma-separated regexes and skips the NUMA
	// gate, the topology classification and ExclusionRegex (default "").
	InclusionRegexOverride string `toml:"nic_inclusion_regex_override"`
	// Checks lists the enabled sub-checks (default AllChecks); unknown names
	// are logged and skipped, but a list with no known name (empty, or
	// only misspelt ones: the agent would monitor nothing) is refused.
	Checks []string `toml:"checks"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		SysfsRoot:      "/sys",
		MetadataPath:   "/var/lib/nvsentinel/gpu_metadata.json",
		StateFile:      "/var/run/nic_health_monitor/state.json",
		BootIDPath:     "/proc/sys/kernel/random/boot_id",
		ProcNetRoute:   "/proc/net/route",
		PollInterval:   time.Second,
		ExclusionRegex: "^veth.*,^docker.*,^br-.*,^lo$",
		Checks:         append([]string(nil), AllChecks...),
	}
}

// RegisterFlags adds the check's flags under prefix ("nic."), each named
// after its TOML key (--nic.sysfs-root); the earlier spellings (--sysfs,
// --nic-checks, ...) still work, deprecated (config.Alias).
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.SysfsRoot, prefix+"sysfs-root", c.SysfsRoot, "sysfs mount point")
	fs.StringVar(&c.MetadataPath, prefix+"metadata-path", c.MetadataPath, "GPU metadata JSON")
	fs.StringVar(&c.StateFile, prefix+"state-file", c.StateFile, "NIC state file, empty for none")
	fs.StringVar(&c.BootIDPath, prefix+"boot-id-path", c.BootIDPath, "kernel boot id file")
	fs.StringVar(&c.ProcNetRoute, prefix+"proc-net-route", c.ProcNetRoute, "host /proc/net/route")
	fs.DurationVar(&c.PollInterval, prefix+"state-polling-interval", c.PollInterval, "NIC state polling interval")
	fs.StringVar(&c.ExclusionRegex, prefix+"nic-exclusion-regex", c.ExclusionRegex, "comma-separated regexes of NICs to drop")
	fs.StringVar(&c.InclusionRegexOverride, prefix+"nic-inclusion-regex-override", c.InclusionRegexOverride, "comma-separated regexes: monitor only these, skip classification")
	fs.Func(prefix+"checks", "comma-separated NIC sub-checks (default "+strings.Join(AllChecks, ",")+")", func(s string) error {
		c.Checks = splitList(s)
		return nil
	})
	// The spellings before flags were named after their TOML keys.
	for old, key := range map[string]string{"sysfs": "sysfs-root", "metadata-path": "metadata-path", "state-file": "state-file",
		"boot-id-path": "boot-id-path", "proc-net-route": "proc-net-route", "state-polling-interval": "state-polling-interval",
		"nic-exclusion-regex": "nic-exclusion-regex", "nic-inclusion-regex-override": "nic-inclusion-regex-override", "nic-checks": "checks"} {
		config.Alias(fs, old, prefix+key)
	}
}

// Validate names the first bad key.
func (c *Config) Validate() error {
	if c.SysfsRoot == "" {
		return fmt.Errorf("nic.sysfs_root: must not be empty")
	}
	if c.PollInterval < 10*time.Millisecond {
		return fmt.Errorf("nic.state_polling_interval: %v is below 10ms", c.PollInterval)
	}
	if _, err := compileList(c.ExclusionRegex); err != nil {
		return fmt.Errorf("nic.nic_exclusion_regex: %w", err)
	}
	if _, err := compileList(c.InclusionRegexOverride); err != nil {
		return fmt.Errorf("nic.nic_inclusion_regex_override: %w", err)
	}
	if c.MetadataPath == "" && c.InclusionRegexOverride == "" {
		return fmt.Errorf("nic.metadata_path: must be set (GPU metadata is a hard dependency)")
	}
	var unknown []string
	known := false
	for _, n := range c.Checks {
		if slices.Contains(AllChecks, n) {
			known = true
		} else {
			unknown = append(unknown, fmt.Sprintf("%q", n))
		}
	}
	if !known {
		// Not one sub-check left: the agent would monitor nothing.
		if len(unknown) > 0 {
			return fmt.Errorf("nic.checks: no known sub-check (unknown: %s; known: %s)", strings.Join(unknown, ", "), strings.Join(AllChecks, ", "))
		}
		return fmt.Errorf("nic.checks: empty (known: %s)", strings.Join(AllChecks, ", "))
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func compileList(s string) ([]*regexp.Regexp, error) {
	var out []*regexp.Regexp
	for _, p := range splitList(s) {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("regex %q: %w", p, err)
		}
		out = append(out, re)
	}
	return out, nil
}
