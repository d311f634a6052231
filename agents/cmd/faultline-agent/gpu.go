package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/faultline/faultline/agents/gpu"
)

// gpuCmd reads the GPUs' health once through NVML, as the gpu check does,
// and prints the incidents as JSON (an empty list when all are healthy):
// whether NVML is reachable in this container, and what it reports.
func gpuCmd(ctx context.Context, args []string, stdout, _ io.Writer) error {
	if len(args) != 1 || args[0] != "check" {
		return fmt.Errorf("usage: gpu check")
	}
	incidents, err := gpu.NewNVML().Health(ctx)
	if err != nil {
		return err
	}
	if incidents == nil {
		incidents = []gpu.Incident{}
	}
	b, err := json.MarshalIndent(incidents, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\n", b)
	return err
}
