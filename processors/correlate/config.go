package correlate

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/schemas/events"
)

// Role is the role's name.
const Role = "correlate"

// Topics the correlate role consumes: events (raw and derived; derived
// ones never trigger) and actions (MultipleRemediations counts them).
var Topics = []string{events.TopicEvents, events.TopicActions}

// Config is the correlate role's configuration (flags "correlate.*").
type Config struct {
	// Rules is a rules file (TOML, see default_rules.toml); "" uses the
	// shipped DefaultRules.
	Rules string `toml:"rules"`
	// Shadow is a comma-separated list of rule names run in shadow mode
	// whatever the rules file says ("all" for every rule). Default "".
	Shadow string `toml:"shadow"`
	// SweepInterval is how often the time-driven part runs (verdicts that
	// start to hold with nothing arriving, e.g. NICPortDrop, and recovery
	// once a window no longer holds); 0 disables it, for rules none of
	// which has onset or recovery "sweep". Default 30s.
	SweepInterval time.Duration `toml:"sweep_interval"`
	// BatchRecords is the batch size the role gathers before it queries
	// (one query per rule per batch). Default 20000. BatchLinger ends a
	// batch first unless the role is behind: a larger batch then shares
	// each rule's window read among more events (§4 of
	// loadtest/RESULTS.md); a rule query over ClickHouse's memory limit
	// is split (Handler.runRule).
	BatchRecords int `toml:"batch_records"`
	// BatchLinger is how long the role waits to gather BatchRecords.
	// Default 200ms.
	BatchLinger time.Duration `toml:"batch_linger"`
	// CacheTTL is how long a replica remembers the verdicts it emitted,
	// covering the time until the store has written them. Default 2m.
	CacheTTL time.Duration `toml:"cache_ttl"`
	// StartWithin: a partition the group has no committed offset for
	// (first start, offsets expired after the broker's
	// offsets.retention.minutes, a renamed group) is read from this far
	// back (pipeline.Config.StartWithin), not from the topic's start — a
	// week of events replayed at 7,000 a second held every fresh verdict
	// back for a day, and a verdict on a trigger older than
	// quarantine.max_event_age (6h) is not acted on anyway. The verdicts
	// of older triggers are then never derived (their events are stored
	// all the same). 0: from the topic's start. Default 6h.
	StartWithin time.Duration `toml:"start_within"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{SweepInterval: 30 * time.Second, BatchRecords: 20000, BatchLinger: 200 * time.Millisecond, CacheTTL: 2 * time.Minute,
		StartWithin: 6 * time.Hour}
}

// RegisterFlags adds the config's flags with the given prefix ("correlate.").
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.Rules, prefix+"rules", c.Rules, "correlate: rules file (TOML); empty uses the shipped rules")
	fs.StringVar(&c.Shadow, prefix+"shadow", c.Shadow, "correlate: comma-separated rules to run in shadow mode (record verdicts, act on none), or all")
	fs.DurationVar(&c.SweepInterval, prefix+"sweep-interval", c.SweepInterval, "correlate: how often time-driven verdicts and recoveries are evaluated (0: never)")
	fs.IntVar(&c.BatchRecords, prefix+"batch-records", c.BatchRecords, "correlate: records gathered per batch (one query per rule per batch)")
	fs.DurationVar(&c.BatchLinger, prefix+"batch-linger", c.BatchLinger, "correlate: how long to wait to gather a batch")
	fs.DurationVar(&c.CacheTTL, prefix+"cache-ttl", c.CacheTTL, "correlate: how long emitted verdicts are remembered while the store catches up")
	fs.DurationVar(&c.StartWithin, prefix+"start-within", c.StartWithin, "correlate: a partition the group has no committed offset for is read from this far back (0: from the topic's start)")
}

// Validate names the first bad key; it also compiles the rules.
func (c Config) Validate(prefix string) error {
	switch {
	case c.SweepInterval < 0:
		return fmt.Errorf("%ssweep_interval: must not be negative, got %s", prefix, c.SweepInterval)
	case c.BatchRecords < 1:
		return fmt.Errorf("%sbatch_records: must be at least 1, got %d", prefix, c.BatchRecords)
	case c.BatchLinger < 0:
		return fmt.Errorf("%sbatch_linger: must not be negative, got %s", prefix, c.BatchLinger)
	case c.CacheTTL <= 0:
		// 0 forgot every batch's records at once: the events the store had
		// not written yet were in no window (a repeat missed), and each
		// verdict was emitted again by every batch until stored.
		return fmt.Errorf("%scache_ttl: must be positive (it covers the store's lag), got %s", prefix, c.CacheTTL)
	case c.StartWithin < 0:
		return fmt.Errorf("%sstart_within: must not be negative (0: from the topic's start), got %s", prefix, c.StartWithin)
	}
	rules, err := LoadRules(c.Rules)
	if err != nil {
		return fmt.Errorf("%srules: %w", prefix, err)
	}
	if _, err := c.applyShadow(rules); err != nil {
		return fmt.Errorf("%sshadow: %w", prefix, err)
	}
	if c.SweepInterval == 0 {
		// Without the sweep such a rule's verdicts never start (onset) or
		// never recover, and every later trigger of a standing one is
		// skipped: its group frozen for good.
		// A recovering rule with a stabilization is one too, whatever its
		// recovery: a verdict recovers only once the stabilization has
		// passed since the last counted event, and a trigger that counts in
		// its own window (a link-down, an applied remediation, an Xid) is
		// that last event itself, so no trigger meets it: only the sweep,
		// with time passing, does. With stabilization 0 the next trigger
		// that finds the window below the threshold recovers the verdict.
		for _, r := range rules {
			if r.SweepOnset || r.SweepRecovery {
				return fmt.Errorf("%ssweep_interval: 0 (no sweep), but rule %s starts or recovers only in the sweep (onset or recovery = \"sweep\")", prefix, r.Name)
			}
			if r.Recover && r.Stabilization > 0 {
				return fmt.Errorf("%ssweep_interval: 0 (no sweep), but rule %s recovers only once its stabilization (%s) has passed since its last counted event, which only the sweep can see", prefix, r.Name, r.Stabilization)
			}
		}
	}
	return nil
}

// applyShadow sets Shadow on the rules named by c.Shadow.
func (c Config) applyShadow(rules []*Rule) ([]*Rule, error) {
	for _, name := range strings.Split(c.Shadow, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		found := false
		for _, r := range rules {
			if name == "all" || r.Name == name {
				r.Shadow, found = true, true
			}
		}
		if !found {
			return nil, fmt.Errorf("no rule %q (rules: %s)", name, strings.Join(Names(rules), ", "))
		}
	}
	return rules, nil
}

// Pipeline returns the runner settings: gather a batch across partitions
// so each rule runs one query per batch; a partition without a committed
// offset starts StartWithin back.
func (c Config) Pipeline() pipeline.Config {
	return pipeline.Config{
		Role:            Role,
		Topics:          Topics,
		MaxPollRecords:  c.BatchRecords,
		MinBatch:        c.BatchRecords,
		Linger:          c.BatchLinger,
		MergePartitions: true,
		StartWithin:     c.StartWithin,
	}
}
