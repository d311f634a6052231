package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/faultline/faultline/agents/kmsg"
)

// kmsgCmd is `faultline-agent kmsg parse [flags] [FILE]`: the events the
// kmsg check would report for a kernel log, one JSON line per event.
func kmsgCmd(_ context.Context, args []string, stdout, _ io.Writer) error {
	if len(args) == 0 || args[0] != "parse" {
		return fmt.Errorf("usage: kmsg parse [--utc] [--boot-time RFC3339] [--year N] [FILE]")
	}
	return kmsg.ParseCommand(args[1:], os.Stdin, stdout)
}
