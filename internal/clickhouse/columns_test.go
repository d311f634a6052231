package clickhouse

import (
	"errors"
	"fmt"
	"testing"

	ch "github.com/ClickHouse/clickhouse-go/v2"
)

func TestColumnsAlreadyAdded(t *testing.T) {
	exists := func(code int32) error {
		return fmt.Errorf("exec: %w", &ch.Exception{Code: code, Message: "Cannot add column `b`: column with this name already exists"})
	}
	for _, tc := range []struct {
		stmt string
		err  error
		want bool
	}{
		{"ALTER TABLE t ADD COLUMN b String, ADD COLUMN c String", exists(44), true},           // ClickHouse 18.16
		{"ALTER TABLE t\n    ADD COLUMN b String,\n    ADD COLUMN c String", exists(15), true}, // current ClickHouse
		{"ALTER TABLE t ADD COLUMN b String, MODIFY COLUMN c UInt8", exists(44), false},
		{"ALTER TABLE t ADD COLUMN b String", &ch.Exception{Code: 60, Message: "Table t doesn't exist"}, false},
		{"ALTER TABLE t ADD COLUMN b String", errors.New("connection refused"), false},
		{"CREATE TABLE t (b String) ENGINE = Memory", exists(44), false},
	} {
		if got := columnsAlreadyAdded(tc.stmt, tc.err); got != tc.want {
			t.Errorf("%q, %v: %v, want %v", tc.stmt, tc.err, got, tc.want)
		}
	}
}
