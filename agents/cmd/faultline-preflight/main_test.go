package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func run(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := dispatch(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func keys(m map[string]any) []string {
	var k []string
	for key := range m {
		k = append(k, key)
	}
	slices.Sort(k)
	return k
}

// TestParseShape checks the operator command's JSON against the issue's
// shape, key by key, on published outputs.
func TestParseShape(t *testing.T) {
	code, out, errs := run("parse", "nccl", "../../preflight/nccl/testdata/alltoall-na-inplace.log")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var n map[string]any
	if err := json.Unmarshal([]byte(out), &n); err != nil || strings.Count(out, "\n") != 1 {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	if got := keys(n); !slices.Equal(got, []string{"avgBusBw", "rows", "wrong"}) {
		t.Fatalf("nccl keys %v", got)
	}
	rows := n["rows"].([]any)
	row := rows[0].(map[string]any)
	if got := keys(row); !slices.Equal(got, []string{"busBwInPlace", "busBwOutOfPlace", "bytes", "wrongInPlace", "wrongOutOfPlace"}) {
		t.Fatalf("row keys %v", got)
	}
	if _, isNum := row["wrongOutOfPlace"].(float64); !isNum || row["wrongInPlace"] != nil || n["wrong"] != false {
		t.Fatalf("N/A in-place #wrong must be null, out-of-place a number: %v", row)
	}

	code, out, errs = run("parse", "dcgm", "../../preflight/dcgm/testdata/table-3.3.8-cuda-init-fail.txt")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var d map[string]any
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatal(err)
	}
	if got := keys(d); !slices.Equal(got, []string{"failedGpus", "failedTests", "hardwareFault", "overall", "tests"}) {
		t.Fatalf("dcgm keys %v", got)
	}
	if d["overall"] != "fail" {
		t.Fatalf("overall %v", d["overall"])
	}
	test := d["tests"].([]any)[0].(map[string]any)
	if got := keys(test); !slices.Equal(got, []string{"gpus", "name", "result"}) {
		t.Fatalf("test keys %v", got)
	}
}

func TestParseErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.log")
	if err := os.WriteFile(bad, []byte("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"+
		"   134217728      33554432     float     sum      -1    613.3  218.85  38x.99      0    614.3  218.48  382.34      0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"parse", "nccl", bad}, 2, "line 2"},
		{[]string{"parse", "dcgm", bad}, 2, "dcgm"},
		{[]string{"parse", "nccl", filepath.Join(dir, "missing")}, 2, "no such file"},
		{[]string{"parse", "xml", bad}, 2, "usage"},
		{[]string{"parse", "dcgm", "--dcgm.gpus", "0,x", bad}, 2, `dcgm.gpus: "x" is not a GPU id`},
		{[]string{"parse", "nccl"}, 2, "usage"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"check"}, 2, "usage"},
		{[]string{"check", "memtest"}, 2, "memtest"},
	} {
		code, out, errs := run(tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) || out != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d and %q", tc.args, code, out, errs, tc.code, tc.want)
		}
	}
}
