package store

import (
	"math"
	"runtime/debug"
	"testing"
)

// TestPipelineOverlapFollowsMemoryLimit: the role decodes its next batch
// while the last is written only where the Go memory limit leaves room for
// two batches (OverlapMemory); no limit set is room.
func TestPipelineOverlapFollowsMemoryLimit(t *testing.T) {
	was := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(was) })
	for _, tc := range []struct {
		limit int64
		want  bool
	}{
		{math.MaxInt64, true}, // GOMEMLIMIT unset
		{921 << 20, true},     // the chart's store default, 1Gi
		{OverlapMemory, true},
		{OverlapMemory - 1, false},
		{460 << 20, false}, // 512Mi
	} {
		debug.SetMemoryLimit(tc.limit)
		if got := DefaultConfig().Pipeline().Overlap; got != tc.want {
			t.Errorf("GOMEMLIMIT %d: Overlap %t, want %t", tc.limit, got, tc.want)
		}
	}
}
