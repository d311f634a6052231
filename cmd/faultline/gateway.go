package main

import (
	"context"
	"flag"
	"io"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/internal/kafka"
)

func runGateway(ctx context.Context, args []string, _, stderr io.Writer) error {
	cfg := DefaultConfig()
	if _, err := config.Load("faultline gateway", args, &cfg, func(fs *flag.FlagSet) {
		cfg.registerLogFlags(fs)
		cfg.Kafka.RegisterFlags(fs, "kafka.")
		cfg.Gateway.RegisterFlags(fs)
	}, func() error {
		if err := cfg.Kafka.Validate("kafka."); err != nil {
			return err
		}
		return cfg.Gateway.Validate()
	}, stderr); err != nil {
		return err
	}
	log, err := newLogger(stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}
	reg := newRegistry()
	topics, err := kafka.NewClient(cfg.Kafka, log)
	if err != nil {
		return err
	}
	err = kafka.EnsureTopics(ctx, topics, cfg.Kafka, kafka.PipelineTopics...)
	topics.Close()
	if err != nil {
		return err
	}
	srv, err := gateway.New(cfg.Gateway, cfg.Kafka, log, reg, gateway.Options{})
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
