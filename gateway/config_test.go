package gateway

import (
	"math"
	"strings"
	"testing"
	"time"
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
		{"skew past a day", func(c *Config) { c.MaxFutureSkew = 48 * time.Hour }, "gateway.max_future_skew: must be between 1m0s and 24h0m0s, got 48h0m0s"},
		{"negative skew", func(c *Config) { c.MaxFutureSkew = -time.Second }, "gateway.max_future_skew: must be between 1m0s and 24h0m0s, got -1s"},
		{"skew under a minute", func(c *Config) { c.MaxFutureSkew = time.Second }, "gateway.max_future_skew: must be between 1m0s and 24h0m0s, got 1s"},
		{"decoded budget under the largest request", func(c *Config) { c.MaxDecodedBytes = 16 << 20 }, "gateway.max_decoded_bytes: must be at least 28580608 (what the largest request gateway.max_batch and gateway.max_body_bytes allow may decode into), got 16777216"},
		{"producer bytes under the largest request", func(c *Config) { c.MaxBufferedBytes = 4 << 20 }, "gateway.max_buffered_bytes: must be at least 5218304 (what the largest request gateway.max_batch and gateway.max_body_bytes allow encodes into), got 4194304"},
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
