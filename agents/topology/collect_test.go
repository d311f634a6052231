package topology

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
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
