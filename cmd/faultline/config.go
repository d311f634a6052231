package main

import (
	"flag"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/processors"
)

// Config is the faultline binary's configuration; each command validates the
// parts it uses.
type Config struct {
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string `toml:"log_level"`
	// LogFormat is text or json. Default text.
	LogFormat  string            `toml:"log_format"`
	Kafka      kafka.Config      `toml:"kafka"`
	Gateway    gateway.Config    `toml:"gateway"`
	Processors processors.Config `toml:"processors"`
	Dev        DevConfig         `toml:"dev"`
}

// DefaultConfig returns every component's defaults.
func DefaultConfig() Config {
	return Config{
		LogLevel:   "info",
		LogFormat:  "text",
		Kafka:      kafka.DefaultConfig(),
		Gateway:    gateway.DefaultConfig(),
		Processors: processors.DefaultConfig(),
		Dev:        DefaultDevConfig(),
	}
}

func (c *Config) registerLogFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json")
}
