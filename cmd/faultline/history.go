package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/faultline/faultline/internal/analytics"
	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/config"
)

// runMigrate is `faultline migrate [--status] [--cluster NAME]`.
func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := DefaultConfig()
	var status bool
	if _, err := config.Load("faultline migrate", args, &cfg, func(fs *flag.FlagSet) {
		cfg.registerLogFlags(fs)
		cfg.Processors.ClickHouse.RegisterFlags(fs, "clickhouse.")
		fs.BoolVar(&status, "status", false, "list applied and pending migrations; apply nothing")
		fs.StringVar(&cfg.Processors.ClickHouse.Cluster, "cluster", cfg.Processors.ClickHouse.Cluster,
			"apply the schema ON CLUSTER NAME: Replicated tables and Distributed tables over them (same as --clickhouse.cluster)")
	}, func() error {
		return cfg.Processors.ClickHouse.Validate("clickhouse.")
	}, stderr, moved, config.NoArgs()); err != nil {
		return err
	}
	log, err := newLogger(stderr, cfg)
	if err != nil {
		return err
	}
	return clickhouse.MigrateCommand(ctx, cfg.Processors.ClickHouse, status, stdout, log)
}

// runQuery is `faultline query NAME [--param k=v]... [--format table|json|csv]`
// and `faultline query --list`.
func runQuery(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	cfg := DefaultConfig()
	params := analytics.Params{}
	format, list := "table", false
	rest, err := config.Load("faultline query", args, &cfg, func(fs *flag.FlagSet) {
		cfg.registerLogFlags(fs)
		cfg.Processors.ClickHouse.RegisterFlags(fs, "clickhouse.")
		fs.Var(params, "param", "query parameter k=v (repeatable; see --list)")
		fs.StringVar(&format, "format", format, "output format: table, json or csv")
		fs.BoolVar(&list, "list", false, "list the named queries and their parameters")
	}, func() error {
		return cfg.Processors.ClickHouse.Validate("clickhouse.")
	}, stderr, moved)
	if err != nil {
		return err
	}
	if list {
		return analytics.List(stdout)
	}
	if name == "" && len(rest) > 0 {
		name, rest = rest[0], rest[1:]
	}
	if name == "" || len(rest) > 0 {
		return fmt.Errorf("usage: faultline query NAME [--param k=v]... [--format table|json|csv] (or --list)")
	}
	log, err := newLogger(stderr, cfg)
	if err != nil {
		return err
	}
	return analytics.QueryCommand(ctx, cfg.Processors.ClickHouse, name, params, format, stdout, log)
}
