package fabric

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestSwitchesNotBound: on an HGX H100 whose NVSwitch driver binds no
// switch (its procfs device list empty) while the switches are on the PCI
// bus (class 0x0680), the node still has a fabric: the FM service that
// failed is not reported recovered, the FM log is still read, and the
// switches the driver does not use are reported missing. The switches the
// NVSwitch driver binds (nvidia-nvswitch) are on the PCI bus too.
func TestSwitchesNotBound(t *testing.T) {
	n := h100Node(t, nil)
	n.healthy()
	n.pci("0x0680", h100Switches...)
	for _, p := range h100Switches {
		if err := os.Symlink("../../../bus/pci/drivers/nvidia-nvswitch", filepath.Join(n.dir, "sys/bus/pci/devices", p, "driver")); err != nil {
			t.Fatal(err)
		}
	}
	n.write("fabricmanager.log", fmStartLine+"\n")
	n.r.out["systemctl show"] = showFailed
	s, _ := n.c.Collect(context.Background())
	if !slices.Equal(s.PCISwitches, h100Switches) {
		t.Errorf("NVSwitches on the PCI bus: %v, want %v (those bound to nvidia-nvswitch too)", s.PCISwitches, h100Switches)
	}
	if got := shorts(n.poll(30 * time.Second)); got != "FabricManagerService:FM-SERVICE-FAILED:fatal@0000:05:00.0" {
		t.Fatalf("failed service: %q", got)
	}
	// The driver binds none of them now.
	for _, p := range h100Switches {
		if err := os.Remove(filepath.Join(n.dir, "proc/driver/nvidia-nvswitch/devices", p)); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(n.dir, "sys/bus/pci/devices", p, "driver")); err != nil {
			t.Fatal(err)
		}
	}
	n.appendLog("fabricmanager.log", "[Oct 28 2024 10:30:40] [ERROR] [tid 9] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:07:00.0 physical id 2 port 46")
	want := "FabricManagerNVSwitchError:SXID-20034:fatal@0000:07:00.0 FabricManagerHAMode:FM-HA-NVSWITCH-UNAVAILABLE:fatal@0000:05:00.0"
	if got := shorts(n.poll(30 * time.Second)); got != want {
		t.Fatalf("no switch bound: %q\nwant %q (the service's failure standing)", got, want)
	}
	if got := shorts(n.poll(30 * time.Second)); got != "" {
		t.Fatalf("reported again: %q", got)
	}
	// Bound again and FM running: both recover.
	n.switches(h100Switches...)
	n.r.out["systemctl show"] = showActive
	want = "FabricManagerService::healthy@0000:05:00.0 FabricManagerHAMode::healthy@0000:05:00.0"
	if got := shorts(n.poll(30 * time.Second)); got != want {
		t.Fatalf("bound again: %q\nwant %q", got, want)
	}
}
