package kmsg

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/validate"
)

// Sources of kernel messages.
const (
	SourceKmsg    = "kmsg"
	SourceJournal = "journal"
	SourceFile    = "file"
)

// Config configures the kmsg check (TOML section [kmsg], flags --kmsg.*).
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
	// File is the file read when Source is "file". While it is missing it
	// is looked for at every check, which fails once it has been missing
	// for missingFileGrace (a minute).
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

// RegisterFlags adds the check's flags under prefix ("kmsg."), each named
// after its TOML key (--kmsg.poll-interval), with c's values as defaults; the
// earlier spellings (--kmsg-poll-interval, ...) still work, deprecated.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.DurationVar(&c.PollInterval, prefix+"poll-interval", c.PollInterval, "how often to read new kernel log lines")
	fs.StringVar(&c.Source, prefix+"source", c.Source, "kernel log source: kmsg, journal or file")
	fs.StringVar(&c.KmsgPath, prefix+"device", c.KmsgPath, "kernel log device")
	fs.StringVar(&c.JournalctlPath, prefix+"journalctl", c.JournalctlPath, "journalctl binary")
	fs.StringVar(&c.File, prefix+"file", c.File, "kernel log file, when the source is file")
	fs.StringVar(&c.StateDir, prefix+"state-dir", c.StateDir, "directory keeping the read position across restarts")
	fs.IntVar(&c.MaxLinesPerCheck, prefix+"max-lines-per-check", c.MaxLinesPerCheck, "most lines read per check run")
	fs.DurationVar(&c.FloodWindow, prefix+"flood-window", c.FloodWindow, "flood-control window per error and device")
	fs.IntVar(&c.FloodBurst, prefix+"flood-burst", c.FloodBurst, "occurrences per window reported one by one")
	// The spellings before flags were named after their TOML keys.
	config.Alias(fs, "kmsg-poll-interval", prefix+"poll-interval")
	config.Alias(fs, "kmsg-source", prefix+"source")
	config.Alias(fs, "kmsg-device", prefix+"device")
	config.Alias(fs, "kmsg-journalctl", prefix+"journalctl")
	config.Alias(fs, "kmsg-file", prefix+"file")
	config.Alias(fs, "kmsg-state-dir", prefix+"state-dir")
	config.Alias(fs, "kmsg-max-lines", prefix+"max-lines-per-check")
	config.Alias(fs, "kmsg-flood-window", prefix+"flood-window")
	config.Alias(fs, "kmsg-flood-burst", prefix+"flood-burst")
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
		return fmt.Errorf("kmsg.max_lines_per_check: must not be negative, got %d", c.MaxLinesPerCheck)
	}
	if c.PollInterval < 0 {
		return fmt.Errorf("kmsg.poll_interval: must not be negative, got %s", c.PollInterval)
	}
	if c.FloodWindow < 0 {
		return fmt.Errorf("kmsg.flood_window: must not be negative, got %s", c.FloodWindow)
	}
	if c.FloodBurst < 0 {
		return fmt.Errorf("kmsg.flood_burst: must not be negative, got %d", c.FloodBurst)
	}
	return nil
}

// missingFileGrace is how long a file source's file may be missing (not
// created yet, a logrotate window, a mount still to come) before the check
// fails for it.
const missingFileGrace = time.Minute

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
	// missing is when a file source's file was first found missing (zero
	// while it is there): it is looked for again at every check.
	missing time.Time
	// bootID is this boot's; cleared is the boot whose start was last
	// reported healthy (afterReboot), rebooted whether that is still to do.
	bootID, cleared string
	rebooted        bool
	pos             sourceState // to save at Commit
	saved           sourceState // as the state file holds it
	// held, the flood summaries to save with pos (savedHeld as saved);
	// restored, those the process before saved, for the next Check.
	held, savedHeld [][]byte
	restored        []*datamodels.HealthEvent
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
		cfg.Parser.BootTime = BootTime(cfg.ProcStatPath)
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
		if errors.Is(err, fs.ErrNotExist) && c.cfg.Source == SourceFile {
			return nil, c.fileMissing(err)
		}
		if errors.Is(err, fs.ErrNotExist) {
			c.log.Info("kernel log source not present", "source", c.cfg.Source)
			c.absent = true
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		c.src, c.missing = src, time.Time{}
	}
	if c.src == nil {
		return nil, nil
	}
	lines := 0
	rerr := c.src.read(ctx, c.cfg.MaxLinesPerCheck, func(l Line) { lines++; c.parser.Process(l) })
	c.parser.Flush(false)
	held := c.parser.held(maxHeldBytes)
	evs := c.parser.Drain()
	if len(c.restored) > 0 {
		// What the process before had counted in flood windows still open.
		evs = append(c.restored, evs...)
		c.restored = nil
	}
	if c.rebooted {
		evs = c.afterReboot(evs, rerr == nil && lines < c.cfg.MaxLinesPerCheck)
	}
	c.occurrenceIDs(evs)
	c.pos = c.src.position()
	c.pos.BootID, c.pos.ClearedBoot = c.bootID, c.cleared
	c.held = c.saveHeld(held)
	return evs, rerr
}

// fileMissing is Check's answer while a file source's file is missing:
// it is looked for again at the next check (the file may be created yet —
// rsyslog, a logrotate window, a mount — and a host without /dev/kmsg is
// not what a configured file's absence means), nothing for
// missingFileGrace, then an error naming the file at every check until
// it appears, for the agent to report the check failing.
func (c *Check) fileMissing(err error) error {
	now := c.parser.cfg.Now()
	if c.missing.IsZero() {
		c.missing = now
		c.log.Info("kernel log file not present yet: looked for at every check", "file", c.cfg.File)
	}
	if gone := now.Sub(c.missing); gone >= missingFileGrace {
		return fmt.Errorf("kmsg.file %s missing for %s: no kernel-log lines read: %w", c.cfg.File, gone.Round(time.Second), err)
	}
	return nil
}

// saveHeld encodes the summaries of the occurrences that open flood
// windows hold, with their ids, to be saved with the read position: the
// position is past their lines, so a restart before the windows close
// would lose them; the next process reports these instead (the same ids if
// it restarts again before its first commit). Holding the position back
// instead would not do: a restart would read again lines after it that a
// closed window's summary already counted, counting them twice.
func (c *Check) saveHeld(held []*datamodels.HealthEvent) [][]byte {
	c.occurrenceIDs(held)
	out := make([][]byte, 0, len(held))
	for _, ev := range held {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(ev)
		if err != nil {
			c.log.Warn("kmsg flood summary not saved: a restart before its window closes loses it", "event", ev.GetMessage(), "err", err)
			continue
		}
		out = append(out, b)
	}
	return out
}

// occurrenceIDs gives each event that carries its line's time an id made
// of the boot the line was logged in and the event (events.OccurrenceID):
// the lines a restart reads again — the agent killed after it spooled
// their events but before Commit saved the position past them, or a
// position that could not be saved — make the same events, stored and
// counted once instead of again under new ids, also when the restart is
// in a later boot (a journal or file source resumes in the boot before).
// The boot is the line's own where the source records it (the journal's
// _BOOT_ID, metadata boot_id); /dev/kmsg holds only this boot's lines; a
// file does not say, and its lines need none: each carries its own time
// (or one of this boot's start, the same in no other boot). Without the
// line's time, or a /dev/kmsg line's boot id, the spool gives the event a
// new id.
func (c *Check) occurrenceIDs(evs []*datamodels.HealthEvent) {
	for _, ev := range evs {
		if ev.GetId() != "" || ev.GetGeneratedTimestamp() == nil {
			continue
		}
		boot := ev.GetMetadata()[MetaBootID]
		if boot == "" && c.cfg.Source == SourceKmsg {
			if boot = c.bootID; boot == "" {
				continue
			}
		}
		ev.Id = events.HashID("faultline-kmsg/v1", boot, events.OccurrenceID(ev))
	}
}

// Commit implements check.Committer: the read position is saved once the
// events of the lines read are spooled.
func (c *Check) Commit() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.src == nil {
		return nil
	}
	if c.pos == c.saved && slices.EqualFunc(c.held, c.savedHeld, bytes.Equal) {
		return nil // nothing read since: no write (and fsync) every poll
	}
	if err := saveState(c.statePath(), savedState{sourceState: c.pos, Held: c.held}); err != nil {
		return err
	}
	c.saved, c.savedHeld = c.pos, c.held
	return nil
}

// afterReboot reports, once after the node rebooted, one healthy event
// per check without entities — a reboot clears what the kernel reported
// in the boot before (the quarantine of an Xid a remediation rebooted the
// node for is lifted by nothing else) — generated at the boot's start.
// They go after the lines of the previous boot still unread (a journal or
// a file source resumes there) and before those of this boot, so a fault
// the new boot reports again stands; so they wait for a read that reached
// this boot's lines or the end. NVSentinel's syslog monitor does the same
// on a boot id change.
func (c *Check) afterReboot(evs []*datamodels.HealthEvent, drained bool) []*datamodels.HealthEvent {
	boot := c.cfg.Parser.BootTime
	before := 0
	for before < len(evs) && !boot.IsZero() && evs[before].GetGeneratedTimestamp() != nil && evs[before].GetGeneratedTimestamp().AsTime().Before(boot) {
		before++
	}
	if before == len(evs) && !drained {
		return evs
	}
	c.rebooted, c.cleared = false, c.bootID
	c.log.Info("node rebooted: reporting the kernel-log checks healthy", "boot", c.bootID)
	healthy := make([]*datamodels.HealthEvent, 0, len(evs)+len(rebootClears))
	healthy = append(healthy, evs[:before]...)
	for _, k := range rebootClears {
		ev := &datamodels.HealthEvent{Version: 1, Agent: Agent, ComponentClass: k.class, CheckName: k.check, IsHealthy: true,
			RecommendedAction: datamodels.RecommendedAction_NONE, Message: "No health failures: the node rebooted (boot " + c.bootID + ")"}
		if !boot.IsZero() {
			ev.GeneratedTimestamp = timestamppb.New(boot)
		}
		healthy = append(healthy, ev)
	}
	return append(healthy, evs[before:]...)
}

// rebootClears are the checks a reboot reports healthy.
var rebootClears = []struct{ check, class string }{
	{CheckXID, ClassGPU}, {CheckSXID, ClassNVSwitch}, {CheckFallenOff, ClassGPU}, {CheckNIC, ClassNIC},
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
	if c.cfg.Source == SourceFile {
		// Before the state is read: a missing file is looked for at
		// every check.
		if _, err := os.Stat(c.cfg.File); err != nil {
			return nil, err
		}
	}
	st := loadState(c.statePath(), c.log)
	c.saved, c.savedHeld = st.sourceState, st.Held
	c.restored = c.restoreHeld(st.Held)
	c.bootID = BootID(c.cfg.BootIDPath)
	c.cleared = st.ClearedBoot
	if c.cleared == "" {
		c.cleared = st.BootID // a state file from before ClearedBoot
	}
	c.rebooted = c.cleared != "" && c.bootID != "" && c.cleared != c.bootID
	if c.bootID == "" {
		c.cleared = "" // unknown boot: nothing to compare next time
	} else if !c.rebooted {
		c.cleared = c.bootID
	}
	switch c.cfg.Source {
	case SourceJournal:
		return newJournal(c.cfg.JournalctlPath, st.sourceState), nil
	case SourceFile:
		// Read from its start — no position saved for it, or the log no
		// longer the file it was saved in (rotated while the agent was
		// down, truncated and written again) — a kern.log spans several
		// boots. Like the journal's -b, only this boot's lines count: an
		// Xid of a boot before, of a node since repaired and rebooted, is
		// no current fault, and no reboot's healthy event would follow it.
		// Resumed at the saved position, the boot before's lines still
		// unread are read (afterReboot). A position saved in this boot
		// (the agent restarted, the log rotated meanwhile) leaves nothing
		// of a boot before unread: no filter, which would drop this boot's
		// first hours were the lines' zone read wrong.
		fromStart := func() { c.parser.skipBefore = c.cfg.Parser.BootTime }
		if st.File == c.cfg.File && st.BootID != "" && st.BootID == c.bootID {
			fromStart = nil
		}
		return newFile(c.cfg.File, st.sourceState, fromStart), nil
	default:
		return openKmsg(c.cfg.KmsgPath, c.bootID, st.sourceState)
	}
}

// restoreHeld decodes the flood summaries the process before saved (see
// saveHeld), made events the gateway takes as any the parser builds.
func (c *Check) restoreHeld(held [][]byte) []*datamodels.HealthEvent {
	var out []*datamodels.HealthEvent
	for _, b := range held {
		ev, err := events.Unmarshal(b)
		if err != nil {
			c.log.Warn("kmsg state: a saved flood summary not read", "path", c.statePath(), "err", err)
			continue
		}
		validate.Clean(ev, c.parser.cfg.Now())
		out = append(out, ev)
	}
	return out
}

// BootTime reads this boot's start, btime, from path (/proc/stat); zero
// when unavailable.
func BootTime(path string) time.Time {
	b, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "btime "); ok {
			if s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && s > 0 {
				return time.Unix(s, 0).UTC()
			}
		}
	}
	return time.Time{}
}

// BootID reads the boot's id from path (/proc/sys/kernel/random/boot_id);
// "" when unavailable.
func BootID(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}
