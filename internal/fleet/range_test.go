package fleet

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/internal/clickhouse"
)

// TestRangeResolve: a summary since 30 days ago was accepted, but its
// reporting nodes come from recent_events, which keeps 8 days: the nodes
// that reported 9 to 30 days ago were silently left out. A since before
// the table's retention is now a 400 naming the limit.
func TestRangeResolve(t *testing.T) {
	now := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	oldest := now.Add(-clickhouse.RecentRetention)
	tests := []struct {
		name    string
		r       Range
		wantErr string
	}{
		{"default", Range{}, ""},
		{"oldest kept", Range{Since: oldest}, ""},
		{"a second before", Range{Since: oldest.Add(-time.Second)}, "since: at most 8 days before now"},
		{"30 days", Range{Since: now.Add(-30 * 24 * time.Hour)}, "recent_events, which keeps 8 days"},
		{"past until", Range{Since: now.Add(-30 * 24 * time.Hour), Until: now.Add(-29 * 24 * time.Hour)}, "since: at most"},
		{"until before since", Range{Since: now.Add(-time.Hour), Until: now.Add(-2 * time.Hour)}, "until: must be after since"},
		{"before 1970", Range{Since: time.Unix(-1, 0)}, "outside the stored range"},
	}
	for _, tt := range tests {
		_, err := tt.r.resolve(now)
		var bad *BadRequest
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.wantErr != "" && (!errors.As(err, &bad) || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: err %v, want a BadRequest containing %q", tt.name, err, tt.wantErr)
		}
	}
}
