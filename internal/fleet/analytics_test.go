package fleet_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/faultline/faultline/internal/fleet"
)

// manyRows is a result of n rows (node, events) that counts the rows read.
type manyRows struct {
	driver.Rows
	n, read int
}

func (r *manyRows) Next() bool {
	if r.read == r.n {
		return false
	}
	r.read++
	return true
}

func (r *manyRows) Scan(dest ...any) error {
	*dest[0].(*string) = "gpu-node-" + strings.Repeat("x", 40)
	*dest[1].(*uint64) = uint64(r.read)
	return nil
}

func (r *manyRows) Columns() []string { return []string{"node", "events"} }
func (r *manyRows) ColumnTypes() []driver.ColumnType {
	return []driver.ColumnType{colType{"node", ""}, colType{"events", uint64(0)}}
}
func (r *manyRows) Close() error { return nil }
func (r *manyRows) Err() error   { return nil }

type colType struct {
	name string
	zero any
}

func (c colType) Name() string           { return c.name }
func (c colType) Nullable() bool         { return false }
func (c colType) ScanType() reflect.Type { return reflect.TypeOf(c.zero) }
func (c colType) DatabaseTypeName() string {
	if _, ok := c.zero.(string); ok {
		return "String"
	}
	return "UInt64"
}

// rowsConn answers every query with its rows.
type rowsConn struct {
	driver.Conn
	rows *manyRows
}

func (c rowsConn) Query(context.Context, string, ...any) (driver.Rows, error) { return c.rows, nil }

// TestAnalyticsStopsAtItsRowBound: an analytics answer is at most 10,000
// rows, and the gateway reads no more of the result than that (it read
// every row, a million here, then kept the first 10,000), and says it was
// cut (it did not: the answer looked whole).
func TestAnalyticsStopsAtItsRowBound(t *testing.T) {
	rows := &manyRows{n: 1_000_000}
	st, err := fleet.New(rowsConn{rows: rows}, slog.Default(), fleet.Options{Now: func() time.Time { return time.Unix(1_800_000_000, 0) }})
	if err != nil {
		t.Fatal(err)
	}
	tab, err := st.Analytics(context.Background(), "alpha", "events_per_day", map[string]string{"since": "2020-01-01"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(tab)
	if len(tab.Rows) != 10000 || rows.read > 10001 || !strings.Contains(string(b), `"truncated":true`) {
		t.Errorf("%d rows answered, %d of %d read, answer %.80s…: want 10000 answered, at most 10001 read, \"truncated\":true",
			len(tab.Rows), rows.read, rows.n, b)
	}

	small := &manyRows{n: 3}
	st, _ = fleet.New(rowsConn{rows: small}, slog.Default(), fleet.Options{})
	tab, err = st.Analytics(context.Background(), "alpha", "events_per_day", nil)
	if b, _ := json.Marshal(tab); err != nil || len(tab.Rows) != 3 || strings.Contains(string(b), `"truncated":true`) {
		t.Errorf("a whole answer: %v %s", err, b)
	}
}
