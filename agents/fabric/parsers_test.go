package fabric

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// golden compares got with the file (go test -update rewrites it).
func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -update creates it)", err)
	}
	if string(got) != string(want) {
		t.Errorf("%s differs (go test -update rewrites it); got:\n%s", path, got)
	}
}

func goldenJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, path, append(b, '\n'))
}

// eachFile runs fn on every testdata file matching pattern, comparing its
// result with <file>.golden.json.
func eachFile(t *testing.T, pattern string, fn func(t *testing.T, text string) any) {
	files, _ := filepath.Glob(filepath.Join("testdata", pattern))
	if len(files) == 0 {
		t.Fatalf("no testdata/%s", pattern)
	}
	for _, f := range files {
		if strings.HasSuffix(f, ".golden.json") {
			continue
		}
		t.Run(filepath.Base(f), func(t *testing.T) {
			goldenJSON(t, f+".golden.json", fn(t, read(t, f)))
		})
	}
}

// The golden test of each parser: what it reads out of every recorded
// output of its kind.

func TestParseSMIGolden(t *testing.T) {
	eachFile(t, "smi/*.txt", func(t *testing.T, s string) any { return ParseSMI(s) })
}

func TestLogReaderGolden(t *testing.T) {
	for _, pat := range []string{"fmlog/*.log", "journal/*.journal", "nvlsm/*.log"} {
		eachFile(t, pat, func(t *testing.T, s string) any {
			r := &LogReader{Loc: time.UTC, Year: 2024}
			if strings.HasPrefix(pat, "nvlsm") {
				r.DefaultSource = SourceNVLSM
			}
			return r.ReadLog(s)
		})
	}
}

func TestSystemctlGolden(t *testing.T) {
	eachFile(t, "systemctl/*", func(t *testing.T, s string) any {
		if strings.Contains(s, "ActiveState=") {
			return ParseSystemctlShow(s)
		}
		return ParseSystemctlStatus(s)
	})
}

func TestFMConfigGolden(t *testing.T) {
	eachFile(t, "config/*.cfg", func(t *testing.T, s string) any { return ParseFMConfig(s) })
}

func TestNVLinkGolden(t *testing.T) {
	eachFile(t, "nvlink/*.txt", func(t *testing.T, s string) any { return ParseNVLink(s, nil) })
}

func TestTopoGolden(t *testing.T) {
	eachFile(t, "topo/*.txt", func(t *testing.T, s string) any {
		m, err := ParseTopoMatrix(s)
		if err != nil {
			t.Fatal(err)
		}
		return map[string]int{"gpus": m.GPUs, "pairs": len(m.Links), "max": m.MaxLinks()}
	})
}

func TestAuditGolden(t *testing.T) {
	eachFile(t, "audit/*.txt", func(t *testing.T, s string) any {
		a, err := ParseAudit(s)
		if err != nil {
			t.Fatal(err)
		}
		rows := map[string][]int{}
		for _, src := range a.GPUs {
			for _, dst := range a.GPUs {
				if src != dst {
					rows[itoa(src)] = append(rows[itoa(src)], a.Links[[2]int{src, dst}])
				}
			}
		}
		return rows
	})
}

func TestPartitionsGolden(t *testing.T) {
	eachFile(t, "fmpm/*.json", func(t *testing.T, s string) any {
		p, err := ParsePartitions(s)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, x := range p.Partitions {
			out = append(out, itoa(x.ID)+" active="+itoa(x.IsActive)+" gpus="+itoa(len(x.GPUs)))
		}
		return out
	})
}

func TestTelemetryGolden(t *testing.T) {
	eachFile(t, "telemetry/*.prom", func(t *testing.T, s string) any {
		tm, err := ParseTelemetry(strings.NewReader(s))
		if err != nil {
			t.Fatal(err)
		}
		return tm
	})
}

func TestExclusionGolden(t *testing.T) {
	eachFile(t, "exclusion/information.txt", func(t *testing.T, s string) any {
		var out []GPUInformation
		for _, b := range splitBlocks(s) {
			out = append(out, ParseGPUInformation(b))
		}
		return out
	})
	eachFile(t, "exclusion/modprobe-nvidia.conf", func(t *testing.T, s string) any {
		x := &ExcludeList{}
		x.Parse("modprobe-nvidia.conf", s)
		return x
	})
	eachFile(t, "exclusion/smi-list-excluded.txt", func(t *testing.T, s string) any { return ParseExcludedGPUs(s) })
}

func itoa(n int) string { return strconv.Itoa(n) }
