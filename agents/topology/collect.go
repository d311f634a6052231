package topology

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/faultline/faultline/internal/groupcmd"
)

// smiWaitDelay is how long, after the context's end killed nvidia-smi's
// process group, its output is still waited for (a child that escaped the
// group, holding the pipe, does not hold Collect).
const smiWaitDelay = 2 * time.Second

// SMIWarningExit reports whether an nvidia-smi exit code is a warning
// that nvidia-smi gives after printing its full output, rather than a
// failure of the command. Only 14 is: "infoROM is corrupted" in the
// RETURN VALUE list of nvidia-smi(1) (NVML_ERROR_CORRUPTED_INFOROM),
// which nvidia-smi returns with its complete output and a "WARNING:
// infoROM is corrupted at gpu ..." line (NVIDIA/gpu-operator#285, and the
// GPU Operator troubleshooting page "infoROM is corrupted (nvidia-smi
// return code 14)"). The other codes of that list (2 invalid argument,
// 3 not supported, 4 no permission, 6 not found, 8 power cables, 9 driver
// not loaded, 10 IRQ issue, 12 NVML not found, 13 function not found,
// 15 GPU lost, 255 other) say the query itself failed.
func SMIWarningExit(code int) bool { return code == 14 }

// SMIWarning reports whether a command's error is nvidia-smi's warning
// exit (an *exec.ExitError with SMIWarningExit's code).
func SMIWarning(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && SMIWarningExit(ee.ExitCode())
}

// Collect runs `nvidia-smi topo -m` and the GPU query with the given binary
// (default "nvidia-smi" on PATH) and returns the parsed metadata. A failing
// GPU query only leaves the PCI addresses empty; a failing or unparseable
// topo -m is an error. A warning exit (SMIWarningExit: 14, infoROM
// corrupted) is accepted when the output parses and is complete (it
// reaches the Legend that nvidia-smi prints after the matrix); cut short,
// it is an error naming the exit code. nvidia-smi runs in a process group
// of its own (groupcmd): at ctx's end a wrapper (the GPU Operator's chroot
// into /run/nvidia/driver) is killed with its children.
func Collect(ctx context.Context, nvidiaSMI, nodeName string) (*Metadata, error) {
	if nvidiaSMI == "" {
		nvidiaSMI = "nvidia-smi"
	}
	var out, errb bytes.Buffer
	cmd := groupcmd.Command(ctx, smiWaitDelay, nvidiaSMI, "topo", "-m")
	cmd.Stdout, cmd.Stderr = &out, &errb
	warning := cmd.Run() // nil, or the warning exit topo -m gave
	if warning != nil {
		if !SMIWarning(warning) {
			return nil, fmt.Errorf("run %s topo -m: %w (stderr: %s)", nvidiaSMI, warning, bytes.TrimSpace(errb.Bytes()))
		}
		dropWarnings(&out)
		if !hasLegend(out.Bytes()) {
			return nil, fmt.Errorf("run %s topo -m: %v (a warning) with incomplete output: no Legend after the matrix (stderr: %s)", nvidiaSMI, warning, bytes.TrimSpace(errb.Bytes()))
		}
	}
	md, err := Parse(&out)
	if err != nil && warning != nil {
		return nil, fmt.Errorf("run %s topo -m: %v (a warning) with unreadable output: %w", nvidiaSMI, warning, err)
	}
	if err != nil {
		return nil, err
	}
	md.NodeName = nodeName
	if err := collectQuery(ctx, nvidiaSMI, md); err != nil {
		return nil, err
	}
	return md, nil
}

// collectQuery adds the GPU query's PCI addresses, UUIDs and serials to
// md; a failing query (not a warning exit) leaves them empty.
func collectQuery(ctx context.Context, nvidiaSMI string, md *Metadata) error {
	var out bytes.Buffer
	q := groupcmd.Command(ctx, smiWaitDelay, nvidiaSMI, "--query-gpu=index,pci.bus_id,uuid,serial", "--format=csv,noheader")
	q.Stdout = &out
	if err := q.Run(); err != nil {
		if !SMIWarning(err) {
			return nil
		}
		dropWarnings(&out)
	}
	return md.ParseGPUQuery(&out)
}

// dropWarnings removes the "WARNING: ..." lines (such as "WARNING:
// infoROM is corrupted at gpu 0000:0B:00.0") that nvidia-smi may print
// with a warning exit.
func dropWarnings(out *bytes.Buffer) {
	var kept []byte
	for _, l := range bytes.SplitAfter(out.Bytes(), []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("WARNING:")) {
			kept = append(kept, l...)
		}
	}
	out.Reset()
	out.Write(kept)
}

// hasLegend reports whether topo -m output reaches its "Legend:" line,
// which nvidia-smi prints after the whole matrix.
func hasLegend(b []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		if strings.HasPrefix(strings.TrimSpace(ansiRe.ReplaceAllString(sc.Text(), "")), "Legend:") {
			return true
		}
	}
	return false
}
