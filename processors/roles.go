// Package processors is the table of processor roles run by
// `faultline process --role=a,b` and by `faultline dev`. Every role is
// built to one contract (processors/role): its package exports Topics, a
// Config with Pipeline(), and Open, which returns the role's consumers
// (each a pipeline.Runner: consume, handle, produce/act, commit) and side
// loops; Run runs them all in one errgroup.
package processors

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/conformance"
	"github.com/faultline/faultline/processors/correlate"
	"github.com/faultline/faultline/processors/drain"
	"github.com/faultline/faultline/processors/janitor"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/quarantine"
	"github.com/faultline/faultline/processors/remediate"
	"github.com/faultline/faultline/processors/role"
	"github.com/faultline/faultline/processors/store"
)

// Config is the configuration of every role; each role reads its own part.
// Role packages add their config struct as a field here, with flag
// registration in RegisterFlags and a check in Validate. Its fields are
// top-level TOML sections of the binary that embeds it (Processors):
// [store], [clickhouse], [kube], …, with flags --store.*, --clickhouse.*, ….
type Config struct {
	// Roles to run: names from the roles table, or "all" (flag --role).
	Roles string `toml:"role"`
	// ClickHouse is the history database, shared by the roles that use it.
	ClickHouse clickhouse.Config `toml:"clickhouse"`
	// Store configures the store role.
	Store store.Config `toml:"store"`
	// Correlate configures the correlate role.
	Correlate correlate.Config `toml:"correlate"`
	// Kube maps cluster names to their API servers, shared by the roles
	// that act on Kubernetes.
	Kube clusters.Config `toml:"kube"`
	// Quarantine configures the quarantine role.
	Quarantine quarantine.Config `toml:"quarantine"`
	// Drain configures the drain role.
	Drain drain.Config `toml:"drain"`
	// Remediate configures the remediate role.
	Remediate remediate.Config `toml:"remediate"`
	// Janitor configures the janitor role.
	Janitor janitor.Config `toml:"janitor"`
	// Conformance configures the conformance role.
	Conformance conformance.Config `toml:"conformance"`
}

// Processors is Config under the name a binary's config embeds it by
// (an embedded struct's fields are its parent's TOML keys).
type Processors = Config

// DefaultConfig returns the defaults of every role.
func DefaultConfig() Config {
	return Config{Roles: "all", ClickHouse: clickhouse.DefaultConfig(), Store: store.DefaultConfig(), Correlate: correlate.DefaultConfig(),
		Kube: clusters.DefaultConfig(), Quarantine: quarantine.DefaultConfig(),
		Drain: drain.DefaultConfig(), Remediate: remediate.DefaultConfig(), Janitor: janitor.DefaultConfig(), Conformance: conformance.DefaultConfig()}
}

// RegisterFlags adds every role's flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Roles, "role", c.Roles, "comma-separated processor roles to run ("+strings.Join(Names(), ", ")+") or all")
	c.ClickHouse.RegisterFlags(fs, "clickhouse.")
	c.Store.RegisterFlags(fs, "store.")
	c.Correlate.RegisterFlags(fs, "correlate.")
	c.Kube.RegisterFlags(fs, "kube.")
	c.Quarantine.RegisterFlags(fs, "quarantine.")
	c.Drain.RegisterFlags(fs, "drain.")
	c.Remediate.RegisterFlags(fs, "remediate.")
	c.Janitor.RegisterFlags(fs, "janitor.")
	c.Conformance.RegisterFlags(fs, "conformance.")
}

// Validate names the first bad key.
func (c Config) Validate() error {
	if _, err := c.Selected(); err != nil {
		return err
	}
	if err := c.ClickHouse.Validate("clickhouse."); err != nil {
		return err
	}
	if err := c.Store.Validate("store."); err != nil {
		return err
	}
	if err := c.Correlate.Validate("correlate."); err != nil {
		return err
	}
	if err := c.Kube.Validate("kube."); err != nil {
		return err
	}
	if err := c.Quarantine.Validate("quarantine."); err != nil {
		return err
	}
	if err := c.Drain.Validate("drain."); err != nil {
		return err
	}
	if err := c.Remediate.Validate("remediate."); err != nil {
		return err
	}
	if err := c.Janitor.Validate("janitor."); err != nil {
		return err
	}
	if err := c.Conformance.Validate("conformance."); err != nil {
		return err
	}
	return c.validateAcross()
}

// validateAcross checks what one role's keys promise another's. Every
// role's process reads the same file (the chart renders one config.toml
// for all of them), so each refuses it alike.
func (c Config) validateAcross() error {
	j, r := c.Janitor, c.Remediate
	switch {
	case j.MaxQueueAge > 0 && j.MaxQueueAge < j.Cooldown:
		// A resource waiting for its node's cooldown would end
		// QueueTimeout, never started.
		return fmt.Errorf("janitor.max_queue_age: must be 0 (no bound) or at least janitor.cooldown (%v): a resource waiting for its node's cooldown would never start; got %v",
			j.Cooldown, j.MaxQueueAge)
	case j.MaxQueueAge >= r.QueueTimeout:
		// The remediate role would fail and escalate a queued resource
		// the janitor may still start.
		return fmt.Errorf("janitor.max_queue_age: must be below remediate.queue_timeout (%v): the remediate role fails a resource not started by then, and the janitor would start it after; got %v",
			r.QueueTimeout, j.MaxQueueAge)
	}
	// Both count from the resource's start (status.startTime): the
	// remediate role would fail and escalate (CONTACT_SUPPORT) a
	// remediation the janitor is still carrying out. Checked where the
	// janitor runs (it reads the same file): a site using NVSentinel's
	// janitor keeps these keys' defaults, which bound nothing there.
	if sel, err := c.Selected(); err != nil || !slices.ContainsFunc(sel, func(r Role) bool { return r.Name == "janitor" }) {
		return nil
	}
	for _, jt := range []struct {
		key string
		d   time.Duration
	}{{"reboot_timeout", j.RebootTimeout}, {"terminate_timeout", j.TerminateTimeout}, {"gpu_reset_timeout", j.GPUResetTimeout}} {
		if jt.d >= r.CompletionTimeout {
			return fmt.Errorf("janitor.%s: must be below remediate.completion_timeout (%v): both count from the resource's start, and the remediate role fails and escalates one not finished by then while the janitor goes on; got %v",
				jt.key, r.CompletionTimeout, jt.d)
		}
	}
	return nil
}

// Selected returns the roles named by Roles, in the order named; a role
// named twice is an error (it would be opened twice, its metrics
// registered twice).
func (c Config) Selected() ([]Role, error) {
	if strings.TrimSpace(c.Roles) == "all" {
		return roles, nil
	}
	var out []Role
	for _, name := range strings.Split(c.Roles, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(roles, func(r Role) bool { return r.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("role: unknown role %q (known: %s, all)", name, strings.Join(Names(), ", "))
		}
		if slices.ContainsFunc(out, func(r Role) bool { return r.Name == name }) {
			return nil, fmt.Errorf("role: %q is named twice", name)
		}
		out = append(out, roles[i])
	}
	return out, nil
}

// Deps are the shared things roles are built from.
type Deps struct {
	Log      *slog.Logger
	Registry prometheus.Registerer
	Kafka    kafka.Config
	Metrics  *pipeline.Metrics
	// Opened, when set, is called once every selected role is open (its
	// dependencies reached, ClickHouse migrated) and about to run: the
	// process is ready.
	Opened func()
}

// Role is one entry of the roles table.
type Role struct {
	// Name is the role's name (--role) and its consumer group's suffix.
	Name string
	// Open builds the role from its part of the config (role.Role has
	// the contract every role package follows).
	Open func(ctx context.Context, cfg Config, deps role.Deps) (*role.Role, error)
	// NoGroup: the role consumes no topic, so it has no consumer group
	// "faultline-<Name>" (the janitor watches its clusters instead).
	NoGroup bool
}

// roles is the fixed table of processor roles, in start order.
var roles = []Role{
	{Name: store.Role, Open: func(ctx context.Context, cfg Config, deps role.Deps) (*role.Role, error) {
		return store.Open(ctx, cfg.Store, deps)
	}},
	{Name: correlate.Role, Open: func(ctx context.Context, cfg Config, deps role.Deps) (*role.Role, error) {
		return correlate.Open(ctx, cfg.Correlate, deps)
	}},
	{Name: quarantine.Role, Open: func(ctx context.Context, cfg Config, deps role.Deps) (*role.Role, error) {
		return quarantine.Open(ctx, cfg.Quarantine, deps)
	}},
	{Name: drain.Role, Open: func(ctx context.Context, cfg Config, deps role.Deps) (*role.Role, error) {
		return drain.Open(ctx, cfg.Drain, deps)
	}},
	{Name: remediate.Role, Open: func(ctx context.Context, cfg Config, deps role.Deps) (*role.Role, error) {
		return remediate.Open(ctx, cfg.Remediate, deps)
	}},
	{Name: janitor.Role, NoGroup: true, Open: func(ctx context.Context, cfg Config, deps role.Deps) (*role.Role, error) {
		return janitor.Open(ctx, cfg.Janitor, deps)
	}},
	{Name: conformance.Role, Open: func(ctx context.Context, cfg Config, deps role.Deps) (*role.Role, error) {
		return conformance.Open(ctx, cfg.Conformance, deps)
	}},
}

// Names lists the role names.
func Names() []string {
	out := make([]string, 0, len(roles))
	for _, r := range roles {
		out = append(out, r.Name)
	}
	sort.Strings(out)
	return out
}

// Run opens the selected roles, then runs them all (each its consumers and
// side loops, role.Role.Run) in one errgroup until ctx ends or one fails:
// the first failure stops every role and is returned, naming the role and
// what failed.
func Run(ctx context.Context, cfg Config, deps Deps) error {
	sel, err := cfg.Selected()
	if err != nil {
		return err
	}
	rd := role.Deps{Log: deps.Log, Registry: deps.Registry, Kafka: deps.Kafka, Metrics: deps.Metrics,
		ClickHouse: cfg.ClickHouse, Kube: cfg.Kube}.WithDefaults()
	built := make([]*role.Role, 0, len(sel))
	for _, r := range sel {
		b, err := r.Open(ctx, cfg, rd)
		if err != nil {
			for _, b := range built {
				if b.Close != nil {
					_ = b.Close()
				}
			}
			return fmt.Errorf("role %s: %w", r.Name, err)
		}
		built = append(built, b)
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, b := range built {
		g.Go(func() error { return b.Run(gctx, rd) })
	}
	if deps.Opened != nil {
		deps.Opened()
	}
	return g.Wait()
}
