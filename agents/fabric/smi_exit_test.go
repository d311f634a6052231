package fabric

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunSMIWarningExit: nvidia-smi's exit 14 (infoROM corrupted, a
// warning after its whole output) with output is no error, for the check's
// runs and CollectSwitchLinks; without output, or another code, it is.
func TestRunSMIWarningExit(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		wantErr      string // "" succeeds
	}{
		{"exit 14 with output", "echo 'GPU 00000000:18:00.0'; echo 'WARNING: infoROM is corrupted at gpu 00000000:18:00.0'; exit 14", ""},
		{"exit 14 without output", "exit 14", "exit status 14"},
		{"exit 15 with output", "echo 'GPU 00000000:18:00.0'; exit 15", "exit status 15"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			smi := filepath.Join(t.TempDir(), "nvidia-smi")
			if err := os.WriteFile(smi, []byte("#!/bin/sh\n"+tc.script+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			c := &Check{cfg: Config{Runner: ExecRunner{}, NvidiaSMI: smi}}
			out, err := c.run(context.Background(), smi, "-q")
			_, lerr := CollectSwitchLinks(context.Background(), ExecRunner{}, smi)
			if tc.wantErr == "" {
				if err != nil || lerr != nil || !strings.Contains(string(out), "GPU 00000000:18:00.0") {
					t.Fatalf("run: %q, %v; CollectSwitchLinks: %v", out, err, lerr)
				}
				return
			}
			for _, e := range []error{err, lerr} {
				if e == nil || !strings.Contains(e.Error(), tc.wantErr) {
					t.Errorf("err = %v, want it to contain %q", e, tc.wantErr)
				}
			}
		})
	}
}
