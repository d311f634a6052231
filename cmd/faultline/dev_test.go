package main

import (
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faultline/faultline/gateway"
)

// TestDevConfigValidate: bad dev settings are refused naming the key and
// quoting the value, a NaN included (it compares false with every bound).
// The fleet's rate must be above 0 (fleetsim would read 0 as its default,
// 20) and fit the gateway: every batch past gateway.max_batch would be
// refused, every event past gateway.rate_per_caller throttled. Validate is
// called directly: a value it wrongly took would start the whole dev
// environment.
func TestDevConfigValidate(t *testing.T) {
	gw := gateway.DefaultConfig()
	if err := DefaultDevConfig().validate(gw); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	smallBatch := gw
	smallBatch.MaxBatch = 10
	slowCaller := gw
	slowCaller.RatePerCaller = 50
	unlimited := gw
	unlimited.RatePerCaller = 0
	for _, tc := range []struct {
		name string
		mod  func(*DevConfig)
		gw   gateway.Config
		want string // empty: valid
	}{
		{"port", func(c *DevConfig) { c.KafkaPort = 70000 }, gw, "dev.kafka_port: 70000 is not a port"},
		{"cluster name", func(c *DevConfig) { c.Cluster = "Dev" }, gw, `dev.cluster: "Dev" is not a cluster name`},
		{"negative rate", func(c *DevConfig) { c.FleetRate = -1 }, gw, "dev.fleet_rate: must be more than 0 and at most 10000 (gateway.max_batch (1000) × 10 batches a second), got -1"},
		{"zero rate", func(c *DevConfig) { c.FleetRate = 0 }, gw, "dev.fleet_rate: must be more than 0 and at most 10000"},
		{"NaN rate", func(c *DevConfig) { c.FleetRate = math.NaN() }, gw, "dev.fleet_rate: must be more than 0 and at most 10000 (gateway.max_batch (1000) × 10 batches a second), got NaN"},
		{"Inf rate", func(c *DevConfig) { c.FleetRate = math.Inf(1) }, gw, "got +Inf"},
		{"rate past the batch", func(c *DevConfig) { c.FleetRate = 10001 }, gw, "dev.fleet_rate: must be more than 0 and at most 10000 (gateway.max_batch (1000) × 10 batches a second), got 10001"},
		{"huge rate", func(c *DevConfig) { c.FleetRate = 1e12 }, unlimited, "got 1e+12"},
		{"rate at the batch", func(c *DevConfig) { c.FleetRate = 10000 }, gw, ""},
		{"rate past a smaller batch", func(c *DevConfig) { c.FleetRate = 101 }, smallBatch, "at most 100 (gateway.max_batch (10) × 10 batches a second), got 101"},
		{"rate past the caller's rate", func(c *DevConfig) { c.FleetRate = 51 }, slowCaller, "dev.fleet_rate: must be more than 0 and at most 50 (gateway.rate_per_caller), got 51"},
		{"no fleet, no rate", func(c *DevConfig) { c.FleetNodes, c.FleetRate = 0, 0 }, gw, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultDevConfig()
			tc.mod(&c)
			err := c.validate(tc.gw)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("err %v, want none", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

// TestDevRefusesUnusedKeys: a key `faultline dev` would override or ignore
// (it starts its own Kafka and ClickHouse, writes its own tokens file,
// has one cluster and is the only janitor), set by a flag or in the
// --config file, is refused naming it, and so is [kafka] that is invalid;
// without them (make run: no flags) nothing is refused. Each case fails
// in config.Load, before anything starts.
func TestDevRefusesUnusedKeys(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"clickhouse.addr flag", []string{"--clickhouse.addr", "ch:9000"}, "clickhouse.addr (--clickhouse.addr): not used by faultline dev: it starts its own ClickHouse server"},
		{"clickhouse.addr in file", []string{"--config", file("ch.toml", "[clickhouse]\naddr = \"ch:9000\"\n")}, "clickhouse.addr: not used by faultline dev: it starts its own ClickHouse server"},
		{"clickhouse.tls flag", []string{"--clickhouse.tls.enabled"}, "clickhouse.tls (--clickhouse.tls.enabled): not used by faultline dev"},
		{"tokens file flag", []string{"--gateway.tokens-file", "/etc/tokens"}, "gateway.tokens_file (--gateway.tokens-file): not used by faultline dev: it writes its own tokens file"},
		{"tokens file old flag", []string{"--tokens-file", "/etc/tokens"}, "gateway.tokens_file (--tokens-file): not used by faultline dev"},
		{"tokens file in file", []string{"--config", file("tok.toml", "[gateway]\ntokens_file = \"/etc/tokens\"\n")}, "gateway.tokens_file: not used by faultline dev"},
		{"kube.clusters flag", []string{"--kube.clusters", "prod=/kc"}, "kube.clusters (--kube.clusters): not used by faultline dev: its one cluster is dev.cluster"},
		{"kube.clusters in file", []string{"--config", file("kube.toml", "[[kube.clusters]]\nname = \"prod\"\nkubeconfig = \"/kc\"\n")}, "kube.clusters: not used by faultline dev"},
		{"kafka brokers in file", []string{"--config", file("kb.toml", "[kafka]\nbrokers = \"k:9092\"\n")}, "kafka.brokers: not used by faultline dev: it starts its own Kafka broker"},
		{"kafka tls in file", []string{"--config", file("kt.toml", "[kafka.tls]\nenabled = true\n")}, "kafka.tls: not used by faultline dev: its own Kafka broker speaks plaintext"},
		{"kafka sasl in file", []string{"--config", file("ks.toml", "[kafka]\nsasl = { mechanism = \"PLAIN\" }\n")}, "kafka.sasl: not used by faultline dev"},
		{"bad kafka in file", []string{"--config", file("kp.toml", "[kafka]\npartitions = 0\n")}, "kafka.partitions: must be at least 1"},
		{"leader election flag", []string{"--janitor.leader-election"}, "janitor.leader_election (--janitor.leader-election): not used by faultline dev"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadDevConfig(tc.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	// make run's flags (none) and the ones TestDev passes.
	for _, args := range [][]string{nil, {"--dev.dir", dir, "--dev.kafka-port", "0", "--dev.clickhouse-port", "0",
		"--gateway.http-addr", "127.0.0.1:0", "--gateway.grpc-addr", "127.0.0.1:0", "--dev.fleet-nodes", "0", "--log-level", "warn"}} {
		cfg, err := loadDevConfig(args, io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		if want := filepath.Join(cfg.Dev.Dir, "tokens"); cfg.Gateway.TokensFile != want {
			t.Fatalf("%q: tokens file %q, want %q", args, cfg.Gateway.TokensFile, want)
		}
	}
}
