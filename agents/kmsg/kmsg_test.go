package kmsg

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var (
	testBoot = time.Date(2024, 10, 28, 9, 0, 0, 0, time.UTC)
	testNow  = time.Date(2024, 10, 28, 12, 0, 0, 0, time.UTC)
)

func testParser(t testing.TB, mod func(*ParserConfig)) *Parser {
	t.Helper()
	cfg := ParserConfig{BootTime: testBoot, Year: 2024, Location: time.UTC, Now: func() time.Time { return testNow }}
	if mod != nil {
		mod(&cfg)
	}
	p, err := NewParser(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func parseAll(t testing.TB, p *Parser, text string) []*datamodels.HealthEvent {
	t.Helper()
	var out []*datamodels.HealthEvent
	if err := ParseStream(p, strings.NewReader(text), func(ev *datamodels.HealthEvent) error {
		out = append(out, ev)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func encode(t testing.TB, evs []*datamodels.HealthEvent) string {
	t.Helper()
	var b strings.Builder
	for _, ev := range evs {
		j, err := MarshalEvent(ev)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

// TestParseGolden runs every testdata/*.log through the parser and compares
// the events with testdata/*.golden.jsonl (go test -update rewrites them).
func TestParseGolden(t *testing.T) {
	logs, _ := filepath.Glob("testdata/*.log")
	if len(logs) == 0 {
		t.Fatal("no corpus in testdata")
	}
	for _, path := range logs {
		t.Run(filepath.Base(path), func(t *testing.T) {
			in, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			got := encode(t, parseAll(t, testParser(t, nil), string(in)))
			golden := strings.TrimSuffix(path, ".log") + ".golden.jsonl"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("events differ from %s (go test -update rewrites it)\n--- got\n%s", golden, got)
			}
		})
	}
}

type want struct {
	check, code string
	fatal       bool
	action      datamodels.RecommendedAction
	entity      string // "TYPE=value" that must be impacted
	count       string
}

func matchEvents(t *testing.T, got []*datamodels.HealthEvent, ws []want) {
	t.Helper()
	if len(got) != len(ws) {
		t.Fatalf("got %d events, want %d:\n%s", len(got), len(ws), encodeT(got))
	}
	for i, w := range ws {
		ev := got[i]
		if ev.CheckName != w.check || ev.ErrorCode[0] != w.code || ev.IsFatal != w.fatal || ev.RecommendedAction != w.action {
			t.Errorf("event %d = %s %s fatal=%v %s, want %s %s fatal=%v %s", i, ev.CheckName, ev.ErrorCode, ev.IsFatal,
				ev.RecommendedAction, w.check, w.code, w.fatal, w.action)
		}
		if w.entity != "" && !strings.Contains(events.EntityKey(ev), w.entity) {
			t.Errorf("event %d entities %s, want %s", i, events.EntityKey(ev), w.entity)
		}
		if ev.Agent != Agent {
			t.Errorf("event %d agent %q", i, ev.Agent)
		}
		c := w.count
		if c == "" {
			c = "1"
		}
		if ev.Metadata["count"] != c {
			t.Errorf("event %d count %s, want %s", i, ev.Metadata["count"], c)
		}
	}
}

func encodeT(evs []*datamodels.HealthEvent) string {
	var b strings.Builder
	for _, ev := range evs {
		j, _ := MarshalEvent(ev)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

const (
	nr  = datamodels.RecommendedAction_NONE
	cr  = datamodels.RecommendedAction_COMPONENT_RESET
	cs  = datamodels.RecommendedAction_CONTACT_SUPPORT
	rbm = datamodels.RecommendedAction_RESTART_BM
	rvm = datamodels.RecommendedAction_RESTART_VM
)

// TestMixedCorpusExact spells out the events of the mixed corpus, so that
// the golden file cannot silently drift into accepting a wrong answer.
func TestMixedCorpusExact(t *testing.T) {
	in, err := os.ReadFile("testdata/mixed.log")
	if err != nil {
		t.Fatal(err)
	}
	got := parseAll(t, testParser(t, nil), string(in))
	matchEvents(t, got, []want{
		{CheckXID, "XID-13", false, nr, "GPU=GPU-c43f0536-e751-7211-d7a7-78c95249ee7d", ""},
		{CheckXID, "XID-31", false, nr, "PCI=0000:3b:00", ""},
		{CheckXID, "XID-48", true, cr, "GPU=GPU-7b4f2c1a-8d6e-4c5b-9a1f-2e3d4c5a6b7c", ""},
		{CheckXID, "XID-63", false, nr, "PCI=0000:5d:00", ""}, // catalog: IGNORE (row remapping event)
		{CheckXID, "XID-45", false, nr, "PCI=0000:5d:00", ""}, // printed twice with one timestamp: one event
		{CheckSXID, "SXID-28006", false, nr, "NVSwitch=0000:c1:00.0", ""},
		{CheckSXID, "SXID-12028", false, rvm, "NVSwitch=0000:07:00.0", ""},
		{CheckSXID, "SXID-20034", true, cr, "NVSwitch=0000:08:00.0", ""},
		{CheckXID, "XID-74", true, cr, "PCI=0000:3b:00", ""},
		{CheckSXID, "SXID-22003", true, rbm, "NVSwitch=0000:09:00.0", ""},
		{CheckSXID, "SXID-99999", true, cs, "NVSwitch=0000:09:00.0", ""},
		{CheckXID, "XID-79", true, rbm, "GPU=GPU-11111111-2222-3333-4444-555555555555", ""},
		{CheckFallenOff, CodeFallenOff, true, rbm, "PCI=0000:db:00", ""},
		{CheckFallenOff, CodeFallenOff, true, rbm, "PCI=0000:19:00", ""},
		{CheckXID, "XID-94", false, nr, "PCI=0000:3b:00", ""},
		{CheckXID, "XID-154", true, cr, "PCI=0000:3b:00", ""},
		{CheckXID, "XID-145", false, nr, "PCI=0018:01:00", ""},
		{CheckXID, "XID-249", true, cs, "PCI=0000:3b:00", ""},
		{CheckNIC, "MLX5-CMD-TIMEOUT", false, nr, "PCI=0000:0c:00.0", ""},
		{CheckNIC, "MLX5-MODULE-UNPLUGGED", false, nr, "PCI=0000:0c:00.1", ""},
		{CheckNIC, "MLX5-MODULE-UNPLUGGED", false, nr, "PCI=0000:0c:00.1", ""}, // the recovery (isHealthy)
		{CheckNIC, "MLX5-INSUFFICIENT-POWER", false, cs, "PCI=0000:1a:00.0", ""},
		{CheckNIC, "MLX5-TX-TIMEOUT", false, nr, "NIC=ens7f0np0", ""},
		{CheckNIC, "MLX5-MODULE-ERROR", false, cs, "PCI=0000:2b:00.0", ""},
		{CheckNIC, "MLX5-FATAL", true, cr, "PCI=0000:2b:00.0", ""},
	})
	if !got[20].IsHealthy || got[19].IsHealthy {
		t.Errorf("cable plugged after unplugged must be the healthy event")
	}
	// SXid detail lines are grouped into their event.
	if d := got[5].Metadata["details"]; !strings.Contains(d, "Severity 0 Engine instance 46") || !strings.Contains(d, "Data {0x00140004") {
		t.Errorf("SXid details not grouped: %q", d)
	}
	if got[5].Metadata["link"] != "46" || got[5].Metadata["nvswitch"] != "nvidia-nvswitch3" {
		t.Errorf("SXid link/switch: %v", got[5].Metadata)
	}
	// pid, process name and channel are kept.
	if m := got[1].Metadata; m["pid"] != "22101" || m["process_name"] != "pt_main_thread" || m["channel"] != "00000008" {
		t.Errorf("Xid 31 metadata: %v", m)
	}
	if m := got[14].Metadata; m["mig_instance"] != "GPU-I:05" {
		t.Errorf("Xid 94 MIG instance: %v", m)
	}
	// Kernel timestamps become wall-clock times with the boot time.
	if ts := got[0].GeneratedTimestamp.AsTime(); !ts.Equal(testBoot.Add(812004424 * time.Microsecond)) {
		t.Errorf("timestamp %v", ts)
	}
}

// TestCausedByPreviousXid: "caused by previous Xid N" never makes an event
// for N.
func TestCausedByPreviousXid(t *testing.T) {
	got := parseAll(t, testParser(t, nil), strings.Join([]string{
		"[ 10.000000] NVRM: Xid (PCI:0000:5d:00): 45, pid=3301, name=train.py, Ch 00000010, caused by previous Xid 48",
		"[ 11.000000] NVRM: Xid (PCI:0000:5d:00): 43, pid=3301, name=train.py, Ch 00000010 (caused by previous Xid 79)",
		"[ 12.000000] NVRM: Channel 0x10 reset caused by previous Xid 79",
	}, "\n"))
	matchEvents(t, got, []want{{CheckXID, "XID-45", false, nr, "", ""}, {CheckXID, "XID-43", false, nr, "", ""}})
}

// TestTopologyAttribution: UUIDs come from the topology metadata when the
// log has no "GPU at PCI" line; SXid links map to their GPU.
func TestTopologyAttribution(t *testing.T) {
	topo := StaticTopology{
		GPUs:        map[string]string{"00000000:3B:00.0": "GPU-aaaa"},
		SwitchLinks: map[string]string{"0000:c1:00.0/46": "GPU-bbbb"},
		NICs:        map[string]string{"0000:0c:00.0": "mlx5_0"},
	}
	got := parseAll(t, testParser(t, func(c *ParserConfig) { c.Topology = topo }), strings.Join([]string{
		"[ 1.0] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE",
		"[ 2.0] nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 12020, Fatal, Link 46 egress sequence ID error",
		"[ 3.0] mlx5_core 0000:0c:00.0: wait_func:1163:(pid 1): QUERY_VPORT(0x755) timeout. Will cause a leak of a command resource",
	}, "\n"))
	matchEvents(t, got, []want{
		{CheckXID, "XID-48", true, cr, "GPU=GPU-aaaa", ""},
		{CheckSXID, "SXID-12020", true, rbm, "GPU=GPU-bbbb", ""},
		{CheckNIC, "MLX5-CMD-TIMEOUT", false, nr, "NIC=mlx5_0", ""},
	})
}

// formats renders one kernel message (at boot+mono) the ways real logs
// carry it.
var formats = map[string]func(mono time.Duration, msg string) string{
	"bare": func(_ time.Duration, m string) string { return m },
	"kmsg": func(d time.Duration, m string) string {
		return fmt.Sprintf("4,%d,%d,-;%s", d/time.Millisecond, d/time.Microsecond, m)
	},
	"dmesg": func(d time.Duration, m string) string { return fmt.Sprintf("[%12.6f] %s", d.Seconds(), m) },
	"dmesg-T": func(d time.Duration, m string) string {
		return "[" + testBoot.Add(d).Format("Mon Jan _2 15:04:05 2006") + "] " + m
	},
	"dmesg-iso": func(d time.Duration, m string) string {
		return strings.Replace(testBoot.Add(d).Format("2006-01-02T15:04:05.000000-07:00"), ".", ",", 1) + " " + m
	},
	"syslog": func(d time.Duration, m string) string {
		return testBoot.Add(d).Format("Jan _2 15:04:05") + " gpu-node-42 kernel: " + m
	},
	"syslog-printk": func(d time.Duration, m string) string {
		return testBoot.Add(d).Format("Jan _2 15:04:05") + fmt.Sprintf(" gpu-node-42 kernel: [%12.6f] %s", d.Seconds(), m)
	},
	"journal-short-iso": func(d time.Duration, m string) string {
		return testBoot.Add(d).Format("2006-01-02T15:04:05-0700") + " gpu-node-42 kernel: " + m
	},
	"journal-short-precise": func(d time.Duration, m string) string {
		return testBoot.Add(d).Format("Jan 02 15:04:05.000000") + " gpu-node-42 kernel: " + m
	},
	"journal-json": func(d time.Duration, m string) string {
		return fmt.Sprintf(`{"__CURSOR":"s=1;i=%x","__REALTIME_TIMESTAMP":"%d","_TRANSPORT":"kernel","SYSLOG_IDENTIFIER":"kernel","MESSAGE":%q,"_SOURCE_MONOTONIC_TIMESTAMP":"%d"}`,
			d, testBoot.Add(d).UnixMicro(), m, d/time.Microsecond)
	},
	"syslog-german": func(d time.Duration, m string) string {
		return strings.Replace(testBoot.Add(d).Format("Jan _2 15:04:05"), "Oct", "Okt", 1) + " gpu-node-42 kernel: " + m
	},
	"dmesg-T-french": func(d time.Duration, m string) string {
		s := testBoot.Add(d).Format("Mon Jan _2 15:04:05 2006")
		s = strings.NewReplacer("Mon", "lun.", "Oct", "oct.").Replace(s)
		return "[" + s + "] " + m
	},
	"syslog-russian": func(d time.Duration, m string) string {
		return strings.Replace(testBoot.Add(d).Format("Jan _2 15:04:05"), "Oct", "окт", 1) + " gpu-node-42 kernel: " + m
	},
	"rfc5424": func(d time.Duration, m string) string {
		return "<4>1 " + testBoot.Add(d).Format(time.RFC3339Nano) + " gpu-node-42 kernel - - - " + m
	},
}

var canonical = []string{
	"NVRM: GPU at PCI:0000:3b:00: GPU-c43f0536-e751-7211-d7a7-78c95249ee7d",
	"NVRM: Xid (PCI:0000:3b:00): 48, pid=2231, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
	"nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 12020, Fatal, Link 46 egress sequence ID error",
	"nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 12020, Severity 1 Engine instance 46 Sub-engine instance 00",
	"NVRM: GPU 0000:db:00.0: GPU has fallen off the bus.",
	"mlx5_core 0000:0c:00.0: mlx5_pcie_event:296:(pid 0): Detected insufficient power on the PCIe slot (27W).",
	"usb 1-1.4: new high-speed USB device number 3 using xhci_hcd",
}

// TestFormats: every format yields the same events; formats with a time
// yield the right generatedTimestamp.
func TestFormats(t *testing.T) {
	wantEv := []want{
		{CheckXID, "XID-48", true, cr, "GPU=GPU-c43f0536-e751-7211-d7a7-78c95249ee7d", ""},
		{CheckSXID, "SXID-12020", true, rbm, "NVSwitch=0000:c1:00.0", ""},
		{CheckFallenOff, CodeFallenOff, true, rbm, "PCI=0000:db:00", ""},
		{CheckNIC, "MLX5-INSUFFICIENT-POWER", false, cs, "PCI=0000:0c:00.0", ""},
	}
	for name, f := range formats {
		t.Run(name, func(t *testing.T) {
			var lines []string
			for i, m := range canonical {
				lines = append(lines, f(time.Duration(100+i)*time.Second+250*time.Millisecond, m))
			}
			got := parseAll(t, testParser(t, nil), strings.Join(lines, "\n")+"\n")
			matchEvents(t, got, wantEv)
			if name == "bare" {
				if got[0].GeneratedTimestamp != nil {
					t.Errorf("bare line got a timestamp")
				}
				return
			}
			ts := got[0].GeneratedTimestamp.AsTime()
			exp := testBoot.Add(101*time.Second + 250*time.Millisecond)
			if d := ts.Sub(exp); d < -time.Second || d > time.Second {
				t.Errorf("timestamp %v, want %v", ts, exp)
			}
		})
	}
}

// TestJournalMessageBytes: journalctl -o json writes a field that is not
// printable UTF-8 — a byte that is not UTF-8 or a control character, as a
// process name in an Xid line can hold — as an array of its bytes, not a
// string (systemd's logs-show.c); such an entry's Xid is still read, its
// text made printable.
func TestJournalMessageBytes(t *testing.T) {
	entry := func(msg string) string {
		return fmt.Sprintf(`{"__CURSOR":"s=1;i=7","__REALTIME_TIMESTAMP":"%d","_TRANSPORT":"kernel","MESSAGE":%s,"_SOURCE_MONOTONIC_TIMESTAMP":"100250000"}`,
			testBoot.Add(100*time.Second).UnixMicro(), msg)
	}
	bytesOf := func(s string) string {
		n := make([]string, len(s))
		for i := range len(s) {
			n[i] = strconv.Itoa(int(s[i]))
		}
		return "[" + strings.Join(n, ",") + "]"
	}
	const xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, name=%s, GPU has fallen off the bus."
	for _, tc := range []struct {
		name, message string // MESSAGE as journalctl writes it
		want          []want
	}{
		{"a string", strconv.Quote(fmt.Sprintf(xid, "python3")), []want{{CheckXID, "XID-79", true, rbm, "PCI=0000:3b:00", ""}}},
		{"bytes: a name that is not UTF-8", bytesOf(fmt.Sprintf(xid, "caf\xe9")), []want{{CheckXID, "XID-79", true, rbm, "PCI=0000:3b:00", ""}}},
		{"bytes: a control character", bytesOf(fmt.Sprintf(xid, "job\x1b[0m")), []want{{CheckXID, "XID-79", true, rbm, "PCI=0000:3b:00", ""}}},
		{"bytes: not a kernel line we read", bytesOf("usb 1-1: \xff"), nil},
		{"not bytes", `[1,"x"]`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := parseAll(t, testParser(t, nil), entry(tc.message)+"\n")
			matchEvents(t, got, tc.want)
			for _, ev := range got {
				if !utf8.ValidString(ev.Message) || strings.ContainsFunc(ev.Message, unicode.IsControl) {
					t.Errorf("message %q is not printable", ev.Message)
				}
			}
		})
	}
}

// TestSameLineTwice: one record read from /dev/kmsg, then from the journal,
// then again after a restart (same state) is reported once; two real
// occurrences with their own timestamps are two events.
func TestSameLineTwice(t *testing.T) {
	msg := canonical[1]
	d := 500 * time.Second
	in := strings.Join([]string{
		formats["kmsg"](d, msg),
		formats["journal-json"](d, msg),
		formats["dmesg"](d, msg),
		formats["syslog-printk"](d, msg),
		formats["kmsg"](d, msg), // re-read after a restart
		formats["journal-short-precise"](d+time.Minute, msg),
		formats["journal-short-precise"](d+time.Minute, msg), // the same journal line again
		formats["dmesg"](d+2*time.Minute, msg),               // a second real occurrence
	}, "\n")
	got := parseAll(t, testParser(t, nil), in)
	matchEvents(t, got, []want{{CheckXID, "XID-48", true, cr, "", ""}, {CheckXID, "XID-48", true, cr, "", ""}, {CheckXID, "XID-48", true, cr, "", ""}})
}

// TestRepeatsInOneSecond: a line is a duplicate by its printk timestamp
// when it has one, not by the whole-second wall-clock time a syslog line
// prints beside it: real repeats within one second, each with its own
// printk time, are all counted. Only a line with no printk time is known
// by its wall-clock time, and only one printed to a fraction of a second:
// a line in whole seconds (syslog, dmesg -T) is never a duplicate.
func TestRepeatsInOneSecond(t *testing.T) {
	msg := canonical[1]
	d := 500 * time.Second
	for _, tc := range []struct {
		name  string
		lines []string
		want  int
	}{
		{"syslog with printk times, one second", []string{
			formats["syslog-printk"](d, msg),
			formats["syslog-printk"](d+200*time.Millisecond, msg),
			formats["syslog-printk"](d+400*time.Millisecond, msg),
		}, 3},
		{"syslog with printk times, one line twice", []string{
			formats["syslog-printk"](d, msg),
			formats["syslog-printk"](d, msg),
			formats["syslog-printk"](d+400*time.Millisecond, msg),
		}, 2},
		{"syslog without printk times, one second", []string{
			formats["syslog"](d, msg),
			formats["syslog"](d+200*time.Millisecond, msg),
			formats["syslog"](d+400*time.Millisecond, msg),
		}, 3},
		{"dmesg -T, one second", []string{
			formats["dmesg-T"](d, msg),
			formats["dmesg-T"](d+200*time.Millisecond, msg),
			formats["dmesg-T"](d+400*time.Millisecond, msg),
		}, 3},
		{"journal short-iso, one second", []string{
			formats["journal-short-iso"](d, msg),
			formats["journal-short-iso"](d+200*time.Millisecond, msg),
		}, 2},
		{"journal short-precise, one line twice", []string{
			formats["journal-short-precise"](d, msg),
			formats["journal-short-precise"](d, msg),
			formats["journal-short-precise"](d+400*time.Millisecond, msg),
		}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			total := 0
			for _, ev := range parseAll(t, testParser(t, nil), strings.Join(tc.lines, "\n")) {
				n, err := strconv.Atoi(ev.GetMetadata()["count"])
				if err != nil {
					t.Fatalf("count %q: %v", ev.GetMetadata()["count"], err)
				}
				total += n
			}
			if total != tc.want {
				t.Errorf("summed count %d, want %d", total, tc.want)
			}
		})
	}
}

// TestFlood: 100000 copies of one error in 100 s are reported as one event
// and then one event per flood window, each with its count; the counts add
// up to every occurrence; CPU stays bounded.
func TestFlood(t *testing.T) {
	var b strings.Builder
	const n = 100000
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "[%12.6f] NVRM: Xid (PCI:0000:3b:00): 13, pid=%d, name=python3, Graphics Exception: ESR 0x514648=0x1000f\n",
			100+float64(i)*0.001, 1000+i%7)
		if i%1000 == 0 {
			fmt.Fprintf(&b, "[%12.6f] usb 1-1: noise\n", 100+float64(i)*0.001)
		}
	}
	start := time.Now()
	got := parseAll(t, testParser(t, nil), b.String())
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("flood took %v", el)
	}
	// 100 s of flood in 10 s windows: the first occurrence, then one
	// rate-limited summary per window.
	if len(got) < 10 || len(got) > 12 {
		t.Fatalf("got %d events for a flood, want about 11:\n%s", len(got), encodeT(got))
	}
	total := 0
	for i, ev := range got {
		c, _ := strconv.Atoi(ev.Metadata["count"])
		total += c
		if i > 0 && ev.Metadata["flood"] != "true" {
			t.Errorf("event %d is not marked as a flood: %v", i, ev.Metadata)
		}
	}
	if total != n {
		t.Errorf("counts add up to %d, want %d", total, n)
	}
	if got[0].Metadata["count"] != "1" || got[0].Metadata["flood"] != "" {
		t.Errorf("first occurrence must be reported at once: %v", got[0].Metadata)
	}
}

// TestFloodPerDevice: a flood on one GPU does not hide another GPU's error,
// and errors after a quiet window are reported at once again.
func TestFloodPerDevice(t *testing.T) {
	var lines []string
	for i := 0; i < 50; i++ {
		lines = append(lines, fmt.Sprintf("[%12.6f] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=a, MMU Fault", 100+float64(i)/10))
	}
	lines = append(lines, "[104.500000] NVRM: Xid (PCI:0000:5d:00): 31, pid=1, name=a, MMU Fault")
	lines = append(lines, "[200.000000] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=a, MMU Fault")
	got := parseAll(t, testParser(t, nil), strings.Join(lines, "\n"))
	matchEvents(t, got, []want{
		{CheckXID, "XID-31", false, nr, "PCI=0000:3b:00", "1"},
		{CheckXID, "XID-31", false, nr, "PCI=0000:5d:00", "1"},
		{CheckXID, "XID-31", false, nr, "PCI=0000:3b:00", "49"},
		{CheckXID, "XID-31", false, nr, "PCI=0000:3b:00", "1"},
	})
}

// TestFloodLineAfterItsWindowClosed: a line whose own time falls in a
// window that the clock has already closed — line times running behind
// the wall clock (a lagging journal or file source, the clock stepped
// forward) — is not counted into the closed window, where nothing would
// report it, but opens a window of its own: three Xid 31s, three counted.
func TestFloodLineAfterItsWindowClosed(t *testing.T) {
	clock := testBoot.Add(120 * time.Second) // the lines' times are 20 s behind it
	p := testParser(t, func(c *ParserConfig) { c.Now = func() time.Time { return clock } })
	xid := func(sec float64) {
		p.Process(Line{Text: fmt.Sprintf("[%12.6f] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=a, MMU Fault", sec), Mono: -1})
	}
	var got []*datamodels.HealthEvent
	poll := func(final bool) {
		p.Flush(final)
		got = append(got, p.Drain()...)
	}
	xid(100)
	poll(false)
	clock = clock.Add(12 * time.Second) // the next poll: the window of 100 s has closed
	poll(false)
	xid(105) // read late, in the window of 100 s
	xid(106)
	poll(false)
	clock = clock.Add(20 * time.Second)
	poll(true)
	total := 0
	for _, ev := range got {
		c, _ := strconv.Atoi(ev.Metadata["count"])
		total += c
	}
	if total != 3 {
		t.Fatalf("counts add up to %d, want 3:\n%s", total, encodeT(got))
	}
}

// TestFloodKeepsTheLineSeverity: where a line's own words set its
// fatality and action (Xid 144-150, Xid 154, SXid), a fatal occurrence
// among non-fatal ones of the same code on the same device, within one
// flood window, is reported as fatal, not folded into a summary made of
// the window's last (non-fatal) occurrence.
func TestFloodKeepsTheLineSeverity(t *testing.T) {
	const (
		xid145 = "[%s] NVRM: Xid (PCI:0000:3b:00): 145, RLW_REMAP %s XC0 i0 Link %s (0x00000000 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)"
		xid154 = "[%s] NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from %s"
		sxid   = "[%s] nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 20034, %s, Link 46 LTSSM Fault Up"
	)
	for _, tc := range []struct {
		name  string
		lines []string
		want  []want
	}{
		{"xid 145", []string{
			fmt.Sprintf(xid145, "100.000000", "Nonfatal", "08"),
			fmt.Sprintf(xid145, "101.000000", "Fatal", "08"),
			fmt.Sprintf(xid145, "102.000000", "Nonfatal", "09"),
		}, []want{
			{CheckXID, "XID-145", false, datamodels.RecommendedAction_NONE, "PCI=0000:3b:00", "1"},
			{CheckXID, "XID-145", true, datamodels.RecommendedAction_COMPONENT_RESET, "PCI=0000:3b:00", "1"},
			{CheckXID, "XID-145", false, datamodels.RecommendedAction_NONE, "PCI=0000:3b:00", "1"},
		}},
		{"xid 154", []string{
			fmt.Sprintf(xid154, "100.000000", "0x1 (GPU Reset Required) to 0x0 (None)"),
			fmt.Sprintf(xid154, "101.000000", "0x0 (None) to 0x1 (GPU Reset Required)"),
			fmt.Sprintf(xid154, "102.000000", "0x1 (GPU Reset Required) to 0x0 (None)"),
		}, []want{
			{CheckXID, "XID-154", false, datamodels.RecommendedAction_NONE, "PCI=0000:3b:00", "1"},
			{CheckXID, "XID-154", true, datamodels.RecommendedAction_COMPONENT_RESET, "PCI=0000:3b:00", "1"},
			{CheckXID, "XID-154", false, datamodels.RecommendedAction_NONE, "PCI=0000:3b:00", "1"},
		}},
		{"sxid", []string{
			fmt.Sprintf(sxid, "100.000000", "Non-fatal"),
			fmt.Sprintf(sxid, "101.000000", "Fatal"),
			fmt.Sprintf(sxid, "102.000000", "Non-fatal"),
		}, []want{
			{CheckSXID, "SXID-20034", false, datamodels.RecommendedAction_NONE, "NVSwitch=0000:08:00.0", "1"},
			{CheckSXID, "SXID-20034", true, datamodels.RecommendedAction_COMPONENT_RESET, "NVSwitch=0000:08:00.0", "1"},
			{CheckSXID, "SXID-20034", false, datamodels.RecommendedAction_NONE, "NVSwitch=0000:08:00.0", "1"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testParser(t, nil)
			for _, l := range tc.lines {
				p.Process(Line{Text: l, Mono: -1})
			}
			p.Flush(true)
			matchEvents(t, p.Drain(), tc.want)
		})
	}
}

// TestFloodSXidSummaryHeld: the summary of an SXid flood that polls save
// (held) while its window is open says "repeated N times" once, however
// many polls made it.
func TestFloodSXidSummaryHeld(t *testing.T) {
	p := testParser(t, nil)
	for _, sec := range []string{"100.000000", "100.500000", "101.000000"} {
		p.Process(Line{Text: "[" + sec + "] nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 20001, Non-fatal, Link 46 TX Replay Error", Mono: -1})
	}
	p.Flush(false) // the last line's group is complete; its window stays open
	var got []*datamodels.HealthEvent
	for i := 0; i < 3; i++ {
		got = append(got, p.held(1<<20)...)
	}
	p.Flush(true)
	final := p.Drain()
	got = append(got, final...)
	for _, ev := range got {
		if n := strings.Count(ev.Message, "rate-limited"); n > 1 {
			t.Errorf("suffix %d times: %s", n, ev.Message)
		}
	}
	if len(final) != 2 || final[1].Metadata["count"] != "2" || strings.Count(final[1].Message, "(repeated 2 times, rate-limited)") != 1 {
		t.Fatalf("want the first line, then a summary of 2 saying so once:\n%s", encodeT(final))
	}
}

func TestCatalog(t *testing.T) {
	c, err := DefaultCatalog()
	if err != nil {
		t.Fatal(err)
	}
	for code, a := range map[int]datamodels.RecommendedAction{13: nr, 31: nr, 45: nr, 48: cr, 79: rbm, 94: nr, 95: cr, 119: cr} {
		if x, _ := c.XID(code); x.Action != a {
			t.Errorf("XID %d action %s, want %s", code, x.Action, a)
		}
	}
	if x, ok := c.XID(4242); ok || x.Action != cs {
		t.Errorf("unknown XID: %v %v", x, ok)
	}
	for code, cl := range map[int]string{11004: "nonfatal", 20001: "nonfatal", 12028: "nonfatal", 11001: "fatal", 24007: "fatal", 12020: "always_fatal", 23017: "always_fatal", 10003: "always_fatal", 19084: "nonfatal"} {
		if s, ok := c.SXID(code, false); !ok || s.Class != cl {
			t.Errorf("SXid %d class %q, want %q", code, s.Class, cl)
		}
	}
	if s, _ := c.SXID(23001, true); s.Action != rbm {
		t.Errorf("always fatal SXid action %s", s.Action)
	}
	// Table 22: 10003 is fatal to the fabric/system (reset all GPUs and
	// NVSwitches); Table 19: 19084's recovery resets all of them too.
	for _, code := range []int{10003, 19084} {
		if s, _ := c.SXID(code, true); s.Action != rbm {
			t.Errorf("SXid %d action %s, want %s", code, s.Action, rbm)
		}
	}
}

// --- sources ---

type fakeKmsg struct{ recs []string }

func (f *fakeKmsg) read(_ int, b []byte) (int, error) {
	if len(f.recs) == 0 {
		return 0, syscall.EAGAIN
	}
	r := f.recs[0]
	f.recs = f.recs[1:]
	if r == "EPIPE" {
		return 0, syscall.EPIPE
	}
	return copy(b, r), nil
}

func TestKmsgSourceRestart(t *testing.T) {
	recs := []string{
		"6,100,1000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n SUBSYSTEM=module\n",
		"4,101,2000000,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE\n",
		"EPIPE",
		"12,102,2500000,-;NVRM: Xid (PCI:0000:3b:00): 79, written by user space\n", // facility user: ignored
		"4,103,3000000,c;NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, GR\n",
	}
	read := func(src *kmsgSource) []*datamodels.HealthEvent {
		p := testParser(t, nil)
		if err := src.read(context.Background(), 100, p.Process); err != nil {
			t.Fatal(err)
		}
		p.Flush(true)
		return p.Drain()
	}
	src := &kmsgSource{rd: (&fakeKmsg{recs: recs}).read, bootID: "boot-a", seq: -1, skip: -1, buf: make([]byte, 4096)}
	matchEvents(t, read(src), []want{{CheckXID, "XID-48", true, cr, "", ""}, {CheckXID, "XID-13", false, nr, "", ""}})
	st := src.position()
	if st.KmsgSeq != 103 || st.BootID != "boot-a" {
		t.Fatalf("position %+v", st)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := saveState(path, savedState{sourceState: st}); err != nil {
		t.Fatal(err)
	}
	st = loadState(path, slog.New(slog.DiscardHandler)).sourceState
	// Same boot: the ring buffer is read from its start again, and what was
	// read before the restart is skipped.
	again := &kmsgSource{rd: (&fakeKmsg{recs: append(recs, "4,104,4000000,-;NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=x, MMU\n")}).read,
		bootID: "boot-a", seq: st.KmsgSeq, skip: st.KmsgSeq, buf: make([]byte, 4096)}
	matchEvents(t, read(again), []want{{CheckXID, "XID-31", false, nr, "", ""}})
	// New boot: everything is new.
	fresh, err := func() (*kmsgSource, error) {
		s := &kmsgSource{rd: (&fakeKmsg{recs: recs}).read, bootID: "boot-b", seq: -1, skip: -1, buf: make([]byte, 4096)}
		if st.BootID == "boot-b" {
			s.skip = st.KmsgSeq
		}
		return s, nil
	}()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(read(fresh)); n != 2 {
		t.Errorf("new boot: %d events, want 2", n)
	}
}

func TestFileSourceFollowAndRotate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kern.log")
	write := func(s string, flags int) {
		f, err := os.OpenFile(path, flags|os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(s)
		f.Close()
	}
	c, err := New(Config{Source: SourceFile, File: path, StateDir: dir, ProcStatPath: "/nonexistent",
		Parser: ParserConfig{BootTime: testBoot, Now: func() time.Time { return testNow }}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	check := func(want int) {
		t.Helper()
		evs, err := c.Check(ctx)
		if err == nil {
			err = c.Commit()
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != want {
			t.Fatalf("got %d events, want %d:\n%s", len(evs), want, encodeT(evs))
		}
	}
	write("[ 1.0] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE\n[ 2.0] NVRM: Xid (PCI:0000:5d:00): 4", os.O_TRUNC)
	check(1)                                                                                          // the partial line waits
	write("8, pid=1, name=x, DBE\n", os.O_APPEND)                                                     // completed
	check(1)                                                                                          //
	check(0)                                                                                          // nothing new
	c2, _ := New(Config{Source: SourceFile, File: path, StateDir: dir, ProcStatPath: "/nonexistent"}) // restart
	if evs, _ := c2.Check(ctx); len(evs) != 0 {
		t.Fatalf("restart re-reported %d events", len(evs))
	}
	write("[ 2.5] NVRM: Xid (PCI:0000:86:00): 48, pid=1, name=x, DBE\n", os.O_APPEND) // written before the rotation
	os.Rename(path, path+".1")
	write("[ 3.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n", os.O_TRUNC)
	check(2) // rotated: the old file's rest (it was lost), then the new file from its start
}

// TestFileSourceResumesTheSameFileOnly: after a restart the file source
// reads on from the saved offset only while the file starts with the bytes
// it started with: a kern.log truncated in place while the agent was down
// (the same inode) and grown past the offset is read from its start — read
// on from the offset, mid-line, its Xid 79 was lost. A state saved without
// that fingerprint (an earlier version) resumes at its offset.
func TestFileSourceResumesTheSameFileOnly(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kern.log")
	if err := os.WriteFile(path, []byte("[ 1.0] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	check := func() string {
		t.Helper()
		c, err := New(Config{Source: SourceFile, File: path, StateDir: dir, ProcStatPath: "/nonexistent"})
		if err != nil {
			t.Fatal(err)
		}
		evs, err := c.Check(context.Background())
		if err == nil {
			err = c.Commit()
		}
		if err != nil {
			t.Fatal(err)
		}
		return encodeT(evs)
	}
	if got := check(); !strings.Contains(got, "XID-48") {
		t.Fatalf("first run: %s", got)
	}
	// The state as an earlier version wrote it: no fingerprint.
	state := filepath.Join(dir, "kmsg-"+SourceFile+".json")
	b, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(b, &st); err != nil || st["head"] == nil {
		t.Fatalf("state %s: no head (%v)", b, err)
	}
	delete(st, "head")
	if b, err = json.Marshal(st); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(state, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := check(); got != "" {
		t.Fatalf("restarted with an earlier version's state: %s; want none", got)
	}
	if err := os.WriteFile(path, []byte("[ 5.0] NVRM: Xid (PCI:0000:86:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := check(); !strings.Contains(got, "XID-79") {
		t.Fatalf("truncated in place and grown past the offset: %q; want its Xid 79", got)
	}
}

func TestJournalSource(t *testing.T) {
	var calls [][]string
	out := strings.Join([]string{
		formats["journal-json"](5*time.Second, canonical[1]),
		`{"__CURSOR":"s=1;i=99","MESSAGE":"usb 1-1: noise","__REALTIME_TIMESTAMP":"1"}`,
	}, "\n")
	j := &journalSource{path: "journalctl", run: func(_ context.Context, name string, args ...string) (io.ReadCloser, func() error, error) {
		calls = append(calls, args)
		return io.NopCloser(strings.NewReader(out)), func() error { return nil }, nil
	}}
	p := testParser(t, nil)
	if err := j.read(context.Background(), 100, p.Process); err != nil {
		t.Fatal(err)
	}
	if err := j.read(context.Background(), 100, p.Process); err != nil {
		t.Fatal(err)
	}
	p.Flush(true)
	matchEvents(t, p.Drain(), []want{{CheckXID, "XID-48", true, cr, "", ""}})
	if got := strings.Join(calls[0], " "); got != "-k -o json --no-pager -b" {
		t.Errorf("first call %q", got)
	}
	if got := strings.Join(calls[1], " "); got != "-k -o json --no-pager --after-cursor=s=1;i=99" {
		t.Errorf("second call %q", got)
	}
	// At most max entries a read; the next goes on from the last one read.
	calls = nil
	out = strings.Join([]string{
		`{"__CURSOR":"s=1;i=100","MESSAGE":"one","__REALTIME_TIMESTAMP":"1"}`,
		`{"__CURSOR":"s=1;i=101","MESSAGE":"two","__REALTIME_TIMESTAMP":"2"}`,
		`{"__CURSOR":"s=1;i=102","MESSAGE":"three","__REALTIME_TIMESTAMP":"3"}`,
	}, "\n")
	var lines []string
	if err := j.read(context.Background(), 2, func(l Line) { lines = append(lines, l.Text) }); err != nil {
		t.Fatal(err)
	}
	if len(lines) != 2 || j.cursor != "s=1;i=101" {
		t.Fatalf("read %d entries, cursor %q; want 2 and the second's", len(lines), j.cursor)
	}
	j.run = func(context.Context, string, ...string) (io.ReadCloser, func() error, error) {
		return nil, nil, errors.New("exec: not found")
	}
	if err := j.read(context.Background(), 10, p.Process); err == nil {
		t.Error("journalctl failure not reported")
	}
}

func TestCheckNotPresent(t *testing.T) {
	c, err := New(Config{KmsgPath: "/nonexistent/kmsg"})
	if err != nil {
		t.Fatal(err)
	}
	if evs, err := c.Check(context.Background()); err != nil || evs != nil {
		t.Fatalf("absent /dev/kmsg: %v %v", evs, err)
	}
	if c.Name() != "kmsg" {
		t.Error(c.Name())
	}
	if _, err := New(Config{Source: "tape"}); err == nil || !strings.Contains(err.Error(), "kmsg.source") {
		t.Errorf("bad source: %v", err)
	}
}

func TestParseCommand(t *testing.T) {
	in, _ := os.ReadFile("testdata/mixed.log")
	var a, b bytes.Buffer
	if err := ParseCommand([]string{"--utc", "--boot-time", testBoot.Format(time.RFC3339)}, bytes.NewReader(in), &a); err != nil {
		t.Fatal(err)
	}
	if err := ParseCommand([]string{"--utc", "--boot-time", testBoot.Format(time.RFC3339), "testdata/mixed.log"}, nil, &b); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile("testdata/mixed.golden.jsonl")
	if a.String() != string(want) || b.String() != string(want) {
		t.Errorf("parse command output differs from the golden file:\n%s", a.String())
	}
	if err := ParseCommand([]string{"a", "b"}, nil, io.Discard); err == nil {
		t.Error("two files accepted")
	}
}

func ExampleParseStream() {
	p, _ := NewParser(ParserConfig{})
	_ = ParseStream(p, strings.NewReader("[ 5.1] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"),
		func(ev *datamodels.HealthEvent) error {
			fmt.Println(ev.CheckName, ev.ErrorCode, ev.IsFatal, ev.RecommendedAction)
			return nil
		})
	// Output: SysLogsXIDError [XID-79] true RESTART_BM
}

// TestSyslogYearOverNewYear: a syslog time prints no year. It is the
// year of the line's reading, or the year before for a date that would be
// more than a day after it — not the year the parser (the agent) started
// in: an agent started in December dated every kern.log line of January a
// year early, and a December line replayed in January is December's.
func TestSyslogYearOverNewYear(t *testing.T) {
	const xid = "%s gpu-node-42 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
	for _, tc := range []struct {
		name    string
		started time.Time // the parser's start
		read    time.Time // the clock when the line is read
		line    string    // syslog prefix
		want    time.Time
	}{
		{"same year", time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 6, 1, 0, 10, 0, 0, time.UTC), "Jun  1 00:05:00", time.Date(2026, 6, 1, 0, 5, 0, 0, time.UTC)},
		{"started in December, read in January", time.Date(2026, 12, 31, 23, 50, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 10, 0, 0, time.UTC), "Jan  1 00:05:00", time.Date(2027, 1, 1, 0, 5, 0, 0, time.UTC)},
		{"December's line read in January", time.Date(2027, 1, 1, 0, 5, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 10, 0, 0, time.UTC), "Dec 31 23:55:00", time.Date(2026, 12, 31, 23, 55, 0, 0, time.UTC)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := tc.started
			p, err := NewParser(ParserConfig{Location: time.UTC, Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			now = tc.read
			p.Process(Line{Text: fmt.Sprintf(xid, tc.line), Mono: -1})
			p.Flush(true)
			evs := p.Drain()
			if len(evs) != 1 {
				t.Fatalf("%d events", len(evs))
			}
			if got := evs[0].GetGeneratedTimestamp().AsTime(); !got.Equal(tc.want) {
				t.Errorf("%q read at %s: %s, want %s", tc.line, tc.read, got, tc.want)
			}
		})
	}
}

// TestParseCommandTimeZone: `kmsg parse --time-zone` reads a kern.log
// recorded on a host in another zone in that host's.
func TestParseCommandTimeZone(t *testing.T) {
	const line = "Oct 28 05:31:00 gpu-node-42 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE\n"
	for _, tc := range []struct {
		zone, want string
	}{
		{"America/Chicago", `"generatedTimestamp":"2024-10-28T10:31:00Z"`},
		{"UTC", `"generatedTimestamp":"2024-10-28T05:31:00Z"`},
		{"Mars/Olympus", "--time-zone"},
	} {
		var out bytes.Buffer
		err := ParseCommand([]string{"--year", "2024", "--time-zone", tc.zone}, strings.NewReader(line), &out)
		got := out.String()
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("--time-zone %s: %s, want %s", tc.zone, got, tc.want)
		}
	}
}

// TestNICRecoveryAfterItsFloodSummary: an mlx5 fault repeated within its
// flood window, then recovered, is reported fault, summary of the held
// repeat, recovery — the summary came after the recovery when the window
// closed, and the NIC stood faulty with nothing to lift it — and the same
// fault again after the recovery is reported at once, a new fault.
func TestNICRecoveryAfterItsFloodSummary(t *testing.T) {
	for _, tc := range []struct{ code, fault, recovery string }{
		{"MLX5-MODULE-UNPLUGGED", "Port module event: module 1, Cable unplugged", "Port module event: module 1, Cable plugged"},
		{"MLX5-INSUFFICIENT-POWER", "Detected insufficient power on the PCIe slot (27W).", "PCIe slot advertised sufficient power (75W)."},
	} {
		t.Run(tc.code, func(t *testing.T) {
			clock := testBoot.Add(100 * time.Second)
			p := testParser(t, func(c *ParserConfig) { c.Now = func() time.Time { return clock } })
			var got []*datamodels.HealthEvent
			line := func(sec float64, msg string) {
				clock = testBoot.Add(time.Duration(sec * float64(time.Second)))
				p.Process(Line{Text: fmt.Sprintf("[%12.6f] mlx5_core 0000:0c:00.1: mlx5_event:1155:(pid 0): %s", sec, msg), Mono: -1})
				p.Flush(false)
				got = append(got, p.Drain()...)
			}
			line(100, tc.fault)
			line(101, tc.fault) // held in the flood window
			line(102, tc.recovery)
			if n := len(got); n != 3 || got[1].GetIsHealthy() || got[1].Metadata["count"] != "1" || !got[2].GetIsHealthy() {
				t.Fatalf("want the fault, its held repeat, then the recovery:\n%s", encodeT(got))
			}
			line(103, tc.fault) // within the window the recovery ended
			if n := len(got); n != 4 || got[3].GetIsHealthy() || got[3].GetErrorCode()[0] != tc.code {
				t.Fatalf("a fault after the recovery not reported at once:\n%s", encodeT(got))
			}
			line(120, "noise") // every window has closed by now
			if n := len(got); n != 4 {
				t.Fatalf("events after the windows closed:\n%s", encodeT(got[4:]))
			}
		})
	}
}

// TestFloodSummaryOfOneHasItsTimes: a summary standing for one occurrence
// carries first_seen and last_seen too, so its event (and id) is never
// that of an event of the window already reported.
func TestFloodSummaryOfOneHasItsTimes(t *testing.T) {
	p := testParser(t, nil)
	for _, sec := range []string{"100.000000", "100.500000"} {
		p.Process(Line{Text: "[" + sec + "] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, Graphics Exception", Mono: -1})
	}
	p.Flush(true)
	got := p.Drain()
	if len(got) != 2 || got[1].Metadata["count"] != "1" || got[1].Metadata["first_seen"] == "" ||
		got[1].Metadata["first_seen"] != got[1].Metadata["last_seen"] || got[1].Metadata["flood"] != "" {
		t.Fatalf("want the first line, then a summary of 1 with its times:\n%s", encodeT(got))
	}
}
