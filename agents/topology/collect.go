package topology

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
)

// Collect runs `nvidia-smi topo -m` and the GPU query with the given binary
// (default "nvidia-smi" on PATH) and returns the parsed metadata. A failing
// GPU query only leaves the PCI addresses empty; a failing or unparseable
// topo -m is an error.
func Collect(ctx context.Context, nvidiaSMI, nodeName string) (*Metadata, error) {
	if nvidiaSMI == "" {
		nvidiaSMI = "nvidia-smi"
	}
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, nvidiaSMI, "topo", "-m")
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("run %s topo -m: %w (stderr: %s)", nvidiaSMI, err, bytes.TrimSpace(errb.Bytes()))
	}
	md, err := Parse(&out)
	if err != nil {
		return nil, err
	}
	md.NodeName = nodeName
	out.Reset()
	errb.Reset()
	q := exec.CommandContext(ctx, nvidiaSMI, "--query-gpu=index,pci.bus_id,uuid,serial", "--format=csv,noheader")
	q.Stdout, q.Stderr = &out, &errb
	if err := q.Run(); err == nil {
		if err := md.ParseGPUQuery(&out); err != nil {
			return nil, err
		}
	}
	return md, nil
}
