package gateway

import (
	"math"
	"strings"
	"testing"
)

// TestConfigValidateRates: the per-caller rates are finite and not below
// 0; a NaN compares false with every bound and was taken.
func TestConfigValidateRates(t *testing.T) {
	base := DefaultConfig()
	base.TokensFile = "/etc/faultline/tokens"
	if err := base.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"negative rate", func(c *Config) { c.RatePerCaller = -1 }, "gateway.rate_per_caller: must be a finite number not below 0 (0: unlimited), got -1"},
		{"NaN rate", func(c *Config) { c.RatePerCaller = math.NaN() }, "gateway.rate_per_caller: must be a finite number not below 0 (0: unlimited), got NaN"},
		{"Inf rate", func(c *Config) { c.RatePerCaller = math.Inf(1) }, "gateway.rate_per_caller: must be a finite number not below 0 (0: unlimited), got +Inf"},
		{"NaN read rate", func(c *Config) { c.ReadRatePerCaller = math.NaN() }, "gateway.read_rate_per_caller: must be a finite number not below 0 (0: unlimited), got NaN"},
		{"Inf read rate", func(c *Config) { c.ReadRatePerCaller = math.Inf(1) }, "gateway.read_rate_per_caller: must be a finite number not below 0 (0: unlimited), got +Inf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.mod(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}
