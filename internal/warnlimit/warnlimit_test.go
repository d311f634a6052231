package warnlimit

import (
	"testing"
	"time"
)

func TestLimit(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type try struct {
		key         string
		at          time.Duration // after t0
		named, full bool
	}
	tests := []struct {
		name  string
		tries []try
	}{
		{"each key once a window", []try{
			{"a", 0, true, false}, {"b", time.Second, true, false}, {"a", 2 * time.Second, false, false},
			{"c", 9 * time.Second, true, false}, {"b", 9 * time.Second, false, false},
		}},
		{"named again in the next window", []try{
			{"a", 0, true, false}, {"a", 9 * time.Second, false, false}, {"a", 10 * time.Second, true, false},
			{"b", 11 * time.Second, true, false}, {"a", 12 * time.Second, false, false},
		}},
		{"keys spent: one line says so, then nothing", []try{
			{"a", 0, true, false}, {"b", 0, true, false}, {"c", 0, true, false},
			{"d", time.Second, false, true}, {"e", time.Second, false, false}, {"d", 2 * time.Second, false, false},
			{"a", 3 * time.Second, false, false},
			{"e", 10 * time.Second, true, false}, {"f", 10 * time.Second, true, false}, {"g", 10 * time.Second, true, false},
			{"h", 11 * time.Second, false, true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := New(10*time.Second, 3)
			for i, tr := range tt.tries {
				named, full := w.Allow(tr.key, t0.Add(tr.at))
				if named != tr.named || full != tr.full {
					t.Fatalf("try %d (%q at +%s): named %v, full %v; want %v, %v", i, tr.key, tr.at, named, full, tr.named, tr.full)
				}
			}
			if len(w.keys) > 3 {
				t.Fatalf("%d keys held, want at most 3", len(w.keys))
			}
		})
	}
}
