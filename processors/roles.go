// Package processors is the table of processor roles run by
// `faultline process --role=a,b` and by `faultline dev`. Every role has the
// same shape (pipeline.Runner: consume, handle, produce/act, commit); a role
// only supplies its topics and its Handler.
package processors

import (
	"context"
	"flag"
	"fmt"
	"io"
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
	"github.com/faultline/faultline/processors/correlate"
	"github.com/faultline/faultline/processors/drain"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/quarantine"
	"github.com/faultline/faultline/processors/remediate"
	"github.com/faultline/faultline/processors/store"
	"github.com/faultline/faultline/schemas/events"
)

// Config is the configuration of every role; each role reads its own part.
// Role packages add their config struct as a field here, with flag
// registration in RegisterFlags and a check in Validate.
type Config struct {
	// Roles to run: names from the roles table, or "all".
	Roles string `toml:"roles"`
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
}

// DefaultConfig returns the defaults of every role.
func DefaultConfig() Config {
	return Config{Roles: "all", ClickHouse: clickhouse.DefaultConfig(), Store: store.DefaultConfig(), Correlate: correlate.DefaultConfig(),
		Kube: clusters.DefaultConfig(), Quarantine: quarantine.DefaultConfig(),
		Drain: drain.DefaultConfig(), Remediate: remediate.DefaultConfig()}
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
	return nil
}

// Selected returns the roles named by Roles, in table order.
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
}

// Role is one entry of the roles table.
type Role struct {
	Name string
	// Topics the role consumes.
	Topics []string
	// New builds the role's handler; the closer (may be nil) is closed
	// after the runner stops.
	New func(ctx context.Context, cfg Config, deps Deps) (pipeline.Handler, io.Closer, error)
	// Pipeline, if set, returns the role's runner settings (batching and
	// the like); Role and Topics are filled in from the entry.
	Pipeline func(cfg Config) pipeline.Config
}

// roles is the fixed table of processor roles, in start order.
var roles = []Role{
	{
		Name:   "store",
		Topics: store.Topics,
		New: func(ctx context.Context, cfg Config, deps Deps) (pipeline.Handler, io.Closer, error) {
			return store.Open(ctx, cfg.ClickHouse, cfg.Store, deps.Log, deps.Registry)
		},
		Pipeline: func(cfg Config) pipeline.Config { return cfg.Store.Pipeline() },
	},
	{
		Name:   "correlate",
		Topics: correlate.Topics,
		New: func(ctx context.Context, cfg Config, deps Deps) (pipeline.Handler, io.Closer, error) {
			return correlate.Open(ctx, cfg.ClickHouse, deps.Kafka, cfg.Correlate, deps.Log, deps.Registry)
		},
		Pipeline: func(cfg Config) pipeline.Config { return cfg.Correlate.Pipeline() },
	},
	{
		Name:   "quarantine",
		Topics: []string{events.TopicEvents},
		New: func(ctx context.Context, cfg Config, deps Deps) (pipeline.Handler, io.Closer, error) {
			h, closer, err := quarantine.Start(ctx, cfg.Quarantine, cfg.Kube, quarantine.Deps{
				Log: deps.Log, Registry: deps.Registry, Kafka: deps.Kafka, Metrics: deps.Metrics})
			if err != nil {
				return nil, nil, err
			}
			return h, closer, nil
		},
		Pipeline: func(cfg Config) pipeline.Config { return cfg.Quarantine.Pipeline() },
	},
	{
		Name:   "drain",
		Topics: drain.Topics,
		New: func(ctx context.Context, cfg Config, deps Deps) (pipeline.Handler, io.Closer, error) {
			h, err := drain.Start(ctx, cfg.Drain, cfg.Kube, deps.Kafka, deps.Log, deps.Registry)
			return h, nil, err
		},
		// A batch may wait for a requeued drain's not-before (at most 20s)
		// and then evict a node's pods.
		Pipeline: func(Config) pipeline.Config { return pipeline.Config{BatchTimeout: 2 * time.Minute} },
	},
	{
		Name:   "remediate",
		Topics: remediate.Topics,
		New: func(ctx context.Context, cfg Config, deps Deps) (pipeline.Handler, io.Closer, error) {
			h, err := remediate.Start(ctx, cfg.Remediate, cfg.Kube, deps.Kafka, deps.Log, deps.Registry)
			return h, nil, err
		},
		Pipeline: func(Config) pipeline.Config { return pipeline.Config{BatchTimeout: 2 * time.Minute} },
	},
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

// Run builds and runs the selected roles until ctx ends or one fails.
func Run(ctx context.Context, cfg Config, deps Deps) error {
	sel, err := cfg.Selected()
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, r := range sel {
		h, closer, err := r.New(gctx, cfg, deps)
		if err != nil {
			return fmt.Errorf("role %s: %w", r.Name, err)
		}
		var pc pipeline.Config
		if r.Pipeline != nil {
			pc = r.Pipeline(cfg)
		}
		pc.Role, pc.Topics = r.Name, r.Topics
		runner := pipeline.NewRunner(pc, deps.Kafka, h, deps.Log, deps.Metrics)
		g.Go(func() error {
			if closer != nil {
				defer closer.Close()
			}
			if err := runner.Run(gctx); err != nil {
				return fmt.Errorf("role %s: %w", r.Name, err)
			}
			return nil
		})
	}
	return g.Wait()
}
