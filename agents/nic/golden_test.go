package nic

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/faultline/faultline/agents/nic/nictest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.json")

// TestReportGolden: discovery and first-poll output of each platform,
// compared with testdata/<platform>.golden.json (the sysfs parser's golden
// files; regenerate with -update).
func TestReportGolden(t *testing.T) {
	for _, p := range []nictest.Platform{nictest.A100OCI(), nictest.H100OCI(), nictest.L40SOCI(),
		nictest.OnPremL40S(true), nictest.GB200(), nictest.System34()} {
		t.Run(p.Name, func(t *testing.T) {
			e := setup(t, p)
			nics, evs, err := e.check().Poll(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			got, err := MarshalReport(nics, evs)
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", p.Name+".golden.json")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update)", err)
			}
			if string(got) != string(want) {
				t.Errorf("output differs from %s; run go test -run TestReportGolden -update and review the diff", golden)
			}
		})
	}
}
