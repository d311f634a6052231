package correlate

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestTriggerErrorsExportedFromStart: each rule's trigger errors are
// exported at 0 from the start, so that an alert's increase() sees the
// first one.
func TestTriggerErrorsExportedFromStart(t *testing.T) {
	rules, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(nil)
	New(nil, rules, nil, 0, nil, m)
	if n := testutil.CollectAndCount(m.triggerErrors); n != len(rules) {
		t.Errorf("faultline_correlate_trigger_errors_total: %d series, want one per rule (%d)", n, len(rules))
	}
}
