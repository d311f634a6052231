// Command faultline-preflight is ADR-026's preflight checks in one binary:
//
//	faultline-preflight webhook [--config FILE] [flags]      the mutating admission webhook and the gang controller
//	faultline-preflight check dcgm-diag|nccl-loopback|nccl-allreduce [flags]
//	                                                         one check, in an injected init container (exit 0/1/2)
//	faultline-preflight parse dcgm|nccl FILE                 what a check would read from a saved output, as JSON
//	faultline-preflight --version                            the version and source revision
//
// main only dispatches; each subcommand loads its own typed configuration.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/faultline/faultline/internal/version"
)

type command struct {
	name  string
	usage string
	run   func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

var commands = []command{
	{"webhook", "webhook [--config FILE] [flags]   serve the admission webhook and run the gang controller", webhookCmd},
	{"check", "check dcgm-diag|nccl-loopback|nccl-allreduce [--config FILE] [flags]   run one check (exit 0 pass, 1 fail, 2 config error)", checkCmd},
	{"parse", "parse dcgm|nccl [--dcgm.gpus 0,1] FILE   print the parsed result as JSON (exit 2 on unreadable input)", parseCmd},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if version.Asked(args) {
		fmt.Fprintln(stdout, version.String("faultline-preflight"))
		return 0
	}
	if len(args) > 0 {
		for _, c := range commands {
			if c.name == args[0] {
				return c.run(ctx, args[1:], stdout, stderr)
			}
		}
	}
	fmt.Fprintln(stderr, "usage: faultline-preflight <command> [args]")
	for _, c := range commands {
		fmt.Fprintln(stderr, "  faultline-preflight "+c.usage)
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		return 0
	}
	fmt.Fprintf(stderr, "faultline-preflight: unknown command %q\n", args[0])
	return 2
}
