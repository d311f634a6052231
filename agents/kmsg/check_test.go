package kmsg

import (
	"strings"
	"testing"
	"time"
)

// TestConfigValidate: each bad setting is refused on its own, naming its
// key and quoting its value.
func TestConfigValidate(t *testing.T) {
	def := DefaultConfig()
	if err := def.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"source", func(c *Config) { c.Source = "tape" }, `kmsg.source: "tape" is not kmsg, journal or file`},
		{"file source without a file", func(c *Config) { c.Source, c.File = SourceFile, "" }, "kmsg.file: required"},
		{"max lines", func(c *Config) { c.MaxLinesPerCheck = -1 }, "kmsg.max_lines_per_check: must not be negative, got -1"},
		{"poll interval", func(c *Config) { c.PollInterval = -time.Second }, "kmsg.poll_interval: must not be negative, got -1s"},
		{"flood window", func(c *Config) { c.FloodWindow = -time.Second }, "kmsg.flood_window: must not be negative, got -1s"},
		{"flood burst", func(c *Config) { c.FloodBurst = -2 }, "kmsg.flood_burst: must not be negative, got -2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mod(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}
