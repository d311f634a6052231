package events

import (
	"strings"
	"testing"
	"time"
)

// TestSameEntities: a key matches the entities it lists, in any order;
// not others, nor the same text split elsewhere by a ',' in a value.
func TestSameEntities(t *testing.T) {
	for _, c := range []struct {
		key   string
		parts []string
		want  bool
	}{
		{"", nil, true},
		{"GPU=GPU-1", nil, false},
		{"", []string{"GPU=GPU-1"}, false},
		{"GPU=GPU-x,PCI=0000:3b:00", []string{"GPU=GPU-x", "PCI=0000:3b:00"}, true},
		{"GPU=GPU-x,PCI=0000:3b:00", []string{"PCI=0000:3b:00", "GPU=GPU-x"}, true},
		{"A=1,B=2,C=3", []string{"C=3", "A=1", "B=2"}, true},
		{"A=1,A=1,B=2", []string{"A=1", "B=2", "A=1"}, true},
		{"A=1,B=2,B=2", []string{"A=1", "B=2", "A=1"}, false},
		{"GPU=GPU-x,PCI=0000:3b:00", []string{"GPU=GPU-x"}, false},
		{"GPU=GPU-x", []string{"GPU=GPU-x", "PCI=0000:3b:00"}, false},
		{"GPU=GPU-x,PCI=0000:3b:00", []string{"PCI=0000:3b:00", "GPU=GPU-y"}, false},
		{"T=a,b,U=c", []string{"U=c", "T=a,b"}, true},      // a ',' in a value
		{"T=a,b,U=c", []string{"T=a", "U=c,b"}, false},     // the same pieces, other entities
		{"T=a,b,U=c", []string{"T=a", "b,U=c"}, true},      // EntityKey's own ambiguity: this order is the key
		{"T=a,U=c,b", []string{"U=c,b", "T=a"}, true},      // a part that is a prefix of another
		{"T=a,U=c,b", []string{"T=a,U=c", "T=a,b"}, false}, // prefixes that tile nothing
	} {
		if got := SameEntities(c.key, c.parts); got != c.want {
			t.Errorf("SameEntities(%q, %q) = %v, want %v", c.key, c.parts, got, c.want)
		}
	}
}

// TestSameEntitiesBounded: parts built to make the search branch (parts
// that are joins of others) end it within its bound.
func TestSameEntitiesBounded(t *testing.T) {
	var parts []string
	for range 32 {
		parts = append(parts, "a=a")
	}
	for range 16 {
		parts = append(parts, "a=a,a=a")
	}
	segs := make([]string, 64)
	for i := range segs {
		segs[i] = "a=a"
	}
	segs[63] = "a=b" // no tiling matches: every one is tried
	start := time.Now()
	if SameEntities(strings.Join(segs, ","), parts) {
		t.Fatal("matched")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("took %v", d)
	}
}
