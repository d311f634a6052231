package main

import (
	"flag"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors"
)

// Config is the faultline binary's configuration; each command validates the
// parts it uses. A key is named the same everywhere: its TOML path
// ("store.batch_records"), its flag (the path with "-" for "_":
// "--store.batch-records") and the errors that name it.
type Config struct {
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string `toml:"log_level"`
	// LogFormat is text or json. Default text.
	LogFormat string `toml:"log_format"`
	// LibraryLogLevel is the level of the libraries' own logs (the Kafka
	// client, ClickHouse driver, client-go): debug, info, warn or error. Default
	// log_level; `faultline dev` defaults it to warn, so its output is the
	// pipeline's decisions and summaries.
	LibraryLogLevel string `toml:"library_log_level"`
	// MetricsAddr serves /metrics, /healthz and /readyz of `faultline
	// process` (empty: off). Default 127.0.0.1:9464.
	MetricsAddr string       `toml:"metrics_addr"`
	Kafka       kafka.Config `toml:"kafka"`
	// Gateway is `faultline gateway` (and dev): flags --gateway.*.
	Gateway gateway.Config `toml:"gateway"`
	// Processors are the processor roles' sections ([clickhouse], [kube],
	// [store], [correlate], [quarantine], [drain], [remediate]) and role.
	processors.Processors
	// Dev is `faultline dev`: flags --dev.*.
	Dev DevConfig `toml:"dev"`
}

// DefaultConfig returns every component's defaults.
func DefaultConfig() Config {
	return Config{
		LogLevel:    "info",
		LogFormat:   "text",
		MetricsAddr: "127.0.0.1:9464",
		Kafka:       kafka.DefaultConfig(),
		Gateway:     gateway.DefaultConfig(),
		Processors:  processors.DefaultConfig(),
		Dev:         DefaultDevConfig(),
	}
}

func (c *Config) registerLogFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json")
	fs.StringVar(&c.LibraryLogLevel, "library-log-level", c.LibraryLogLevel, "level of the libraries' own logs (Kafka client, ClickHouse driver, client-go): debug, info, warn or error (default: log-level; faultline dev: warn)")
}

// registerGatewayFlags adds the gateway's flags under its section
// (--gateway.grpc-addr), the old bare spellings kept as deprecated.
func (c *Config) registerGatewayFlags(fs *flag.FlagSet) {
	config.Prefix(fs, "gateway.", c.Gateway.RegisterFlags)
}

// moved are keys of older faultline versions, with what to set instead.
var moved = config.Moved(map[string]string{
	"processors":            "the processor sections are top-level: [store], [correlate], [clickhouse], [kube], [quarantine], [drain], [remediate], and role",
	"processors.roles":      "use role at the top level",
	"processors.clickhouse": "use [clickhouse]",
	"processors.kube":       "use [kube]",
	"processors.store":      "use [store]",
	"processors.correlate":  "use [correlate]",
	"processors.quarantine": "use [quarantine]",
	"processors.drain":      "use [drain]",
	"processors.remediate":  "use [remediate]",
	"clickhouse.password":   "put the password in a file (clickhouse.password_file) or an environment variable (clickhouse.password_env); it is never a config value",
})
