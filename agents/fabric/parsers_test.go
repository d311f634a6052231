package fabric

import (
	"encoding/json"
	"flag"
	"fmt"
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
			return ParseSystemctlShow(s, time.UTC)
		}
		return ParseSystemctlStatus(s, time.UTC)
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

// TestLogReaderTimes: the times LogReader gives lines of each format on a
// host in America/New_York, whose clock went back from 02:00 EDT to 01:00
// EST on 1 November 2026: FM's and NVLSM's local times are read in the
// host's zone — in the repeated hour the first pass, unless the previous
// line was already in the second (hostzone.Date) —, the journal's own time
// (zone-free) wins over FM's prefix in its message, and a short-iso time
// keeps its offset.
func TestLogReaderTimes(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	utc := func(h, m int) time.Time { return time.Date(2026, 11, 1, h, m, 0, 0, time.UTC) }
	for _, tc := range []struct {
		name  string
		lines []string
		want  []time.Time
	}{
		{"FM log", []string{"[Nov 1 2026 00:30:00] [INFO] [tid 1] a"}, []time.Time{utc(4, 30)}},
		{"FM log through the repeated hour", []string{
			"[Nov 1 2026 01:10:00] [INFO] [tid 1] first pass",
			"[Nov 1 2026 01:50:00] [INFO] [tid 1] first pass",
			"[Nov 1 2026 01:05:00] [INFO] [tid 1] second pass",
			"[Nov 1 2026 01:40:00] [INFO] [tid 1] second pass",
			"[Nov 1 2026 02:10:00] [INFO] [tid 1] after",
		}, []time.Time{utc(5, 10), utc(5, 50), utc(6, 5), utc(6, 40), utc(7, 10)}},
		{"NVLSM log", []string{"Nov  1 09:00:00 123456 [7F3A5C1FF700] 0x02 -> SUBNET UP"}, []time.Time{utc(14, 0)}},
		{"journal JSON with FM's prefix", []string{`{"__REALTIME_TIMESTAMP":"1793523600000000","SYSLOG_IDENTIFIER":"nv-fabricmanager","MESSAGE":"[Nov 1 2026 01:00:00] [ERROR] [tid 9] x"}`}, []time.Time{time.UnixMicro(1793523600000000)}},
		{"journal short-iso with offset", []string{"2026-11-01T09:00:00+0100 host nv-fabricmanager[1]: x"}, []time.Time{utc(8, 0)}},
		{"journal short-iso without", []string{"2026-11-01T09:00:00 host nv-fabricmanager[1]: x"}, []time.Time{utc(14, 0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &LogReader{Loc: ny, Year: 2026}
			lines := r.ReadLog(strings.Join(tc.lines, "\n"))
			if len(lines) != len(tc.want) {
				t.Fatalf("%d lines, want %d", len(lines), len(tc.want))
			}
			for i, ll := range lines {
				if !ll.Time.Equal(tc.want[i]) {
					t.Errorf("%s: %s, want %s", tc.lines[i], ll.Time.UTC(), tc.want[i])
				}
			}
		})
	}
}

// TestLogReaderYear: NVLSM's log prints no year. It is the year of the
// line's reading, or the year before for a date that would be more than a
// day after it (a December line read in January; it was the year of the
// machine's clock, whatever the reader's Now).
func TestLogReaderYear(t *testing.T) {
	const line = "%s 123456 [7F3A5C1FF700] 0x02 -> SUBNET UP"
	for _, tc := range []struct {
		now  time.Time
		at   string
		want time.Time
	}{
		{time.Date(2028, 6, 1, 12, 0, 0, 0, time.UTC), "Jun  1 11:00:00", time.Date(2028, 6, 1, 11, 0, 0, 0, time.UTC)},
		{time.Date(2028, 1, 1, 0, 10, 0, 0, time.UTC), "Dec 31 23:59:00", time.Date(2027, 12, 31, 23, 59, 0, 0, time.UTC)},
		{time.Date(2028, 1, 1, 0, 10, 0, 0, time.UTC), "Jan  1 00:05:00", time.Date(2028, 1, 1, 0, 5, 0, 0, time.UTC)},
	} {
		r := &LogReader{Loc: time.UTC, DefaultSource: SourceNVLSM, Now: func() time.Time { return tc.now }}
		lines := r.ReadLog(fmt.Sprintf(line, tc.at))
		if len(lines) != 1 || !lines[0].Time.Equal(tc.want) {
			t.Errorf("%q read at %s: %+v, want %s", tc.at, tc.now, lines, tc.want)
		}
	}
}

// FM names the fabric node "on fid N" up to 580 and "on NodeId N" from 590
// (journal/field-590-nodeid-sxid.journal); a line with either is an SXid.
func TestParseSXidLine(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want SXidLine
	}{
		{"detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port 33",
			SXidLine{Code: 20034, Fatal: true, Fid: "0", SwitchPCI: "0000:86:00.0", SwitchPhys: 3, Port: 33}},
		{"detected NVSwitch non-fatal error 22013 on NodeId 0 on NVSwitch pci bus id 00000000:08:00.0 physical id 3 port 60",
			SXidLine{Code: 22013, NodeID: "0", SwitchPCI: "0000:08:00.0", SwitchPhys: 3, Port: 60}},
		{"detected NVSwitch fatal error 20034 on NodeId 1 on NVSwitch pci bus id 00000000:08:00.0 physical id 3 port 61",
			SXidLine{Code: 20034, Fatal: true, NodeID: "1", SwitchPCI: "0000:08:00.0", SwitchPhys: 3, Port: 61}},
		{"detected NVSwitch non-fatal error 12028 on NVSwitch pci bus id 00000000:86:00.0",
			SXidLine{Code: 12028, SwitchPCI: "0000:86:00.0", SwitchPhys: -1, Port: -1}},
	} {
		got, ok := parseSXidLine(tc.msg)
		if !ok || got != tc.want {
			t.Errorf("parseSXidLine(%q) = %+v, %v; want %+v", tc.msg, got, ok, tc.want)
		}
	}
}
