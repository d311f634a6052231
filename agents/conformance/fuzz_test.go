package conformance

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/internal/fuzzseed"
	"github.com/faultline/faultline/schemas/events"
)

// FuzzCheck: whatever the node's files and the BMC tool hold, the check
// does not panic; it reports every component, in one event the gateway
// takes once stamped as the agent stamps it, whose fingerprint is that of
// the components it carries, the same on a second collection; and a port
// file it does not need (a rate or state no parser takes) leaves the NIC
// firmware readable.
func FuzzCheck(f *testing.F) {
	f.Add("550.54.14", "Video BIOS:      96.00.89.00.01\n", "28.39.1002", "1: DOWN", "2.1.5", "03/14/2024", "6.8.0-45-generic", "BOOT_IMAGE=/vmlinuz ro iommu=pt", "sha256:4b1f", []byte("Firmware Revision         : 1.12\n"))
	f.Add("", "", "", "", "", "", "", "", "", []byte(nil))
	f.Add("\x1b[31m550\x00", "Video BIOS:\n", "28.39.1002\n\n", "garbage", "\xff\xfe", strings.Repeat("9", 5000), "6.8\r\n", "a\x00b\x00c", "unreadable: x", []byte("Firmware Revision : \x1b[0m\n"))
	f.Add("1", "Model: H100\nVideo BIOS: \xc3\n", "x", "4: ACTIVE: extra", "v", "d", "k", strings.Repeat("p ", 3000), "i", []byte("Firmware Revision:"))
	root := f.TempDir()
	if err := os.CopyFS(root, os.DirFS(filepath.Join("testdata", "h100-a"))); err != nil {
		f.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Sysfs, cfg.Procfs = filepath.Join(root, "sys"), filepath.Join(root, "proc")
	cfg.OSImageFile = filepath.Join(root, "os-image")
	cfg.Components = []Component{{Name: "bios_from_file", File: filepath.Join(root, "sys/class/dmi/id/bios_version"), Pattern: `^(\S+)`}}
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, driver, information, fwVer, portState, biosVersion, biosDate, osrelease, cmdline, osImage string, bmc []byte) {
		for path, v := range map[string]string{
			"sys/module/nvidia/version":                        driver,
			"proc/driver/nvidia/gpus/0000:18:00.0/information": information,
			"sys/class/infiniband/mlx5_0/fw_ver":               fwVer,
			"sys/class/infiniband/mlx5_0/ports/1/state":        portState,
			"sys/class/infiniband/mlx5_1/ports/1/rate":         portState,
			"sys/class/dmi/id/bios_version":                    biosVersion,
			"sys/class/dmi/id/bios_date":                       biosDate,
			"proc/sys/kernel/osrelease":                        osrelease,
			"proc/cmdline":                                     cmdline,
			"os-image":                                         osImage,
		} {
			if err := os.WriteFile(filepath.Join(root, path), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		c, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.run = func(context.Context, []string) ([]byte, error) { return bmc, nil }
		evs, err := c.Check(t.Context())
		if err != nil || len(evs) != 1 {
			t.Fatalf("Check = %d events, %v; want one", len(evs), err)
		}
		ev := evs[0]
		comps := components(ev.Metadata)
		for _, n := range append(BuiltIns, "bios_from_file") {
			if _, ok := comps[n]; !ok {
				t.Errorf("component %s not reported: %v", n, ev.Metadata)
			}
		}
		again := c.Collect(t.Context())
		if fp := Fingerprint(again); ev.Metadata[MetaFingerprint] != fp {
			t.Errorf("fingerprint %s, a second collection's %s", ev.Metadata[MetaFingerprint], fp)
		}
		if !strings.Contains(again[NICFirmware], events.Printable(strings.TrimSpace(fwVer))) {
			t.Errorf("nic_firmware %q, want it to hold mlx5_0's fw_ver %q whatever the ports hold", again[NICFirmware], fwVer)
		}
		fuzzseed.Stamped(t, "conformance", evs, now)
	})
}
