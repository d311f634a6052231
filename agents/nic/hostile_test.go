package nic

import (
	"os"
	"path/filepath"
	"testing"
)

// unreadable makes a sysfs file fail to read (EISDIR), as a file that
// answers EIO while the firmware is busy or a reset is under way; the
// returned func restores it with v.
func unreadable(t *testing.T, path string) func(v string) {
	t.Helper()
	must(t, os.Remove(path))
	must(t, os.Mkdir(path, 0o755))
	return func(v string) {
		t.Helper()
		must(t, os.Remove(path))
		must(t, os.WriteFile(path, []byte(v+"\n"), 0o644))
	}
}

// TestCounterReadFailureKeepsSnapshot: a link_downed read that fails for a
// poll (a firmware query that times out, often during the very link trouble
// the counter counts) must not forget the last reading: the increase seen
// at the next good read is reported (Appendix A: link_downed delta > 0).
func TestCounterReadFailureKeepsSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name    string
		counter string
		dir     string
	}{
		{"link_downed", CounterLinkDowned, "counters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, small())
			c := e.check()
			poll(t, c)
			restore := unreadable(t, filepath.Join(e.tree.PortDir("mlx5_0", 1), tc.dir, tc.counter))
			wantEvents(t, "unreadable", poll(t, c), nil)
			restore("1")
			wantEvents(t, "readable again, increased", poll(t, c), []string{
				"F InfiniBandDegradationCheck: Port mlx5_0 port 1: link_downed increased by 1 (now 1)"})
			// Across a restart too: the snapshot persisted while unreadable.
			restore = unreadable(t, filepath.Join(e.tree.PortDir("mlx5_0", 1), tc.dir, tc.counter))
			poll(t, c)
			restore("3")
			wantEvents(t, "after restart", poll(t, e.check()), []string{
				"F InfiniBandDegradationCheck: Port mlx5_0 port 1: link_downed increased by 2 (now 3)"})
		})
	}
}
