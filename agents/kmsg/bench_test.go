package kmsg

import (
	"fmt"
	"math/rand"
	"strings"
	"syscall"
	"testing"
	"time"
)

// benchCorpus builds a realistic mixed kernel log: mostly unrelated kernel
// noise, with NVIDIA, NVSwitch and mlx5 messages (1 in 50 lines), in the
// formats of dmesg, dmesg -T, syslog, journal short-iso and journal JSON.
func benchCorpus(n int) []string {
	rnd := rand.New(rand.NewSource(1))
	noise := []string{
		"usb 1-1.4: new high-speed USB device number %d using xhci_hcd",
		"EXT4-fs (nvme0n1p2): re-mounted %d. Quota mode: none.",
		"audit: type=1400 audit(1700000000.123:%d): apparmor=\"STATUS\" operation=\"profile_load\" profile=\"unconfined\" name=\"snap.lxd\"",
		"IPv6: ADDRCONF(NETDEV_CHANGE): eth%d: link becomes ready",
		"nvme nvme0: I/O %d QID 5 timeout, completion polled",
		"perf: interrupt took too long (%d > 2500), lowering kernel.perf_event_max_sample_rate to 79750",
		"TCP: request_sock_TCP: Possible SYN flooding on port 8080. Sending cookies.  Check SNMP counters %d.",
		"kvm: already loaded vendor module 'kvm_intel' %d",
		"systemd-journald[%d]: Received client request to flush runtime journal.",
		"mce: [Hardware Error]: Machine check events logged %d",
		"ib0: mtu > 4092 will cause multicast packet drops %d",
		"bond0: (slave ens7f%d): link status definitely up, 100000 Mbps full duplex",
	}
	hits := []string{
		"NVRM: Xid (PCI:0000:%02x:00): 13, pid=22101, name=python3, Graphics Exception: ESR 0x514648=0x1000f 0x514650=0x0",
		"NVRM: Xid (PCI:0000:%02x:00): 31, pid=22101, name=pt_main_thread, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS",
		"NVRM: Xid (PCI:0000:%02x:00): 48, pid=3301, name=train.py, An uncorrectable double bit error (DBE) has been detected",
		"nvidia-nvswitch3: SXid (PCI:0000:%02x:00.0): 28006, Non-fatal, Link 46 MC TS crumbstore MCTO (First)",
		"nvidia-nvswitch3: SXid (PCI:0000:%02x:00.0): 28006, Severity 0 Engine instance 46 Sub-engine instance 00",
		"mlx5_core 0000:%02x:00.0: wait_func:1163:(pid 24101): ACCESS_REG(0x805) timeout. Will cause a leak of a command resource",
		"NVRM: GPU at PCI:0000:%02x:00: GPU-c43f0536-e751-7211-d7a7-78c95249ee7d",
	}
	out := make([]string, n)
	for i := range out {
		d := time.Duration(i) * 3 * time.Millisecond
		var msg string
		if i%50 == 7 {
			msg = fmt.Sprintf(hits[rnd.Intn(len(hits))], 0x10+rnd.Intn(8))
		} else {
			msg = fmt.Sprintf(noise[rnd.Intn(len(noise))], rnd.Intn(100000))
		}
		switch i % 5 {
		case 0:
			out[i] = formats["dmesg"](d, msg)
		case 1:
			out[i] = formats["dmesg-T"](d, msg)
		case 2:
			out[i] = formats["syslog-printk"](d, msg)
		case 3:
			out[i] = formats["journal-short-iso"](d, msg)
		case 4:
			out[i] = formats["journal-json"](d, msg)
		}
	}
	return out
}

// BenchmarkParseMixed measures kernel-log lines parsed per second on one
// core: go test -run '^$' -bench ParseMixed -cpu 1 ./agents/kmsg/
func BenchmarkParseMixed(b *testing.B) {
	corpus := benchCorpus(200000)
	bytes := 0
	for _, l := range corpus {
		bytes += len(l) + 1
	}
	p := testParser(b, nil)
	b.SetBytes(int64(bytes / len(corpus)))
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		p.Process(Line{Text: corpus[i%len(corpus)], Mono: -1})
		if i%4096 == 0 {
			p.Flush(false)
			p.Drain()
		}
	}
	b.StopTimer()
	report(b, cpu0)
}

// BenchmarkParseFlood measures a flood: every line is the same Xid on the
// same GPU, each with its own timestamp.
func BenchmarkParseFlood(b *testing.B) {
	lines := floodLines
	for i := range lines {
		if lines[i] != "" {
			break
		}
		lines[i] = fmt.Sprintf("[%12.6f] NVRM: Xid (PCI:0000:3b:00): 13, pid=%d, name=python3, Graphics Exception: ESR 0x514648=0x1000f", float64(i)*0.0001, 1000+i%7)
	}
	p := testParser(b, nil)
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		// Shift time forward on each pass so dedup does not swallow repeats.
		if i > 0 && i%len(lines) == 0 {
			p = testParser(b, nil)
		}
		p.Process(Line{Text: lines[i%len(lines)], Mono: -1})
		if i%4096 == 0 {
			p.Flush(false)
			p.Drain()
		}
	}
	b.StopTimer()
	report(b, cpu0)
}

var _ = strings.Join

// report adds lines/s of wall-clock time and lines per CPU-second of this
// process (user+system), the per-core figure that holds on a shared
// machine where wall-clock time includes waiting for a core.
func report(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "lines/s")
	if d := cpuTime() - cpu0; d > 0 {
		b.ReportMetric(float64(b.N)/d.Seconds(), "lines/cpu-s")
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var floodLines = make([]string, 100000)
