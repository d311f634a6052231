package main

import (
	"context"
	"fmt"
	"io"

	"github.com/faultline/faultline/agents/preflight/checks"
)

// checkCmd is `faultline-preflight check NAME [flags]`.
func checkCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "" || args[0][0] == '-' {
		fmt.Fprintln(stderr, "usage: faultline-preflight check dcgm-diag|nccl-loopback|nccl-allreduce [--config FILE] [flags]")
		return checks.ExitConfig
	}
	return checks.Main(ctx, args[0], args[1:], checks.Options{Stdout: stdout, Stderr: stderr})
}
