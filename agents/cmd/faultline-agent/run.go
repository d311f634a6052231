package main

import (
	"context"
	"io"
	"log/slog"
	"os"

	"github.com/faultline/faultline/agents/agent"
)

// runAgent is `faultline-agent run`: parse config, build the logger, Run.
func runAgent(ctx context.Context, args []string, _, stderr io.Writer) error {
	cfg, err := agent.LoadConfig("faultline-agent run", args, os.Getenv)
	if err != nil {
		return err
	}
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	a, err := agent.New(cfg, log, agent.Options{})
	if err != nil {
		return err
	}
	return a.Run(ctx)
}
