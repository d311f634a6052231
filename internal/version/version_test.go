package version

import (
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	old, oldRev := Version, Revision
	t.Cleanup(func() { Version, Revision = old, oldRev })
	Version, Revision = "v1.2.3", "abc123"
	got := String("faultline")
	if !strings.HasPrefix(got, "faultline v1.2.3 (revision abc123, go") {
		t.Errorf("String = %q", got)
	}
}

func TestAsked(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"--version"}, true},
		{[]string{"-version"}, true},
		{[]string{"version"}, true},
		{[]string{"run", "--version"}, false},
		{nil, false},
	} {
		if got := Asked(tc.args); got != tc.want {
			t.Errorf("Asked(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}
