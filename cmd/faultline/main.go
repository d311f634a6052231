// Command faultline is the central pipeline: the gateway, the processors,
// the all-in-one dev mode, migrations and named queries.
//
//	faultline gateway [flags]          the gRPC + REST door
//	faultline process --role=a,b       processor roles (or all)
//	faultline dev [flags]              everything in one process (make run)
//	faultline migrate [flags]          apply ClickHouse migrations
//	faultline query NAME [--param k=v] run a named analytics query
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

// newLogger builds the process logger (JSON or text on stderr).
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log_level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log_format: want text or json, got %q", format)
}
