package testenv

import "testing"

// TestDecide: the rule of every server test — skip under -short; run when
// the server is installed; when it is not, skip, or fail where servers are
// required (CI, FAULTLINE_REQUIRE_SERVERS=1).
func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		short, installed, required bool
		want                       verdict
	}{
		{true, true, true, skip},
		{true, false, true, skip},
		{true, true, false, skip},
		{false, true, false, run},
		{false, true, true, run},
		{false, false, false, skip},
		{false, false, true, fail},
	} {
		if got := decide(tc.short, tc.installed, tc.required); got != tc.want {
			t.Errorf("short %v installed %v required %v: %d, want %d", tc.short, tc.installed, tc.required, got, tc.want)
		}
	}
}
