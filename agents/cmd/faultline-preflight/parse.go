package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/faultline/faultline/agents/preflight/dcgm"
	"github.com/faultline/faultline/agents/preflight/nccl"
	"github.com/faultline/faultline/internal/config"
)

// parseConfig is the configuration of `faultline-preflight parse`.
type parseConfig struct {
	DCGM struct {
		// GPUs are the DCGM GPU ids the diagnostic ran on, for DCGM 3.x
		// tables that say "All" (default: the GPUs the output names).
		GPUs string `toml:"gpus"`
	} `toml:"dcgm"`
}

// parseCmd is `faultline-preflight parse dcgm|nccl FILE`: one JSON object
// on stdout; unreadable input exits 2 naming the line.
func parseCmd(_ context.Context, args []string, stdout, stderr io.Writer) int {
	usage := "usage: faultline-preflight parse dcgm|nccl [--dcgm.gpus 0,1] FILE"
	if len(args) == 0 || (args[0] != "dcgm" && args[0] != "nccl") {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	kind := args[0]
	var cfg parseConfig
	var gpus []int
	rest, err := config.Load("faultline-preflight parse "+kind, args[1:], &cfg, func(fs *flag.FlagSet) {
		fs.StringVar(&cfg.DCGM.GPUs, "dcgm.gpus", cfg.DCGM.GPUs, "DCGM GPU ids the diagnostic ran on (for 3.x \"All\")")
	}, func() error {
		for _, p := range strings.Split(cfg.DCGM.GPUs, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			n, err := strconv.Atoi(p)
			if err != nil || n < 0 {
				return fmt.Errorf("dcgm.gpus: %q is not a GPU id", p)
			}
			gpus = append(gpus, n)
		}
		return nil
	}, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "faultline-preflight: parse:", err)
		return 2
	}
	if len(rest) != 1 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	f, err := os.Open(rest[0])
	if err != nil {
		fmt.Fprintln(stderr, "faultline-preflight: parse:", err)
		return 2
	}
	defer f.Close()
	var out any
	switch kind {
	case "dcgm":
		out, err = dcgm.Parse(f, dcgm.Options{GPUs: gpus})
	case "nccl":
		out, err = nccl.Parse(f)
	}
	if err != nil {
		var pd *dcgm.ParseError
		var pn *nccl.ParseError
		if errors.As(err, &pd) || errors.As(err, &pn) {
			fmt.Fprintf(stderr, "faultline-preflight: parse %s %s: %v\n", kind, rest[0], err)
			return 2
		}
		fmt.Fprintln(stderr, "faultline-preflight: parse:", err)
		return 2
	}
	enc := json.NewEncoder(stdout)
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(stderr, "faultline-preflight: parse:", err)
		return 1
	}
	return 0
}
