package topology

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCollectWarningExit runs Collect against a fake nvidia-smi that
// prints a topo -m output and exits with a code: a warning exit (14,
// infoROM corrupted) with a complete matrix is parsed; cut short or
// garbled, or any other non-zero exit, it is an error naming the code.
func TestCollectWarningExit(t *testing.T) {
	read := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join("testdata", name+".txt"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	lines := func(s string, n int) string { return strings.Join(strings.SplitAfter(s, "\n")[:n], "") }
	h100, single := read("h100_dgx_tabs"), read("single_gpu_no_nics")
	const warning = "WARNING: infoROM is corrupted at gpu 00000000:0F:00.0\n"
	for _, tc := range []struct {
		name    string
		topo    string
		code    int
		wantErr string // "" parses
		gpus    int
	}{
		{"exit 0", h100, 0, "", 8},
		{"exit 14, complete", h100, 14, "", 8},
		{"exit 14, complete after a WARNING line", warning + h100, 14, "", 8},
		{"exit 14, cut in the NIC rows", lines(h100, 12), 14, "exit status 14 (a warning) with incomplete output", 0},
		{"exit 14, cut before the Legend", lines(single, 3), 14, "exit status 14 (a warning) with incomplete output", 0},
		{"exit 14, garbled", read("err_bad_cell"), 14, "exit status 14 (a warning) with unreadable output", 0},
		{"exit 15 (GPU lost), complete", h100, 15, "exit status 15", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			topo := filepath.Join(dir, "topo.txt")
			if err := os.WriteFile(topo, []byte(tc.topo), 0o644); err != nil {
				t.Fatal(err)
			}
			code := strconv.Itoa(tc.code)
			smi := filepath.Join(dir, "nvidia-smi")
			query := "0, 00000000:0F:00.0, GPU-a, 1\n"
			if tc.code != 0 {
				query = warning + query
			}
			script := "#!/bin/sh\nif [ \"$1\" = topo ]; then cat '" + topo + "'; exit " + code + "; fi\n" +
				"printf '%s' '" + query + "'; exit " + code + "\n"
			if err := os.WriteFile(smi, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			md, err := Collect(context.Background(), smi, "n1")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(md.GPUs) != tc.gpus || md.NodeName != "n1" {
				t.Fatalf("collected %d GPUs, node %q", len(md.GPUs), md.NodeName)
			}
			if md.GPUs[0].UUID != "GPU-a" {
				t.Errorf("GPU0 = %+v, want the GPU query's UUID", md.GPUs[0])
			}
		})
	}
}

// TestCollectStopsAtItsDeadline: an nvidia-smi wrapper (the GPU
// Operator's chroot into /run/nvidia/driver) whose child hangs holding
// the output returns soon after the context's end, its child killed with
// it — the child's pipe kept Collect, and `topology collect`, until the
// child ended.
func TestCollectStopsAtItsDeadline(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		wantErr      string // "" collects the matrix without the query's PCI addresses
	}{
		{"topo -m hangs", "#!/bin/sh\nsleep 30 & wait\n", "topo -m: signal: killed"},
		{"the GPU query hangs", "#!/bin/sh\nif [ \"$1\" = topo ]; then cat '" + testdataPath(t, "h100_dgx_tabs") + "'; exit 0; fi\nsleep 30 & wait\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			smi := filepath.Join(t.TempDir(), "nvidia-smi")
			if err := os.WriteFile(smi, []byte(tc.script), 0o755); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			md, err := Collect(ctx, smi, "n1")
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("returned after %v (err %v); want soon after the deadline", took, err)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || len(md.GPUs) != 8 || md.GPUs[0].PCIAddress != "" {
				t.Fatalf("collected %+v, %v; want the matrix's 8 GPUs, no PCI addresses", md, err)
			}
		})
	}
}

func testdataPath(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name+".txt"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}
