// Package conformance is the node agent's conformance check: it reads the
// node's configuration-critical software and firmware versions (GPU driver,
// GPU VBIOS, NIC firmware, BIOS and BMC versions, kernel version and boot
// parameters, the OS image hash, and any configured extra component) and
// reports them with their fingerprint, a SHA-256 of the sorted component
// list, as one HealthEvent: checkName NodeConformance, metadata
// "fingerprint" and "component.<name>" = value (see
// ../../shared/seeds/node-conformance-drift.txt).
//
// Every configured component is reported: one that cannot be read has the
// value "unreadable: <reason>", so a node whose tool broke differs from its
// group instead of silently matching it; one the node does not have (not
// configured, no such hardware, its tool not installed) has the stable
// value "absent: <reason>", a value like any other (the processor leaves a
// report with an unreadable component out of its group's majority, not
// one with an absent component). The check reports at start, every
// Interval (default 6h) and whenever the agent is asked to (SIGUSR1, or
// POST /checks/conformance/run on the agent's local endpoint), whether or
// not the fingerprint changed: the processor treats a node without a report
// within its staleness window as unknown. After a collection with an
// unreadable component it asks to run again sooner (RetryIn: 1 minute,
// doubling up to conformance.interval) until one is complete.
//
// Sources (paths relative to the configured sysfs and procfs roots, so
// tests run on fixture trees): GPU driver /sys/module/nvidia/version; GPU
// VBIOS the "Video BIOS" lines of /proc/driver/nvidia/gpus/*/information;
// NIC firmware /sys/class/infiniband/*/fw_ver (the devices listed by
// prometheus/procfs; none, with a Mellanox NIC on the PCI bus whose RDMA
// device is yet to appear, is unreadable: rdmaPending); BIOS /sys/class/dmi/id/bios_* (prometheus/procfs);
// BMC the firmware revision printed by a command (default `ipmitool mc
// info`); kernel /proc/sys/kernel/osrelease and /proc/cmdline
// (prometheus/procfs); the OS image hash a configured file or command.
package conformance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/procfs"
	"github.com/prometheus/procfs/sysfs"

	"github.com/faultline/faultline/agents/topology"
	"github.com/faultline/faultline/internal/groupcmd"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/validate"
)

// Names of the event this check reports.
const (
	// CheckName is the event's checkName.
	CheckName = "NodeConformance"
	// Agent is the event's agent.
	Agent = "faultline-agent/conformance"
	// ComponentClass is the event's componentClass.
	ComponentClass = "NODE"
	// MetaFingerprint is the metadata key of the fingerprint (hex SHA-256).
	MetaFingerprint = "fingerprint"
	// MetaComponentPrefix prefixes each component's metadata key.
	MetaComponentPrefix = "component."
	// Unreadable prefixes the value of a component that could not be read.
	Unreadable = "unreadable: "
	// Absent prefixes the value of a component the node does not have: not
	// configured (os_image), no such hardware (no NVIDIA GPU on the PCI
	// bus, no RDMA device), its command not installed.
	Absent = "absent: "
)

// Built-in component names.
const (
	GPUDriver   = "gpu_driver"
	GPUVBIOS    = "gpu_vbios"
	NICFirmware = "nic_firmware"
	BIOSVersion = "bios_version"
	BIOSDate    = "bios_date"
	BMCVersion  = "bmc_version"
	Kernel      = "kernel"
	BootParams  = "boot_params"
	OSImage     = "os_image"
)

// BuiltIns lists the built-in components in report order.
var BuiltIns = []string{GPUDriver, GPUVBIOS, NICFirmware, BIOSVersion, BIOSDate, BMCVersion, Kernel, BootParams, OSImage}

// MaxComponents is the most components one event carries: the gateway
// takes validate.MaxMetadata metadata keys, one of them the fingerprint.
const MaxComponents = validate.MaxMetadata - 1

// MaxValue is the longest component value reported (the gateway refuses
// metadata values over 2048 bytes); a longer value is cut and ends in
// "...", its fingerprint still taken over the whole value.
const MaxValue = 2000

// MaxFile is the most bytes of a file read for a component: a larger file
// (an os_image_file pointed at the image itself) is unreadable, not read
// into the agent's memory.
const MaxFile = 64 << 10

// Component is an extra component read from a file or a command.
type Component struct {
	// Name is the component's name ([a-z0-9_.-], at most 64 bytes).
	Name string `toml:"name"`
	// File is read for the value (its trimmed content; a regular file of
	// at most MaxFile bytes); not with Command.
	File string `toml:"file"`
	// Command is run for the value (argv, no shell; its trimmed standard
	// output); not with File.
	Command []string `toml:"command"`
	// Pattern, when set, is a regular expression applied to the output:
	// the value is its first submatch (or whole match). No match is
	// unreadable.
	Pattern string `toml:"pattern"`

	re *regexp.Regexp
}

// Config is the check's section ([conformance], flags --conformance.*).
type Config struct {
	// Interval is how often the fingerprint is reported besides at start
	// and on request (sooner after a collection with an unreadable
	// component: RetryIn). Default 6h.
	Interval time.Duration `toml:"interval"`
	// Timeout bounds one collection (commands included). Default 1m.
	Timeout time.Duration `toml:"timeout"`
	// Sysfs is the sysfs mount point. Default "/sys".
	Sysfs string `toml:"sysfs"`
	// Procfs is the procfs mount point. Default "/proc".
	Procfs string `toml:"procfs"`
	// OSImageFile holds the OS image hash (its trimmed content, at most
	// MaxFile bytes). Default none; with neither it nor OSImageCommand the
	// os_image component is "absent: not configured".
	OSImageFile string `toml:"os_image_file"`
	// OSImageCommand prints the OS image hash (argv, no shell). Default none.
	OSImageCommand []string `toml:"os_image_command"`
	// BMCCommand prints the BMC firmware version. Default
	// ["ipmitool", "mc", "info"]; empty leaves the component out.
	BMCCommand []string `toml:"bmc_command"`
	// BMCPattern picks the version out of BMCCommand's output (first
	// submatch). Default `Firmware Revision\s*:\s*(\S+)` (ipmitool).
	BMCPattern string `toml:"bmc_pattern"`
	// Disable lists built-in components left out of the fingerprint
	// (e.g. "gpu_vbios" on nodes without NVIDIA's procfs). Default none.
	Disable []string `toml:"disable"`
	// BootParamsIgnore lists more kernel parameter names (the part before
	// the first "=", e.g. "console") whose values boot_params writes as
	// "*", beside the per-node ones it always masks. Default none.
	BootParamsIgnore []string `toml:"boot_params_ignore"`
	// Components are extra components, at most MaxComponents - len(BuiltIns).
	Components []Component `toml:"components"`

	bmcRE *regexp.Regexp
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Interval:   6 * time.Hour,
		Timeout:    time.Minute,
		Sysfs:      "/sys",
		Procfs:     "/proc",
		BMCCommand: []string{"ipmitool", "mc", "info"},
		BMCPattern: `Firmware Revision\s*:\s*(\S+)`,
	}
}

// RegisterFlags adds the check's flags under prefix ("conformance."). The
// lists (os_image_command, bmc_command, disable) take comma-separated
// values; components are set in the TOML file.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.DurationVar(&c.Interval, prefix+"interval", c.Interval, "how often the conformance fingerprint is reported (also at start and on SIGUSR1)")
	fs.DurationVar(&c.Timeout, prefix+"timeout", c.Timeout, "bound of one conformance collection")
	fs.StringVar(&c.Sysfs, prefix+"sysfs", c.Sysfs, "sysfs mount point")
	fs.StringVar(&c.Procfs, prefix+"procfs", c.Procfs, "procfs mount point")
	fs.StringVar(&c.OSImageFile, prefix+"os-image-file", c.OSImageFile, "file holding the OS image hash")
	fs.Func(prefix+"os-image-command", "command printing the OS image hash (comma-separated argv)", listFlag(&c.OSImageCommand))
	fs.Func(prefix+"bmc-command", "command printing the BMC firmware version (comma-separated argv; empty: leave out)", listFlag(&c.BMCCommand))
	fs.StringVar(&c.BMCPattern, prefix+"bmc-pattern", c.BMCPattern, "regular expression picking the BMC version out of bmc_command's output")
	fs.Func(prefix+"disable", "built-in components to leave out (comma-separated: "+strings.Join(BuiltIns, ",")+")", listFlag(&c.Disable))
	fs.Func(prefix+"boot-params-ignore", "kernel parameter names whose values boot_params masks (comma-separated)", listFlag(&c.BootParamsIgnore))
}

func listFlag(dst *[]string) func(string) error {
	return func(s string) error {
		*dst = nil
		for _, f := range strings.Split(s, ",") {
			if f = strings.TrimSpace(f); f != "" {
				*dst = append(*dst, f)
			}
		}
		return nil
	}
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`)

// Validate names the first bad key and compiles the patterns.
func (c *Config) Validate() error {
	switch {
	case c.Interval <= 0:
		return fmt.Errorf("conformance.interval: must be positive, got %v", c.Interval)
	case c.Timeout <= 0:
		return fmt.Errorf("conformance.timeout: must be positive, got %v", c.Timeout)
	case c.Sysfs == "":
		return errors.New("conformance.sysfs: required")
	case c.Procfs == "":
		return errors.New("conformance.procfs: required")
	case c.OSImageFile != "" && len(c.OSImageCommand) > 0:
		return errors.New("conformance.os_image_command: not together with conformance.os_image_file")
	}
	for _, d := range c.Disable {
		if !slices.Contains(BuiltIns, d) {
			return fmt.Errorf("conformance.disable: %q is not a built-in component (%s)", d, strings.Join(BuiltIns, ", "))
		}
	}
	for _, p := range c.BootParamsIgnore {
		if p == "" || strings.ContainsAny(p, "= \t\n") {
			return fmt.Errorf("conformance.boot_params_ignore: %q is not a kernel parameter name (no \"=\", no spaces)", p)
		}
	}
	if len(c.BMCCommand) > 0 {
		re, err := regexp.Compile(c.BMCPattern)
		if err != nil {
			return fmt.Errorf("conformance.bmc_pattern: %w", err)
		}
		c.bmcRE = re
	}
	if n := MaxComponents - len(BuiltIns); len(c.Components) > n {
		return fmt.Errorf("conformance.components: %d extra components, at most %d (the gateway takes %d metadata keys per event, %d of them the fingerprint and the built-in components)",
			len(c.Components), n, validate.MaxMetadata, 1+len(BuiltIns))
	}
	seen := map[string]bool{}
	for _, b := range BuiltIns {
		seen[b] = true
	}
	for i := range c.Components {
		x := &c.Components[i]
		key := fmt.Sprintf("conformance.components[%d]", i)
		switch {
		case !nameRE.MatchString(x.Name):
			return fmt.Errorf("%s.name: %q must match %s", key, x.Name, nameRE)
		case seen[x.Name]:
			return fmt.Errorf("%s.name: %q is already a component", key, x.Name)
		case (x.File == "") == (len(x.Command) == 0):
			return fmt.Errorf("%s: exactly one of file and command is required", key)
		}
		seen[x.Name] = true
		if x.Pattern != "" {
			re, err := regexp.Compile(x.Pattern)
			if err != nil {
				return fmt.Errorf("%s.pattern: %w", key, err)
			}
			x.re = re
		}
	}
	return nil
}

// Fingerprint is the hex SHA-256 of the components sorted by name, each
// written "name=value\n" (a name holds no "=" or newline; a value's
// newlines are escaped as "\n"), so the same components in any order give
// the same fingerprint and any change of a name or value changes it.
func Fingerprint(components map[string]string) string {
	names := make([]string, 0, len(components))
	for n := range components {
		names = append(names, n)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		v := strings.ReplaceAll(strings.ReplaceAll(components[n], `\`, `\\`), "\n", `\n`)
		fmt.Fprintf(h, "%s=%s\n", n, v)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Check is the conformance check.
type Check struct {
	cfg Config
	log *slog.Logger
	sys sysfs.FS
	prc procfs.FS
	// run runs a command (tests replace it); default exec.
	run func(ctx context.Context, argv []string) ([]byte, error)
	// now is the clock (tests replace it); default time.Now.
	now func() time.Time

	mu sync.Mutex
	// pendingSince is when this process first saw each Mellanox device
	// (PCI address) pending, as long as it stays pending (rdmaPending).
	pendingSince map[string]time.Time
	// partial counts the collections in a row with an unreadable
	// component (RetryIn).
	partial int
}

// retryMin is the first re-collection after a collection with an
// unreadable component, doubling up to the interval.
const retryMin = time.Minute

// New builds the check (cfg validated by the caller or here).
func New(cfg Config, log *slog.Logger) (*Check, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	sys, err := sysfs.NewFS(cfg.Sysfs)
	if err != nil {
		return nil, fmt.Errorf("conformance.sysfs: %w", err)
	}
	prc, err := procfs.NewFS(cfg.Procfs)
	if err != nil {
		return nil, fmt.Errorf("conformance.procfs: %w", err)
	}
	return &Check{cfg: cfg, log: log, sys: sys, prc: prc, run: runCommand, now: time.Now}, nil
}

// Name is "conformance".
func (c *Check) Name() string { return "conformance" }

// Check collects the components and returns the one NodeConformance event.
func (c *Check) Check(ctx context.Context) ([]*datamodels.HealthEvent, error) {
	comps := c.Collect(ctx)
	partial := false
	for _, v := range comps {
		partial = partial || strings.HasPrefix(v, Unreadable)
	}
	c.mu.Lock()
	if partial {
		c.partial++
	} else {
		c.partial = 0
	}
	c.mu.Unlock()
	return []*datamodels.HealthEvent{Event(comps)}, nil
}

// RetryIn is when the check asks to run again (check.Retrier): after a
// collection with an unreadable component (after a reboot the GPU driver
// or MOFED is often not loaded yet) in 1 minute, doubling with each such
// collection in a row up to the interval (a component unreadable for good
// — GPUs passed through to VMs, a BMC hanging — back to the interval after
// about 9 quick retries, not reported 24 times as often); after a complete
// one 0 (the interval). A partial report standing for the whole interval
// kept a remediated node from being cleared, a sensitive node's drift
// past its 4h timeout, and a pool undecided after a rolling reboot.
func (c *Check) RetryIn() time.Duration {
	c.mu.Lock()
	n := c.partial
	c.mu.Unlock()
	if n == 0 {
		return 0
	}
	return min(retryMin<<min(n-1, 20), c.cfg.Interval)
}

// Event is the NodeConformance event of a component set: healthy, not
// fatal, recommendedAction NONE, metadata the fingerprint and every
// component (values cut to MaxValue).
func Event(comps map[string]string) *datamodels.HealthEvent {
	fp := Fingerprint(comps)
	md := map[string]string{MetaFingerprint: fp}
	var bad, absent []string
	for n, v := range comps {
		md[MetaComponentPrefix+n] = events.Truncate(v, MaxValue)
		switch {
		case strings.HasPrefix(v, Unreadable):
			bad = append(bad, n)
		case strings.HasPrefix(v, Absent):
			absent = append(absent, n)
		}
	}
	sort.Strings(bad)
	sort.Strings(absent)
	msg := fmt.Sprintf("conformance fingerprint %s over %d components", fp[:16], len(comps))
	if len(bad) > 0 {
		msg += "; unreadable: " + strings.Join(bad, ", ")
	}
	if len(absent) > 0 {
		msg += "; absent: " + strings.Join(absent, ", ")
	}
	return &datamodels.HealthEvent{
		Version:           1,
		Agent:             Agent,
		ComponentClass:    ComponentClass,
		CheckName:         CheckName,
		IsHealthy:         true,
		IsFatal:           false,
		RecommendedAction: datamodels.RecommendedAction_NONE,
		Message:           msg,
		Metadata:          md,
	}
}

// Collect reads every component; one that cannot be read gets
// "unreadable: <reason>", one the node does not have "absent: <reason>".
// The commands share conformance.timeout: each may take the time left
// less a reserve for each command still to run after it (half the
// timeout shared among the commands), so one that hangs (an `ipmitool mc
// info` waiting on its BMC) leaves the others their reserve, a slow one
// may still take half the timeout or more, and what a fast one leaves
// goes to the later ones.
func (c *Check) Collect(ctx context.Context) map[string]string {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	left := 0 // commands still to run
	if len(c.cfg.BMCCommand) > 0 {
		left++
	}
	if c.cfg.OSImageFile == "" && len(c.cfg.OSImageCommand) > 0 {
		left++
	}
	for _, x := range c.cfg.Components {
		if x.File == "" {
			left++
		}
	}
	reserve := c.cfg.Timeout / time.Duration(2*max(left, 1))
	command := func(argv []string, re *regexp.Regexp) (string, error) {
		dl, _ := ctx.Deadline()
		left--
		share := time.Until(dl) - time.Duration(max(left, 0))*reserve
		cctx, cancel := context.WithTimeout(ctx, share)
		defer cancel()
		v, err := c.command(cctx, argv, re)
		if err != nil && errors.Is(cctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("timed out after %v (its share of conformance.timeout): %w", max(share, 0).Round(time.Millisecond), err)
		}
		return v, err
	}
	out := map[string]string{}
	set := func(name string, v string, err error) {
		if slices.Contains(c.cfg.Disable, name) {
			return
		}
		var a absentError
		switch {
		case errors.As(err, &a):
			out[name] = Absent + reason(err)
		case err != nil:
			out[name] = Unreadable + reason(err)
		default:
			out[name] = events.Printable(v)
		}
	}
	v, err := c.gpuDriver()
	set(GPUDriver, v, err)
	v, err = c.vbios()
	set(GPUVBIOS, v, err)
	v, err = c.nicFirmware()
	set(NICFirmware, v, err)
	dmi, derr := c.sys.DMIClass()
	v, err = deref(dmi, derr, func(d *sysfs.DMIClass) *string { return d.BiosVersion }, "bios_version")
	set(BIOSVersion, v, err)
	v, err = deref(dmi, derr, func(d *sysfs.DMIClass) *string { return d.BiosDate }, "bios_date")
	set(BIOSDate, v, err)
	if len(c.cfg.BMCCommand) > 0 {
		v, err = command(c.cfg.BMCCommand, c.cfg.bmcRE)
		set(BMCVersion, v, err)
	}
	v, err = c.readFile(filepath.Join(c.cfg.Procfs, "sys", "kernel", "osrelease"))
	set(Kernel, v, err)
	args, err := c.prc.CmdLine()
	set(BootParams, bootParams(args, c.cfg.BootParamsIgnore), err)
	switch {
	case c.cfg.OSImageFile != "":
		v, err = c.readFile(c.cfg.OSImageFile)
	case len(c.cfg.OSImageCommand) > 0:
		v, err = command(c.cfg.OSImageCommand, nil)
	default:
		v, err = "", absentError{"not configured (conformance.os_image_file or conformance.os_image_command)"}
	}
	set(OSImage, v, err)
	for _, x := range c.cfg.Components {
		if x.File != "" {
			v, err = c.readFile(x.File)
			if err == nil && x.re != nil {
				v, err = match(x.re, []byte(v))
			}
		} else {
			v, err = command(x.Command, x.re)
		}
		set(x.Name, v, err)
	}
	return out
}

// bootParams is the kernel command line without what names this node
// rather than its configuration, so that nodes installed or netbooted from
// one image have one fingerprint:
//   - GRUB's BOOT_IMAGE (the kernel by the disk it was read from,
//     "(hd1,gpt2)/vmlinuz-…"; the kernel version is its own component) is
//     left out;
//   - the identifier of a root= or resume= given by UUID or PARTUUID, or
//     by /dev/disk/by-uuid/ or /dev/disk/by-partuuid/ (each installed
//     node's filesystems have their own): "root=UUID=*",
//     "root=/dev/disk/by-uuid/*";
//   - an installed node's RAID and LUKS identifiers: rd.md.uuid= and
//     rd.luks.uuid= are "*", rd.luks.name=<uuid>=<name> is "*=<name>";
//   - a netbooted node's identity: PXELINUX's BOOTIF= (the boot NIC's MAC)
//     and SYSAPPEND's SYSUUID=, SYSSERIAL=, MBSERIAL= and MBASSET=,
//     hostname= and systemd.hostname=, any hardware address of 6 to 20
//     octets as one "*" (an Ethernet MAC, an IPoIB address; dracut's
//     ifname=: maskHardwareAddrs; ip='s macaddr, by its position, also
//     after an empty MTU: ipMacaddr), and the client address
//     and hostname of a static ip= (the kernel's and dracut's
//     <client>:<server>:<gateway>:<netmask>:
//     <hostname>:<device>:<autoconf>…, however many fields are given, as
//     PXELINUX's IPAPPEND 1 gives four; an IPv6 address in brackets): "*";
//   - what OpenCHAMI's and CSM's boot script service adds per node and per
//     boot: xname=, nid=, bss_referral_token=, spire_join_token= and
//     bos_session_id=: "*";
//   - the value of every parameter named in ignore (conformance.
//     boot_params_ignore): "*".
//
// Every other parameter, and the rest of those (gateway, netmask, device,
// autoconf), is kept as is, in its order.
func bootParams(args []string, ignore []string) string {
	out := make([]string, 0, len(args))
	for _, a := range args {
		if strings.HasPrefix(a, "BOOT_IMAGE=") {
			continue
		}
		key, val, _ := strings.Cut(a, "=")
		switch {
		case slices.Contains(maskedParams, key), slices.Contains(ignore, key):
			val = "*"
		case key == "root", key == "resume":
			for _, p := range []string{"UUID=", "PARTUUID=", "/dev/disk/by-uuid/", "/dev/disk/by-partuuid/"} {
				if strings.HasPrefix(val, p) {
					val = p + "*"
				}
			}
		case key == "rd.luks.name":
			if _, name, ok := strings.Cut(val, "="); ok {
				val = "*=" + name
			} else {
				val = "*"
			}
		case key == "ip":
			val = maskHardwareAddrs(ipMacaddr(staticIP(val)))
		default:
			val = maskHardwareAddrs(val)
		}
		if val != "" || strings.Contains(a, "=") {
			a = key + "=" + val
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

// maskedParams are the kernel parameters whose whole value names the node
// or the boot rather than the configuration (see bootParams).
var maskedParams = []string{
	"BOOTIF", "SYSUUID", "SYSSERIAL", "MBSERIAL", "MBASSET", "hostname", "systemd.hostname",
	"xname", "nid", "bss_referral_token", "spire_join_token", "bos_session_id",
	"rd.md.uuid", "rd.luks.uuid",
}

// staticIP is an ip= value with its client address (field 0, when an
// address) and, when the client is an address or empty, its hostname
// (field 4) written "*"; an address in brackets (IPv6) is one field.
// Another form (ip=dhcp, ip=eth0:dhcp) is kept.
func staticIP(val string) string {
	f := ipFields(val)
	client := strings.TrimSuffix(strings.TrimPrefix(f[0], "["), "]")
	if f[0] != "" && net.ParseIP(client) == nil {
		return val
	}
	for _, i := range []int{0, 4} {
		if i < len(f) && f[i] != "" {
			f[i] = "*"
		}
	}
	return strings.Join(f, ":")
}

// ipFields is an ip= value split at its colons; an address in brackets
// (IPv6) is one field. Joined with ":" they are the value again.
func ipFields(val string) []string {
	var f []string
	for rest := val; ; {
		end := 0
		if strings.HasPrefix(rest, "[") {
			end = max(strings.IndexByte(rest, ']'), 0)
		}
		i := strings.IndexByte(rest[end:], ':')
		if i < 0 {
			return append(f, rest)
		}
		f, rest = append(f, rest[:end+i]), rest[end+i+1:]
	}
}

// ipMacaddr is an ip= value with dracut's <macaddr> written "*", found as
// dracut finds it: after <autoconf>:[<mtu>]: of
// ip=<interface>:<autoconf>[:[<mtu>][:<macaddr>]] (autoconf dhcp, on,
// any, dhcp6, auto6, either6 or link6) and of
// ip=<client>:[<peer>]:<gateway>:<netmask>:<hostname>:<interface>:
// <autoconf>[:[<mtu>][:<macaddr>]]. An empty MTU puts "::" before it,
// which is no IPv6 address (maskHardwareAddrs keeps what is beside "::").
// The rest must be a hardware address (6 to 20 octets): the DNS form,
// ...:<autoconf>:<dns1>:<dns2>, is kept.
func ipMacaddr(val string) string {
	f := ipFields(val)
	at := 8
	if len(f) > 1 && slices.Contains([]string{"dhcp", "on", "any", "dhcp6", "auto6", "either6", "link6"}, f[1]) {
		at = 3
	}
	if len(f) <= at || !wholeHardwareAddr.MatchString(strings.Join(f[at:], ":")) {
		return val
	}
	return strings.Join(append(f[:at], "*"), ":")
}

// wholeHardwareAddr is a value that is one hardwareAddr.
var wholeHardwareAddr = regexp.MustCompile(`(?i)^[0-9a-f]{2}(?:[:-][0-9a-f]{2}){5,19}$`)

// hardwareAddr is a link-layer address written with colons or dashes:
// 6 (Ethernet MAC) to 20 octets (IPoIB: QPN and GID).
var hardwareAddr = regexp.MustCompile(`(?i)\b[0-9a-f]{2}(?:[:-][0-9a-f]{2}){5,19}\b`)

// maskHardwareAddrs writes each hardware address in val as one "*" (an
// IPoIB address kept its last two octets when 6 at a time were masked, a
// fingerprint per node). What is part of an IPv6 address is kept: inside
// brackets (dracut's ip=) or beside "::".
func maskHardwareAddrs(val string) string {
	var b strings.Builder
	last := 0
	for _, m := range hardwareAddr.FindAllStringIndex(val, -1) {
		i, j := m[0], m[1]
		if strings.Count(val[:i], "[") > strings.Count(val[:i], "]") ||
			strings.HasSuffix(val[:i], "::") || strings.HasPrefix(val[j:], "::") {
			continue
		}
		b.WriteString(val[last:i])
		b.WriteString("*")
		last = j
	}
	if last == 0 {
		return val
	}
	b.WriteString(val[last:])
	return b.String()
}

func deref(d *sysfs.DMIClass, err error, f func(*sysfs.DMIClass) *string, file string) (string, error) {
	if err != nil {
		return "", fmt.Errorf("dmi: %w", err)
	}
	if p := f(d); p != nil {
		return *p, nil
	}
	return "", fmt.Errorf("dmi: no %s", file)
}

// absentError is the reason a component is absent from the node (reported
// Absent + reason) rather than unreadable.
type absentError struct{ reason string }

func (e absentError) Error() string { return e.reason }

// readFile is the trimmed content of a regular file of at most MaxFile
// bytes: a FIFO (which would never end) or a device is refused.
func (c *Check) readFile(path string) (string, error) {
	b, err := readCapped(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func readCapped(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", path, fi.Mode().Type())
	}
	return topology.ReadCapped(path, MaxFile)
}

// gpuDriver is the nvidia module's version; without the module, absent on
// a node without NVIDIA GPU and unreadable on one with (the driver not
// loaded yet after a reboot, or failing to load).
func (c *Check) gpuDriver() (string, error) {
	v, err := c.readFile(filepath.Join(c.cfg.Sysfs, "module", "nvidia", "version"))
	if errors.Is(err, fs.ErrNotExist) {
		if nerr := c.noGPU(); nerr != nil {
			return "", nerr
		}
		return "", fmt.Errorf("nvidia module not loaded, NVIDIA GPU on the PCI bus: %w", err)
	}
	return v, err
}

// noGPU is an absentError when no NVIDIA GPU (vendor 0x10de, display
// class 0x03xxxx) is on the node's PCI bus (<sysfs>/bus/pci/devices), nil
// when one is. An NVSwitch (a bridge) is no GPU.
func (c *Check) noGPU() error {
	devs, _ := filepath.Glob(filepath.Join(c.cfg.Sysfs, "bus", "pci", "devices", "*"))
	for _, d := range devs {
		vendor, verr := c.readFile(filepath.Join(d, "vendor"))
		class, cerr := c.readFile(filepath.Join(d, "class"))
		if verr == nil && cerr == nil && vendor == "0x10de" && strings.HasPrefix(class, "0x03") {
			return nil
		}
	}
	return absentError{"no NVIDIA GPU"}
}

// vbios is the distinct VBIOS versions of the node's NVIDIA GPUs, sorted,
// comma-separated (independent of PCI addresses and GPU order).
func (c *Check) vbios() (string, error) {
	dirs, err := filepath.Glob(filepath.Join(c.cfg.Procfs, "driver", "nvidia", "gpus", "*", "information"))
	if err != nil {
		return "", err
	}
	if len(dirs) == 0 {
		if nerr := c.noGPU(); nerr != nil {
			return "", nerr
		}
		return "", fmt.Errorf("no GPU in %s, NVIDIA GPU on the PCI bus", filepath.Join(c.cfg.Procfs, "driver", "nvidia", "gpus"))
	}
	set := map[string]bool{}
	for _, f := range dirs {
		b, err := readCapped(f)
		if err != nil {
			return "", err
		}
		v, err := match(vbiosRE, b)
		if err != nil {
			return "", fmt.Errorf("%s: %w", f, err)
		}
		if strings.Contains(v, "?") {
			// nv-procfs.c's "??.??.??.??.??": the driver could not read
			// it (the GPU off the bus, locked up), a fault, not a version.
			return "", fmt.Errorf("%s: VBIOS not readable by the driver (%s)", f, v)
		}
		set[v] = true
	}
	return joinSet(set), nil
}

var vbiosRE = regexp.MustCompile(`(?m)^Video BIOS:\s*(\S+)`)

// nicFirmware is the distinct firmware versions of the node's RDMA
// devices, sorted, comma-separated: the devices as prometheus/procfs lists
// them, each one's fw_ver read alone. procfs's InfiniBandDevice also
// parses every port, and fails the device on a port file it cannot read
// or parse (a counter answering EINVAL on a ConnectX-7 port in switch
// mode, node_exporter#3265): that would report the firmware unreadable,
// a drift from the node's group, for a fault the NIC check reports.
func (c *Check) nicFirmware() (string, error) {
	names, err := c.sys.InfiniBandClassDevices()
	if errors.Is(err, fs.ErrNotExist) || err == nil && len(names) == 0 {
		if dev, why := c.rdmaPending(); dev != "" {
			return "", fmt.Errorf("no InfiniBand devices in %s, Mellanox NIC %s on the PCI bus (%s)",
				filepath.Join(c.cfg.Sysfs, "class", "infiniband"), dev, why)
		}
		return "", absentError{"no InfiniBand devices"}
	}
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	c.pendingSince = nil // the RDMA devices are there: a later reload waits anew
	c.mu.Unlock()
	set := map[string]bool{}
	for _, n := range names {
		v, err := c.readFile(filepath.Join(c.cfg.Sysfs, "class", "infiniband", n, "fw_ver"))
		if err != nil {
			return "", err
		}
		set[v] = true
	}
	return joinSet(set), nil
}

// bootGrace is how long after boot a Mellanox NIC bound to no driver is
// taken for its driver not loaded yet, and how long after this process
// first saw it pending a Mellanox NIC is taken for pending (rdmaPending).
const bootGrace = 15 * time.Minute

// rdmaPending is the address of a Mellanox/NVIDIA networking device
// (vendor 0x15b3, class 0x0207xx InfiniBand or 0x0200xx Ethernet) on the
// node's PCI bus (<sysfs>/bus/pci/devices) whose RDMA device plausibly is
// yet to appear in class/infiniband, and why; "" when there is none. Its
// driver (the device's driver link) is mlx5_core and the mlx5_ib or
// ib_core module is loaded (<sysfs>/module): the RDMA device being
// registered, MOFED reloading; or it has no driver and the mlx5_core or
// mlx_compat module is loaded (an openibd / MOFED reload at any time
// since boot: the device unbound for a moment) or the node booted less
// than bootGrace ago (<procfs>/uptime): the driver not loaded yet.
// A device bound to vfio-pci (passed to a VM), or to mlx5_core without
// mlx5_ib or ib_core (a plain Ethernet NIC), or left without driver long
// after boot with no Mellanox module loaded, never shows up there: the
// node has no RDMA device. A device is pending for bootGrace since this
// process first saw it pending (or within bootGrace of boot), no longer:
// an Ethernet-only ConnectX beside an unbound Mellanox function (SR-IOV
// VFs not autoprobed, a port an admin unbound), or NICs failing their
// probe after a bad flash, were unreadable for ever.
func (c *Check) rdmaPending() (dev, why string) {
	now := c.now()
	up, upOK := c.uptime()
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[string]time.Time{}
	defer func() { c.pendingSince = seen }()
	devs, _ := filepath.Glob(filepath.Join(c.cfg.Sysfs, "bus", "pci", "devices", "*"))
	for _, d := range devs {
		vendor, verr := c.readFile(filepath.Join(d, "vendor"))
		class, cerr := c.readFile(filepath.Join(d, "class"))
		if verr != nil || cerr != nil || vendor != "0x15b3" ||
			!strings.HasPrefix(class, "0x0207") && !strings.HasPrefix(class, "0x0200") {
			continue
		}
		reason := ""
		link, err := os.Readlink(filepath.Join(d, "driver"))
		switch driver := filepath.Base(link); {
		case err == nil && driver == "mlx5_core" && (c.moduleLoaded("mlx5_ib") || c.moduleLoaded("ib_core")):
			reason = "bound to mlx5_core with the RDMA modules loaded: its RDMA device not registered yet"
		case errors.Is(err, fs.ErrNotExist):
			if c.moduleLoaded("mlx5_core") || c.moduleLoaded("mlx_compat") {
				reason = "no driver bound with mlx5_core or mlx_compat loaded: the driver being (re)loaded"
			} else if upOK && up < bootGrace {
				reason = fmt.Sprintf("no driver bound %s after boot: its driver not loaded yet", up.Round(time.Second))
			}
		}
		if reason == "" {
			continue
		}
		addr := filepath.Base(d)
		first, ok := c.pendingSince[addr]
		if !ok {
			first = now
		}
		seen[addr] = first
		if dev == "" && (now.Sub(first) < bootGrace || upOK && up < bootGrace) {
			dev, why = addr, reason
		}
	}
	return dev, why
}

// moduleLoaded is whether <sysfs>/module/<name> exists.
func (c *Check) moduleLoaded(name string) bool {
	_, err := os.Stat(filepath.Join(c.cfg.Sysfs, "module", name))
	return err == nil
}

// uptime is the time since boot (<procfs>/uptime); ok false when it
// cannot be read.
func (c *Check) uptime() (time.Duration, bool) {
	v, err := c.readFile(filepath.Join(c.cfg.Procfs, "uptime"))
	if err != nil {
		return 0, false
	}
	f, _, _ := strings.Cut(v, " ")
	secs, err := strconv.ParseFloat(f, 64)
	if err != nil || secs < 0 {
		return 0, false
	}
	return time.Duration(secs * float64(time.Second)), true
}

func joinSet(set map[string]bool) string {
	out := make([]string, 0, len(set))
	for v := range set {
		out = append(out, v)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func (c *Check) command(ctx context.Context, argv []string, re *regexp.Regexp) (string, error) {
	b, err := c.run(ctx, argv)
	if notInstalled(argv[0], err) {
		return "", absentError{argv[0] + " not installed"}
	}
	if err != nil {
		return "", err
	}
	if re != nil {
		return match(re, b)
	}
	return strings.TrimSpace(string(b)), nil
}

// notInstalled is whether err says that the command named name is not on
// the node: not found in $PATH, or, for a path (bmc_command =
// ["/usr/bin/ipmitool", …]), the file itself does not exist (not a
// script whose interpreter is missing, which is broken, not absent).
func notInstalled(name string, err error) bool {
	if errors.Is(err, exec.ErrNotFound) {
		return true
	}
	if !strings.Contains(name, "/") || !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	_, serr := os.Lstat(name)
	return errors.Is(serr, fs.ErrNotExist)
}

// runCommand runs argv in its own process group; at ctx's end the whole
// group is killed, and the output is no longer waited for after
// commandWaitDelay (a child that escaped the group and holds the output
// open does not hold the collection).
func runCommand(ctx context.Context, argv []string) ([]byte, error) {
	cmd := groupcmd.Command(ctx, commandWaitDelay, argv[0], argv[1:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if s := strings.TrimSpace(stderr.String()); s != "" {
			return nil, fmt.Errorf("%s: %w: %s", argv[0], err, firstLine(s))
		}
		return nil, fmt.Errorf("%s: %w", argv[0], err)
	}
	return out, nil
}

// commandWaitDelay is how long a command's output is waited for after its
// collection's timeout killed it.
const commandWaitDelay = time.Second

func match(re *regexp.Regexp, b []byte) (string, error) {
	m := re.FindSubmatch(b)
	switch {
	case m == nil:
		return "", fmt.Errorf("no match for %s", re)
	case len(m) > 1:
		return strings.TrimSpace(string(m[1])), nil
	}
	return strings.TrimSpace(string(m[0])), nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// reason is an error's text, one line, printable, at most 200 bytes.
func reason(err error) string {
	return events.Truncate(events.Printable(firstLine(err.Error())), 200)
}
