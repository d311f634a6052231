package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/faultline/faultline/agents/preflight/webhook"
	"github.com/faultline/faultline/internal/config"
)

// webhookCmd is `faultline-preflight webhook [--config FILE] [flags]`.
func webhookCmd(ctx context.Context, args []string, _, stderr io.Writer) int {
	cfg := webhook.DefaultConfig()
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		cfg.Webhook.ServiceNamespace = ns
	}
	if _, err := config.Load("faultline-preflight webhook", args, &cfg, cfg.RegisterFlags, cfg.Validate, stderr, config.NoArgs()); err != nil {
		fmt.Fprintln(stderr, "faultline-preflight: webhook:", err)
		return 2
	}
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	s, err := webhook.New(cfg, log, webhook.Options{})
	if err != nil {
		fmt.Fprintln(stderr, "faultline-preflight: webhook:", err)
		return 1
	}
	if err := s.Run(ctx); err != nil {
		fmt.Fprintln(stderr, "faultline-preflight: webhook:", err)
		return 1
	}
	return 0
}
