package analytics

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Formats are the output formats of Write.
var Formats = []string{"table", "json", "csv"}

// Write prints the result as an aligned table, a JSON array of objects, or
// CSV with a header row.
func (r *Result) Write(w io.Writer, format string) error {
	switch format {
	case "table", "":
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, strings.Join(r.Columns, "\t"))
		for _, row := range r.Rows {
			cells := make([]string, len(row))
			for i, v := range row {
				cells[i] = text(v)
			}
			fmt.Fprintln(tw, strings.Join(cells, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		_, err := fmt.Fprintf(w, "(%d rows)\n", len(r.Rows))
		return err
	case "csv":
		cw := csv.NewWriter(w)
		if err := cw.Write(r.Columns); err != nil {
			return err
		}
		for _, row := range r.Rows {
			cells := make([]string, len(row))
			for i, v := range row {
				cells[i] = text(v)
			}
			if err := cw.Write(cells); err != nil {
				return err
			}
		}
		cw.Flush()
		return cw.Error()
	case "json":
		out := make([]map[string]any, 0, len(r.Rows))
		for _, row := range r.Rows {
			obj := make(map[string]any, len(row))
			for i, v := range row {
				if t, ok := v.(time.Time); ok {
					v = t.UTC().Format(time.RFC3339)
				}
				obj[r.Columns[i]] = v
			}
			out = append(out, obj)
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	return fmt.Errorf("format: want table, json or csv, got %q", format)
}

// text is the table and CSV form of a value.
func text(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case time.Time:
		return v.UTC().Format("2006-01-02 15:04:05")
	case []string:
		return strings.Join(v, ",")
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case float32:
		return strconv.FormatFloat(float64(v), 'f', -1, 32)
	}
	return fmt.Sprint(v)
}
