package main

import (
	"context"
	"fmt"
	"io"

	"github.com/faultline/faultline/agents/fabric"
)

// fabricCmd is `faultline-agent fabric parse [flags] FILE...`: the events
// the fabric check would report for recorded outputs, one JSON line each.
func fabricCmd(_ context.Context, args []string, stdout, _ io.Writer) error {
	if len(args) == 0 || args[0] != "parse" {
		return fmt.Errorf("usage: fabric parse [--kind fm-log|journal|nvidia-smi-q|systemctl|...] [--nvswitches N] FILE...")
	}
	return fabric.ParseCommand(args[1:], stdout)
}
