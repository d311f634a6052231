package checks

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGPUUUIDsWarningExit: nvidia-smi's exit 14 (infoROM corrupted, a
// warning after the full list) still lists the GPUs; without a GPU, or
// with another code, it is an error naming the code.
func TestGPUUUIDsWarningExit(t *testing.T) {
	const list = "echo 'WARNING: infoROM is corrupted at gpu 00000000:18:00.0'; echo GPU-aaa; echo GPU-bbb"
	for _, tc := range []struct {
		name, script string
		want         string // the UUIDs, or the error's text
	}{
		{"exit 0", list, "GPU-aaa,GPU-bbb"},
		{"exit 14 with the list", list + "; exit 14", "GPU-aaa,GPU-bbb"},
		{"exit 14 without a GPU", "echo 'WARNING: infoROM is corrupted at gpu 00000000:18:00.0'; exit 14", "nvidia-smi exited 14 and listed no GPU"},
		{"exit 15 with the list", list + "; exit 15", "nvidia-smi exited 15"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			smi := filepath.Join(t.TempDir(), "nvidia-smi")
			if err := os.WriteFile(smi, []byte("#!/bin/sh\n"+tc.script+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			uuids, err := gpuUUIDs(context.Background(), io.Discard, os.Environ(), smi)
			got := strings.Join(uuids, ",")
			if err != nil {
				got = err.Error()
			}
			if !strings.Contains(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
