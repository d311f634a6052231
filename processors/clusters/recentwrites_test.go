package clusters

import (
	"testing"
	"time"
)

func TestRecentWrites(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		wrote string // the rv the write produced; "-": no write
		copy  string // the watch's copy's rv
		after time.Duration
		want  bool
	}{
		{"never written", "-", "5", 0, true},
		{"the copy holds the write", "7", "7", time.Second, true},
		{"the copy is older than the write", "7", "5", time.Second, false},
		{"the write in flight or failed", "", "5", time.Second, false},
		{"the copy older, the write no longer recent", "7", "5", RecentWrite, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r RecentWrites
			if tc.wrote != "-" {
				r.Wrote("c/n", t0, tc.wrote)
			}
			if got := r.Trusted("c/n", tc.copy, t0.Add(tc.after)); got != tc.want {
				t.Fatalf("Trusted = %v, want %v", got, tc.want)
			}
			if !r.Trusted("c/other", tc.copy, t0) {
				t.Fatal("another key is not trusted")
			}
		})
	}
	// Old writes are pruned.
	var r RecentWrites
	r.Wrote("c/a", t0, "1")
	r.Wrote("c/b", t0.Add(2*RecentWrite), "2")
	if _, ok := r.writes["c/a"]; ok || len(r.writes) != 1 {
		t.Fatalf("writes after the prune: %v", r.writes)
	}
}
