package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/faultline/faultline/agents/topology"
)

// topologyCmd is `faultline-agent topology parse [FILE|-]` (print the
// gpu_metadata.json of a saved `nvidia-smi topo -m` output) and
// `faultline-agent topology collect` (run nvidia-smi, write the file
// atomically; --timeout bounds the nvidia-smi runs, killed with their
// children past it).
func topologyCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: topology parse [FILE|-] | topology collect [--nvidia-smi PATH] [--output FILE] [--node-name NAME] [--timeout D]")
	}
	switch args[0] {
	case "parse":
		fs := flag.NewFlagSet("topology parse", flag.ContinueOnError)
		fs.SetOutput(stderr)
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		in := io.Reader(os.Stdin)
		if fs.NArg() > 0 && fs.Arg(0) != "-" {
			f, err := os.Open(fs.Arg(0))
			if err != nil {
				return err
			}
			defer f.Close()
			in = f
		}
		md, err := topology.Parse(in)
		if err != nil {
			return err
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(md)
	case "collect":
		fs := flag.NewFlagSet("topology collect", flag.ContinueOnError)
		fs.SetOutput(stderr)
		smi := fs.String("nvidia-smi", "nvidia-smi", "nvidia-smi binary")
		out := fs.String("output", "/var/lib/nvsentinel/gpu_metadata.json", "metadata file to write (atomically)")
		node := fs.String("node-name", os.Getenv("NODE_NAME"), "node name recorded in the file")
		timeout := fs.Duration("timeout", 2*time.Minute, "how long nvidia-smi may run (topo -m and the GPU query together)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *timeout <= 0 {
			return fmt.Errorf("--timeout: must be positive, got %v", *timeout)
		}
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		md, err := topology.Collect(ctx, *smi, *node)
		if err != nil {
			return err
		}
		if err := topology.WriteFile(*out, md); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "wrote %s: %d GPUs, %d NICs\n", *out, len(md.GPUs), len(md.NICTopology))
		return nil
	}
	return fmt.Errorf("unknown topology command %q (parse, collect)", args[0])
}
