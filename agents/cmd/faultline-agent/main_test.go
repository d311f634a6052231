package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/agents/gpu"
	"github.com/faultline/faultline/agents/nic/nictest"
	"github.com/faultline/faultline/agents/topology"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := dispatch(context.Background(), args, &out, &errb)
	return out.String(), err
}

func TestTopologyParseCommand(t *testing.T) {
	out, err := run(t, "topology", "parse", "../../topology/testdata/h100_dgx_tabs.txt")
	if err != nil {
		t.Fatal(err)
	}
	var md topology.Metadata
	if err := json.Unmarshal([]byte(out), &md); err != nil || len(md.GPUs) != 8 || len(md.NICTopology) != 12 {
		t.Fatalf("output %q: %v", out, err)
	}
	if _, err := run(t, "topology", "parse", "../../topology/testdata/err_bad_cell.txt"); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("bad input: %v", err)
	}
}

// TestTopologyCollectCommand runs collect against a fake nvidia-smi.
func TestTopologyCollectCommand(t *testing.T) {
	dir := t.TempDir()
	topo, _ := filepath.Abs("../../topology/testdata/ansi_colours.txt")
	smi := filepath.Join(dir, "nvidia-smi")
	script := "#!/bin/sh\nif [ \"$1\" = topo ]; then cat " + topo + "; else printf '0, 00000000:0F:00.0, GPU-a, 1\\n1, 00000000:15:00.0, GPU-b, 2\\n'; fi\n"
	if err := os.WriteFile(smi, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	outFile := filepath.Join(dir, "gpu_metadata.json")
	if _, err := run(t, "topology", "collect", "--nvidia-smi", smi, "--output", outFile, "--node-name", "n1"); err != nil {
		t.Fatal(err)
	}
	md, err := topology.Load(outFile)
	if err != nil || md.NodeName != "n1" || md.GPUs[1].PCIAddress != "0000:15:00.0" || len(md.NICTopology) != 2 {
		t.Fatalf("collected %+v, %v", md, err)
	}
}

// TestNICCheckCommand: --once prints NICs and events; with --state-file a
// second run reports only the transition.
func TestNICCheckCommand(t *testing.T) {
	dir := t.TempDir()
	tree, err := nictest.New(filepath.Join(dir, "sys"))
	if err != nil {
		t.Fatal(err)
	}
	p := nictest.GB200()
	if err := p.Build(tree); err != nil {
		t.Fatal(err)
	}
	meta := filepath.Join(dir, "gpu_metadata.json")
	topology.WriteFile(meta, p.Metadata)
	boot := filepath.Join(dir, "boot_id")
	os.WriteFile(boot, []byte("b1"), 0o644)
	state := filepath.Join(dir, "state.json")
	args := []string{"nic", "check", "--sysfs", tree.Root, "--metadata", meta, "--boot-id-path", boot, "--proc-net-route", filepath.Join(dir, "none"), "--once", "--state-file", state}
	out, err := run(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		NICs []struct {
			Name      string `json:"name"`
			Role      string `json:"role"`
			Monitored bool   `json:"monitored"`
		} `json:"nics"`
		Events []map[string]any `json:"events"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// 4 monitored ports: a state and a degradation baseline each; a first
	// poll's device and card baselines for their 4 devices and 4 cards;
	// and the 2 devices not monitored: a device, a port (both checks) and
	// a card baseline each (faults an earlier boot raised before they were
	// excluded are lifted).
	if len(rep.NICs) != 6 || len(rep.Events) != 24 {
		t.Fatalf("%d NICs, %d events\n%s", len(rep.NICs), len(rep.Events), out)
	}
	tree.SetPort("ibp3s0", 1, nictest.Down, nictest.Disabled)
	out, err = run(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	json.Unmarshal([]byte(out), &rep)
	if len(rep.Events) != 1 || rep.Events[0]["message"] != "Port ibp3s0 port 1: state DOWN, phys_state Disabled" ||
		rep.Events[0]["recommendedAction"] != "REPLACE_VM" {
		t.Fatalf("second run events: %v", rep.Events)
	}
}

func TestUnknownCommand(t *testing.T) {
	if _, err := run(t, "bogus"); err == nil {
		t.Error("unknown command accepted")
	}
	if _, err := run(t, "nic", "check", "--sysfs", t.TempDir(), "--metadata", "/nonexistent", "--once"); err == nil || !strings.Contains(err.Error(), "GPU metadata") {
		t.Errorf("missing metadata: %v", err)
	}
}

// TestFabricParseCommand: `fabric parse` prints what the fabric check
// would send (the scenario golden file of the fabric package), detects the
// kinds, and names the file and the problem on bad input.
func TestFabricParseCommand(t *testing.T) {
	td := "../../fabric/testdata/"
	out, err := run(t, "fabric", "parse", "--utc", "--year", "2024", "--now", "2024-10-28T12:00:00Z", "--nvswitches", "4",
		td+"smi/hgx-h100-topology.txt", td+"nvlink/h100-remote.txt", td+"fmlog/constructed-h100-sxid-access.log")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(td + "scenarios/h100-sxid-access-port.golden.jsonl")
	if out != string(want) {
		t.Errorf("output differs from the golden file:\n%s", out)
	}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"fabric", "parse", "--kind", "fm-logs", td + "fmlog/gpud-h100-runtime.log"}, `--kind "fm-logs" is not one of`},
		{[]string{"fabric", "parse", "main.go"}, "main.go: cannot tell what this file is; pass --kind"},
		{[]string{"fabric", "parse", "--kind", "nvswitch-audit", td + "smi/pcie-no-nvswitch.txt"}, "pcie-no-nvswitch.txt: nvswitch-audit: line 1: header cell"},
		{[]string{"fabric", "parse", td + "missing.log"}, "no such file"},
		{[]string{"fabric", "parse"}, "at least one FILE"},
		{[]string{"fabric", "check"}, "usage: fabric parse"},
	} {
		if _, err := run(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.msg)
		}
	}
}

// TestGPUCheckCommand: one NVML read. Without a GPU or driver (these
// machines) it says so; with one it prints the incidents as a JSON list.
func TestGPUCheckCommand(t *testing.T) {
	if _, err := run(t, "gpu"); err == nil || !strings.Contains(err.Error(), "usage: gpu check") {
		t.Errorf("gpu without check: %v, want the usage", err)
	}
	out, err := run(t, "gpu", "check")
	switch {
	case errors.Is(err, gpu.ErrNotPresent), err != nil && strings.Contains(err.Error(), "without cgo"):
		t.Logf("no NVML here: %v", err)
	case err != nil:
		t.Fatal(err)
	default:
		var incidents []gpu.Incident
		if err := json.Unmarshal([]byte(out), &incidents); err != nil || incidents == nil {
			t.Errorf("output %q: %v, want a JSON list", out, err)
		}
	}
}

// TestTopologyCollectTimeout: --timeout bounds collect against an
// nvidia-smi wrapper whose child hangs (the context had no deadline: the
// command never returned and gpu_metadata.json was never written); a
// --timeout not above zero is refused, naming the flag.
func TestTopologyCollectTimeout(t *testing.T) {
	dir := t.TempDir()
	smi := filepath.Join(dir, "nvidia-smi")
	if err := os.WriteFile(smi, []byte("#!/bin/sh\nsleep 30 & wait\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	outFile := filepath.Join(dir, "gpu_metadata.json")
	for _, tc := range []struct {
		timeout, wantErr string
	}{
		{"300ms", "topo -m"},
		{"0s", "--timeout"},
		{"-1s", "--timeout"},
	} {
		t.Run(tc.timeout, func(t *testing.T) {
			start := time.Now()
			_, err := run(t, "topology", "collect", "--nvidia-smi", smi, "--output", outFile, "--timeout", tc.timeout)
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("returned after %v (err %v)", took, err)
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}
