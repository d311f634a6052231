package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/faultline/faultline/agents/nic"
)

// nicCmd is `faultline-agent nic check --sysfs DIR --metadata FILE --once
// [--state-file F]`: the discovered NICs with role and monitoring decision
// and the events one poll emits, as JSON. Without --state-file nothing is
// persisted (every run is a first poll); with it, successive runs report
// transitions as the agent would. Without --once it polls every
// --state-polling-interval and prints one report per poll that has events.
func nicCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "check" {
		return fmt.Errorf("usage: nic check --sysfs DIR --metadata FILE --once [--state-file F]")
	}
	cfg := nic.DefaultConfig()
	cfg.StateFile = ""
	fs := flag.NewFlagSet("nic check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.RegisterFlags(fs, "")
	fs.StringVar(&cfg.MetadataPath, "metadata", cfg.MetadataPath, "alias of --metadata-path")
	once := fs.Bool("once", false, "poll once and exit")
	verbose := fs.Bool("v", false, "log to stderr")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	lvl := slog.LevelWarn
	if *verbose {
		lvl = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	c, err := nic.New(cfg, nic.Options{Logger: log})
	if err != nil {
		return err
	}
	for first := true; ; first = false {
		nics, evs, err := c.Poll(ctx)
		if err != nil {
			return err
		}
		if first || len(evs) > 0 {
			b, err := nic.MarshalReport(nics, evs)
			if err != nil {
				return err
			}
			if _, err := stdout.Write(b); err != nil {
				return err
			}
		}
		if err := c.Commit(); err != nil {
			return err
		}
		if *once {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(cfg.PollInterval):
		}
	}
}
