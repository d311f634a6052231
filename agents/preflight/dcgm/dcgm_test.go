package dcgm

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// goldenView adds to the `parse dcgm` JSON what the runner uses but the
// operator command does not print.
type goldenView struct {
	Result           *Result  `json:"result"`
	Format           string   `json:"format"`
	Version          string   `json:"version"`
	DeviceCount      int      `json:"deviceCount"`
	DiagnosticErrors []string `json:"diagnosticErrors"`
	Warnings         []string `json:"warnings"`
}

// TestGolden parses every published dcgmi output in testdata (sources in
// testdata/README.md) and compares with its golden file.
func TestGolden(t *testing.T) {
	var files []string
	for _, g := range []string{"testdata/table-*.txt", "testdata/json-*.json"} {
		m, _ := filepath.Glob(g)
		for _, f := range m {
			if !strings.HasSuffix(f, ".golden.json") {
				files = append(files, f)
			}
		}
	}
	if len(files) < 8 {
		t.Fatalf("testdata incomplete: %v", files)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			res, err := Parse(bytes.NewReader(b), Options{})
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			v := goldenView{Result: res, Format: res.Format, Version: res.Version, DeviceCount: res.DeviceCount,
				DiagnosticErrors: []string{}, Warnings: []string{}}
			for _, tt := range res.Tests {
				if tt.DiagnosticError() {
					v.DiagnosticErrors = append(v.DiagnosticErrors, tt.Name)
				}
				for _, w := range tt.Warnings {
					v.Warnings = append(v.Warnings, w.Text)
				}
			}
			got, _ := json.MarshalIndent(v, "", "  ")
			got = append(got, '\n')
			golden := path[:len(path)-len(filepath.Ext(path))] + ".golden.json"
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("output differs from %s:\n%s", golden, got)
			}
		})
	}
}

func parseFile(t *testing.T, name string, opt Options) *Result {
	t.Helper()
	f, err := os.Open("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := Parse(f, opt)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return r
}

// TestSemantics states the facts each published output must yield.
func TestSemantics(t *testing.T) {
	// DCGM 3.3.8: GPU Memory "Fail - All" on 8 GPUs, each with a CUDA
	// init warning (a real failure, not the diagnostic's own); the
	// wrapped warnings join back into DCGM's sentence.
	r := parseFile(t, "table-3.3.8-cuda-init-fail.txt", Options{})
	if r.Overall != Fail || !r.HardwareFault || !slices.Equal(r.FailedTests, []string{"GPU Memory"}) ||
		!slices.Equal(r.FailedGPUs, []int{0, 1, 2, 3, 4, 5, 6, 7}) || r.Version != "3.3.8" || r.DeviceCount != 8 {
		t.Errorf("3.3.8: %+v", r)
	}
	mem := r.Tests[slices.IndexFunc(r.Tests, func(t Test) bool { return t.Name == "GPU Memory" })]
	if len(mem.Warnings) != 8 || mem.Warnings[3].GPU != 3 ||
		!strings.Contains(mem.Warnings[0].Text, "Restart DCGM. Rerun diagnostics. Unable to initialize CUDA library: 'system not yet initialized'") ||
		!strings.HasSuffix(mem.Warnings[0].Text, "Refer to https://github.com/nvidia/cuda-samples") {
		t.Errorf("3.3.8 warnings: %q", mem.Warnings[0].Text)
	}
	// The runner knows which GPUs it asked for: "All" means those.
	r = parseFile(t, "table-3.3.8-cuda-init-fail.txt", Options{GPUs: []int{2, 5}})
	if got := r.FailedGPUs; !slices.Equal(got, []int{2, 5}) {
		t.Errorf("explicit GPUs: failed %v, want [2 5]", got)
	}

	// DCGM 4.2.3 and 4.4.1: pcie "Fail" while every GPU passes, all
	// warnings internal errors (a child process crashed or printed what
	// DCGM could not parse): not a hardware fault.
	for _, name := range []string{"table-4.2.3-internal-error.txt", "table-4.4.1-internal-error.txt"} {
		r := parseFile(t, name, Options{})
		if r.Overall != Fail || r.HardwareFault || len(r.FailedGPUs) != 0 || !slices.Equal(r.FailedTests, []string{"pcie"}) {
			t.Errorf("%s: overall=%s hw=%v gpus=%v tests=%v", name, r.Overall, r.HardwareFault, r.FailedGPUs, r.FailedTests)
		}
		pcie := r.Tests[len(r.Tests)-1]
		if !pcie.DiagnosticError() || len(pcie.GPUs) == 0 || pcie.GPUs[0].Result != Pass {
			t.Errorf("%s: pcie %+v", name, pcie)
		}
		if !strings.Contains(pcie.Warnings[0].Text, "couldn't be parsed") && !strings.Contains(pcie.Warnings[0].Text, "exited with non-zero status 1") {
			t.Errorf("%s: warning not joined: %q", name, pcie.Warnings[0].Text)
		}
	}

	r = parseFile(t, "table-4.4.2-pass.txt", Options{})
	if r.Overall != Pass || r.HardwareFault || len(r.Tests) != 3 || r.Tests[2].GPUs[0] != (GPUResult{0, Pass}) {
		t.Errorf("4.4.2: %+v", r)
	}
	r = parseFile(t, "table-3.3.9-skip-twice.txt", Options{})
	if r.Overall != Pass || len(r.Tests) != 15 || r.Tests[9].Result != Skip || len(r.Tests[9].GPUs) != 2 {
		t.Errorf("3.3.9 twice: %d tests, %+v", len(r.Tests), r.Tests)
	}
	// 3.x per-GPU lists: "Pass - GPUs: 1, ..., 7" then "Fail - GPU: 0",
	// the thermal-violation warning joined; the published fragment's last
	// row lost its closing border.
	r = parseFile(t, "table-3.x-mle-r2-fail-gpu0.txt", Options{})
	if r.Overall != Fail || !r.HardwareFault || !slices.Equal(r.FailedGPUs, []int{0}) || len(r.Tests[0].GPUs) != 8 ||
		r.Tests[0].Warnings[0].GPU != 0 || !strings.HasSuffix(r.Tests[0].Warnings[0].Text, "fans, and any other components.") {
		t.Errorf("3.x fail GPU 0: %+v", r)
	}
	r = parseFile(t, "table-3.3.1-cuda-busy-fail-gpu0.txt", Options{})
	if r.Overall != Fail || !slices.Equal(r.FailedGPUs, []int{0}) || r.Tests[0].GPUs[1] != (GPUResult{1, Pass}) ||
		!strings.Contains(r.Tests[0].Warnings[0].Text, "Unable to create CUDA context: 'CUDA-capable device(s) is/are busy or unavailable'.") {
		t.Errorf("3.3.1 fail GPU 0: %+v", r)
	}
	// A deployment "Error" row (pending row remaps): a failure of the
	// GPU it names, even with no test row above it.
	r = parseFile(t, "table-3.x-mle-deployment-error.txt", Options{})
	if r.Overall != Fail || !r.HardwareFault || !slices.Equal(r.FailedGPUs, []int{3}) || !slices.Equal(r.FailedTests, []string{"Deployment"}) ||
		r.Tests[0].Warnings[0].Text != "GPU 3 has uncorrectable memory errors and row remappings are pending" {
		t.Errorf("deployment error: %+v", r)
	}
	r = parseFile(t, "json-3.x-r3-pass-skip.json", Options{})
	if r.Format != "json" || r.Overall != Pass || len(r.Tests) != 16 {
		t.Errorf("3.x json: %+v", r)
	}
	if eud := r.Tests[12]; eud.Name != "EUD Test" || eud.Result != Skip || eud.GPUs[0] != (GPUResult{0, Skip}) {
		t.Errorf("3.x json EUD: %+v", eud)
	}
	r = parseFile(t, "json-4.x-diagnostic-pass.json", Options{})
	if r.Overall != Pass || len(r.Tests) != 1 || len(r.Tests[0].GPUs) != 8 {
		t.Errorf("4.x json: %+v", r)
	}
}

// TestJSONFailures drives the JSON reader through the failure shapes DCGM's
// own code writes (dcgmi/Diag.cpp): 4.x per-entity warnings with
// error_id/error_category, 3.x per-GPU results, a runtime_error.
func TestJSONFailures(t *testing.T) {
	doc4 := `{"DCGM Diagnostic":{"test_categories":[{"category":"Hardware","tests":[
	 {"name":"memory","results":[
	   {"entity_group":"GPU","entity_group_id":1,"entity_id":0,"status":"Pass"},
	   {"entity_group":"GPU","entity_group_id":1,"entity_id":3,"status":"Fail","warnings":[{"error_category":10,"error_id":52,"error_severity":2,"warning":"Faulty memory detected on GPU 3"}]}],
	  "test_summary":{"status":"Fail"}},
	 {"name":"pcie","results":[{"entity_group":"GPU","entity_group_id":1,"entity_id":0,"status":"Pass"}],
	  "test_summary":{"status":"Fail","warnings":[{"error_category":16,"error_id":44,"error_severity":3,"warning":"There was an internal error during the test: 'x'"}]}}]}]},
	 "metadata":{"version":"4.2.3","Driver Version Detected":"570.148.08"}}`
	r, err := Parse(strings.NewReader(doc4), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Overall != Fail || !r.HardwareFault || !slices.Equal(r.FailedGPUs, []int{3}) || !slices.Equal(r.FailedTests, []string{"memory", "pcie"}) ||
		r.Tests[0].DiagnosticError() || !r.Tests[1].DiagnosticError() || r.Version != "4.2.3" {
		t.Fatalf("4.x: %+v", r)
	}
	doc3 := "Successfully ran diagnostic for group.\n" + `{"DCGM GPU Diagnostic":{"test_categories":[{"category":"Stress","tests":[
	 {"name":"Targeted Power","results":[{"gpu_ids":"0","status":"Pass"},{"gpu_ids":"1","status":"Fail","warnings":[{"warning":"GPU 1 power too low","error_id":63}]}]}]}],"version":"3.3.5"}}`
	r, err = Parse(strings.NewReader(doc3), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.FailedGPUs, []int{1}) || !slices.Equal(r.FailedTests, []string{"Targeted Power"}) || !r.HardwareFault {
		t.Fatalf("3.x: %+v", r)
	}
	r, err = Parse(strings.NewReader(`{"DCGM GPU Diagnostic":{"runtime_error":"Unable to get the driver version","version":"440.37"}}`), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Overall != Fail || r.HardwareFault || r.RuntimeError == "" || len(r.Tests) != 0 {
		t.Fatalf("runtime error: %+v", r)
	}
}

// TestUnreadable: errors name the line.
func TestUnreadable(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		line           int
	}{
		{"empty", "", "no dcgmi diag table", 0},
		{"prose", "nothing\nhere\n", "no dcgmi diag table, JSON document or dcgmi error in 2 lines", 0},
		{"bad status", "+---+\n| PCIe                      | Maybe                                          |\n", `test PCIe: result "Maybe" is not Pass`, 2},
		{"bad gpu list", "+---+\n| PCIe                      | Fail - GPU: x                                  |\n", `GPU id "x"`, 2},
		{"cut row", "+---+\n| PCIe                      \n", "table row has no second column", 2},
		{"bad json", "Successfully ran diagnostic for group.\n{\"DCGM GPU Diagnostic\": [\n", "JSON document does not decode", 2},
		{"foreign json", "{\"hello\": 1}\n", `no "DCGM Diagnostic"`, 1},
		{"json bad status", `{"DCGM Diagnostic":{"test_categories":[{"category":"x","tests":[{"name":"memory","results":[{"entity_group":"GPU","entity_id":0,"status":"Meh"}]}]}]}}`, `status "Meh"`, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tc.in), Options{})
			var pe *ParseError
			if !errors.As(err, &pe) || !strings.Contains(err.Error(), tc.want) || pe.Line != tc.line {
				t.Fatalf("err = %v, want line %d containing %q", err, tc.line, tc.want)
			}
		})
	}
	// A dcgmi error alone is a readable result: the diagnostic did not run.
	r, err := Parse(strings.NewReader("Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n"), Options{})
	if err != nil || r.RuntimeError == "" || r.Overall != Fail || r.HardwareFault {
		t.Fatalf("dcgmi error: %+v %v", r, err)
	}
}

func TestDiscovery(t *testing.T) {
	f, err := os.Open("testdata/discovery-1gpu.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := ParseDiscovery(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || m["GPU-934a71d6-e50c-86a3-f752-3743a8c1bbb2"] != 0 {
		t.Fatalf("discovery: %v", m)
	}
}
