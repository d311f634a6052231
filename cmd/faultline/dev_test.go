package main

import (
	"math"
	"strings"
	"testing"
)

// TestDevConfigValidate: bad dev settings are refused naming the key and
// quoting the value, a NaN included (it compares false with every bound).
// Validate is called directly: a value it wrongly took would start the
// whole dev environment.
func TestDevConfigValidate(t *testing.T) {
	if err := DefaultDevConfig().validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*DevConfig)
		want string
	}{
		{"port", func(c *DevConfig) { c.KafkaPort = 70000 }, "dev.kafka_port: 70000 is not a port"},
		{"cluster name", func(c *DevConfig) { c.Cluster = "Dev" }, `dev.cluster: "Dev" is not a cluster name`},
		{"negative rate", func(c *DevConfig) { c.FleetRate = -1 }, "dev.fleet_rate: must be a finite number not below 0, got -1"},
		{"NaN rate", func(c *DevConfig) { c.FleetRate = math.NaN() }, "dev.fleet_rate: must be a finite number not below 0, got NaN"},
		{"Inf rate", func(c *DevConfig) { c.FleetRate = math.Inf(1) }, "dev.fleet_rate: must be a finite number not below 0, got +Inf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultDevConfig()
			tc.mod(&c)
			if err := c.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}
