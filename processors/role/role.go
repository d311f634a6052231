// Package role is the contract every processor role is built to, so that a
// new role is made by copying an existing one.
//
// A role package (processors/store, correlate, quarantine, drain,
// remediate) exports:
//
//   - Topics, the topics its main consumer reads;
//   - Config, with DefaultConfig(), RegisterFlags(fs, prefix),
//     Validate(prefix) naming the bad key, and Pipeline() returning its
//     runner settings (Topics included);
//   - Open(ctx, cfg Config, deps role.Deps) (*role.Role, error), its one
//     constructor: it connects what the role needs (ClickHouse, topics it
//     creates, cluster clients) and returns the Role, starting nothing.
//
// A Role is its consumers (a handler over topics, each run by a
// pipeline.Runner: consume, handle, produce, commit) plus its side loops
// (work outside Handle: the correlate sweep, quarantine's uncordon watch,
// the store's retention). Run runs all of them in one errgroup: the first
// that fails stops the others and fails the role, and through
// processors.Run the process, so nothing fails unseen.
package role

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
)

// Deps are what every role is built from: the process's logger, metrics
// and Kafka settings, and the config sections the roles share.
type Deps struct {
	// Log is the process logger; a role adds its "role" attribute.
	// Default slog.Default().
	Log *slog.Logger
	// Registry gets the role's metrics. Default: a registry of its own
	// (metrics not exported).
	Registry prometheus.Registerer
	// Kafka is how every client of the role reaches Kafka.
	Kafka kafka.Config
	// Metrics are the pipeline's metrics, shared by every consumer.
	// Default: registered on Registry.
	Metrics *pipeline.Metrics
	// ClickHouse is the shared [clickhouse] section (store, correlate).
	ClickHouse clickhouse.Config
	// Kube is the shared [kube] section: the clusters the Kubernetes-facing
	// roles act on (quarantine, drain, remediate).
	Kube clusters.Config
}

// WithDefaults fills the unset fields of d.
func (d Deps) WithDefaults() Deps {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	if d.Registry == nil {
		d.Registry = prometheus.NewRegistry()
	}
	if d.Metrics == nil {
		d.Metrics = pipeline.NewMetrics(d.Registry)
	}
	return d
}

// Role is a built processor role: what Run runs.
type Role struct {
	// Name is the role's name (the roles table's).
	Name string
	// Consumers are the role's Kafka consumers, each a handler run by a
	// pipeline.Runner with its settings (Role names the consumer group
	// "faultline-<Role>" and the metrics label; Topics are consumed). The
	// first is the role's own consumer; quarantine adds its retry
	// consumer.
	Consumers []Consumer
	// Loops run beside the consumers until ctx ends.
	Loops []Loop
	// Close releases what the role holds (connections, watches) once its
	// consumers and loops have stopped; may be nil.
	Close func() error
}

// Consumer is one handler over topics.
type Consumer struct {
	// Pipeline are the runner settings, Role and Topics included.
	Pipeline pipeline.Config
	// Handler handles the consumed batches.
	Handler pipeline.Handler
}

// Loop is work a role does outside Handle, on its own schedule.
type Loop struct {
	// Name says what the loop is in errors and logs ("sweep").
	Name string
	// Run works until ctx ends and then returns nil. Returning before
	// ctx ends — an error, or nil — fails the role: a loop does not stop
	// by itself. A transient failure (one sweep's query) is the loop's to
	// log and retry; an error returned is one it cannot get past.
	Run func(ctx context.Context) error
}

// ErrLoopStopped is returned by Run for a loop that returned nil before its
// context ended.
var ErrLoopStopped = errors.New("stopped before the role did")

// Run runs the role's consumers and loops until ctx ends or one of them
// fails, then closes the role. It returns the first failure, naming the
// role and the consumer or loop; nil when ctx ended.
func (r *Role) Run(ctx context.Context, deps Deps) error {
	deps = deps.WithDefaults()
	g, gctx := errgroup.WithContext(ctx)
	for _, c := range r.Consumers {
		runner := pipeline.NewRunner(c.Pipeline, deps.Kafka, c.Handler, deps.Log, deps.Metrics)
		g.Go(func() error {
			if err := runner.Run(gctx); err != nil {
				return fmt.Errorf("role %s: consumer %s: %w", r.Name, c.Pipeline.Role, err)
			}
			if gctx.Err() == nil {
				return fmt.Errorf("role %s: consumer %s: %w", r.Name, c.Pipeline.Role, ErrLoopStopped)
			}
			return nil
		})
	}
	for _, l := range r.Loops {
		g.Go(func() (err error) {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("role %s: %s: panic: %v", r.Name, l.Name, p)
				}
			}()
			err = l.Run(gctx)
			switch {
			case err != nil && gctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
				return nil // ended with ctx
			case err != nil:
				return fmt.Errorf("role %s: %s: %w", r.Name, l.Name, err)
			case gctx.Err() == nil:
				return fmt.Errorf("role %s: %s: %w", r.Name, l.Name, ErrLoopStopped)
			}
			return nil
		})
	}
	err := g.Wait()
	if r.Close != nil {
		if cerr := r.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("role %s: close: %w", r.Name, cerr)
		}
	}
	return err
}
