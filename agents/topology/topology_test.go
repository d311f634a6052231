package topology

import (
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// TestParseGolden parses every testdata/*.txt and compares the JSON with
// testdata/*.golden.json; files named err_* must fail with a line-numbered
// error recorded in testdata/*.golden.err.
func TestParseGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".txt")
		t.Run(name, func(t *testing.T) {
			in, err := os.Open(f)
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()
			md, perr := Parse(in)
			var got []byte
			golden := strings.TrimSuffix(f, ".txt")
			if strings.HasPrefix(name, "err_") {
				if perr == nil {
					t.Fatalf("parse succeeded, want an error")
				}
				var pe *ParseError
				if !errors.As(perr, &pe) {
					t.Fatalf("error %v is not a *ParseError", perr)
				}
				got = []byte(perr.Error() + "\n")
				golden += ".golden.err"
			} else {
				if perr != nil {
					t.Fatalf("parse: %v", perr)
				}
				got, _ = json.MarshalIndent(md, "", "  ")
				got = append(got, '\n')
				golden += ".golden.json"
			}
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("read golden (run with -update): %v", err)
			}
			if string(want) != string(got) {
				t.Errorf("mismatch with %s\n--- got\n%s\n--- want\n%s", golden, got, want)
			}
		})
	}
}

// TestParseFacts checks the facts each field-validation platform depends on,
// independent of the golden files.
func TestParseFacts(t *testing.T) {
	load := func(name string) *Metadata {
		t.Helper()
		f, err := os.Open(filepath.Join("testdata", name+".txt"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		md, err := Parse(f)
		if err != nil {
			t.Fatal(err)
		}
		return md
	}
	h := load("h100_dgx_tabs")
	if len(h.GPUs) != 8 || len(h.NICTopology) != 12 {
		t.Fatalf("h100: %d GPUs, %d NICs", len(h.GPUs), len(h.NICTopology))
	}
	if got := h.NICTopology["mlx5_3"][1]; got != "PXB" {
		t.Errorf("h100 mlx5_3 to GPU1 = %q, want PXB", got)
	}
	if h.GPUs[5].NUMANode != 1 || h.GPUs[5].CPUAffinity != "56-111,168-223" {
		t.Errorf("h100 GPU5 = %+v", h.GPUs[5])
	}
	r := load("legend_remap_spaces")
	if got := r.NICTopology["mlx5_4"]; strings.Join(got, ",") != "PXB,PXB,SYS,SYS" {
		t.Errorf("legend remap: NIC0 is mlx5_4, got %v", got)
	}
	g := load("gb200_grace")
	if g.GPUs[2].NUMANode != 1 || len(g.GPUs[2].NUMANodes) != 17 || g.GPUs[2].GPUNUMAID == nil || *g.GPUs[2].GPUNUMAID != 18 {
		t.Errorf("gb200 GPU2 = %+v", g.GPUs[2])
	}
	if set := g.NUMASet(); !set[0] || !set[1] || !set[17] {
		t.Errorf("gb200 NUMA set = %v", set)
	}
	o := load("old_named_nics")
	if got := o.NICTopology["mlx5_1"]; strings.Join(got, ",") != "SYS,PHB" {
		t.Errorf("old format mlx5_1 = %v (SOC must read as SYS)", got)
	}
	if o.GPUs[0].NUMANode != -1 {
		t.Errorf("old format has no NUMA column, got %d", o.GPUs[0].NUMANode)
	}
	v := load("vm_numa_na")
	if len(v.NUMASet()) != 0 || v.GPUs[1].NUMANode != -1 {
		t.Errorf("vm: N/A must be -1: %+v", v.GPUs)
	}
	s := load("single_gpu_no_nics")
	if len(s.GPUs) != 1 || len(s.NICTopology) != 0 {
		t.Errorf("single: %+v", s)
	}
}

func TestParseGPUQuery(t *testing.T) {
	md := &Metadata{GPUs: []GPU{{GPUID: 0}, {GPUID: 1}}}
	err := md.ParseGPUQuery(strings.NewReader("0, 00000000:0F:00.0, GPU-aaa, 1650000000001\n1, 00000000:15:00.0, GPU-bbb, [N/A]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if md.GPUs[0].PCIAddress != "0000:0f:00.0" || md.GPUs[1].UUID != "GPU-bbb" || md.GPUs[1].SerialNumber != "" {
		t.Errorf("got %+v", md.GPUs)
	}
}
