// Command faultline is the central pipeline: the gateway, the processors,
// the all-in-one dev mode, migrations and named queries.
//
//	faultline gateway [flags]          the gRPC + REST door
//	faultline process --role=a,b       processor roles (or all)
//	faultline dev [flags]              everything in one process (make run)
//	faultline migrate [flags]          apply ClickHouse migrations
//	faultline query NAME [--param k=v] run a named analytics query
//	faultline --version                the version and source revision
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/faultline/faultline/internal/version"
	"github.com/faultline/faultline/internal/warnlimit"
)

// command is one subcommand: it parses its own flags from args.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]command{
	"gateway": {"serve the gRPC and REST ingress", runGateway},
	"process": {"run processor roles (--role=store,correlate,... or all)", runProcess},
	"dev":     {"all-in-one pipeline with embedded Kafka and a local ClickHouse (make run)", runDev},
	"migrate": {"apply the ClickHouse schema migrations (--status lists them)", runMigrate},
	"query":   {"run a named analytics query (--list names them)", runQuery},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "faultline:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if version.Asked(args) {
		_, err := fmt.Fprintln(stdout, version.String("faultline"))
		return err
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return fmt.Errorf("a command is required")
		}
		return nil
	}
	c, ok := commands[args[0]]
	if !ok {
		usage(stderr)
		return fmt.Errorf("unknown command %q", args[0])
	}
	return c.run(ctx, args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "usage: faultline COMMAND [flags]\n\ncommands:")
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
}

// libraryComponents are the "component" attributes of the loggers faultline
// hands to libraries: franz-go (internal/kafka), clickhouse-go
// (internal/clickhouse) and klog, client-go's own log (newLogger). Their
// records go through at library_log_level.
var libraryComponents = map[string]bool{"kafka": true, "clickhouse": true, "client-go": true}

// newLogger builds the process logger (JSON or text on w) at log_level,
// the libraries' records at library_log_level (default log_level). It
// also routes klog through it as component client-go: the lines client-go
// logs itself (the janitor's leader election: "attempting to acquire",
// "failed to renew") would otherwise go to stderr in klog's own format,
// each message at most once a minute (spaced). klog is process-wide; each
// command builds one logger.
func newLogger(w io.Writer, cfg Config) (*slog.Logger, error) {
	var own, lib slog.Level
	if err := own.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return nil, fmt.Errorf("log_level: %w", err)
	}
	lib = own
	if cfg.LibraryLogLevel != "" {
		if err := lib.UnmarshalText([]byte(cfg.LibraryLogLevel)); err != nil {
			return nil, fmt.Errorf("library_log_level: %w", err)
		}
	}
	opts := &slog.HandlerOptions{Level: min(own, lib)}
	var h slog.Handler
	switch strings.ToLower(cfg.LogFormat) {
	case "json":
		h = slog.NewJSONHandler(w, opts)
	case "text", "":
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, fmt.Errorf("log_format: want text or json, got %q", cfg.LogFormat)
	}
	log := slog.New(levels{Handler: h, own: own, lib: lib})
	klog.SetSlogLogger(slog.New(spaced{log.With("component", "client-go").Handler(), warnlimit.New(time.Minute, 32)}))
	return log, nil
}

// spaced logs each message at most once per window of its warnlimit.Limit
// (client-go's: its leader elector logs the same error at every try, every
// 2 s with the janitor's default lease, where the janitor warns once a
// minute); past its keys one line says the rest are dropped.
type spaced struct {
	slog.Handler
	lim *warnlimit.Limit
}

func (s spaced) Handle(ctx context.Context, r slog.Record) error {
	switch named, full := s.lim.Allow(r.Message, r.Time); {
	case named:
		return s.Handler.Handle(ctx, r)
	case full && s.Handler.Enabled(ctx, slog.LevelWarn):
		return s.Handler.Handle(ctx, slog.NewRecord(r.Time, slog.LevelWarn, "more messages within a minute than are logged; the rest are dropped until it ends", r.PC))
	}
	return nil
}

func (s spaced) WithAttrs(attrs []slog.Attr) slog.Handler {
	return spaced{s.Handler.WithAttrs(attrs), s.lim}
}

func (s spaced) WithGroup(name string) slog.Handler { return spaced{s.Handler.WithGroup(name), s.lim} }

// levels passes a record at the level of its logger: lib for the loggers
// of libraryComponents, own for the others.
type levels struct {
	slog.Handler
	own, lib slog.Level
	isLib    bool
}

func (l levels) Enabled(ctx context.Context, level slog.Level) bool {
	if l.isLib {
		return level >= l.lib
	}
	return level >= l.own
}

func (l levels) WithAttrs(attrs []slog.Attr) slog.Handler {
	isLib := l.isLib
	for _, a := range attrs {
		if a.Key == "component" && libraryComponents[a.Value.String()] {
			isLib = true
		}
	}
	return levels{Handler: l.Handler.WithAttrs(attrs), own: l.own, lib: l.lib, isLib: isLib}
}

func (l levels) WithGroup(name string) slog.Handler {
	return levels{Handler: l.Handler.WithGroup(name), own: l.own, lib: l.lib, isLib: l.isLib}
}
