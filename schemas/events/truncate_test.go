package events

import (
	"testing"
	"unicode/utf8"
)

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"0123456789abc", 10, "0123456..."},
		{"GPU 0000:17:00 — fallen off the bus", 19, "GPU 0000:17:00 ..."}, // the cut would split "—" (3 bytes)
	} {
		got := Truncate(tc.in, tc.n)
		if got != tc.want || len(got) > tc.n || !utf8.ValidString(got) {
			t.Errorf("Truncate(%q, %d) = %q, want %q (at most %d bytes, valid UTF-8)", tc.in, tc.n, got, tc.want, tc.n)
		}
	}
}
