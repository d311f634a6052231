package events

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestBoundKey(t *testing.T) {
	long := strings.Repeat("GPU=GPU-0a1b2c3d-0000-1111-2222-333344445555,", 64)
	for _, tc := range []struct {
		name, in string
		n        int
		same     bool
	}{
		{"short and plain stays", "GPU=GPU-1,NIC=mlx5_0", 256, true},
		{"exactly n stays", strings.Repeat("a", 64), 64, true},
		{"long is cut and hashed", long, 256, false},
		{"escaped characters are hashed", `a<b>&"c"`, 256, false},
		{"control characters are hashed", "XID\n  force: true", 256, false},
		{"invalid utf-8 is hashed", "a\xffb", 256, false},
		{"non-ASCII stays", "GPU=Ünïcödé", 256, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := BoundKey(tc.in, tc.n)
			if (got == tc.in) != tc.same {
				t.Fatalf("BoundKey(%q) = %q", tc.in, got)
			}
			if len(got) > tc.n || IsBoundKey(got) == tc.same {
				t.Fatalf("BoundKey(%q) = %q: %d bytes, stand-in %v", tc.in, got, len(got), IsBoundKey(got))
			}
			b, _ := json.Marshal(got)
			if len(b) != len(got)+2 {
				t.Fatalf("%q costs %d bytes in JSON", got, len(b))
			}
			if BoundKey(tc.in, tc.n) != got {
				t.Fatal("not deterministic")
			}
		})
	}
	if BoundKey(long, 256) == BoundKey(long+"x", 256) {
		t.Fatal("two long values with the same prefix got the same stand-in")
	}
}
