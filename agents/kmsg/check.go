package kmsg

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// Sources of kernel messages.
const (
	SourceKmsg    = "kmsg"
	SourceJournal = "journal"
	SourceFile    = "file"
)

// Config configures the kmsg check (TOML section [kmsg], flags --kmsg-*).
type Config struct {
	// PollInterval is how often the check reads new lines (default 5s).
	PollInterval time.Duration `toml:"poll_interval"`
	// Source is where kernel messages come from: "kmsg" (default),
	// "journal" or "file".
	Source string `toml:"source"`
	// KmsgPath is the kernel log device (default /dev/kmsg).
	KmsgPath string `toml:"device"`
	// JournalctlPath is the journalctl binary (default "journalctl").
	JournalctlPath string `toml:"journalctl"`
	// File is the file read when Source is "file".
	File string `toml:"file"`
	// StateDir keeps the read position across restarts (default
	// /var/lib/faultline-agent/kmsg); empty keeps none, so a restart re-reads
	// the kernel ring buffer or the whole current boot.
	StateDir string `toml:"state_dir"`
	// BootIDPath identifies the boot (default /proc/sys/kernel/random/boot_id).
	BootIDPath string `toml:"boot_id_path"`
	// ProcStatPath gives the boot time, btime (default /proc/stat).
	ProcStatPath string `toml:"proc_stat_path"`
	// MaxLinesPerCheck bounds the lines one Check call reads, so that a
	// flood costs bounded CPU per call; the rest is read by the next call
	// (default 200000).
	MaxLinesPerCheck int `toml:"max_lines_per_check"`
	// FloodWindow and FloodBurst tune flood control (defaults 10s and 1; see
	// ParserConfig).
	FloodWindow time.Duration `toml:"flood_window"`
	FloodBurst  int           `toml:"flood_burst"`
	// Parser tunes parsing beyond the above (topology, clock); not in TOML.
	Parser ParserConfig `toml:"-"`
	// Logger defaults to slog.Default().
	Logger *slog.Logger `toml:"-"`
}

// DefaultConfig returns the defaults documented on the fields.
func DefaultConfig() Config {
	return Config{PollInterval: 5 * time.Second, Source: SourceKmsg, KmsgPath: "/dev/kmsg", JournalctlPath: "journalctl",
		StateDir: "/var/lib/faultline-agent/kmsg", BootIDPath: "/proc/sys/kernel/random/boot_id", ProcStatPath: "/proc/stat",
		MaxLinesPerCheck: 200000, FloodWindow: 10 * time.Second, FloodBurst: 1}
}

// RegisterFlags binds the --kmsg-* flags to c, with c's values as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.PollInterval, "kmsg-poll-interval", c.PollInterval, "how often to read new kernel log lines (kmsg.poll_interval)")
	fs.StringVar(&c.Source, "kmsg-source", c.Source, "kernel log source: kmsg, journal or file (kmsg.source)")
	fs.StringVar(&c.KmsgPath, "kmsg-device", c.KmsgPath, "kernel log device (kmsg.device)")
	fs.StringVar(&c.JournalctlPath, "kmsg-journalctl", c.JournalctlPath, "journalctl binary (kmsg.journalctl)")
	fs.StringVar(&c.File, "kmsg-file", c.File, "kernel log file, when the source is file (kmsg.file)")
	fs.StringVar(&c.StateDir, "kmsg-state-dir", c.StateDir, "directory keeping the read position across restarts (kmsg.state_dir)")
	fs.IntVar(&c.MaxLinesPerCheck, "kmsg-max-lines", c.MaxLinesPerCheck, "most lines read per check run (kmsg.max_lines_per_check)")
	fs.DurationVar(&c.FloodWindow, "kmsg-flood-window", c.FloodWindow, "flood-control window per error and device (kmsg.flood_window)")
	fs.IntVar(&c.FloodBurst, "kmsg-flood-burst", c.FloodBurst, "occurrences per window reported one by one (kmsg.flood_burst)")
}

// Validate names the first bad setting.
func (c *Config) Validate() error {
	switch c.Source {
	case "", SourceKmsg, SourceJournal:
	case SourceFile:
		if c.File == "" {
			return errors.New("kmsg.file: required when kmsg.source is file")
		}
	default:
		return fmt.Errorf("kmsg.source: %q is not kmsg, journal or file", c.Source)
	}
	if c.MaxLinesPerCheck < 0 {
		return errors.New("kmsg.max_lines_per_check: must not be negative")
	}
	if c.PollInterval < 0 || c.FloodWindow < 0 || c.FloodBurst < 0 {
		return errors.New("kmsg.poll_interval, flood_window, flood_burst: must not be negative")
	}
	return nil
}

// Check is the kernel-log check: GPU Xid, NVSwitch SXid, GPU fallen off the
// bus, mlx5 driver errors. Each Check call returns the events of the lines
// read since the previous call.
type Check struct {
	cfg    Config
	log    *slog.Logger
	mu     sync.Mutex
	parser *Parser
	src    source
	absent bool
}

// New returns the kmsg check.
func New(cfg Config) (*Check, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Source == "" {
		cfg.Source = SourceKmsg
	}
	if cfg.KmsgPath == "" {
		cfg.KmsgPath = "/dev/kmsg"
	}
	if cfg.JournalctlPath == "" {
		cfg.JournalctlPath = "journalctl"
	}
	if cfg.BootIDPath == "" {
		cfg.BootIDPath = "/proc/sys/kernel/random/boot_id"
	}
	if cfg.ProcStatPath == "" {
		cfg.ProcStatPath = "/proc/stat"
	}
	if cfg.MaxLinesPerCheck == 0 {
		cfg.MaxLinesPerCheck = 200000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Parser.FloodWindow == 0 {
		cfg.Parser.FloodWindow = cfg.FloodWindow
	}
	if cfg.Parser.FloodBurst == 0 {
		cfg.Parser.FloodBurst = cfg.FloodBurst
	}
	if cfg.Parser.BootTime.IsZero() {
		cfg.Parser.BootTime = bootTime(cfg.ProcStatPath)
	}
	p, err := NewParser(cfg.Parser)
	if err != nil {
		return nil, err
	}
	return &Check{cfg: cfg, log: cfg.Logger, parser: p}, nil
}

// Name implements check.Check.
func (c *Check) Name() string { return "kmsg" }

// Check implements check.Check.
func (c *Check) Check(ctx context.Context) ([]*datamodels.HealthEvent, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.src == nil && !c.absent {
		src, err := c.open()
		if errors.Is(err, fs.ErrNotExist) {
			c.log.Info("kernel log source not present", "source", c.cfg.Source)
			c.absent = true
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		c.src = src
	}
	if c.src == nil {
		return nil, nil
	}
	rerr := c.src.read(ctx, c.cfg.MaxLinesPerCheck, c.parser.Process)
	c.parser.Flush(false)
	evs := c.parser.Drain()
	if err := saveState(c.statePath(), c.src.position()); err != nil {
		c.log.Warn("kmsg state not saved", "err", err)
	}
	return evs, rerr
}

// Close releases the source.
func (c *Check) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.src == nil {
		return nil
	}
	err := c.src.close()
	c.src = nil
	return err
}

func (c *Check) statePath() string {
	if c.cfg.StateDir == "" {
		return ""
	}
	return filepath.Join(c.cfg.StateDir, "kmsg-"+c.cfg.Source+".json")
}

func (c *Check) open() (source, error) {
	st := loadState(c.statePath())
	switch c.cfg.Source {
	case SourceJournal:
		return newJournal(c.cfg.JournalctlPath, st), nil
	case SourceFile:
		if _, err := os.Stat(c.cfg.File); err != nil {
			return nil, err
		}
		return newFile(c.cfg.File, st), nil
	default:
		bid, _ := os.ReadFile(c.cfg.BootIDPath)
		return openKmsg(c.cfg.KmsgPath, strings.TrimSpace(string(bid)), st)
	}
}

// bootTime reads btime from /proc/stat; zero when unavailable.
func bootTime(path string) time.Time {
	b, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "btime "); ok {
			if s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return time.Unix(s, 0).UTC()
			}
		}
	}
	return time.Time{}
}
