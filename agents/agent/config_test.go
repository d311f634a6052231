package agent

import (
	"strings"
	"testing"
	"time"
)

// TestCheckIntervalsArePositive: a check's poll interval is its schedule
// (time.NewTicker, which panics on 0 and takes the whole agent down) and
// its per-run deadline, so 0 is refused at start, naming the key.
func TestCheckIntervalsArePositive(t *testing.T) {
	env := func(string) string { return "node-1" }
	for _, tc := range []struct {
		check, flag, want string
	}{
		{"kmsg", "--kmsg.poll-interval=0s", "kmsg.poll_interval: must be positive, got 0s"},
		{"fabric", "--fabric.poll-interval=0s", "fabric.poll_interval: must be positive, got 0s"},
		{"gpu", "--gpu.poll-interval=0s", "gpu.poll_interval: must be positive, got 0s"},
		{"kmsg", "--kmsg.poll-interval=-1s", "kmsg.poll_interval: must be positive, got -1s"},
	} {
		_, err := LoadConfig("t", []string{"--checks=" + tc.check, tc.flag}, env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.flag, err, tc.want)
		}
	}
}

// TestChecksListedOnce: a check named twice ran twice, each instance
// reading the same source (every new kernel log line reported twice) and
// writing the same state file; it is refused at start.
func TestChecksListedOnce(t *testing.T) {
	env := func(string) string { return "node-1" }
	for _, args := range [][]string{
		{"--checks=kmsg,kmsg"},
		{"--checks=nic,csp,nic"},
	} {
		_, err := LoadConfig("t", args, env)
		if err == nil || !strings.Contains(err.Error(), "checks: ") || !strings.Contains(err.Error(), "listed twice") {
			t.Errorf("%v: err %v, want it to name checks and the repeated check", args, err)
		}
	}
}

// TestStrayWordRefused: `--gateway.insecure false` sets the true/false
// flag to true and leaves "false" a stray word, after which the flag
// parser stops; it is refused before validation, naming the word.
func TestStrayWordRefused(t *testing.T) {
	env := func(string) string { return "node-1" }
	_, err := LoadConfig("t", []string{"--gateway.insecure", "false", "--checks=kmsg"}, env)
	if err == nil || !strings.Contains(err.Error(), `unexpected argument "false"`) {
		t.Errorf("err %v, want the stray word refused", err)
	}
}

// TestMinTriggerInterval: min_trigger_interval defaults to a minute, 0
// turns the limit off, and a negative value is refused at start naming
// the key.
func TestMinTriggerInterval(t *testing.T) {
	env := func(string) string { return "node-1" }
	cfg, err := LoadConfig("t", []string{"--checks=kmsg"}, env)
	if err != nil || cfg.MinTriggerInterval != time.Minute {
		t.Fatalf("default: %v, err %v; want 1m0s", cfg.MinTriggerInterval, err)
	}
	if cfg, err = LoadConfig("t", []string{"--checks=kmsg", "--min-trigger-interval=0s"}, env); err != nil || cfg.MinTriggerInterval != 0 {
		t.Fatalf("0s: %v, err %v", cfg.MinTriggerInterval, err)
	}
	_, err = LoadConfig("t", []string{"--checks=kmsg", "--min-trigger-interval=-1s"}, env)
	if want := "min_trigger_interval: must not be negative, got -1s"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("-1s: err %v, want %q", err, want)
	}
}
