package nccl

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// goldenView is what the golden files hold: the JSON of `parse nccl` plus
// the failures the log reports.
type goldenView struct {
	Result   *Result  `json:"result"`
	Failures []string `json:"failures"`
	Worst    string   `json:"worst,omitempty"`
}

// TestGolden parses every published log in testdata (see
// testdata/README.md for where each comes from) and compares with its
// golden file.
func TestGolden(t *testing.T) {
	logs, err := filepath.Glob("testdata/*.log")
	if err != nil || len(logs) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	for _, path := range logs {
		t.Run(filepath.Base(path), func(t *testing.T) {
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			res, err := Parse(f)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			v := goldenView{Result: res, Failures: []string{}}
			for _, fl := range res.Failures {
				v.Failures = append(v.Failures, string(fl.Code))
			}
			if w, ok := Worst(res.Failures); ok {
				v.Worst = string(w.Code)
			}
			got, _ := json.MarshalIndent(v, "", "  ")
			got = append(got, '\n')
			golden := strings.TrimSuffix(path, ".log") + ".golden.json"
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

// TestSemantics states, per published log, the facts the golden files
// encode, so a wrong golden file cannot hide a wrong parser.
func TestSemantics(t *testing.T) {
	parse := func(name string) *Result {
		t.Helper()
		f, err := os.Open("testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		r, err := Parse(f)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return r
	}
	i64 := func(p *int64) string {
		if p == nil {
			return "null"
		}
		return strings.TrimSpace(strings.Repeat(" ", 0) + jsonNum(*p))
	}

	r := parse("h100-single-node.log")
	if len(r.Rows) != 6 || r.AvgBusBw != 439.369 || r.Wrong || r.Rows[5].Bytes != 4294967296 || r.Rows[5].BusBwInPlace != 476.53 {
		t.Errorf("h100: %+v", r)
	}
	r = parse("derived-corruption.log")
	if !r.Wrong || i64(r.Rows[2].WrongOutOfPlace) != "268435000" || i64(r.Rows[2].WrongInPlace) != "1024" || r.OutOfBounds != 2 {
		t.Errorf("corruption: wrong=%v row=%s/%s oob=%d", r.Wrong, i64(r.Rows[2].WrongOutOfPlace), i64(r.Rows[2].WrongInPlace), r.OutOfBounds)
	}
	if r.AvgBusBw != 439.369 {
		t.Errorf("corruption keeps the bandwidth: %v", r.AvgBusBw)
	}
	r = parse("slurm-label-two-nodes.log")
	if len(r.Rows) != 11 || r.AvgBusBw != 142.735 || r.Rows[0].WrongOutOfPlace != nil || r.Wrong {
		t.Errorf("slurm N/A: rows=%d avg=%v", len(r.Rows), r.AvgBusBw)
	}
	r = parse("mpirun-error-column.log")
	if len(r.Rows) != 28 || r.AvgBusBw != 7.80081 || !r.ErrorColumn || r.Wrong || i64(r.Rows[0].WrongOutOfPlace) != "0" {
		t.Errorf("mpirun error column: rows=%d avg=%v errcol=%v wrong=%v", len(r.Rows), r.AvgBusBw, r.ErrorColumn, r.Wrong)
	}
	r = parse("rtx5090-wide-values.log")
	if len(r.Rows) != 25 || r.AvgBusBw != 0 || !r.HasAvg || r.Rows[24].BusBwInPlace != 0 {
		t.Errorf("5090: rows=%d avg=%v", len(r.Rows), r.AvgBusBw)
	}
	r = parse("alltoall-na-inplace.log")
	if len(r.Rows) != 1 || r.Rows[0].WrongInPlace != nil || i64(r.Rows[0].WrongOutOfPlace) != "0" {
		t.Errorf("alltoall: %+v", r.Rows)
	}
	for name, code := range map[string]Code{
		"rtx5090-cuda-failure.log": UnhandledCudaError,
		"system-error.log":         SystemError,
		"cuda-init-failure.log":    UnhandledCudaError,
		// A CUDA runtime newer than the driver: the image's, not the GPU's.
		"cuda-driver-insufficient.log": CudaSetupError,
		"torch-internal-error.log":     InternalError,
		"torch-system-error.log":       SystemError,
		"torch-remote-error.log":       RemoteError,
		"torch-timeout.log":            Timeout,
	} {
		r := parse(name)
		w, ok := Worst(r.Failures)
		if !ok || w.Code != code {
			t.Errorf("%s: worst failure %v (%v), want %s", name, w.Code, ok, code)
		}
		if len(r.Rows) != 0 {
			t.Errorf("%s: %d rows from a failed run", name, len(r.Rows))
		}
	}
	// torchrun's start-up banner alone is not a result: the runner reads it
	// together with the benchmark's output.
	b, _ := os.ReadFile("testdata/torchrun-banner.txt")
	if _, err := Parse(bytes.NewReader(b)); err == nil {
		t.Error("the torchrun banner alone parsed as a result")
	}
}

func jsonNum(n int64) string { b, _ := json.Marshal(n); return string(b) }

// TestErrorColumnTolerance: the old layouts count an error only above
// nccl-tests' own tolerance, DeltaMaxValue(type) * (nranks - 1).
func TestErrorColumnTolerance(t *testing.T) {
	log := `#  Rank  0 Pid 1 on h device  0 [0x07] A100
#  Rank  1 Pid 2 on h device  1 [0x0a] A100
#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error
        4096          1024     float     sum    93.73    0.04    0.09  1e-06    93.15    0.04    0.09  3e-05
        4096          1024      half     sum    93.73    0.04    0.09  9e-03    93.15    0.04    0.09  2e-02
`
	r, err := Parse(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	want := [][2]int64{{0, 1}, {0, 1}}
	for i, w := range want {
		if *r.Rows[i].WrongOutOfPlace != w[0] || *r.Rows[i].WrongInPlace != w[1] {
			t.Errorf("row %d: %d/%d, want %v", i, *r.Rows[i].WrongOutOfPlace, *r.Rows[i].WrongInPlace, w)
		}
	}
	if !r.Wrong {
		t.Error("an error above tolerance must set wrong")
	}
}

// TestUnreadable: input that is no nccl-tests log, and a full-width row
// whose numbers do not read, are errors naming the line.
func TestUnreadable(t *testing.T) {
	const hdr = "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
	for _, tc := range []struct {
		name, in, want string
		line           int
	}{
		{"empty", "", "no nccl-tests table", 0},
		{"prose", "hello\nworld\n", "no nccl-tests table, Avg bus bandwidth footer or NCCL failure in 2 lines", 0},
		{"bad busbw", "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n" +
			"   134217728      33554432     float     sum      -1    613.3  218.85  38x.99      0    614.3  218.48  382.34      0\n", `busbw (field 8) "38x.99" is not a number`, 2},
		{"bad wrong", "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n" +
			"   134217728      33554432     float     sum      -1    613.3  218.85  382.99     -3    614.3  218.48  382.34      0\n", `#wrong (field 9) "-3" is not a count or N/A`, 2},
		{"bad avg", "# Avg bus bandwidth    : fast\n", `Avg bus bandwidth "fast" is not a number`, 1},
		// A bandwidth that measures nothing: compared with a threshold,
		// NaN would pass.
		{"nan busbw", hdr + "   134217728      33554432     float     sum      -1    613.3     nan     nan      0    614.3  218.48  382.34      0\n",
			`line 2: busbw (field 8) "nan" is not a bandwidth`, 2},
		{"-nan in-place busbw", hdr + "   134217728      33554432     float     sum      -1    613.3  218.85  382.99      0    614.3    -nan    -nan      0\n",
			`in-place busbw (field 12) "-nan" is not a number`, 2},
		{"inf busbw", hdr + "   134217728      33554432     float     sum      -1    613.3  218.85  382.99      0    614.3     inf     inf      0\n",
			`in-place busbw (field 12) "inf" is not a bandwidth`, 2},
		{"negative busbw", hdr + "   134217728      33554432     float     sum      -1    613.3  218.85   -3.10      0    614.3  218.48  382.34      0\n",
			`busbw (field 8) "-3.10" is not a bandwidth`, 2},
		{"nan avg", "# Avg bus bandwidth    : nan \n", `Avg bus bandwidth "nan" is not a bandwidth`, 1},
		{"negative avg", "# Avg bus bandwidth    : -5\n", `Avg bus bandwidth "-5" is not a bandwidth`, 1},
		{"inf avg", "# Avg bus bandwidth    : +Inf\n", `Avg bus bandwidth "+Inf" is not a bandwidth`, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tc.in))
			var pe *ParseError
			if !errors.As(err, &pe) || !strings.Contains(err.Error(), tc.want) || pe.Line != tc.line {
				t.Fatalf("err = %v, want line %d containing %q", err, tc.line, tc.want)
			}
		})
	}
}

// TestInterruptedRow: a row cut by a process killed mid-line (or another
// process's output spliced in) is skipped, not an error.
func TestInterruptedRow(t *testing.T) {
	log := `#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
        2048           512     float     sum      -1
[0] h100clust-worker-1:497888:497888 [0] NCCL INFO 2048 Bytes -> Algo 0 proto 0 time 25.495272
[0]     73.09    0.03    0.05      0[0] h100clust-worker-1:497888:497888 [0] NCCL INFO 2048 Bytes -> Algo 0 proto 0 time 25.495272
        4096          1024     float     sum      -1    74.12    0.06    0.10      0    73.80    0.06    0.10      0
`
	r, err := Parse(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Rows) != 1 || r.Rows[0].Bytes != 4096 || r.Interrupted != 1 {
		t.Fatalf("rows %+v interrupted %d", r.Rows, r.Interrupted)
	}
}

func TestStripPrefixes(t *testing.T) {
	for in, want := range map[string]string{
		"[1,0]<stdout>:#       size": "#       size",
		" 0:      8388608":           "      8388608",
		"0: # Avg":                   " # Avg",
		"[0]     73.09":              "     73.09",
		"   134217728      33554432": "   134217728      33554432",
		"12:34 not a label":          "12:34 not a label",
	} {
		if got := stripPrefixes(in); got != want {
			t.Errorf("stripPrefixes(%q) = %q, want %q", in, got, want)
		}
	}
}

// BenchmarkParse10MB parses a 10 MB nccl-tests log: the header, rows of the
// published H100 run repeated until the log reaches 10 MB, and the summary.
func BenchmarkParse10MB(b *testing.B) {
	raw, err := os.ReadFile(filepath.Join("testdata", "h100-single-node.log"))
	if err != nil {
		b.Fatal(err)
	}
	var head, rows, tail []string
	for _, line := range strings.SplitAfter(string(raw), "\n") {
		switch {
		case strings.HasPrefix(line, "# Out of bounds") || strings.HasPrefix(line, "# Avg bus") || (len(rows) > 0 && strings.HasPrefix(line, "#")):
			tail = append(tail, line)
		case strings.HasPrefix(line, "#") || line == "":
			head = append(head, line)
		default:
			rows = append(rows, line)
		}
	}
	var buf bytes.Buffer
	buf.WriteString(strings.Join(head, ""))
	for n := 0; buf.Len() < 10<<20; n++ {
		buf.WriteString(rows[n%len(rows)])
	}
	buf.WriteString(strings.Join(tail, ""))
	log := buf.Bytes()
	b.SetBytes(int64(len(log)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res, err := Parse(bytes.NewReader(log))
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Rows) < 10<<20/200 || !res.HasAvg {
			b.Fatalf("parsed %d rows, avg %v", len(res.Rows), res.HasAvg)
		}
	}
}
