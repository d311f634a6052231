// Command faultline-agent is the node agent: `faultline-agent [run] [flags]`
// runs the enabled checks and sends their events to the gateway; the other
// subcommands are operator tools that print, as JSON, what the agent would
// report for a given input.
//
// Subcommands are one table (commands below). To add one for a check
// (e.g. `faultline-agent kmsg parse [FILE]`), write a
// func(ctx, args, stdout, stderr) error in a file of this package and add a
// line to the table; checks themselves are registered in agents/agent
// (registry.go).
package main

import (
	"context"
	"errors"
	"flag"
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
	run   func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = []command{
	{"run", "run [--config FILE] [flags]   run the agent (the default)", runAgent},
	{"topology", "topology collect|parse ...   GPU↔NIC topology → gpu_metadata.json", topologyCmd},
	{"nic", "nic check --sysfs DIR --metadata FILE --once [--state-file F]   one NIC poll as JSON", nicCmd},
	{"kmsg", "kmsg parse [--utc] [--boot-time T] [FILE]   kernel log (any format, stdin without FILE) → events as JSON lines", kmsgCmd},
	{"fabric", "fabric parse [--kind K] [--nvswitches N] FILE...   Fabric Manager outputs (kind detected) → events as JSON lines", fabricCmd},
	{"gpu", "gpu check   one NVML health read (what the gpu check sees) as JSON", gpuCmd},
	{"state-dir", "state-dir --dir DIR --owner UID:GID   give the state directory to the user the agent runs as (the chart's init container)", stateDirCmd},
	{"host-zone", "host-zone --etc DIR --out DIR   copy the host's time zone out of its /etc (the chart's init container)", hostZoneCmd},
	{"machine-id", "machine-id --sysfs DIR --out DIR   copy the machine's system UUID where a non-root agent reads it (the chart's init container)", machineIDCmd},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "faultline-agent:", err)
		}
		os.Exit(1)
	}
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if version.Asked(args) {
		_, err := fmt.Fprintln(stdout, version.String("faultline-agent"))
		return err
	}
	if len(args) == 0 || (len(args[0]) > 0 && args[0][0] == '-' && args[0] != "-h" && args[0] != "--help") {
		return runAgent(ctx, args, stdout, stderr)
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprintln(stderr, "usage: faultline-agent <command> [args]")
	for _, c := range commands {
		fmt.Fprintln(stderr, "  faultline-agent "+c.usage)
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		return flag.ErrHelp
	}
	return fmt.Errorf("unknown command %q", args[0])
}
