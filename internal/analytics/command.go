package analytics

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/faultline/faultline/internal/clickhouse"
)

// Params is a repeatable k=v flag (--param k=v).
type Params map[string]string

// String implements flag.Value.
func (p Params) String() string {
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k+"="+p[k])
	}
	sort.Strings(keys)
	return strings.Join(keys, ",")
}

// Set implements flag.Value.
func (p Params) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want k=v, got %q", s)
	}
	p[k] = v
	return nil
}

// List prints the named queries with their descriptions and parameters.
func List(w io.Writer) error {
	qs, err := Builtin()
	if err != nil {
		return err
	}
	names := make([]string, 0, len(qs))
	for n := range qs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		q := qs[n]
		fmt.Fprintf(w, "%s\n    %s\n", n, q.Description)
		for _, p := range q.Params {
			def := p.Default
			if def == "" {
				def = "''"
			}
			fmt.Fprintf(w, "    --param %s=%s  (%s) %s\n", p.Name, def, p.Type, p.Help)
		}
	}
	return nil
}

// QueryCommand runs the named query against the configured database and
// writes the result to stdout in format (table, json or csv). An unknown
// name lists the known ones.
func QueryCommand(ctx context.Context, cfg clickhouse.Config, name string, params Params, format string, stdout io.Writer, log *slog.Logger) error {
	qs, err := Builtin()
	if err != nil {
		return err
	}
	q, ok := qs[name]
	if !ok {
		names := make([]string, 0, len(qs))
		for n := range qs {
			names = append(names, n)
		}
		sort.Strings(names)
		return fmt.Errorf("unknown query %q (known: %s; --list describes them)", name, strings.Join(names, ", "))
	}
	switch format {
	case "table", "json", "csv":
	default:
		return fmt.Errorf("format: want table, json or csv, got %q", format)
	}
	conn, err := clickhouse.Open(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer conn.Close()
	res, err := Run(ctx, conn, q, params, time.Now())
	if err != nil {
		return err
	}
	return res.Write(stdout, format)
}
