package correlate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidateSweepInterval: sweep_interval 0 (no sweep) is refused while
// a rule starts or recovers only in the sweep (the shipped NICPortDrop,
// FabricIncident and Xid rules), naming the key and the rule; before it
// was accepted, and those verdicts never started, or never recovered and
// froze their groups. Rules that need no sweep run without one.
func TestValidateSweepInterval(t *testing.T) {
	noSweep := filepath.Join(t.TempDir(), "rules.toml")
	if err := os.WriteFile(noSweep, []byte(`
[[rule]]
name = "Custom"
trigger = "event.checkName == 'X'"
window = "10m"
threshold = 1
query = "SELECT tid, 1.0 AS value, emptyArrayString() AS cause_ids, toUInt64(0) AS last_ms FROM triggers"
`), 0o644); err != nil {
		t.Fatal(err)
	}
	// RepeatedNICLinkFlap, MultipleRemediations and NVSwitchSXidGPUXid
	// recover on "event", but their triggers always count in their own
	// window: with a stabilization, only the sweep can recover them.
	stabilized := filepath.Join(t.TempDir(), "stabilized.toml")
	if err := os.WriteFile(stabilized, []byte(`
[[rule]]
name = "Flaps"
trigger = "event.checkName == 'X'"
window = "10m"
threshold = 3
stabilization = "30m"
query = "SELECT tid, 1.0 AS value, emptyArrayString() AS cause_ids, toUInt64(0) AS last_ms FROM triggers"
`), 0o644); err != nil {
		t.Fatal(err)
	}
	noRecover := filepath.Join(t.TempDir(), "norecover.toml")
	if err := os.WriteFile(noRecover, []byte(`
[[rule]]
name = "Once"
trigger = "event.checkName == 'X'"
window = "10m"
threshold = 3
stabilization = "30m"
recover = false
query = "SELECT tid, 1.0 AS value, emptyArrayString() AS cause_ids, toUInt64(0) AS last_ms FROM triggers"
`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, rules string
		sweep       bool
		want        string
	}{
		{"shipped rules, the sweep", "", true, ""},
		{"shipped rules, no sweep", "", false, `correlate.sweep_interval: 0 (no sweep), but rule `},
		{"rules that need no sweep", noSweep, false, ""},
		{"a stabilization, no sweep", stabilized, false, `correlate.sweep_interval: 0 (no sweep), but rule Flaps recovers only once its stabilization (30m0s)`},
		{"a stabilization, the sweep", stabilized, true, ""},
		{"a stabilization, no recovery, no sweep", noRecover, false, ""},
	} {
		c := DefaultConfig()
		c.Rules = tc.rules
		if !tc.sweep {
			c.SweepInterval = 0
		}
		err := c.Validate("correlate.")
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
