// Package analytics runs the named queries of sql/analytics: each file is
// one query with a header that documents it and declares its typed
// parameters. `faultline query NAME [--param k=v] [--format table|json|csv]`
// runs one and prints the result.
//
// Header format (SQL comments before the query):
//
//	-- One or more lines describing the query.
//	-- param: NAME TYPE DEFAULT  what it means
//
// TYPE is String, UInt64, Int64, Float64 or DateTime; DEFAULT is a literal
// (a pair of single quotes for the empty string), and for DateTime also "now" or "now-DURATION"
// (Go durations plus a "d" suffix for days, e.g. now-7d). The query refers
// to a parameter as @NAME; values are bound by the client driver as quoted
// literals, never spliced as text.
package analytics

import (
	"context"
	"fmt"
	"io/fs"
	"math"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"

	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/sql"
)

// Query is one named analytics query.
type Query struct {
	// Name is the file name without .sql.
	Name string
	// Description is the header's text.
	Description string
	// Params are the declared parameters, in header order.
	Params []Param
	// SQL is the whole file.
	SQL string
}

// Param is a declared parameter of a query.
type Param struct {
	Name    string
	Type    string
	Default string
	Help    string
}

var paramRE = regexp.MustCompile(`^--\s*param:\s*([a-z_][a-z0-9_]*)\s+(String|UInt64|Int64|Float64|DateTime)\s+('[^']*'|\S+)\s*(.*)$`)

// Load reads every *.sql in dir of fsys.
func Load(fsys fs.FS, dir string) (map[string]Query, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read queries %s: %w", dir, err)
	}
	out := map[string]Query{}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".sql")
		if e.IsDir() || !ok {
			continue
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read query %s: %w", e.Name(), err)
		}
		q, err := parse(name, string(b))
		if err != nil {
			return nil, fmt.Errorf("query %s: %w", e.Name(), err)
		}
		out[name] = q
	}
	return out, nil
}

// Builtin returns the queries shipped in sql/analytics.
func Builtin() (map[string]Query, error) { return Load(sql.Analytics, "analytics") }

func parse(name, text string) (Query, error) {
	q := Query{Name: name, SQL: text}
	var desc []string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "--") {
			break
		}
		if strings.HasPrefix(strings.TrimSpace(strings.TrimPrefix(line, "--")), "param:") {
			m := paramRE.FindStringSubmatch(line)
			if m == nil {
				return q, fmt.Errorf("bad param line %q (want: -- param: name Type default help)", line)
			}
			p := Param{Name: m[1], Type: m[2], Default: strings.Trim(m[3], "'"), Help: strings.TrimSpace(m[4])}
			if _, err := p.value(p.Default, time.Now()); err != nil {
				return q, fmt.Errorf("param %s: default: %w", p.Name, err)
			}
			q.Params = append(q.Params, p)
			continue
		}
		desc = append(desc, strings.TrimSpace(strings.TrimPrefix(line, "--")))
	}
	q.Description = strings.Join(desc, " ")
	for _, p := range q.Params {
		if !strings.Contains(text, "@"+p.Name) {
			return q, fmt.Errorf("param %s is declared but not used as @%s", p.Name, p.Name)
		}
	}
	return q, nil
}

// value converts a text value to the parameter's Go type.
func (p Param) value(s string, now time.Time) (any, error) {
	switch p.Type {
	case "String":
		return s, nil
	case "UInt64":
		return strconv.ParseUint(s, 10, 64)
	case "Int64":
		return strconv.ParseInt(s, 10, 64)
	case "Float64":
		return strconv.ParseFloat(s, 64)
	case "DateTime":
		return parseTime(s, now)
	}
	return nil, fmt.Errorf("unknown type %s", p.Type)
}

// The range a ClickHouse DateTime holds (UInt32 seconds): 18.16 wraps a
// time outside it silently (2200-01-01 became 1963's date modulo 2^32),
// and the query answered for another window.
var (
	minTime = time.Unix(0, 0).UTC()
	maxTime = time.Unix(math.MaxUint32, 0).UTC()
)

// parseTime accepts now, now-DURATION, RFC 3339, "2006-01-02 15:04:05",
// 2006-01-02 and Unix seconds; the result is UTC, whole seconds, within
// what a DateTime holds (1970-01-01 to 2106-02-07).
func parseTime(s string, now time.Time) (time.Time, error) {
	t, err := parseAnyTime(s, now)
	if err != nil {
		return t, err
	}
	if t.Before(minTime) || t.After(maxTime) {
		return time.Time{}, fmt.Errorf("%q is outside the range a DateTime holds, %s to %s",
			s, minTime.Format(time.RFC3339), maxTime.Format(time.RFC3339))
	}
	return t, nil
}

func parseAnyTime(s string, now time.Time) (time.Time, error) {
	now = now.UTC().Truncate(time.Second)
	if s == "now" {
		return now, nil
	}
	if d, ok := strings.CutPrefix(s, "now-"); ok {
		dur, err := parseDuration(d)
		if err != nil {
			return time.Time{}, err
		}
		return now.Add(-dur), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC().Truncate(time.Second), nil
		}
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.Unix(n, 0).UTC(), nil
	}
	return time.Time{}, fmt.Errorf("%q is not a time (now, now-7d, RFC 3339, YYYY-MM-DD[ hh:mm:ss] or Unix seconds)", s)
}

// maxDuration is the longest now-DURATION: past it, now less it is
// before 1970 anyway (and a Duration overflows at 292 years).
const maxDuration = 200 * 365 * 24 * time.Hour

func parseDuration(s string) (time.Duration, error) {
	var dur time.Duration
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(d, 64)
		if err != nil || math.IsNaN(n) || n < 0 || n > float64(maxDuration/(24*time.Hour)) {
			return 0, fmt.Errorf("bad duration %q (days from 0 to %d)", s, maxDuration/(24*time.Hour))
		}
		dur = time.Duration(n * float64(24*time.Hour))
	} else {
		var err error
		if dur, err = time.ParseDuration(s); err != nil {
			return 0, err
		}
	}
	if dur < 0 || dur > maxDuration {
		return 0, fmt.Errorf("bad duration %q (from 0 to %d days)", s, maxDuration/(24*time.Hour))
	}
	return dur, nil
}

// Args binds values (by parameter name, text form) over the defaults and
// returns the driver's named arguments. Unknown names are an error.
func (q Query) Args(values map[string]string, now time.Time) ([]any, error) {
	known := map[string]Param{}
	for _, p := range q.Params {
		known[p.Name] = p
	}
	for k := range values {
		if _, ok := known[k]; !ok {
			names := make([]string, 0, len(known))
			for n := range known {
				names = append(names, n)
			}
			sort.Strings(names)
			return nil, fmt.Errorf("query %s has no parameter %q (parameters: %s)", q.Name, k, strings.Join(names, ", "))
		}
	}
	args := make([]any, 0, len(q.Params))
	times := map[string]time.Time{}
	secs := map[string]uint64{}
	for _, p := range q.Params {
		s, ok := values[p.Name]
		if !ok {
			s = p.Default
		}
		v, err := p.value(s, now)
		if err != nil {
			return nil, fmt.Errorf("param %s (%s): %w", p.Name, p.Type, err)
		}
		args = append(args, ch.Named(p.Name, v))
		times[p.Name], _ = v.(time.Time)
		if n, ok := v.(uint64); ok {
			secs[p.Name] = n
		}
	}
	if since, until := times["since"], times["until"]; !since.IsZero() && !until.IsZero() && until.Before(since) {
		return nil, fmt.Errorf("param until (%s) is before since (%s)", until.Format(time.RFC3339), since.Format(time.RFC3339))
	}
	// @until - @window: ClickHouse 18.16 computes a DateTime less a UInt64
	// modulo 2^32, so a window reaching before 1970 wrapped to a time in
	// the future and the query answered for an empty window (200, no rows).
	for _, m := range minusRE.FindAllStringSubmatch(q.SQL, -1) {
		t, d := times[m[1]], secs[m[2]]
		if _, ok := secs[m[2]]; ok && !t.IsZero() && d > uint64(t.Unix()) {
			return nil, fmt.Errorf("param %s (UInt64): %d seconds before %s (%s) is before 1970-01-01, the earliest a DateTime holds: at most %d",
				m[2], d, m[1], t.Format(time.RFC3339), t.Unix())
		}
	}
	return args, nil
}

// minusRE finds a parameter subtracted from another (@until - @window).
var minusRE = regexp.MustCompile(`@([a-z_][a-z0-9_]*)\s*-\s*@([a-z_][a-z0-9_]*)`)

// Result is a query's answer.
type Result struct {
	Columns []string
	Types   []string
	Rows    [][]any
	// Truncated: the query had more rows than RunMax's bound.
	Truncated bool
}

// Run runs q with values bound (see Args) and reads the whole result.
func Run(ctx context.Context, conn clickhouse.Conn, q Query, values map[string]string, now time.Time) (*Result, error) {
	return RunMax(ctx, conn, q, values, now, 0)
}

// RunMax is Run reading at most maxRows rows (0: no bound): at a row past
// it, the query is cancelled and the result is Truncated.
func RunMax(ctx context.Context, conn clickhouse.Conn, q Query, values map[string]string, now time.Time, maxRows int) (*Result, error) {
	args, err := q.Args(values, now)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rows, err := conn.Query(ctx, q.SQL, args...)
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", q.Name, err)
	}
	defer rows.Close()
	res := &Result{Columns: rows.Columns()}
	cts := rows.ColumnTypes()
	for _, ct := range cts {
		res.Types = append(res.Types, ct.DatabaseTypeName())
	}
	for rows.Next() {
		if maxRows > 0 && len(res.Rows) == maxRows {
			res.Truncated = true
			cancel() // ClickHouse stops the query; Close drops what already came
			return res, nil
		}
		dest := make([]any, len(cts))
		for i, ct := range cts {
			dest[i] = newScan(ct.ScanType())
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("query %s: %w", q.Name, err)
		}
		row := make([]any, len(dest))
		for i, d := range dest {
			row[i] = deref(d)
		}
		res.Rows = append(res.Rows, row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("query %s: %w", q.Name, err)
	}
	return res, nil
}
