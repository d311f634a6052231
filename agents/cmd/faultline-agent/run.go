package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

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
	// SIGUSR1 runs every check now (the conformance check's "on request",
	// e.g. after OpenCHAMI remediated the node).
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-usr1:
				log.Info("SIGUSR1: running every check now")
				a.Trigger("")
			}
		}
	}()
	return a.Run(ctx)
}
