package conformance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/validate"
)

func fixture(t *testing.T, tree string, mod func(*Config)) *Check {
	t.Helper()
	cfg := DefaultConfig()
	root := filepath.Join("testdata", tree)
	cfg.Sysfs, cfg.Procfs = filepath.Join(root, "sys"), filepath.Join(root, "proc")
	cfg.OSImageFile = filepath.Join(root, "os-image")
	if mod != nil {
		mod(&cfg)
	}
	c, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.run = func(_ context.Context, argv []string) ([]byte, error) {
		switch argv[0] {
		case "ipmitool":
			return []byte("Device ID                 : 32\nFirmware Revision         : 1.12\nIPMI Version              : 2.0\n"), nil
		case "broken":
			return nil, errors.New("broken: exit status 1: permission denied")
		}
		return []byte(strings.Join(argv[1:], " ") + "\n"), nil
	}
	return c
}

func TestCollect(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tree   string
		mod    func(*Config)
		want   map[string]string // subset
		bad    []string          // components that must be unreadable
		absent []string          // components that must be reported absent
		gone   []string          // components that must be left out
	}{
		{name: "h100 reference", tree: "h100-a", want: map[string]string{
			GPUDriver: "550.54.14", GPUVBIOS: "96.00.89.00.01", NICFirmware: "28.39.1002",
			BIOSVersion: "2.1.5", BIOSDate: "03/14/2024", BMCVersion: "1.12", Kernel: "6.8.0-45-generic",
			BootParams: "root=UUID=* ro iommu=pt pci=realloc=off",
			OSImage:    "sha256:4b1f0c8e2d7a9b3c5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5",
		}},
		{name: "mixed NIC firmware is the sorted set", tree: "h100-b", want: map[string]string{NICFirmware: "28.39.1002,28.41.1000"}},
		{name: "no GPU, no RDMA: absent, not dropped", tree: "no-gpu", absent: []string{GPUDriver, GPUVBIOS, NICFirmware}},
		{name: "os image not configured", tree: "h100-a", mod: func(c *Config) { c.OSImageFile = "" }, absent: []string{OSImage}},
		{name: "os image from a command", tree: "h100-a", mod: func(c *Config) { c.OSImageFile, c.OSImageCommand = "", []string{"echo", "sha256:abc"} },
			want: map[string]string{OSImage: "sha256:abc"}},
		{name: "bmc command failing", tree: "h100-a", mod: func(c *Config) { c.BMCCommand = []string{"broken"} }, bad: []string{BMCVersion}},
		{name: "bmc off", tree: "h100-a", mod: func(c *Config) { c.BMCCommand = nil }, gone: []string{BMCVersion}},
		{name: "disabled built-in", tree: "no-gpu", mod: func(c *Config) { c.Disable = []string{GPUVBIOS} }, gone: []string{GPUVBIOS}, absent: []string{GPUDriver}},
		{name: "extra components", tree: "h100-a", mod: func(c *Config) {
			c.Components = []Component{
				{Name: "product", File: "testdata/h100-a/sys/class/dmi/id/product_name"},
				{Name: "ofed", Command: []string{"echo", "OFED-internal-24.07-0.6.1:"}, Pattern: `OFED-internal-(\S+):`},
				{Name: "missing", File: "testdata/nothing-here"},
			}
		}, want: map[string]string{"product": "DGX H100", "ofed": "24.07-0.6.1"}, bad: []string{"missing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fixture(t, tc.tree, tc.mod)
			got := c.Collect(context.Background())
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
			for _, k := range tc.bad {
				if !strings.HasPrefix(got[k], Unreadable) || len(got[k]) <= len(Unreadable) {
					t.Errorf("%s = %q, want unreadable with a reason", k, got[k])
				}
			}
			for _, k := range tc.absent {
				if !strings.HasPrefix(got[k], Absent) || len(got[k]) <= len(Absent) {
					t.Errorf("%s = %q, want absent with a reason", k, got[k])
				}
			}
			for _, k := range tc.gone {
				if _, ok := got[k]; ok {
					t.Errorf("%s reported (%q), want left out", k, got[k])
				}
			}
			for _, k := range BuiltIns {
				_, ok := got[k]
				switch {
				case k == BMCVersion && len(c.cfg.BMCCommand) == 0, contains(c.cfg.Disable, k):
				case !ok:
					t.Errorf("built-in %s dropped", k)
				}
			}
		})
	}
}

// components are the component values an event's metadata carries.
func components(md map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range md {
		if n, ok := strings.CutPrefix(k, MetaComponentPrefix); ok {
			out[n] = v
		}
	}
	return out
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestEvent(t *testing.T) {
	c := fixture(t, "no-gpu", func(c *Config) { c.BMCCommand = []string{"broken"} })
	evs, err := c.Check(context.Background())
	if err != nil || len(evs) != 1 {
		t.Fatalf("Check = %d events, %v", len(evs), err)
	}
	ev := evs[0]
	if ev.CheckName != "NodeConformance" || !ev.IsHealthy || ev.IsFatal {
		t.Fatalf("event %v", ev)
	}
	md := ev.Metadata
	comps := components(md)
	if md[MetaFingerprint] != Fingerprint(comps) || len(md[MetaFingerprint]) != 64 {
		t.Fatalf("fingerprint %q does not match components %v", md[MetaFingerprint], comps)
	}
	if !strings.Contains(ev.Message, "unreadable: bmc_version; absent: gpu_driver, gpu_vbios, nic_firmware") {
		t.Errorf("message %q does not name the unreadable and absent components", ev.Message)
	}
}

func TestFingerprintStability(t *testing.T) {
	a := fixture(t, "h100-a", nil)
	b := fixture(t, "h100-b", nil)
	ca, cb := a.Collect(context.Background()), b.Collect(context.Background())
	fa := Fingerprint(ca)
	// Order independence: maps iterate in random order; insert in reverse.
	for i := 0; i < 50; i++ {
		m := map[string]string{}
		keys := []string{}
		for k := range ca {
			keys = append(keys, k)
		}
		for j := len(keys) - 1; j >= 0; j-- {
			m[keys[j]] = ca[keys[j]]
		}
		if Fingerprint(m) != fa {
			t.Fatal("fingerprint depends on order")
		}
	}
	if again := Fingerprint(a.Collect(context.Background())); again != fa {
		t.Fatal("fingerprint not stable over collections")
	}
	if Fingerprint(cb) == fa {
		t.Fatal("NIC firmware change did not change the fingerprint")
	}
	// Any one component's change changes it; so do an added or removed one.
	for k := range ca {
		m := maps.Clone(ca)
		m[k] += "x"
		if Fingerprint(m) == fa {
			t.Errorf("change of %s kept the fingerprint", k)
		}
		delete(m, k)
		if Fingerprint(m) == fa {
			t.Errorf("removing %s kept the fingerprint", k)
		}
	}
	m := maps.Clone(ca)
	m["extra"] = ""
	if Fingerprint(m) == fa {
		t.Error("an added component kept the fingerprint")
	}
	// No ambiguity between names and values.
	if Fingerprint(map[string]string{"a": "b\nc=d"}) == Fingerprint(map[string]string{"a": "b", "c": "d"}) {
		t.Error("a value with a newline collides with two components")
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Interval = 0 }, "conformance.interval"},
		{func(c *Config) { c.Timeout = -1 }, "conformance.timeout"},
		{func(c *Config) { c.OSImageFile, c.OSImageCommand = "f", []string{"x"} }, "conformance.os_image_command"},
		{func(c *Config) { c.Disable = []string{"gpu"} }, "conformance.disable"},
		{func(c *Config) { c.BMCPattern = "(" }, "conformance.bmc_pattern"},
		{func(c *Config) { c.BootParamsIgnore = []string{"xname=x1000c0s0b0n0"} }, "conformance.boot_params_ignore"},
		{func(c *Config) { c.BootParamsIgnore = []string{"site rack"} }, "conformance.boot_params_ignore"},
		{func(c *Config) { c.BootParamsIgnore = []string{""} }, "conformance.boot_params_ignore"},
		{func(c *Config) { c.Components = []Component{{Name: "Bad Name", File: "f"}} }, "conformance.components[0].name"},
		{func(c *Config) { c.Components = []Component{{Name: "kernel", File: "f"}} }, "conformance.components[0].name"},
		{func(c *Config) { c.Components = []Component{{Name: "x"}} }, "conformance.components[0]: exactly one"},
		{func(c *Config) { c.Components = []Component{{Name: "x", File: "f", Pattern: "["}} }, "conformance.components[0].pattern"},
	} {
		c := DefaultConfig()
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate = %v, want %q", err, tc.want)
		}
	}
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestLongValueCut(t *testing.T) {
	comps := map[string]string{"boot_params": strings.Repeat("a", 5000)}
	ev := Event(comps)
	if n := len(ev.Metadata["component.boot_params"]); n > MaxValue {
		t.Fatalf("value %d bytes", n)
	}
	if ev.Metadata[MetaFingerprint] != Fingerprint(comps) {
		t.Fatal("fingerprint not over the whole value")
	}
}

// TestEventPassesGatewayValidation: the gateway's validator (shared with
// the agent's spool) accepts the check's events, the no-GPU node's
// unreadable components included.
func TestEventPassesGatewayValidation(t *testing.T) {
	for _, tree := range []string{"h100-a", "no-gpu"} {
		ev := Event(fixture(t, tree, nil).Collect(context.Background()))
		ev.NodeName = "node-1"
		ev.GeneratedTimestamp = timestamppb.Now()
		if err := (validate.Validator{}).Validate(ev, time.Now()); err != nil {
			t.Errorf("%s: %v", tree, err)
		}
	}
}

// TestNICFirmwareBesidePortFaults: a port file procfs cannot parse (a rate
// or state no parser takes) is the NIC check's business; the firmware
// versions are still read, and a device without fw_ver is named.
func TestNICFirmwareBesidePortFaults(t *testing.T) {
	for _, tc := range []struct{ file, content string }{
		{"mlx5_0/ports/1/rate", "Invalid argument"},
		{"mlx5_0/ports/1/state", "garbage"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			root := t.TempDir()
			if err := os.CopyFS(root, os.DirFS(filepath.Join("testdata", "h100-b"))); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "sys/class/infiniband", tc.file), []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			c := fixture(t, "h100-b", func(c *Config) { c.Sysfs = filepath.Join(root, "sys") })
			if got := c.Collect(t.Context())[NICFirmware]; got != "28.39.1002,28.41.1000" {
				t.Fatalf("nic_firmware = %q, want both cards' firmware", got)
			}
		})
	}
	c := fixture(t, "h100-b", func(c *Config) { c.Sysfs = t.TempDir() })
	if err := os.MkdirAll(filepath.Join(c.cfg.Sysfs, "class/infiniband/mlx5_0"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := c.Collect(t.Context())[NICFirmware]; !strings.HasPrefix(got, Unreadable) || !strings.Contains(got, "mlx5_0/fw_ver") {
		t.Fatalf("nic_firmware = %q, want unreadable naming the missing fw_ver", got)
	}
}

// TestNICFirmwareDriverLoading: with a Mellanox NIC on the PCI bus whose
// RDMA device is yet to appear (bound to mlx5_core with mlx5_ib or ib_core
// loaded, or bound to no driver just after boot or while mlx5_core or
// mlx_compat is loaded: an openibd / MOFED reload), a missing or empty
// class/infiniband is its driver loading late or being reloaded (MOFED
// restarting mlx5_core): unreadable, left out of the majority, not the
// stable "absent" that would make the node drift. A ConnectX used as a
// plain Ethernet NIC (mlx5_core without mlx5_ib), passed to a VM
// (vfio-pci) or left without driver long after boot never has one: absent,
// not unreadable for ever.
func TestNICFirmwareDriverLoading(t *testing.T) {
	const ib, eth = "0x020700", "0x020000"
	for _, tc := range []struct {
		name          string
		vendor, class string   // "": no PCI device
		driver        string   // the device's driver link; "": none
		modules       []string // in <sysfs>/module
		uptime        string   // <procfs>/uptime; "": none
		ibDir         bool     // an empty class/infiniband
		want          string   // prefix
	}{
		{"ConnectX InfiniBand, mlx5_ib loaded, class/infiniband missing", "0x15b3", ib, "mlx5_core", []string{"mlx5_core", "mlx5_ib", "ib_core"}, "172800.00 1000.00", false, Unreadable},
		{"ConnectX InfiniBand, mlx5_ib loaded, class/infiniband empty", "0x15b3", ib, "mlx5_core", []string{"mlx5_core", "mlx5_ib", "ib_core"}, "172800.00 1000.00", true, Unreadable},
		{"ConnectX Ethernet, ib_core loaded, class/infiniband empty", "0x15b3", eth, "mlx5_core", []string{"mlx5_core", "ib_core"}, "172800.00 1000.00", true, Unreadable},
		{"Ethernet-only ConnectX: mlx5_core without mlx5_ib", "0x15b3", eth, "mlx5_core", []string{"mlx5_core"}, "120.00 100.00", true, Absent},
		{"ConnectX passed to a VM: vfio-pci", "0x15b3", ib, "vfio-pci", []string{"vfio_pci", "mlx5_ib", "ib_core"}, "120.00 100.00", false, Absent},
		{"no driver, 2 minutes after boot", "0x15b3", ib, "", nil, "120.00 100.00", false, Unreadable},
		{"no driver, 2 days after boot", "0x15b3", ib, "", nil, "172800.00 1000.00", true, Absent},
		{"no driver, 2 days after boot, mlx5_core loaded (openibd reload)", "0x15b3", ib, "", []string{"mlx5_core"}, "172800.00 1000.00", true, Unreadable},
		{"no driver, 2 days after boot, mlx_compat loaded (MOFED reload)", "0x15b3", ib, "", []string{"mlx_compat"}, "172800.00 1000.00", false, Unreadable},
		{"no driver, uptime unreadable, mlx5_core loaded", "0x15b3", ib, "", []string{"mlx5_core", "mlx_compat"}, "", true, Unreadable},
		{"Ethernet-only ConnectX 2 days after boot: mlx5_core without mlx5_ib", "0x15b3", eth, "mlx5_core", []string{"mlx5_core", "mlx_compat"}, "172800.00 1000.00", true, Absent},
		{"ConnectX passed to a VM with mlx5_core loaded: vfio-pci", "0x15b3", ib, "vfio-pci", []string{"vfio_pci", "mlx5_core"}, "172800.00 1000.00", true, Absent},
		{"no driver, uptime unreadable", "0x15b3", ib, "", nil, "", true, Absent},
		{"Mellanox bridge only", "0x15b3", "0x060400", "", nil, "120.00 100.00", true, Absent},
		{"Intel Ethernet", "0x8086", eth, "", nil, "120.00 100.00", true, Absent},
		{"no PCI device", "", "", "", nil, "120.00 100.00", false, Absent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sys, proc := t.TempDir(), t.TempDir()
			write := func(path, v string) {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(v+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tc.vendor != "" {
				dev := filepath.Join(sys, "bus/pci/devices/0000:3b:00.0")
				write(filepath.Join(dev, "vendor"), tc.vendor)
				write(filepath.Join(dev, "class"), tc.class)
				if tc.driver != "" {
					if err := os.Symlink("../../../bus/pci/drivers/"+tc.driver, filepath.Join(dev, "driver")); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, m := range tc.modules {
				write(filepath.Join(sys, "module", m, "refcnt"), "0")
			}
			if tc.uptime != "" {
				write(filepath.Join(proc, "uptime"), tc.uptime)
			}
			if tc.ibDir {
				if err := os.MkdirAll(filepath.Join(sys, "class/infiniband"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			c := fixture(t, "no-gpu", func(c *Config) { c.Sysfs, c.Procfs = sys, proc })
			got := c.Collect(t.Context())[NICFirmware]
			if !strings.HasPrefix(got, tc.want) || len(got) <= len(tc.want) {
				t.Fatalf("nic_firmware = %q, want %q with a reason", got, tc.want)
			}
			if tc.want == Absent && got != Absent+"no InfiniBand devices" {
				t.Fatalf("nic_firmware = %q, want the stable %q", got, Absent+"no InfiniBand devices")
			}
		})
	}
}

// TestNICFirmwarePendingBounded: a Mellanox NIC left pending (no driver,
// mlx5_core loaded: an unbound SR-IOV VF beside an Ethernet-only ConnectX,
// NICs failing their probe after a bad flash) 2 days after boot is
// unreadable for bootGrace since the agent first saw it pending, absent
// after. It was unreadable for ever: the node partial for good.
func TestNICFirmwarePendingBounded(t *testing.T) {
	sys, proc := t.TempDir(), t.TempDir()
	write := func(path, v string) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dev := filepath.Join(sys, "bus/pci/devices/0000:3b:00.0")
	write(filepath.Join(dev, "vendor"), "0x15b3")
	write(filepath.Join(dev, "class"), "0x020700")
	write(filepath.Join(sys, "module/mlx5_core/refcnt"), "0")
	write(filepath.Join(proc, "uptime"), "172800.00 1000.00")
	c := fixture(t, "no-gpu", func(c *Config) { c.Sysfs, c.Procfs = sys, proc })
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	now := t0
	c.now = func() time.Time { return now }
	for _, step := range []struct {
		after time.Duration
		want  string
	}{
		{0, Unreadable},
		{10 * time.Minute, Unreadable},
		{16 * time.Minute, Absent},
	} {
		now = t0.Add(step.after)
		if got := c.Collect(t.Context())[NICFirmware]; !strings.HasPrefix(got, step.want) {
			t.Fatalf("t0+%v: nic_firmware = %q, want %q", step.after, got, step.want)
		}
	}
}

// TestMostComponents: the most extra components the config takes still
// make an event the gateway takes; one more is refused at start, naming
// the key.
func TestMostComponents(t *testing.T) {
	extra := func(n int) func(*Config) {
		return func(c *Config) {
			c.Components = nil
			for i := range n {
				c.Components = append(c.Components, Component{Name: fmt.Sprintf("extra-%02d", i), Command: []string{"echo", "v"}})
			}
		}
	}
	most := MaxComponents - len(BuiltIns)
	ev := Event(fixture(t, "h100-a", extra(most)).Collect(t.Context()))
	ev.NodeName, ev.GeneratedTimestamp = "node-1", timestamppb.Now()
	if err := (validate.Validator{}).Validate(ev, time.Now()); err != nil {
		t.Fatalf("%d extra components: %v", most, err)
	}
	cfg := DefaultConfig()
	extra(most + 1)(&cfg)
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("conformance.components: %d extra components, at most %d", most+1, most)) {
		t.Fatalf("Validate = %v, want the count refused", err)
	}
}

// TestBootParamsPerNodeIdentity: two nodes installed from the same image
// have the same boot configuration, but the installer gives each root
// filesystem (and swap) its own UUID, and GRUB names the kernel by the
// disk it booted from: the kernel command lines differ only there. Those
// are not configuration; they must not split the nodes' fingerprints. A
// real change of a parameter, or of how root is found, still does.
func TestBootParamsPerNodeIdentity(t *testing.T) {
	collect := func(cmdline string) map[string]string {
		t.Helper()
		root := t.TempDir()
		if err := os.CopyFS(root, os.DirFS(filepath.Join("testdata", "h100-a"))); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "proc", "cmdline"), []byte(cmdline+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return fixture(t, "h100-a", func(c *Config) { c.Procfs = filepath.Join(root, "proc") }).Collect(t.Context())
	}
	a := collect("BOOT_IMAGE=(hd0,gpt2)/vmlinuz-6.8.0-45-generic root=UUID=0f3a9c1e-5b7d-4e2a-9f11-2c4d6e8a0b13 ro resume=UUID=8c2e ro iommu=pt pci=realloc=off")
	b := collect("BOOT_IMAGE=(hd1,gpt2)/vmlinuz-6.8.0-45-generic root=UUID=7d41b0aa-13c2-4f6e-8a5d-90e1f2a3b4c5 ro resume=UUID=11d0 ro iommu=pt pci=realloc=off")
	if Fingerprint(a) != Fingerprint(b) {
		t.Errorf("same boot configuration, different fingerprints: boot_params %q vs %q", a[BootParams], b[BootParams])
	}
	for _, changed := range []string{
		"BOOT_IMAGE=(hd0,gpt2)/vmlinuz-6.8.0-45-generic root=UUID=0f3a ro resume=UUID=8c2e ro iommu=off pci=realloc=off",
		"BOOT_IMAGE=(hd0,gpt2)/vmlinuz-6.8.0-45-generic root=/dev/nfs ro resume=UUID=8c2e ro iommu=pt pci=realloc=off",
	} {
		if c := collect(changed); Fingerprint(c) == Fingerprint(a) {
			t.Errorf("boot_params %q: a real change kept the fingerprint", c[BootParams])
		}
	}

	// Netbooted nodes (PXE, dracut): each names its boot NIC, its address
	// and its hostname on the command line.
	netboot := func(n int, gateway, autoconf string) string {
		return fmt.Sprintf("BOOTIF=01-0c-42-a1-00-00-%02x ip=10.0.0.%d::%s:255.255.255.0:gpu-%03d:eth0:%s ifname=eth0:0c:42:a1:00:00:%02x "+
			"systemd.hostname=gpu-%03d root=/dev/nfs nfsroot=10.0.0.1:/images/gpu-ubuntu ro iommu=pt", n, n, gateway, n, autoconf, n, n)
	}
	a, b = collect(netboot(5, "10.0.0.1", "none")), collect(netboot(6, "10.0.0.1", "none"))
	if Fingerprint(a) != Fingerprint(b) {
		t.Errorf("netbooted from one image, different fingerprints: boot_params %q vs %q", a[BootParams], b[BootParams])
	}
	for _, c := range []map[string]string{collect(netboot(5, "10.0.0.254", "none")), collect(netboot(5, "10.0.0.1", "dhcp"))} {
		if Fingerprint(c) == Fingerprint(a) {
			t.Errorf("boot_params %q: a real change kept the fingerprint", c[BootParams])
		}
	}
}

// TestAbsentIsNotUnreadable: what a node does not have — a GPU, an RDMA
// device, a tool, an os_image source the operator never configured — is
// the stable value "absent: …", which the processor counts in its group's
// majority; "unreadable: …" (left out of it) is kept for a read that
// failed: a GPU on the PCI bus whose driver is not loaded (yet), a tool
// that failed.
func TestAbsentIsNotUnreadable(t *testing.T) {
	pci := func(t *testing.T, class string) string {
		t.Helper()
		sys := t.TempDir()
		dev := filepath.Join(sys, "bus/pci/devices/0000:18:00.0")
		if err := os.MkdirAll(dev, 0o755); err != nil {
			t.Fatal(err)
		}
		for f, v := range map[string]string{"vendor": "0x10de\n", "class": class + "\n"} {
			if err := os.WriteFile(filepath.Join(dev, f), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(filepath.Join(sys, "class/infiniband"), 0o755); err != nil {
			t.Fatal(err)
		}
		return sys
	}
	for _, tc := range []struct {
		name        string
		mod         func(t *testing.T, c *Config)
		run         bool // the real runCommand
		bad, absent []string
	}{
		{name: "GPU on the PCI bus, driver not loaded", mod: func(t *testing.T, c *Config) { c.Sysfs = pci(t, "0x030200") },
			bad: []string{GPUDriver, GPUVBIOS}},
		{name: "only an NVSwitch from NVIDIA; empty class/infiniband", mod: func(t *testing.T, c *Config) { c.Sysfs = pci(t, "0x068000") },
			absent: []string{GPUDriver, GPUVBIOS, NICFirmware}},
		{name: "tool not installed", run: true, mod: func(t *testing.T, c *Config) {
			c.BMCCommand = []string{"faultline-no-such-tool", "mc", "info"}
			c.Components = []Component{{Name: "ofed", Command: []string{"faultline-no-such-tool"}}}
		}, absent: []string{BMCVersion, "ofed"}},
		{name: "tool by absolute path not installed", run: true, mod: func(t *testing.T, c *Config) {
			c.BMCCommand = []string{"/usr/bin/faultline-no-such-tool", "mc", "info"}
			c.Components = []Component{{Name: "ofed", Command: []string{filepath.Join(t.TempDir(), "ofed_info"), "-s"}}}
		}, absent: []string{BMCVersion, "ofed"}},
		{name: "tool by path whose interpreter is missing", run: true, mod: func(t *testing.T, c *Config) {
			script := filepath.Join(t.TempDir(), "ipmitool")
			if err := os.WriteFile(script, []byte("#!/nonexistent/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			c.BMCCommand = []string{script, "mc", "info"}
		}, bad: []string{BMCVersion}},
		{name: "tool failing", run: true, mod: func(t *testing.T, c *Config) { c.BMCCommand = []string{"sh", "-c", "exit 1"} },
			bad: []string{BMCVersion}},
		{name: "os_image not configured", mod: func(t *testing.T, c *Config) { c.OSImageFile = "" }, absent: []string{OSImage}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fixture(t, "no-gpu", func(c *Config) { tc.mod(t, c) })
			if tc.run {
				c.run = runCommand
			}
			got := c.Collect(t.Context())
			for _, k := range tc.bad {
				if !strings.HasPrefix(got[k], Unreadable) {
					t.Errorf("%s = %q, want unreadable", k, got[k])
				}
			}
			for _, k := range tc.absent {
				if !strings.HasPrefix(got[k], Absent) || len(got[k]) <= len(Absent) {
					t.Errorf("%s = %q, want absent with a reason", k, got[k])
				}
			}
		})
	}
}

// TestBootParamsNetbootForms: the other ways a netbooted node's identity
// reaches its command line — PXELINUX's IPAPPEND 1 (ip= of four fields),
// dracut's static IPv6 (the client in brackets), PXELINUX's SYSAPPEND
// (SYSUUID=, SYSSERIAL=, MBSERIAL=, MBASSET=) — give two nodes of one
// image the same boot_params; a real difference beside them still differs.
func TestBootParamsNetbootForms(t *testing.T) {
	bp := func(s string) string { return bootParams(strings.Fields(s), nil) }
	for _, tc := range []struct {
		name       string
		a, b, diff string // a and b: two nodes; diff: a real change of a
	}{
		{"IPAPPEND 1",
			"ip=10.0.0.5:10.0.0.1:10.0.0.1:255.255.255.0 root=/dev/nfs ro",
			"ip=10.0.0.6:10.0.0.1:10.0.0.1:255.255.255.0 root=/dev/nfs ro",
			"ip=10.0.0.5:10.0.0.1:10.0.0.254:255.255.255.0 root=/dev/nfs ro"},
		{"client address only",
			"ip=10.0.0.5 ro", "ip=10.0.0.6 ro", "ip=10.0.0.5 ro iommu=pt"},
		{"dracut static IPv6",
			"ip=[fd00::5]::[fd00::1]:64:gpu-005:eth0:none ro",
			"ip=[fd00::6]::[fd00::1]:64:gpu-006:eth0:none ro",
			"ip=[fd00::5]::[fd00::1]:64:gpu-005:eth0:dhcp6 ro"},
		{"SYSAPPEND",
			"SYSUUID=4c4c4544-0035-3510-8052-b4c04f4e5332 SYSSERIAL=5Q8RN52 MBSERIAL=.5Q8RN52.CNFCP0019D0123. MBASSET=A-00123 SYSPRODUCT=PowerEdge_XE9680 ro",
			"SYSUUID=4c4c4544-0036-3610-8052-b4c04f4e5333 SYSSERIAL=6Q8RN52 MBSERIAL=.6Q8RN52.CNFCP0019D0456. MBASSET=A-00456 SYSPRODUCT=PowerEdge_XE9680 ro",
			"SYSUUID=4c4c4544-0035-3510-8052-b4c04f4e5332 SYSSERIAL=5Q8RN52 MBSERIAL=.5Q8RN52.CNFCP0019D0123. MBASSET=A-00123 SYSPRODUCT=PowerEdge_R760 ro"},
		// IPoIB: a 20-octet hardware address (QPN, GID) in dracut's
		// ifname= and in ip='s macaddr is masked whole; only its last
		// two octets were left, a fingerprint per node.
		{"IPoIB ifname",
			"ifname=ib0:80:00:02:08:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:12:34:56 ip=ib0:dhcp ro",
			"ifname=ib0:80:00:02:09:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:ab:cd:ef ip=ib0:dhcp ro",
			"ifname=ib1:80:00:02:08:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:12:34:56 ip=ib1:dhcp ro"},
		{"IPoIB ip= macaddr",
			"ip=10.0.0.5::10.0.0.1:255.255.255.0:gpu-005:ib0:none:2044:80:00:02:08:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:12:34:56 ro",
			"ip=10.0.0.6::10.0.0.1:255.255.255.0:gpu-006:ib0:none:2044:80:00:02:09:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:ab:cd:ef ro",
			"ip=10.0.0.5::10.0.0.1:255.255.255.0:gpu-005:ib0:none:65520:80:00:02:08:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:12:34:56 ro"},
		// dracut's macaddr after an empty MTU ("::" before it): masked
		// as well, in the short and in the static form.
		{"ip= macaddr, no MTU",
			"ip=eth0:dhcp::52:54:00:12:34:56 ro",
			"ip=eth0:dhcp::52:54:00:12:34:57 ro",
			"ip=eth0:dhcp6::52:54:00:12:34:56 ro"},
		{"static ip= macaddr, no MTU",
			"ip=10.0.0.5::10.0.0.1:255.255.255.0:gpu-005:eth0:none::52:54:00:12:34:56 ro",
			"ip=10.0.0.6::10.0.0.1:255.255.255.0:gpu-006:eth0:none::52:54:00:12:34:57 ro",
			"ip=10.0.0.5::10.0.0.1:255.255.255.0:gpu-005:eth0:none:9000:52:54:00:12:34:56 ro"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if a, b := bp(tc.a), bp(tc.b); a != b {
				t.Errorf("one image, different boot_params: %q vs %q", a, b)
			}
			if a, d := bp(tc.a), bp(tc.diff); a == d {
				t.Errorf("a real change kept boot_params %q", a)
			}
		})
	}
	// Forms that are not a static address are kept as they are.
	for _, s := range []string{"ip=dhcp", "ip=eth0:dhcp", "ip=[fd00::5"} {
		if got := bp(s); got != s {
			t.Errorf("bootParams(%q) = %q, want it kept", s, got)
		}
	}
	// A hardware address is masked as one "*"; IPv6 addresses (groups of
	// 1-4 hex digits, in brackets in ip=, or beside "::") are kept.
	for in, want := range map[string]string{
		"ifname=ib0:80:00:02:08:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:12:34:56": "ifname=ib0:*",
		"ifname=eth0:0c:42:a1:00:00:05":                                          "ifname=eth0:*",
		"ip=[fd00::5]::[fd00::1]:64::eth0:none:1500:0c:42:a1:00:00:05":           "ip=*::[fd00::1]:64::eth0:none:1500:*",
		"ip=[fd00::5]::[fd00::12:34:56:78:9a:bc]:64::eth0:none":                  "ip=*::[fd00::12:34:56:78:9a:bc]:64::eth0:none",
		"ipv6.gw=fd00::12:34:56:78:9a:bc":                                        "ipv6.gw=fd00::12:34:56:78:9a:bc",
		"ipv6.gw=12:34:56:78:9a:bc::1":                                           "ipv6.gw=12:34:56:78:9a:bc::1",
		// dracut's macaddr is masked by its position, after
		// <autoconf>:[<mtu>]:, also when the MTU is empty ("::" before
		// it is no IPv6 address): the short and the static form.
		"ip=eth0:dhcp::52:54:00:12:34:56":                                                                                       "ip=eth0:dhcp::*",
		"ip=eth0:dhcp:9000:52:54:00:12:34:56":                                                                                   "ip=eth0:dhcp:9000:*",
		"ip=10.0.0.5::10.0.0.1:255.255.255.0:gpu-005:eth0:none::52:54:00:12:34:56":                                              "ip=*::10.0.0.1:255.255.255.0:*:eth0:none::*",
		"ip=::10.0.0.1:255.255.255.0::eth0:none::52:54:00:12:34:56":                                                             "ip=::10.0.0.1:255.255.255.0::eth0:none::*",
		"ip=[fd00::5]::[fd00::1]:64::eth0:none::52:54:00:12:34:56":                                                              "ip=*::[fd00::1]:64::eth0:none::*",
		"ip=ib0:dhcp::80:00:02:08:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:12:34:56":                                              "ip=ib0:dhcp::*",
		"ip=10.0.0.5::10.0.0.1:255.255.255.0:gpu-005:ib0:none::80:00:02:08:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:12:34:56":     "ip=*::10.0.0.1:255.255.255.0:*:ib0:none::*",
		"ip=10.0.0.5::10.0.0.1:255.255.255.0:gpu-005:ib0:none:2044:80:00:02:08:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:12:34:56": "ip=*::10.0.0.1:255.255.255.0:*:ib0:none:2044:*",
		// The DNS form keeps its servers.
		"ip=10.0.0.5::10.0.0.1:255.255.255.0::eth0:none:10.0.0.53:10.0.0.54": "ip=*::10.0.0.1:255.255.255.0::eth0:none:10.0.0.53:10.0.0.54",
	} {
		if got := bp(in); got != want {
			t.Errorf("bootParams(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestCommandTimeout: conformance.timeout bounds a command whose child
// outlives it (the shell killed, its sleep still holding the output
// open): the collection returns soon after the timeout with the command
// unreadable, also when the child left the command's process group.
func TestCommandTimeout(t *testing.T) {
	for _, argv := range [][]string{
		{"sh", "-c", "sleep 5; echo x"},
		{"setsid", "sh", "-c", "sleep 5; echo x"},
	} {
		t.Run(argv[0], func(t *testing.T) {
			if _, err := exec.LookPath(argv[0]); err != nil {
				t.Skip(err)
			}
			c := fixture(t, "no-gpu", func(c *Config) {
				c.Timeout = 500 * time.Millisecond
				c.Components = []Component{{Name: "slow", Command: argv}}
			})
			c.run = runCommand
			start := time.Now()
			got := c.Collect(t.Context())
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("Collect took %v, want about the 500ms timeout", took)
			}
			if !strings.HasPrefix(got["slow"], Unreadable) {
				t.Errorf("slow = %q, want unreadable", got["slow"])
			}
		})
	}
}

// TestFileCapped: os_image_file and a component's file are read only when
// a regular file of at most MaxFile bytes: one larger (an os_image_file
// pointed at the image itself) is not read into memory, and a FIFO
// (which would never end) is not opened; both are unreadable at once.
func TestFileCapped(t *testing.T) {
	dir := t.TempDir()
	big, fifo, exact := filepath.Join(dir, "image.img"), filepath.Join(dir, "fifo"), filepath.Join(dir, "exact")
	if err := os.WriteFile(big, make([]byte, MaxFile+1), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exact, []byte(strings.Repeat("a", MaxFile)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	c := fixture(t, "no-gpu", func(c *Config) {
		c.OSImageFile = big
		c.Components = []Component{{Name: "fifo", File: fifo}, {Name: "exact", File: exact}}
	})
	done := make(chan map[string]string, 1)
	go func() { done <- c.Collect(t.Context()) }()
	select {
	case got := <-done:
		for _, k := range []string{OSImage, "fifo"} {
			if !strings.HasPrefix(got[k], Unreadable) {
				t.Errorf("%s = %.100q (%d bytes), want unreadable", k, got[k], len(got[k]))
			}
		}
		if got["exact"] != strings.Repeat("a", MaxFile) {
			t.Errorf("a file of MaxFile bytes: %d bytes read", len(got["exact"]))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Collect hangs on a FIFO")
	}
}

// TestBootParamsPerNodeTokens: OpenCHAMI's and CSM's boot script service
// appends each node's xname and nid and a per-boot token to its command
// line (CSM also a SPIRE join token and the BOS session), and installed
// nodes name their RAID and LUKS volumes and their root by UUID: two
// nodes of one image must not differ there (every node a group of one,
// every sensitive node drained); a real change beside them still
// differs, and conformance.boot_params_ignore masks more parameters.
func TestBootParamsPerNodeTokens(t *testing.T) {
	const bss = "nmd_data=url=s3://boot-images/e080a4f6/rootfs ds=nocloud-net;s=http://10.92.100.81:8888/ ip=dhcp quiet"
	for _, tc := range []struct {
		name       string
		ignore     []string
		a, b, diff string // a and b: two nodes; diff: a real change of a
		want       string // bootParams(a), when set
	}{
		{name: "OpenCHAMI BSS",
			a:    "console=ttyS0 xname=x1000c0s0b0n0 nid=1 bss_referral_token=7066efb4-29d1-4de6-82b2-b27083033d0e ds=nocloud-net;s=192.168.100.1/",
			b:    "console=ttyS0 xname=x1000c0s1b0n0 nid=2 bss_referral_token=5bac28cb-b46a-4053-a445-e7cad67accd7 ds=nocloud-net;s=192.168.100.1/",
			diff: "console=ttyS1 xname=x1000c0s0b0n0 nid=1 bss_referral_token=7066efb4-29d1-4de6-82b2-b27083033d0e ds=nocloud-net;s=192.168.100.1/",
			want: "console=ttyS0 xname=* nid=* bss_referral_token=* ds=nocloud-net;s=192.168.100.1/"},
		{name: "CSM",
			a:    "spire_join_token=e16f8875-7716-4196-a9c3-3a6c368da3e7 bos_session_id=012f3f17-1dd6-492d-9c62-8d067647df03 xname=x1007c5s7b1n0 nid=2982 bss_referral_token=5bac28cb " + bss,
			b:    "spire_join_token=0b7e9a61-2c4d-4e8f-9a1b-3c5d7e9f1a2b bos_session_id=147b09de-59a8-4444-9bcb-9b54ac7d78cc xname=x3000c0s28b4n0 nid=12 bss_referral_token=7066efb4 " + bss,
			diff: "spire_join_token=e16f8875-7716-4196-a9c3-3a6c368da3e7 bos_session_id=012f3f17-1dd6-492d-9c62-8d067647df03 xname=x1007c5s7b1n0 nid=2982 bss_referral_token=5bac28cb " + strings.Replace(bss, "e080a4f6", "11111111", 1)},
		{name: "installed: RAID, LUKS, root by /dev/disk",
			a:    "root=/dev/disk/by-uuid/0f3a9c1e-5b7d-4e2a-9f11-2c4d6e8a0b13 resume=/dev/disk/by-partuuid/8c2e-01 rd.md.uuid=1a2b3c4d:5e6f7a8b:9c0d1e2f:3a4b5c6d rd.luks.uuid=luks-2c4d6e8a-0b13-4e2a-9f11-0f3a9c1e5b7d rd.luks.name=2c4d6e8a-0b13-4e2a-9f11-0f3a9c1e5b7d=cryptroot ro",
			b:    "root=/dev/disk/by-uuid/7d41b0aa-13c2-4f6e-8a5d-90e1f2a3b4c5 resume=/dev/disk/by-partuuid/11d0-02 rd.md.uuid=6d5c4b3a:2f1e0d9c:8b7a6f5e:4d3c2b1a rd.luks.uuid=luks-90e1f2a3-b4c5-4f6e-8a5d-7d41b0aa13c2 rd.luks.name=90e1f2a3-b4c5-4f6e-8a5d-7d41b0aa13c2=cryptroot ro",
			diff: "root=/dev/disk/by-uuid/0f3a9c1e-5b7d-4e2a-9f11-2c4d6e8a0b13 resume=/dev/disk/by-partuuid/8c2e-01 rd.md.uuid=1a2b3c4d:5e6f7a8b:9c0d1e2f:3a4b5c6d rd.luks.uuid=luks-2c4d6e8a-0b13-4e2a-9f11-0f3a9c1e5b7d rd.luks.name=2c4d6e8a-0b13-4e2a-9f11-0f3a9c1e5b7d=cryptdata ro",
			want: "root=/dev/disk/by-uuid/* resume=/dev/disk/by-partuuid/* rd.md.uuid=* rd.luks.uuid=* rd.luks.name=*=cryptroot ro"},
		{name: "root by label is configuration",
			a: "root=LABEL=root ro", b: "root=LABEL=root ro", diff: "root=/dev/disk/by-label/root ro"},
		{name: "boot_params_ignore", ignore: []string{"site.rack", "console"},
			a:    "site.rack=r12 console=ttyS0,115200 iommu=pt",
			b:    "site.rack=r13 console=ttyS1,115200 iommu=pt",
			diff: "site.rack=r12 console=ttyS0,115200 iommu=off",
			want: "site.rack=* console=* iommu=pt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bp := func(s string) string { return bootParams(strings.Fields(s), tc.ignore) }
			a, b, d := bp(tc.a), bp(tc.b), bp(tc.diff)
			if a != b {
				t.Errorf("one image, different boot_params: %q vs %q", a, b)
			}
			if a == d {
				t.Errorf("a real change kept boot_params %q", a)
			}
			if tc.want != "" && a != tc.want {
				t.Errorf("boot_params %q, want %q", a, tc.want)
			}
		})
	}
	// Through the config: the key reaches the collection.
	root := t.TempDir()
	if err := os.CopyFS(root, os.DirFS(filepath.Join("testdata", "h100-a"))); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "proc", "cmdline"), []byte("site.rack=r12 xname=x1000c0s0b0n0 ro\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := fixture(t, "h100-a", func(c *Config) { c.Procfs, c.BootParamsIgnore = filepath.Join(root, "proc"), []string{"site.rack"} })
	if got := c.Collect(t.Context())[BootParams]; got != "site.rack=* xname=* ro" {
		t.Errorf("boot_params %q, want site.rack and xname masked", got)
	}
}

// TestHungCommandLeavesOthersTime: bmc_command runs first; one that hangs
// (ipmitool waiting on its BMC) takes only its share of
// conformance.timeout, so the OS image command and the components after
// it are still read instead of all being unreadable (the node partial,
// its drift unjudged and escalated).
func TestHungCommandLeavesOthersTime(t *testing.T) {
	c := fixture(t, "no-gpu", func(c *Config) {
		c.Timeout = 1500 * time.Millisecond
		c.BMCCommand = []string{"sh", "-c", "sleep 5"}
		c.OSImageFile, c.OSImageCommand = "", []string{"echo", "sha256:abc"}
		c.Components = []Component{{Name: "ofed", Command: []string{"echo", "24.07"}}, {Name: "slow", Command: []string{"sh", "-c", "sleep 5"}}}
	})
	c.run = runCommand
	start := time.Now()
	got := c.Collect(t.Context())
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Collect took %v, want about the 1.5s timeout", took)
	}
	for k, v := range map[string]string{OSImage: "sha256:abc", "ofed": "24.07"} {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	for _, k := range []string{BMCVersion, "slow"} {
		if !strings.HasPrefix(got[k], Unreadable+"timed out") {
			t.Errorf("%s = %q, want unreadable: timed out", k, got[k])
		}
	}
}

// TestRetryWhileUnreadable: after a collection with an unreadable
// component (after a reboot the driver container or MOFED not loaded yet)
// the check asks to run again in 1 minute, doubling up to its interval
// (a component unreadable for good costs a few quick runs); a complete collection returns it to the interval. It
// waited the interval (6h): the node's partial report stood, a fixed
// node was not cleared and a sensitive one was escalated at 4h.
func TestRetryWhileUnreadable(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
		want     []time.Duration
	}{
		{"default interval", 6 * time.Hour, []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 16 * time.Minute, 32 * time.Minute,
			64 * time.Minute, 128 * time.Minute, 256 * time.Minute, 6 * time.Hour, 6 * time.Hour}},
		{"short interval", 5 * time.Minute, []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fixture(t, "h100-a", func(c *Config) { c.Interval = tc.interval })
			if d := c.RetryIn(); d != 0 {
				t.Fatalf("before any run: retry in %v, want 0", d)
			}
			ok := c.run
			broken := func(ctx context.Context, argv []string) ([]byte, error) {
				if argv[0] == "ipmitool" {
					return nil, errors.New("ipmitool: exit status 1: Could not open device at /dev/ipmi0")
				}
				return ok(ctx, argv)
			}
			for round := range 2 {
				c.run = broken
				for i, want := range tc.want {
					if _, err := c.Check(context.Background()); err != nil {
						t.Fatal(err)
					}
					if d := c.RetryIn(); d != want {
						t.Fatalf("round %d, partial collection %d: retry in %v, want %v", round, i+1, d, want)
					}
				}
				c.run = ok
				evs, err := c.Check(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(evs[0].Message, "unreadable") {
					t.Fatalf("complete collection: %s", evs[0].Message)
				}
				if d := c.RetryIn(); d != 0 {
					t.Fatalf("round %d, complete collection: retry in %v, want 0 (the interval)", round, d)
				}
			}
		})
	}
}

// TestVBIOSNotReadableByTheDriver: NVIDIA's nv-procfs.c prints "Video
// BIOS: ??.??.??.??.??" when the driver cannot read the VBIOS version (the
// GPU fallen off the bus or locked up). That is no version: gpu_vbios is
// unreadable (the report partial). It was taken as a version, the
// fingerprint changed, and a hardware fault was judged configuration
// drift (the drift taint, OpenCHAMI's reboot for a major drift, a
// sensitive node drained).
func TestVBIOSNotReadableByTheDriver(t *testing.T) {
	const gpu0 = "proc/driver/nvidia/gpus/0000:18:00.0/information"
	for _, tc := range []struct {
		name   string
		line   string // gpu0's Video BIOS line ("": the fixture's)
		want   string // gpu_vbios; "": unreadable
		reason string // in the unreadable value
	}{
		{name: "reference", want: "96.00.89.00.01"},
		{name: "not readable by the driver", line: "Video BIOS: \t ??.??.??.??.??", reason: "VBIOS not readable by the driver"},
		{name: "partly not readable", line: "Video BIOS: \t 96.00.??.00.01", reason: "VBIOS not readable by the driver"},
		{name: "another version", line: "Video BIOS: \t 96.00.99.00.01", want: "96.00.89.00.01,96.00.99.00.01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if err := os.CopyFS(root, os.DirFS(filepath.Join("testdata", "h100-a"))); err != nil {
				t.Fatal(err)
			}
			if tc.line != "" {
				f := filepath.Join(root, gpu0)
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				b = []byte(strings.Replace(string(b), "Video BIOS: \t 96.00.89.00.01", tc.line, 1))
				if err := os.WriteFile(f, b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			c := fixture(t, "h100-a", func(c *Config) {
				c.Sysfs, c.Procfs, c.OSImageFile = filepath.Join(root, "sys"), filepath.Join(root, "proc"), filepath.Join(root, "os-image")
			})
			got := c.Collect(context.Background())[GPUVBIOS]
			switch {
			case tc.want != "" && got != tc.want:
				t.Fatalf("gpu_vbios = %q, want %q", got, tc.want)
			case tc.want == "" && (!strings.HasPrefix(got, Unreadable) || !strings.Contains(got, tc.reason) || !strings.Contains(got, "0000:18:00.0")):
				t.Fatalf("gpu_vbios = %q, want unreadable: ... %s, naming the GPU", got, tc.reason)
			}
		})
	}
}
