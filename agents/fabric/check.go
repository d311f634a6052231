package fabric

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/faultline/faultline/agents/kmsg"
	"github.com/faultline/faultline/agents/topology"
	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/internal/groupcmd"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// Runner runs a command and returns its standard output.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) ([]byte, error)
}

// ExecRunner runs commands with os/exec, each in a process group of its
// own (groupcmd).
type ExecRunner struct{}

// Run implements Runner. Past the deadline the command is killed with
// every child it started (a wrapper's nsenter or chroot'd nvidia-smi, left
// running before, one more each poll), and its output no longer waited
// for 2s after: a child holding the pipe kept the check, and its lock,
// until it ended.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return groupcmd.Command(ctx, 2*time.Second, name, args...).Output()
}

// runSMI runs nvidia-smi through r. A warning exit (topology.SMIWarningExit:
// 14, infoROM corrupted) comes after nvidia-smi printed its whole output,
// so with output it is no error; without, it stays one.
func runSMI(ctx context.Context, r Runner, name string, args ...string) ([]byte, error) {
	out, err := r.Run(ctx, name, args...)
	if topology.SMIWarning(err) && len(bytes.TrimSpace(out)) > 0 {
		return out, nil
	}
	return out, err
}

// Config configures the fabric check (TOML section [fabric], flags
// --fabric.*). Paths are the host's; in a container point them at the
// host's mounts.
type Config struct {
	// PollInterval is how often the check runs (default 30s).
	PollInterval time.Duration `toml:"poll_interval"`
	// Platform forces the platform: auto (default), a100, h100 or b200.
	Platform string `toml:"platform"`
	// NVSwitchGlob finds NVSwitch device files when the NVSwitch driver's
	// procfs (ProcRoot/driver/nvidia-nvswitch/devices) is absent (default
	// "/dev/nvidia-nvswitch[0-9]*").
	NVSwitchGlob string `toml:"nvswitch_glob"`
	// Service is the FM systemd unit (default "nvidia-fabricmanager").
	Service string `toml:"service"`
	// ConfigFile is FM's config (default
	// /usr/share/nvidia/nvswitch/fabricmanager.cfg).
	ConfigFile string `toml:"config_file"`
	// LogFile is FM's log (default /var/log/fabricmanager.log; the
	// config's LOG_FILE_NAME when it sets one and this is the default).
	LogFile string `toml:"log_file"`
	// NVLSMLogFile and NVLSMPIDFile are NVLSM's log and pid file (HGX B200;
	// defaults /var/log/nvlsm.log, /var/run/nvidia-fabricmanager/nvlsm.pid).
	NVLSMLogFile string `toml:"nvlsm_log_file"`
	NVLSMPIDFile string `toml:"nvlsm_pid_file"`
	// ProcRoot, SysRoot and ModprobeDir locate /proc, /sys and
	// /etc/modprobe.d (defaults those).
	ProcRoot    string `toml:"proc_root"`
	SysRoot     string `toml:"sys_root"`
	ModprobeDir string `toml:"modprobe_dir"`
	// MetadataPath is the topology collector's gpu_metadata.json, the
	// node's known GPUs (a GPU listed there that the driver does not see
	// failed to enumerate); "" off. The agent passes nic.metadata_path.
	MetadataPath string `toml:"metadata_path"`
	// Systemctl, Journalctl, NvidiaSMI, NVSwitchAudit and FMPM are the
	// binaries (defaults systemctl, journalctl, nvidia-smi, nvswitch-audit,
	// fmpm). A missing binary is a source not present, not an error.
	Systemctl     string `toml:"systemctl"`
	Journalctl    string `toml:"journalctl"`
	NvidiaSMI     string `toml:"nvidia_smi"`
	NVSwitchAudit string `toml:"nvswitch_audit"`
	FMPM          string `toml:"fmpm"`
	// InProgressTimeout is how long a GPU's fabric registration may stay
	// In Progress / Not Started after FM started (a GPU that registered
	// in this FM run and re-registers, after a reset: after it was first
	// seen so) before it is reported (default 5m).
	InProgressTimeout time.Duration `toml:"in_progress_timeout"`
	// BootGrace is how long after boot (/proc/stat btime) an FM unit
	// that systemd has not started yet this boot is not reported as
	// inactive (default 10m).
	BootGrace time.Duration `toml:"boot_grace"`
	// TopologyInterval is how often `nvidia-smi nvlink -R` (the NVSwitch
	// port map) and nvswitch-audit run (default 10m).
	TopologyInterval time.Duration `toml:"topology_interval"`
	// StateFile keeps the standing conditions, the boot, the logs' read
	// positions and the time the log was evaluated up to across restarts
	// of the agent (default
	// /var/lib/faultline-agent/fabric/state.json; "" none: a fault that
	// clears while the agent is down, or that a reboot remediates, is then
	// never reported healthy).
	StateFile string `toml:"state_file"`
	// TelemetryURL is dcgm-exporter's /metrics, read for NVSwitch
	// telemetry on HGX B200 (default "": off).
	TelemetryURL string `toml:"telemetry_url"`
	// Location is the host's time zone, the zone of the times FM's and
	// NVLSM's logs print without one and systemctl run on the host prints
	// (default time.Local; the agent passes its time_zone, the host's: in
	// its container time.Local is UTC).
	Location *time.Location `toml:"-"`
	// Runner runs the binaries (default ExecRunner).
	Runner Runner `toml:"-"`
	// Telemetry overrides the telemetry source (tests: a RecordedSource).
	Telemetry TelemetrySource `toml:"-"`
	// Now is the clock (default time.Now).
	Now func() time.Time `toml:"-"`
	// Logger defaults to slog.Default().
	Logger *slog.Logger `toml:"-"`
}

// DefaultConfig returns the defaults documented on the fields.
func DefaultConfig() Config {
	return Config{PollInterval: 30 * time.Second, Platform: "auto", NVSwitchGlob: "/dev/nvidia-nvswitch[0-9]*", Service: "nvidia-fabricmanager",
		ConfigFile: "/usr/share/nvidia/nvswitch/fabricmanager.cfg", LogFile: "/var/log/fabricmanager.log",
		NVLSMLogFile: "/var/log/nvlsm.log", NVLSMPIDFile: "/var/run/nvidia-fabricmanager/nvlsm.pid",
		ProcRoot: "/proc", SysRoot: "/sys", ModprobeDir: "/etc/modprobe.d",
		Systemctl: "systemctl", Journalctl: "journalctl", NvidiaSMI: "nvidia-smi", NVSwitchAudit: "nvswitch-audit", FMPM: "fmpm",
		InProgressTimeout: 5 * time.Minute, BootGrace: 10 * time.Minute, TopologyInterval: 10 * time.Minute, StateFile: "/var/lib/faultline-agent/fabric/state.json"}
}

// RegisterFlags adds the check's flags under prefix ("fabric."), each named
// after its TOML key (--fabric.poll-interval), with c's values as defaults; the
// earlier spellings (--fabric-poll-interval, ...) still work, deprecated.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.DurationVar(&c.PollInterval, prefix+"poll-interval", c.PollInterval, "how often the fabric check runs")
	fs.StringVar(&c.Platform, prefix+"platform", c.Platform, "auto, a100, h100 or b200")
	fs.StringVar(&c.NVSwitchGlob, prefix+"nvswitch-glob", c.NVSwitchGlob, "NVSwitch device files")
	fs.StringVar(&c.Service, prefix+"service", c.Service, "Fabric Manager systemd unit")
	fs.StringVar(&c.ConfigFile, prefix+"config-file", c.ConfigFile, "Fabric Manager config file")
	fs.StringVar(&c.LogFile, prefix+"log-file", c.LogFile, "Fabric Manager log file")
	fs.StringVar(&c.NVLSMLogFile, prefix+"nvlsm-log-file", c.NVLSMLogFile, "NVLSM log file, HGX B200")
	fs.StringVar(&c.NvidiaSMI, prefix+"nvidia-smi", c.NvidiaSMI, "nvidia-smi binary")
	fs.DurationVar(&c.InProgressTimeout, prefix+"in-progress-timeout", c.InProgressTimeout, "longest a GPU fabric registration may stay in progress after FM start-up")
	fs.DurationVar(&c.BootGrace, prefix+"boot-grace", c.BootGrace, "time after boot during which an FM unit not yet started is not reported")
	fs.StringVar(&c.TelemetryURL, prefix+"telemetry-url", c.TelemetryURL, "dcgm-exporter /metrics URL for NVSwitch telemetry, HGX B200")
	fs.StringVar(&c.StateFile, prefix+"state-file", c.StateFile, "file keeping the standing conditions across restarts; empty: none")
	// The spellings before flags were named after their TOML keys.
	config.Alias(fs, "fabric-poll-interval", prefix+"poll-interval")
	config.Alias(fs, "fabric-platform", prefix+"platform")
	config.Alias(fs, "fabric-nvswitch-glob", prefix+"nvswitch-glob")
	config.Alias(fs, "fabric-service", prefix+"service")
	config.Alias(fs, "fabric-config-file", prefix+"config-file")
	config.Alias(fs, "fabric-log-file", prefix+"log-file")
	config.Alias(fs, "fabric-nvlsm-log-file", prefix+"nvlsm-log-file")
	config.Alias(fs, "fabric-nvidia-smi", prefix+"nvidia-smi")
	config.Alias(fs, "fabric-in-progress-timeout", prefix+"in-progress-timeout")
	config.Alias(fs, "fabric-telemetry-url", prefix+"telemetry-url")
}

// Validate names the first bad setting.
func (c *Config) Validate() error {
	switch {
	case c.InProgressTimeout < 0:
		return errors.New("fabric.in_progress_timeout: must not be negative")
	case c.PollInterval < 0:
		return errors.New("fabric.poll_interval: must not be negative")
	case c.TopologyInterval < 0:
		return errors.New("fabric.topology_interval: must not be negative")
	case c.BootGrace < 0:
		return errors.New("fabric.boot_grace: must not be negative")
	}
	switch c.Platform {
	case "", "auto", PlatformA100, PlatformH100, PlatformB200:
	default:
		return fmt.Errorf("fabric.platform: %q is not auto, a100, h100 or b200", c.Platform)
	}
	if c.TelemetryURL != "" && !strings.HasPrefix(c.TelemetryURL, "http://") && !strings.HasPrefix(c.TelemetryURL, "https://") {
		return fmt.Errorf("fabric.telemetry_url: %q is not an http(s) URL", c.TelemetryURL)
	}
	return nil
}

func (c *Config) defaults() {
	d := DefaultConfig()
	set := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	set(&c.NVSwitchGlob, d.NVSwitchGlob)
	set(&c.Service, d.Service)
	set(&c.ConfigFile, d.ConfigFile)
	set(&c.LogFile, d.LogFile)
	set(&c.NVLSMLogFile, d.NVLSMLogFile)
	set(&c.NVLSMPIDFile, d.NVLSMPIDFile)
	set(&c.ProcRoot, d.ProcRoot)
	set(&c.SysRoot, d.SysRoot)
	set(&c.ModprobeDir, d.ModprobeDir)
	set(&c.Systemctl, d.Systemctl)
	set(&c.Journalctl, d.Journalctl)
	set(&c.NvidiaSMI, d.NvidiaSMI)
	set(&c.NVSwitchAudit, d.NVSwitchAudit)
	set(&c.FMPM, d.FMPM)
	if c.InProgressTimeout == 0 {
		c.InProgressTimeout = d.InProgressTimeout
	}
	if c.BootGrace == 0 {
		c.BootGrace = d.BootGrace
	}
	if c.TopologyInterval == 0 {
		c.TopologyInterval = d.TopologyInterval
	}
	if c.Location == nil {
		c.Location = time.Local
	}
	if c.Runner == nil {
		c.Runner = ExecRunner{}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Telemetry == nil && c.TelemetryURL != "" {
		c.Telemetry = ExporterSource{URL: c.TelemetryURL}
	}
}

// Check is the Fabric Manager check: each run collects a Snapshot of the
// node and hands it to the Evaluator.
type Check struct {
	cfg  Config
	log  *slog.Logger
	eval *Evaluator

	mu            sync.Mutex
	fmLog, lsmLog tailer
	// journalCursor is where the unit's journal was read up to (saved in
	// the state file); journalRead: this run read it once.
	journalCursor string
	journalRead   bool
	lastTopology  time.Time
	// fmpmWarned: when a missing fmpm was last logged.
	fmpmWarned time.Time
	bootID     string
	saved      []byte
}

// New returns the fabric check.
func New(cfg Config) (*Check, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	ev, err := NewEvaluator(EvalConfig{Platform: cfg.Platform, InProgressTimeout: cfg.InProgressTimeout, Service: cfg.Service, BootGrace: cfg.BootGrace})
	if err != nil {
		return nil, err
	}
	c := &Check{cfg: cfg, log: cfg.Logger, eval: ev}
	c.resume()
	return c, nil
}

// fmpmWarnEvery is how often a missing fmpm is logged.
const fmpmWarnEvery = time.Hour

// journalCopySlack is how much later than the FM log's newest line a
// journal copy of an FM line may be dated and still be taken for the
// log's: the log prints whole seconds, journald stamps the line when it
// receives it.
const journalCopySlack = 5 * time.Second

// fabricState is the state file.
type fabricState struct {
	BootID        string                     `json:"boot_id"`
	Reported      time.Time                  `json:"reported"`
	ReportedLines []string                   `json:"reported_lines,omitempty"`
	Conditions    map[string]json.RawMessage `json:"conditions"`
	// FMLog and NVLSMLog are where the logs were read up to.
	FMLog    *logPosition `json:"fm_log,omitempty"`
	NVLSMLog *logPosition `json:"nvlsm_log,omitempty"`
	// JournalCursor is where the unit's journal was read up to.
	JournalCursor string `json:"journal_cursor,omitempty"`
	// FMLogNewest is the time of the newest line the FM log has given:
	// the journal's copies of FM's occurrence lines up to it are the
	// log's.
	FMLogNewest time.Time `json:"fm_log_newest,omitzero"`
}

// maxStateBytes bounds the state file read at start: the standing
// conditions of a node (a few hundred at most — per GPU, NVLink, NVSwitch
// — of a few hundred bytes each) are well under 1 MiB; a larger file is
// not one the check wrote.
const maxStateBytes = 4 << 20

// resume gives the evaluator what the previous run of the agent left.
func (c *Check) resume() {
	c.bootID = kmsg.BootID(filepath.Join(c.cfg.ProcRoot, "sys/kernel/random/boot_id"))
	boot := kmsg.BootTime(filepath.Join(c.cfg.ProcRoot, "stat"))
	c.eval.SetBootStart(boot)
	if c.cfg.StateFile == "" {
		return
	}
	var st fabricState
	b, err := topology.ReadCapped(c.cfg.StateFile, maxStateBytes)
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			c.log.Warn("fabric state file not read: starting afresh", "path", c.cfg.StateFile, "err", err)
		}
		return
	}
	conds := map[string]*datamodels.HealthEvent{}
	for k, raw := range st.Conditions {
		ev := &datamodels.HealthEvent{}
		if protojson.Unmarshal(raw, ev) == nil {
			conds[k] = ev
		}
	}
	c.fmLog.saved, c.lsmLog.saved, c.journalCursor = st.FMLog, st.NVLSMLog, st.JournalCursor
	c.fmLog.newest = st.FMLogNewest
	newBoot := st.BootID != "" && c.bootID != "" && st.BootID != c.bootID
	c.eval.Resume(Standing{Conditions: conds, Reported: st.Reported, ReportedLines: st.ReportedLines}, boot, newBoot)
}

// Commit implements check.Committer: the state file is written (when it
// changed) once the last poll's events are spooled, with the logs' read
// positions past the lines of those events.
func (c *Check) Commit() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cfg.StateFile == "" {
		return nil
	}
	st := c.eval.Standing()
	fs := fabricState{BootID: c.bootID, Reported: st.Reported.UTC(), ReportedLines: st.ReportedLines, Conditions: map[string]json.RawMessage{},
		FMLog: c.fmLog.position(), NVLSMLog: c.lsmLog.position(), JournalCursor: c.journalCursor, FMLogNewest: c.fmLog.newest.UTC()}
	for k, ev := range st.Conditions {
		if raw, err := protojson.Marshal(ev); err == nil {
			fs.Conditions[k] = raw
		}
	}
	b, err := json.Marshal(fs)
	if err != nil || bytes.Equal(b, c.saved) {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(c.cfg.StateFile), 0o755); err != nil {
		return fmt.Errorf("fabric state: %w", err)
	}
	if err := topology.AtomicWrite(c.cfg.StateFile, b); err != nil {
		return fmt.Errorf("fabric state: %w", err)
	}
	c.saved = b
	return nil
}

// Name implements check.Check.
func (c *Check) Name() string { return "fabric" }

// Evaluator is the check's evaluator (its platform and topology).
func (c *Check) Evaluator() *Evaluator { return c.eval }

// Check implements check.Check: one poll. A source that fails is logged in
// the returned error; the others are still evaluated.
func (c *Check) Check(ctx context.Context) ([]*datamodels.HealthEvent, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, err := c.Collect(ctx)
	return c.eval.Evaluate(s), err
}

// Collect reads every source of the node into a snapshot.
func (c *Check) Collect(ctx context.Context) (*Snapshot, error) {
	now := c.cfg.Now()
	s := NewSnapshot(now)
	var errs []error
	s.NVSwitchPCIs, s.NVSwitchCount = c.nvswitches()
	s.NVLinkBridges = c.nvlinkBridges()
	s.PCIGPUs, s.PCISwitches = c.pciDevices()
	if cfgText, err := os.ReadFile(c.cfg.ConfigFile); err == nil {
		s.Config = ParseFMConfig(string(cfgText))
	}
	fabric := s.NVSwitchCount > 0 || len(s.PCISwitches) > 0 || s.NVLinkBridges > 0 || c.cfg.Platform == PlatformB200
	// The service: looked at on every host (a unit failing on a host
	// without NVSwitches is a misconfiguration).
	if out, err := c.run(ctx, c.cfg.Systemctl, "show", c.cfg.Service, "--property=Id,LoadState,ActiveState,SubState,Result,MainPID,ActiveEnterTimestamp,InactiveExitTimestamp"); err != nil {
		errs = append(errs, err)
	} else if out != nil {
		s.Service = ParseSystemctlShow(string(out), c.cfg.Location)
		// The journal: while the unit is not running, for its lifecycle
		// lines; every poll where it is FM's log (syslog or stderr).
		if s.Service.LoadState != "not-found" && (!s.Service.Running() || s.Config.LogsToJournal()) {
			lines, err := c.journal(ctx)
			errs = append(errs, err)
			s.Log = append(s.Log, lines...)
		}
	}
	if fabric {
		logFile := c.cfg.LogFile
		if s.Config != nil && s.Config.LogFile != "" && logFile == DefaultConfig().LogFile {
			logFile = s.Config.LogFile
		}
		lines, err := c.fmLog.read(logFile, &LogReader{Loc: c.cfg.Location, Now: c.cfg.Now})
		errs = append(errs, err)
		if newest, behind := c.fmLog.newest, c.fmLog.More(); behind || !newest.IsZero() {
			// FM logs its SXids and partition errors to syslog too: where
			// the log file has covered their time, it has them, and the
			// journal's copies (s.Log holds only the journal's lines
			// here) would report them again; its lifecycle lines are what
			// the journal is read for. While the file's read has more to
			// read (a poll reads at most chunkBytes), the journal's lines
			// are dated past what it has given yet, and it gives them a
			// later poll. Once it is read to its end, a line dated past
			// its newest (FM logging to syslog only, the file stale or
			// rotated away) is the only report of it. Both times are
			// instants (the file's read in its zone, the journal's its
			// own): journald stamps a line when it receives it, up to
			// journalCopySlack after FM's whole-second time.
			s.Log = slices.DeleteFunc(s.Log, func(ll LogLine) bool {
				return c.eval.logOccurrence(ll) && (behind || !ll.Time.After(newest.Add(journalCopySlack)))
			})
		}
		s.Log = append(s.Log, lines...)
	}
	if fabric && (c.cfg.Platform == PlatformB200 || s.NVLinkBridges > 0) {
		lines, err := c.lsmLog.read(c.cfg.NVLSMLogFile, &LogReader{Loc: c.cfg.Location, Now: c.cfg.Now, DefaultSource: SourceNVLSM})
		errs = append(errs, err)
		s.Log = append(s.Log, lines...)
		running := c.nvlsmRunning()
		s.NVLSMRunning = &running
	}
	if out, err := c.run(ctx, c.cfg.NvidiaSMI, "-q"); err != nil {
		errs = append(errs, err)
	} else if out != nil {
		s.SMI = ParseSMI(string(out))
	}
	if fabric && s.SMI != nil {
		topo := now.Sub(c.lastTopology) >= c.cfg.TopologyInterval
		args := []string{"nvlink", "-s"}
		if out, err := c.run(ctx, c.cfg.NvidiaSMI, args...); err != nil {
			errs = append(errs, err)
		} else if out != nil {
			s.NVLink = ParseNVLink(string(out), nil)
		}
		if topo {
			if out, err := c.run(ctx, c.cfg.NvidiaSMI, "nvlink", "-R"); err != nil {
				errs = append(errs, err)
			} else if out != nil {
				s.NVLink = ParseNVLink(string(out), s.NVLink)
				c.lastTopology = now
			}
			if c.eval.Platform().Name != PlatformB200 && c.cfg.Platform != PlatformB200 {
				// A failing audit (its exit, its deadline) fails the check
				// while FM runs (or its state is not known), as fmpm's
				// does; the runner logs it once per topology interval,
				// when the audit runs. Without a matrix the reachability
				// conditions found before stand: none lifted, none raised.
				out, err := c.run(ctx, c.cfg.NVSwitchAudit)
				switch {
				case err != nil:
					if s.Service == nil || s.Service.Running() {
						errs = append(errs, err)
					}
				case out != nil:
					if a, err := ParseAudit(string(out)); err == nil {
						s.Audit = a
					} else {
						errs = append(errs, err)
					}
				}
			}
		}
		if s.Config != nil && s.Config.FabricMode > 0 {
			// Shared NVSwitch / vGPU mode: without the partitions the
			// reachability matrix is not judged (auditConds), so a failing
			// fmpm fails the check and a missing one is warned of. fmpm
			// gets its list from FM: while FM is not running (the service
			// conditions report it) its failure is expected.
			out, err := c.run(ctx, c.cfg.FMPM, "-l")
			switch {
			case err != nil:
				if s.Service == nil || s.Service.Running() {
					errs = append(errs, err)
				}
			case out == nil:
				if c.fmpmWarned.IsZero() || now.Sub(c.fmpmWarned) >= fmpmWarnEvery {
					c.fmpmWarned = now
					c.log.Warn("fabric: fmpm not installed in Shared NVSwitch / vGPU mode: partitions unknown, nvswitch-audit reachability not checked",
						"fmpm", c.cfg.FMPM, "fabric_mode", s.Config.FabricMode)
				}
			default:
				if p, err := ParsePartitions(string(out)); err == nil {
					s.Partitions = p
				} else {
					errs = append(errs, err)
				}
			}
		}
	}
	c.exclusion(s)
	if c.cfg.MetadataPath != "" {
		if m, err := topology.Load(c.cfg.MetadataPath); err == nil {
			for _, g := range m.GPUs {
				s.ExpectedGPUs = append(s.ExpectedGPUs, ExpectedGPU{UUID: g.UUID, PCI: g.PCIAddress})
			}
		}
	}
	if c.cfg.Telemetry != nil {
		t, err := c.cfg.Telemetry.Read(ctx)
		errs = append(errs, err)
		s.Telemetry = t
	}
	return s, errors.Join(errs...)
}

// run runs a binary; a binary that is not installed returns nil, nil.
func (c *Check) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	var out []byte
	var err error
	if name == c.cfg.NvidiaSMI {
		out, err = runSMI(ctx, c.cfg.Runner, name, args...)
	} else {
		out, err = c.cfg.Runner.Run(ctx, name, args...)
	}
	if errors.Is(err, exec.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return out, nil
}

// journal reads the unit's journal lines since the last read, which a
// previous run of the agent may have saved (else the last 100, taken for
// a replayed tail); a saved cursor the journal no longer has (a volatile
// journal after a reboot, entries vacuumed) reads the last 100 instead.
func (c *Check) journal(ctx context.Context) ([]LogLine, error) {
	first, resumed := !c.journalRead, c.journalCursor != ""
	out, err := c.readJournal(ctx)
	if err != nil && first && resumed {
		c.log.Warn("fabric: the saved journal cursor was not found; reading the unit's last 100 entries", "err", err)
		c.journalCursor, resumed = "", false
		out, err = c.readJournal(ctx)
	}
	if err != nil || out == nil {
		return nil, err
	}
	c.journalRead = true
	r := &LogReader{Loc: c.cfg.Location, Now: c.cfg.Now}
	var lines []LogLine
	for _, l := range strings.Split(string(out), "\n") {
		var rec struct {
			Cursor string `json:"__CURSOR"`
		}
		if json.Unmarshal([]byte(l), &rec) == nil && rec.Cursor != "" {
			c.journalCursor = rec.Cursor
		}
		lines = append(lines, r.Feed(l)...)
	}
	lines = append(lines, r.Flush()...)
	for i := range lines {
		// the last 100 entries, of any boot, or those after the cursor
		// the previous run saved (none of them evaluated)
		lines[i].Replayed, lines[i].Resumed = first, first && resumed
	}
	return lines, nil
}

// readJournal runs journalctl for the entries after the cursor (the last
// 100 without one).
func (c *Check) readJournal(ctx context.Context) ([]byte, error) {
	args := []string{"-u", c.cfg.Service, "-o", "json", "--no-pager"}
	if c.journalCursor != "" {
		args = append(args, "--after-cursor="+c.journalCursor)
	} else {
		args = append(args, "-n", "100")
	}
	return c.run(ctx, c.cfg.Journalctl, args...)
}

// nvswitches lists the NVSwitches the NVSwitch driver bound
// (procfs devices directory, else the device files).
func (c *Check) nvswitches() ([]string, int) {
	if ents, err := os.ReadDir(filepath.Join(c.cfg.ProcRoot, "driver/nvidia-nvswitch/devices")); err == nil {
		var out []string
		for _, e := range ents {
			out = append(out, pci4(e.Name()))
		}
		sort.Strings(out)
		return out, len(out)
	}
	m, _ := filepath.Glob(c.cfg.NVSwitchGlob)
	var out []string
	for _, d := range m {
		out = append(out, filepath.Base(d))
	}
	return out, len(out)
}

// nvlinkBridges counts the CX7 functions whose VPD says SW_MNG (the HGX
// B200 NVLink management bridge, as nvidia-fabricmanager-start.sh finds it).
func (c *Check) nvlinkBridges() int {
	m, _ := filepath.Glob(filepath.Join(c.cfg.SysRoot, "class/infiniband/*/device/vpd"))
	n := 0
	for _, f := range m {
		b, err := os.ReadFile(f)
		if err == nil && strings.Contains(string(b), "SW_MNG") {
			n++
		}
	}
	return n
}

// pciDevices lists NVIDIA GPU (class 0x0302) and NVSwitch (class 0x0680)
// functions on the PCI bus that are bound to the nvidia or nvidia-nvswitch
// driver or to none (a function bound to vfio-pci belongs to a VM); nil,
// nil when sysfs is not readable.
func (c *Check) pciDevices() (gpus, switches []string) {
	dir := filepath.Join(c.cfg.SysRoot, "bus/pci/devices")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil
	}
	gpus, switches = []string{}, []string{}
	for _, e := range ents {
		v, _ := os.ReadFile(filepath.Join(dir, e.Name(), "vendor"))
		if strings.TrimSpace(string(v)) != "0x10de" {
			continue
		}
		if drv, err := os.Readlink(filepath.Join(dir, e.Name(), "driver")); err == nil {
			if d := filepath.Base(drv); d != "nvidia" && d != "nvidia-nvswitch" {
				continue // given to another driver on purpose (vfio-pci for a VM)
			}
		}
		cl, _ := os.ReadFile(filepath.Join(dir, e.Name(), "class"))
		switch cls := strings.TrimSpace(string(cl)); {
		case strings.HasPrefix(cls, "0x0302"):
			gpus = append(gpus, pci4(e.Name()))
		case strings.HasPrefix(cls, "0x0680"):
			switches = append(switches, pci4(e.Name()))
		}
	}
	return gpus, switches
}

// exclusion reads the driver's GPU information files and the exclude
// lists of the modprobe configuration and kernel command line.
func (c *Check) exclusion(s *Snapshot) {
	if m, err := filepath.Glob(filepath.Join(c.cfg.ProcRoot, "driver/nvidia/gpus/*/information")); err == nil && len(m) > 0 {
		s.GPUInfo = []GPUInformation{}
		for _, f := range m {
			if b, err := os.ReadFile(f); err == nil {
				g := ParseGPUInformation(string(b))
				if g.PCI == "" {
					g.PCI = pci4(filepath.Base(filepath.Dir(f)))
				}
				s.GPUInfo = append(s.GPUInfo, g)
			}
		}
	}
	x := &ExcludeList{}
	confs, _ := filepath.Glob(filepath.Join(c.cfg.ModprobeDir, "*.conf"))
	for _, f := range confs {
		if b, err := os.ReadFile(f); err == nil {
			x.Parse(f, string(b))
		}
	}
	if b, err := os.ReadFile(filepath.Join(c.cfg.ProcRoot, "cmdline")); err == nil {
		x.Parse("/proc/cmdline", string(b))
	}
	if len(x.Sources) > 0 || s.GPUInfo != nil {
		s.Excludes = x
	}
}

// nvlsmRunning reads NVLSM's pid file and checks the process.
func (c *Check) nvlsmRunning() bool {
	b, err := os.ReadFile(c.cfg.NVLSMPIDFile)
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return false
	}
	comm, err := os.ReadFile(filepath.Join(c.cfg.ProcRoot, strconv.Itoa(pid), "comm"))
	return err == nil && strings.Contains(string(comm), "nvlsm")
}

// parseMetadata reads the expected GPUs of a gpu_metadata.json.
func parseMetadata(text string) ([]ExpectedGPU, error) {
	var m topology.Metadata
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		return nil, fmt.Errorf("gpu_metadata.json: %w", err)
	}
	var out []ExpectedGPU
	for _, g := range m.GPUs {
		out = append(out, ExpectedGPU{UUID: g.UUID, PCI: g.PCIAddress})
	}
	return out, nil
}
