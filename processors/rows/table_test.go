package rows

import (
	"strings"
	"testing"

	"github.com/faultline/faultline/processors/rows/rowstest"
)

// TestTable: the external table holds the named columns in the order
// named, a row per record; a name that is no column is an error naming it.
func TestTable(t *testing.T) {
	var b Events
	for _, ev := range rowstest.Events(t) {
		if err := b.Add(rowstest.EventRecord(t, ev)); err != nil {
			t.Fatal(err)
		}
	}
	tbl, err := b.Table("batch", "node", "error_codes", "ts")
	if err != nil {
		t.Fatal(err)
	}
	if got := tbl.Structure(); got != "node String, error_codes Array(String), ts DateTime" {
		t.Errorf("structure %q", got)
	}
	if got := tbl.Block().Rows(); got != b.Len() || got == 0 {
		t.Errorf("%d rows, want %d", got, b.Len())
	}
	if _, err := b.Table("batch", "node", "nope"); err == nil || !strings.Contains(err.Error(), `external table batch: no column "nope"`) {
		t.Errorf("unknown column: %v", err)
	}
}
