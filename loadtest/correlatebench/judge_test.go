package main

import "testing"

// TestJudge: a rule never triggered fails either phase, one never queried
// fails no-skip; in steady, one triggered but never decided (every trigger
// skipped) passes with a warning instead of silently.
func TestJudge(t *testing.T) {
	for _, c := range []struct {
		name         string
		all          bool
		ev, sk, q    float64
		failed, warn bool
	}{
		{"no-skip: decided and queried", true, 100, 5, 3, false, false},
		{"no-skip: never triggered", true, 0, 0, 0, true, false},
		{"no-skip: never queried", true, 100, 0, 0, true, false},
		{"steady: decided", false, 100, 50, 3, false, false},
		{"steady: never triggered", false, 0, 0, 0, true, false},
		{"steady: all skipped", false, 0, 1149, 0, false, true},
	} {
		failed, warning := judge(c.all, c.ev, c.sk, c.q)
		if failed != c.failed || (warning != "") != c.warn {
			t.Errorf("%s: failed %v, warning %q; want failed %v, a warning %v", c.name, failed, warning, c.failed, c.warn)
		}
	}
}
