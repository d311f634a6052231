package fabric

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/faultline/faultline/agents/kmsg"
	"github.com/faultline/faultline/agents/topology/topologytest"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// fakeRunner answers commands by "name arg0 arg1" prefix.
type fakeRunner struct {
	mu    sync.Mutex
	out   map[string]string
	err   map[string]error
	calls []string
}

func (f *fakeRunner) Run(_ context.Context, name string, args ...string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cmd := strings.TrimSpace(name + " " + strings.Join(args, " "))
	f.calls = append(f.calls, cmd)
	best := ""
	for k := range f.out {
		if strings.HasPrefix(cmd, k) && len(k) > len(best) {
			best = k
		}
	}
	for k, e := range f.err {
		if strings.HasPrefix(cmd, k) {
			return nil, e
		}
	}
	if best == "" {
		return nil, exec.ErrNotFound
	}
	return []byte(f.out[best]), nil
}

func (f *fakeRunner) called(prefix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

// node is a simulated host: procfs, sysfs, modprobe.d and files.
type node struct {
	t   *testing.T
	dir string
	r   *fakeRunner
	now time.Time
	c   *Check
}

const (
	showActive = "Id=nvidia-fabricmanager.service\nLoadState=loaded\nActiveState=active\nSubState=running\nResult=success\nMainPID=2131\nActiveEnterTimestamp=Mon 2024-10-28 10:00:01 UTC\n"
	showFailed = "Id=nvidia-fabricmanager.service\nLoadState=loaded\nActiveState=failed\nSubState=failed\nResult=exit-code\nMainPID=0\n"
	showAbsent = "Id=nvidia-fabricmanager.service\nLoadState=not-found\nActiveState=inactive\nSubState=dead\n"
)

func newNode(t *testing.T, cfg func(*Config)) *node {
	dir := t.TempDir()
	n := &node{t: t, dir: dir, r: &fakeRunner{out: map[string]string{}, err: map[string]error{}},
		now: time.Date(2024, 10, 28, 10, 30, 0, 0, time.UTC)}
	for _, d := range []string{"proc", "sys", "modprobe.d"} {
		os.MkdirAll(filepath.Join(dir, d), 0o755)
	}
	c := Config{ProcRoot: filepath.Join(dir, "proc"), SysRoot: filepath.Join(dir, "sys"), ModprobeDir: filepath.Join(dir, "modprobe.d"),
		ConfigFile: filepath.Join(dir, "fabricmanager.cfg"), LogFile: filepath.Join(dir, "fabricmanager.log"),
		NVLSMLogFile: filepath.Join(dir, "nvlsm.log"), NVLSMPIDFile: filepath.Join(dir, "nvlsm.pid"),
		NVSwitchGlob: filepath.Join(dir, "dev/nvidia-nvswitch[0-9]*"), Runner: n.r, Now: func() time.Time { return n.now }}
	if cfg != nil {
		cfg(&c)
	}
	ch, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	n.c = ch
	return n
}

func (n *node) write(rel, content string) {
	p := filepath.Join(n.dir, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		n.t.Fatal(err)
	}
}

func (n *node) appendLog(rel, line string) {
	f, err := os.OpenFile(filepath.Join(n.dir, rel), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	f.WriteString(line + "\n")
	f.Close()
}

// switches creates the NVSwitch driver's procfs entries.
func (n *node) switches(pcis ...string) {
	for _, p := range pcis {
		os.MkdirAll(filepath.Join(n.dir, "proc/driver/nvidia-nvswitch/devices", p), 0o755)
	}
}

// h100Switches are the NVSwitches of the HGX H100 in testdata.
var h100Switches = []string{"0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"}

// h100Node is newNode for an HGX H100 host: its four NVSwitches and FM's
// default configuration; the service and the tools' output are each
// test's (healthy sets those of a healthy host).
func h100Node(t *testing.T, cfg func(*Config)) *node {
	n := newNode(t, cfg)
	n.switches(h100Switches...)
	n.write("fabricmanager.cfg", testdata(t, "config/h100-default.cfg"))
	return n
}

// healthy sets FM running and the tools' output of a healthy HGX H100.
func (n *node) healthy() {
	n.r.out["systemctl show"] = showActive
	n.r.out["nvidia-smi -q"] = testdata(n.t, "smi/hgx-h100-topology.txt")
	n.r.out["nvidia-smi nvlink -s"] = testdata(n.t, "nvlink/h100-status.txt")
	n.r.out["nvidia-smi nvlink -R"] = testdata(n.t, "nvlink/h100-remote.txt")
}

// pci creates sysfs PCI functions (class 0x0302 GPU, 0x0680 NVSwitch).
func (n *node) pci(class string, pcis ...string) {
	for _, p := range pcis {
		n.write("sys/bus/pci/devices/"+p+"/vendor", "0x10de\n")
		n.write("sys/bus/pci/devices/"+p+"/class", class+"00\n")
	}
}

func (n *node) poll(advance time.Duration) []*datamodels.HealthEvent {
	n.t.Helper()
	n.now = n.now.Add(advance)
	evs, err := n.c.Check(context.Background())
	if err == nil {
		err = n.c.Commit() // as the runner does once they are spooled
	}
	if err != nil {
		n.t.Fatalf("check: %v", err)
	}
	return evs
}

func shorts(evs []*datamodels.HealthEvent) string {
	var s []string
	for _, e := range evs {
		sev := "nonfatal"
		switch {
		case e.IsHealthy:
			sev = "healthy"
		case e.IsFatal:
			sev = "fatal"
		}
		code := ""
		if len(e.ErrorCode) > 0 {
			code = e.ErrorCode[0]
		}
		s = append(s, e.CheckName+":"+code+":"+sev+"@"+e.EntitiesImpacted[0].EntityValue)
	}
	return strings.Join(s, " ")
}

func testdata(t *testing.T, p string) string { return read(t, filepath.Join("testdata", p)) }

// TestCheckH100Node polls a simulated HGX H100 host: a healthy fabric
// reports nothing; an FM log SXid names the GPU on its access port; an
// inactive NVLink (the H100 sign of an access link failure) stands until
// it clears; the FM service failing and coming back; nvidia-smi nvlink -R
// runs once per topology interval.
func TestCheckH100Node(t *testing.T) {
	n := h100Node(t, nil)
	n.healthy()
	n.write("fabricmanager.log", "[Oct 28 2024 10:00:01] [INFO] [tid 1] Fabric Manager version 550.127.05 is running with the following configuration options\n")
	if evs := n.poll(0); len(evs) != 0 {
		t.Fatalf("healthy node: %s", shorts(evs))
	}
	if p := n.c.Evaluator().Platform(); p.Name != PlatformH100 || p.NVSwitches != 4 {
		t.Fatalf("platform %+v", p)
	}
	n.appendLog("fabricmanager.log", "[Oct 28 2024 10:31:00] [ERROR] [tid 9] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:07:00.0 physical id 2 port 46")
	evs := n.poll(30 * time.Second)
	if got := shorts(evs); got != "FabricManagerNVSwitchError:SXID-20034:fatal@0000:07:00.0" {
		t.Fatalf("sxid: %s", got)
	}
	if g := evs[0].EntitiesImpacted[1]; g.EntityValue != "GPU-257d8671-d0e6-d1a7-dea9-952249a668fa" || evs[0].RecommendedAction != datamodels.RecommendedAction_COMPONENT_RESET {
		t.Errorf("sxid GPU %v action %s", g, evs[0].RecommendedAction)
	}
	n.r.out["nvidia-smi nvlink -s"] = testdata(t, "nvlink/h100-status-inactive.txt")
	if got := shorts(n.poll(30 * time.Second)); got != "FabricManagerHAMode:FM-HA-ACCESS-NVLINK-INACTIVE:nonfatal@GPU-d100a000-0000-0000-0000-000000000003" {
		t.Fatalf("inactive: %s", got)
	}
	if evs := n.poll(30 * time.Second); len(evs) != 0 {
		t.Fatalf("standing condition reported again: %s", shorts(evs))
	}
	n.r.out["nvidia-smi nvlink -s"] = testdata(t, "nvlink/h100-status.txt")
	if got := shorts(n.poll(30 * time.Second)); got != "FabricManagerHAMode::healthy@GPU-d100a000-0000-0000-0000-000000000003" {
		t.Fatalf("recovery: %s", got)
	}
	n.r.out["systemctl show"] = showFailed
	n.r.out["journalctl"] = `{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"1730111700000000","SYSLOG_IDENTIFIER":"nv-fabricmanager","MESSAGE":"fabric manager NVIDIA GPU driver interface version 550.127.05 don't match with driver version 550.90.07. Please update with matching NVIDIA driver package."}` + "\n"
	if got := shorts(n.poll(30 * time.Second)); got != "FabricManagerInit:FM-INIT-DRIVER-MISMATCH:fatal@0000:05:00.0 FabricManagerService:FM-SERVICE-FAILED:fatal@0000:05:00.0" {
		t.Fatalf("failed service: %s", got)
	}
	if n.r.called("journalctl -u nvidia-fabricmanager -o json --no-pager -n 100") != 1 {
		t.Errorf("journal not read from its tail: %v", n.r.calls)
	}
	n.poll(30 * time.Second)
	if n.r.called("journalctl -u nvidia-fabricmanager -o json --no-pager --after-cursor=s=1") != 1 {
		t.Errorf("journal not read after its cursor: %v", n.r.calls)
	}
	n.r.out["systemctl show"] = showActive
	n.appendLog("fabricmanager.log", "[Oct 28 2024 10:40:00] [INFO] [tid 1] Fabric Manager version 550.127.05 is running with the following configuration options")
	n.appendLog("fabricmanager.log", "[Oct 28 2024 10:40:09] [INFO] [tid 1] Successfully configured all the available NVSwitches to route GPU NVLink traffic.")
	if got := shorts(n.poll(30 * time.Second)); got != "FabricManagerInit::healthy@0000:05:00.0 FabricManagerService::healthy@0000:05:00.0" {
		t.Fatalf("recovery: %s", got)
	}
	if c := n.r.called("nvidia-smi nvlink -R"); c != 1 {
		t.Errorf("nvlink -R ran %d times within one topology interval", c)
	}
	n.poll(10 * time.Minute)
	if c := n.r.called("nvidia-smi nvlink -R"); c != 2 {
		t.Errorf("nvlink -R ran %d times after the interval", c)
	}
}

// TestCheckNoNVSwitch: on a host without NVSwitches the FM log is not read
// and an FM unit that is not installed is fine; one that fails (with
// NV_WARN_NOTHING_TO_DO in its journal) is a misconfiguration, not fatal.
func TestCheckNoNVSwitch(t *testing.T) {
	n := newNode(t, nil)
	n.write("fabricmanager.log", "[Oct 28 2024 10:05:00] [ERROR] [tid 912] detected NVSwitch fatal error 12020 on fid 0 on NVSwitch pci bus id 00000000:07:00.0 physical id 0 port 33\n")
	n.r.out["systemctl show"] = showAbsent
	n.r.out["nvidia-smi -q"] = testdata(t, "smi/pcie-no-nvswitch.txt")
	if evs := n.poll(0); len(evs) != 0 {
		t.Fatalf("flagged: %s", shorts(evs))
	}
	if n.r.called("journalctl") != 0 || n.r.called("nvidia-smi nvlink") != 0 {
		t.Errorf("fabric sources read on a host without NVSwitches: %v", n.r.calls)
	}
	n.r.out["systemctl show"] = showFailed
	n.r.out["journalctl"] = testdata(t, "journal/gpu-operator-610-nothing-to-do.journal")
	evs := n.poll(30 * time.Second)
	if got := shorts(evs); got != "FabricManagerConfig:FM-CONFIG-NO-NVSWITCH:nonfatal@nvidia-fabricmanager FabricManagerConfig:FM-CONFIG-NO-NVSWITCH:nonfatal@nvidia-fabricmanager" {
		t.Fatalf("misconfiguration: %s", got)
	}
	n.r.err["nvidia-smi"] = exec.ErrNotFound
	n.r.err["systemctl"] = errors.New("dbus timeout")
	if _, err := n.c.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "dbus timeout") {
		t.Errorf("systemctl failure: %v", err)
	}
}

// TestCheckExclusionFromTheHost: the driver's view of excluded GPUs and
// NVSwitches (information files, PCI functions the NVSwitch driver did not
// bind) against the exclude lists of modprobe.d and the kernel command
// line, and a GPU of gpu_metadata.json that fails to enumerate.
func TestCheckExclusionFromTheHost(t *testing.T) {
	n := newNode(t, func(c *Config) { c.MetadataPath = "" })
	n.c.cfg.MetadataPath = filepath.Join(n.dir, "gpu_metadata.json")
	sw := []string{"0000:c4:00.0", "0000:c5:00.0", "0000:c6:00.0", "0000:c7:00.0", "0000:c8:00.0", "0000:c9:00.0"}
	n.pci("0x0680", sw...)
	n.switches(sw[:5]...)
	n.pci("0x0302", "0000:07:00.0", "0000:0f:00.0", "0000:87:00.0")
	// 87:00.0 is passed through to a VM: not the driver's, not a candidate
	os.MkdirAll(filepath.Join(n.dir, "sys/bus/pci/drivers/vfio-pci"), 0o755)
	os.Symlink(filepath.Join(n.dir, "sys/bus/pci/drivers/vfio-pci"), filepath.Join(n.dir, "sys/bus/pci/devices/0000:87:00.0/driver"))
	n.write("proc/driver/nvidia/gpus/0000:07:00.0/information", "Model: \t\t NVIDIA A100-SXM4-80GB\nGPU UUID: \t GPU-a100a100-0000-0000-0000-000000000000\nBus Location: \t 0000:07:00.0\nGPU Excluded:\t No\n")
	n.write("proc/driver/nvidia/gpus/0000:0f:00.0/information", "Model: \t\t NVIDIA A100-SXM4-80GB\nGPU UUID: \t GPU-a100a100-0000-0000-0000-000000000001\nBus Location: \t 0000:0f:00.0\nGPU Excluded:\t Yes\n")
	n.write("modprobe.d/nvidia-exclude.conf", "options nvidia NVreg_ExcludedGpus=GPU-a100a100-0000-0000-0000-000000000001 NvSwitchExcludelist=SWX-c9\n")
	n.write("proc/cmdline", "BOOT_IMAGE=/vmlinuz ro quiet\n")
	n.write("gpu_metadata.json", `{"version":"1.0","gpus":[{"gpu_id":0,"pci_address":"0000:07:00.0","numa_node":0,"uuid":"GPU-a100a100-0000-0000-0000-000000000000"},`+
		`{"gpu_id":2,"pci_address":"0000:47:00.0","numa_node":0,"uuid":"GPU-a100a100-0000-0000-0000-000000000002"}],"nic_topology":{}}`)
	n.r.out["systemctl show"] = showActive
	n.r.out["nvidia-smi -q"] = strings.Split(testdata(t, "smi/a100-535-layout.txt"), "GPU 00000000:0F:00.0")[0]
	got := shorts(n.poll(0))
	want := "NVSwitchExclusion:NVSWITCH-EXCLUDED:nonfatal@0000:c9:00.0 GPUExclusion:GPU-EXCLUDED:nonfatal@GPU-a100a100-0000-0000-0000-000000000001 " +
		"GPUExclusion:GPU-EXCLUSION-CANDIDATE:fatal@GPU-a100a100-0000-0000-0000-000000000002 " +
		"FabricManagerHAMode:FM-HA-NVSWITCH-FM-ABORTED:fatal@0000:c4:00.0"
	if !sameSet(got, want) {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// TestCheckB200: the NVLink management bridge (VPD SW_MNG) makes a host
// without PCI NVSwitches a fabric host; NVLSM's pid file and process;
// NVSwitch telemetry from recorded dcgm-exporter outputs.
func TestCheckB200(t *testing.T) {
	n := newNode(t, func(c *Config) {
		c.Telemetry = &RecordedSource{Files: []string{"testdata/telemetry/b200-dcgm-exporter-1.prom", "testdata/telemetry/b200-dcgm-exporter-2.prom"}}
	})
	for i := 0; i < 4; i++ {
		n.write("sys/class/infiniband/mlx5_"+string(rune('0'+i))+"/device/vpd", "\x82\x20NVIDIA ConnectX-7\x90SMDL SW_MNG\x78")
	}
	n.write("sys/class/infiniband/mlx5_4/device/vpd", "\x82\x20NVIDIA ConnectX-7 NIC\x78")
	n.write("nvlsm.pid", "3012\n")
	n.write("proc/3012/comm", "nvlsm\n")
	n.write("nvlsm.log", testdata(t, "nvlsm/constructed-b200-nvlsm.log")[:strings.Index(testdata(t, "nvlsm/constructed-b200-nvlsm.log"), "Jun 02 09:12")])
	n.r.out["systemctl show"] = showActive
	n.r.out["nvidia-smi -q"] = testdata(t, "smi/b200-580-k8s-test-infra.txt")
	if evs := n.poll(0); len(evs) != 0 {
		t.Fatalf("healthy B200: %s", shorts(evs))
	}
	if p := n.c.Evaluator().Platform(); p.Name != PlatformB200 || p.NVLinkBridges != 4 {
		t.Fatalf("platform %+v", p)
	}
	os.Remove(filepath.Join(n.dir, "proc/3012/comm"))
	got := shorts(n.poll(30 * time.Second))
	if !sameSet(got, "NVLSMService:NVLSM-NOT-RUNNING:fatal@nvidia-fabricmanager NVSwitchTelemetry:NVSWITCH-LINK-REPLAY-ERRORS:nonfatal@nvswitch0 "+
		"NVSwitchTelemetry:NVSWITCH-LINK-DOWN:fatal@nvswitch0 NVSwitchTelemetry:NVSWITCH-THERMAL-SLOWDOWN:nonfatal@nvswitch1") {
		t.Fatalf("nvlsm gone, telemetry: %s", got)
	}
	// FM fails too: NVLSM (which FM starts) is not judged while FM is
	// down, and its fault stands — it was reported healthy as if it ran.
	n.r.out["systemctl show"] = showFailed
	if got := shorts(n.poll(30 * time.Second)); strings.Contains(got, "NVLSMService") || !strings.Contains(got, "FabricManagerService:FM-SERVICE-FAILED") {
		t.Fatalf("FM failed beside NVLSM: %s", got)
	}
}

// TestKmsgSXidGetsTheGPU: the port map learned from nvidia-smi nvlink -R,
// handed to the kmsg check, names the GPU of a kernel-log SXid too.
func TestKmsgSXidGetsTheGPU(t *testing.T) {
	topo := BuildTopology(ParseNVLink(testdata(t, "nvlink/h100-remote.txt"), nil), nil, nil)
	if len(topo.Switches) != 4 || len(topo.Access) != 144 {
		t.Fatalf("topology: %d switches, %d access ports", len(topo.Switches), len(topo.Access))
	}
	p, err := kmsg.NewParser(kmsg.ParserConfig{Topology: kmsg.StaticTopology{SwitchLinks: topo.SwitchLinks()}, Location: time.UTC, Year: 2026})
	if err != nil {
		t.Fatal(err)
	}
	var got []*datamodels.HealthEvent
	if err := kmsg.ParseStream(p, strings.NewReader("Mar  2 11:00:00 h nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Fatal, Link 46 LTSSM Fault Up\n"),
		func(e *datamodels.HealthEvent) error { got = append(got, e); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[0].EntitiesImpacted) != 2 || got[0].EntitiesImpacted[1].EntityValue != "GPU-257d8671-d0e6-d1a7-dea9-952249a668fa" {
		t.Fatalf("kmsg SXid: %v", got)
	}
	if _, pt := topo.Port("0000:07:00.0", 63, false); pt != PortUnknown {
		t.Errorf("unwired port on a platform without trunks: %s", pt)
	}
	if _, pt := topo.Port("0000:07:00.0", 63, true); pt != PortTrunk {
		t.Errorf("unwired port of a known switch with trunks: %s", pt)
	}
}

func sameSet(a, b string) bool {
	x, y := strings.Fields(a), strings.Fields(b)
	if len(x) != len(y) {
		return false
	}
	m := map[string]int{}
	for _, s := range x {
		m[s]++
	}
	for _, s := range y {
		m[s]--
	}
	for _, v := range m {
		if v != 0 {
			return false
		}
	}
	return true
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		edit func(*Config)
		key  string
	}{
		{func(c *Config) { c.Platform = "h300" }, "fabric.platform"},
		{func(c *Config) { c.InProgressTimeout = -1 }, "fabric.in_progress_timeout"},
		{func(c *Config) { c.TelemetryURL = "localhost:9400" }, "fabric.telemetry_url"},
		{func(c *Config) { c.TopologyInterval = -time.Second }, "fabric.topology_interval"},
	} {
		c := DefaultConfig()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), tc.key) {
			t.Errorf("%s: %v", tc.key, err)
		}
	}
	d := DefaultConfig()
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestRestartAndReboot: what stood before the agent restarted, or before
// the node rebooted, is cleared when it is over (the state file keeps the
// standing conditions), a fatal occurrence of the previous boot (an SXid:
// the reboot reset the NVSwitches and GPUs) is reported healthy once, and
// the FM log's replay does not report an occurrence again.
func TestRestartAndReboot(t *testing.T) {
	const sxid = "[Oct 28 2024 10:29:00] [ERROR] [tid 9] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:07:00.0 physical id 2 port 46"
	// reboot: the checks whose faults are occurrences, healthy once.
	const reboot = "FabricManagerNVSwitchError::healthy@ FabricManagerPartition::healthy@ NVSwitchTelemetry::healthy@"
	cases := []struct {
		name   string
		before func(n *node) // the first agent run's node
		after  func(n *node) // what changed while the agent was down
		reboot bool          // the node rebooted meanwhile
		first  string        // the first run's events
		want   string        // the restarted agent's first poll
	}{
		{"service failed, running again after an agent restart",
			func(n *node) { n.r.out["systemctl show"] = showFailed },
			func(n *node) { n.r.out["systemctl show"] = showActive }, false,
			"FabricManagerService:FM-SERVICE-FAILED:fatal@0000:05:00.0",
			"FabricManagerService::healthy@0000:05:00.0"},
		{"service failed, running after the reboot",
			func(n *node) { n.r.out["systemctl show"] = showFailed },
			func(n *node) { n.r.out["systemctl show"] = showActive }, true,
			"FabricManagerService:FM-SERVICE-FAILED:fatal@0000:05:00.0",
			reboot + " FabricManagerService::healthy@0000:05:00.0"},
		{"fabric probe timeout, completed after the reboot",
			func(n *node) { n.r.out["nvidia-smi -q"] = testdata(t, "smi/h100-560-layout.txt") },
			func(n *node) { n.r.out["nvidia-smi -q"] = testdata(t, "smi/hgx-h100-topology.txt") }, true,
			"GPUFabricState:FABRIC-PROBE-TIMEOUT:fatal@GPU-d100d100-0000-0000-0000-000000000002 GPUFabricHealth:FABRIC-BANDWIDTH-DEGRADED:nonfatal@GPU-d100d100-0000-0000-0000-000000000006",
			reboot + " GPUFabricHealth::healthy@GPU-d100d100-0000-0000-0000-000000000006 GPUFabricState::healthy@GPU-d100d100-0000-0000-0000-000000000002"},
		{"fatal SXid, node rebooted",
			func(n *node) { n.appendLog("fabricmanager.log", sxid) },
			func(n *node) {
				n.appendLog("fabricmanager.log", "[Oct 28 2024 11:00:30] [INFO] [tid 1] Fabric Manager version 550.127.05 is running with the following configuration options")
				n.appendLog("fabricmanager.log", "[Oct 28 2024 11:00:39] [INFO] [tid 1] Successfully configured all the available NVSwitches to route GPU NVLink traffic.")
			}, true,
			"FabricManagerNVSwitchError:SXID-20034:fatal@0000:07:00.0",
			reboot},
		{"fatal SXid, agent restarted: the log's replay is not reported again",
			func(n *node) { n.appendLog("fabricmanager.log", sxid) },
			func(n *node) {}, false,
			"FabricManagerNVSwitchError:SXID-20034:fatal@0000:07:00.0",
			""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := restartNode(t) // started on this boot
			tc.before(n)
			if got := shortsOrNode(n.poll(0)); got != tc.first {
				t.Fatalf("first run: %s\nwant %s", got, tc.first)
			}
			tc.after(n)
			n.now = n.now.Add(10 * time.Minute)
			if tc.reboot {
				n.now = n.now.Add(30 * time.Minute)
				n.write("proc/sys/kernel/random/boot_id", "6f7a1c2e-0000-4000-8000-000000000002\n")
				n.write("proc/stat", "cpu  1 2 3 4\nbtime 1730113200\n") // 2024-10-28 11:00:00 UTC
			}
			c, err := New(n.c.cfg) // the agent restarted
			if err != nil {
				t.Fatal(err)
			}
			n.c = c
			evs := n.poll(0)
			if got := shortsOrNode(evs); got != tc.want {
				t.Fatalf("after the restart: %s\nwant %s", got, tc.want)
			}
			for _, e := range evs {
				if e.IsHealthy && len(e.EntitiesImpacted) == 0 && !e.GeneratedTimestamp.AsTime().Equal(time.Unix(1730113200, 0)) {
					t.Errorf("%s healthy at %v, want the boot's start", e.CheckName, e.GeneratedTimestamp.AsTime())
				}
			}
			if evs := n.poll(30 * time.Second); len(evs) != 0 {
				t.Fatalf("reported again: %s", shortsOrNode(evs))
			}
		})
	}
}

// shortsOrNode is shorts, "@" for an event without entities.
func shortsOrNode(evs []*datamodels.HealthEvent) string {
	var s []string
	for _, e := range evs {
		if len(e.EntitiesImpacted) == 0 {
			s = append(s, e.CheckName+"::healthy@")
			continue
		}
		s = append(s, shorts([]*datamodels.HealthEvent{e}))
	}
	return strings.Join(s, " ")
}

// TestStateFileNotUsed: a state file that cannot be used — larger than the
// check ever writes (damaged, or state_file pointed at another file),
// corrupt, unreadable — is not read into memory whole nor silently taken
// for a first start: the check starts afresh (what stands is reported
// again) and warns why; a missing one is a first start, not warned about.
func TestStateFileNotUsed(t *testing.T) {
	const failed = "FabricManagerService:FM-SERVICE-FAILED:fatal@0000:05:00.0"
	for _, tc := range topologytest.StateDamages(maxStateBytes, `{"boot_id": "6f7a`) {
		t.Run(tc.Name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "fabric-state.json")
			var logs strings.Builder
			n := h100Node(t, func(c *Config) { c.StateFile, c.Logger = state, slog.New(slog.NewTextHandler(&logs, nil)) })
			n.healthy()
			n.r.out["systemctl show"] = showFailed
			if got := shorts(n.poll(0)); got != failed {
				t.Fatalf("first run: %s\nwant %s", got, failed)
			}
			tc.Alter(t, state)
			logs.Reset()
			c, err := New(n.c.cfg) // the agent restarted
			if err != nil {
				t.Fatal(err)
			}
			n.now = n.now.Add(30 * time.Second)
			evs, err := c.Check(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got := shorts(evs); got != failed {
				t.Errorf("after the restart: %q, want %q (a fresh start)", got, failed)
			}
			warned := strings.Contains(logs.String(), "level=WARN")
			if warned != (tc.Warn != "") || !strings.Contains(logs.String(), tc.Warn) {
				t.Errorf("log, want a warning naming %q: %s", tc.Warn, logs.String())
			}
		})
	}
}

// TestLogTimesOfThisBoot: FM writes its log in the host's local time, and
// the agent reads a time without a zone in its own (UTC in the
// DaemonSet's container). On a host west of UTC a line reads as hours
// older than it is, and this boot's SXids, in its first hours, read as
// older than the boot (/proc/stat btime is zone-free): only the log's tail
// replayed at start can hold an earlier boot's lines; a line written while
// the agent reads the log is this boot's whatever its time says.
func TestLogTimesOfThisBoot(t *testing.T) {
	const sxid = "[Oct 28 2024 %s] [ERROR] [tid 9] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:07:00.0 physical id 2 port 46"
	const want = "FabricManagerNVSwitchError:SXID-20034:fatal@0000:07:00.0"
	for _, tc := range []struct {
		name     string
		at       string // the line's time; the node booted at 10:00 UTC, the agent's clock reads 10:30
		replayed bool   // in the log when the agent started, else written after its first poll
		want     string
	}{
		{"replayed, of an earlier boot", "09:40:00", true, ""},
		{"replayed, of this boot", "10:10:00", true, want},
		{"written since, host in UTC", "10:31:00", false, want},
		{"written since, host 5h behind UTC", "05:31:00", false, want},
		{"written since, host 8h behind UTC", "02:31:00", false, want},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := h100Node(t, nil)
			n.healthy()
			n.write("proc/stat", "cpu  1 2 3 4\nbtime 1730109600\n") // 2024-10-28 10:00:00 UTC
			log := ""
			if tc.replayed {
				log = fmt.Sprintf(sxid, tc.at) + "\n"
			}
			n.write("fabricmanager.log", log)
			c, err := New(n.c.cfg) // reads the boot's start
			if err != nil {
				t.Fatal(err)
			}
			n.c = c
			got := shorts(n.poll(0))
			if !tc.replayed {
				if got != "" {
					t.Fatalf("first poll: %s", got)
				}
				n.appendLog("fabricmanager.log", fmt.Sprintf(sxid, tc.at))
				got = shorts(n.poll(time.Minute))
			}
			if got != tc.want {
				t.Errorf("SXid at %s: %q, want %q", tc.at, got, tc.want)
			}
		})
	}
}

// TestHostTimeZone: FM writes its log in the host's local time; the check
// reads it in Config.Location (the agent's time_zone, the host's), not in
// its own zone (UTC in the DaemonSet's container). On a host 5h behind
// UTC an SXid's generatedTimestamp read as UTC was 5h early, on a host 9h
// ahead 9h late (the correlator's SXid–Xid and fabric-incident windows
// missed it), and there the log's tail replayed at start kept an earlier
// boot's lines as this boot's.
func TestHostTimeZone(t *testing.T) {
	const sxid = "[%s] [ERROR] [tid 9] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:07:00.0 physical id 2 port 46"
	const want = "FabricManagerNVSwitchError:SXID-20034:fatal@0000:07:00.0"
	boot := time.Date(2024, 10, 28, 10, 0, 0, 0, time.UTC) // the agent's clock reads 10:30
	for _, zone := range []string{"UTC", "Etc/GMT+5", "America/Chicago", "Asia/Tokyo"} {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name     string
			at       time.Time // the line's true instant
			replayed bool      // in the log when the agent started, else written after its first poll
			want     string
		}{
			{"replayed, of an earlier boot", boot.Add(-20 * time.Minute), true, ""},
			{"replayed, of this boot", boot.Add(10 * time.Minute), true, want},
			{"written since", boot.Add(31 * time.Minute), false, want},
		} {
			t.Run(zone+"/"+tc.name, func(t *testing.T) {
				n := h100Node(t, func(c *Config) { c.Location = loc })
				n.healthy()
				n.write("proc/stat", fmt.Sprintf("cpu  1 2 3 4\nbtime %d\n", boot.Unix()))
				line := fmt.Sprintf(sxid, tc.at.In(loc).Format("Jan _2 2006 15:04:05"))
				log := ""
				if tc.replayed {
					log = line + "\n"
				}
				n.write("fabricmanager.log", log)
				c, err := New(n.c.cfg) // reads the boot's start
				if err != nil {
					t.Fatal(err)
				}
				n.c = c
				evs := n.poll(0)
				if !tc.replayed {
					if got := shorts(evs); got != "" {
						t.Fatalf("first poll: %s", got)
					}
					n.appendLog("fabricmanager.log", line)
					evs = n.poll(time.Minute)
				}
				if got := shorts(evs); got != tc.want {
					t.Fatalf("%s: %q, want %q", line, got, tc.want)
				}
				if len(evs) == 1 {
					if got := evs[0].GetGeneratedTimestamp().AsTime(); !got.Equal(tc.at) {
						t.Errorf("%s: generatedTimestamp %s, want %s", line, got, tc.at)
					}
				}
			})
		}
	}
}

// TestServiceStartInHostZone: systemctl run on the host (a wrapper
// entering its namespaces: the agent's image has none) prints FM's start
// in the host's zone, by its abbreviation ("EST"), which Go's time.Parse
// took for UTC. On a host 5h behind UTC, FM restarted a minute ago read as
// started 5h ago, and a GPU still registering with the fabric (In
// Progress) was at once reported FABRIC-PROBE-TIMEOUT, not after
// in_progress_timeout (5m).
func TestServiceStartInHostZone(t *testing.T) {
	now := time.Date(2024, 10, 28, 10, 30, 0, 0, time.UTC) // newNode's clock
	for _, zone := range []string{"UTC", "America/New_York", "America/Los_Angeles", "Asia/Tokyo"} {
		t.Run(zone, func(t *testing.T) {
			loc, err := time.LoadLocation(zone)
			if err != nil {
				t.Fatal(err)
			}
			n := h100Node(t, func(c *Config) { c.Location = loc })
			n.healthy()
			n.r.out["nvidia-smi -q"] = testdata(t, "smi/h100-550-mixed.txt")
			started := now.Add(-time.Minute).In(loc).Format("Mon 2006-01-02 15:04:05 MST")
			n.r.out["systemctl show"] = strings.Replace(showActive, "Mon 2024-10-28 10:00:01 UTC", started, 1)
			for _, ev := range n.poll(0) {
				if slices.Contains(ev.ErrorCode, "FABRIC-PROBE-TIMEOUT") {
					t.Fatalf("FM started at %s, a minute ago: %s", started, ev.Message)
				}
			}
			var timeouts int
			for _, ev := range n.poll(5 * time.Minute) {
				if slices.Contains(ev.ErrorCode, "FABRIC-PROBE-TIMEOUT") {
					timeouts++
				}
			}
			if timeouts == 0 {
				t.Errorf("FM started at %s: no FABRIC-PROBE-TIMEOUT 6 minutes after", started)
			}
		})
	}
}

// TestJournalSXidNotReportedAgain: FM logs an SXid to its log file and to
// syslog too ("nv-fabricmanager[5183]: detected NVSwitch non-fatal error
// ..."); when the unit then stops or fails, its journal is read for the
// lifecycle lines, and the SXid there is the one the log file already
// reported: it is not reported again. Without the log file the journal's
// SXid is the only one, and is reported.
func TestJournalSXidNotReportedAgain(t *testing.T) {
	const msg = "detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id 00000000:07:00.0 physical id 2 port 46"
	at := time.Date(2024, 10, 28, 10, 31, 0, 0, time.UTC)
	journal := func(t time.Time) string {
		return fmt.Sprintf(`{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"%d","SYSLOG_IDENTIFIER":"nv-fabricmanager","_PID":"5183","MESSAGE":%q}`+"\n", t.UnixMicro(), msg)
	}
	for _, tc := range []struct {
		name    string
		logFile bool
		journal time.Time
		want    int
	}{
		{"journal copy in the log line's second", true, at, 1},
		{"journal copy a second later", true, at.Add(time.Second), 1},
		{"no log file: the journal's SXid", false, at, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := h100Node(t, nil)
			n.healthy()
			n.write("fabricmanager.log", "[Oct 28 2024 10:00:01] [INFO] [tid 1] Fabric Manager version 550.127.05 is running with the following configuration options\n")
			if !tc.logFile {
				if err := os.Remove(filepath.Join(n.dir, "fabricmanager.log")); err != nil {
					t.Fatal(err)
				}
			}
			n.poll(0)
			if tc.logFile {
				n.appendLog("fabricmanager.log", "[Oct 28 2024 10:31:00] [ERROR] [tid 9] "+msg)
			}
			sxids := 0
			count := func(evs []*datamodels.HealthEvent) {
				for _, ev := range evs {
					if slices.Contains(ev.GetErrorCode(), "SXID-12028") {
						sxids++
					}
				}
			}
			count(n.poll(60 * time.Second))
			n.r.out["systemctl show"] = showFailed
			n.r.out["journalctl"] = journal(tc.journal)
			count(n.poll(30 * time.Second))
			if sxids != tc.want {
				t.Errorf("SXID-12028 reported %d times, want %d", sxids, tc.want)
			}
		})
	}
}

// TestJournalSXidPastTheLogFile: the journal's copy of an FM SXid is
// dropped only where the FM log file has covered its time. FM logging to
// syslog only (the file stale since its start line), the journal's SXid
// is the only report of it, also after a restart; FM logging to both, it
// is reported once, also when the file's line was read by the run before
// a restart (the file's newest line time is kept in the state).
func TestJournalSXidPastTheLogFile(t *testing.T) {
	const msg = "detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id 00000000:07:00.0 physical id 2 port 46"
	at := time.Date(2024, 10, 28, 10, 31, 0, 0, time.UTC)
	journal := fmt.Sprintf(`{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"%d","SYSLOG_IDENTIFIER":"nv-fabricmanager","_PID":"5183","MESSAGE":%q}`+"\n", at.UnixMicro(), msg)
	for _, tc := range []struct {
		name     string
		fileHas  bool // the file has the SXid line too
		restart  bool // the agent restarts before the unit fails
		wantSXid int
	}{
		{"file stale", false, false, 1},
		{"file stale, restarted", false, true, 1},
		{"both, restarted", true, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := restartNode(t) // the file's newest line: 10:00:01
			n.poll(0)
			if tc.fileHas {
				n.appendLog("fabricmanager.log", "[Oct 28 2024 10:31:00] [ERROR] [tid 9] "+msg)
			}
			sxids := 0
			count := func(evs []*datamodels.HealthEvent) {
				for _, ev := range evs {
					if slices.Contains(ev.GetErrorCode(), "SXID-12028") {
						sxids++
					}
				}
			}
			count(n.poll(60 * time.Second))
			if tc.restart {
				n.restart()
			}
			n.r.out["systemctl show"] = showFailed
			n.r.out["journalctl"] = journal
			count(n.poll(30 * time.Second))
			if sxids != tc.wantSXid {
				t.Errorf("SXID-12028 reported %d times, want %d", sxids, tc.wantSXid)
			}
		})
	}
}

// TestJournalSXidWhileTheLogFileLags: FM writes its SXids to both; after
// more than a poll's read of the FM log (a storm of lines before FM
// failed), the journal's copy of the last SXid is dated past what the
// file has given yet. It is not evaluated while the file's read has more
// to read: the file gives the SXid a later poll, and it is reported once.
func TestJournalSXidWhileTheLogFileLags(t *testing.T) {
	const msg = "detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id 00000000:07:00.0 physical id 2 port 46"
	at := time.Date(2024, 10, 28, 10, 31, 30, 0, time.UTC)
	n := restartNode(t)
	n.poll(0)
	n.infoLines(5 << 20) // dated 10:31:00
	n.appendLog("fabricmanager.log", "[Oct 28 2024 10:31:30] [ERROR] [tid 9] "+msg)
	n.r.out["systemctl show"] = showFailed
	n.r.out["journalctl"] = fmt.Sprintf(`{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"%d","SYSLOG_IDENTIFIER":"nv-fabricmanager","_PID":"5183","MESSAGE":%q}`+"\n", at.Add(400*time.Millisecond).UnixMicro(), msg)
	n.r.out["journalctl -u nvidia-fabricmanager -o json --no-pager --after-cursor=s=1"] = ""
	sxids := 0
	for range 3 {
		for _, ev := range n.poll(2 * time.Minute) {
			if slices.Contains(ev.GetErrorCode(), "SXID-12028") {
				sxids++
			}
		}
	}
	if sxids != 1 {
		t.Errorf("SXID-12028 reported %d times, want once", sxids)
	}
}

// TestJournalIsTheFMLog: fabricmanager.cfg sends FM's log to syslog
// (LOG_USE_SYSLOG=1) or to stderr (LOG_FILE_NAME empty), both the unit's
// journal: a fatal SXid FM logs there while it runs is reported.
func TestJournalIsTheFMLog(t *testing.T) {
	const msg = "detected NVSwitch fatal error 12020 on fid 0 on NVSwitch pci bus id 00000000:07:00.0 physical id 2 port 46"
	for _, tc := range []struct{ name, cfg string }{
		{"LOG_USE_SYSLOG=1", "LOG_FILE_NAME=/var/log/fabricmanager.log\nLOG_USE_SYSLOG=1\n"},
		{"LOG_FILE_NAME empty", "LOG_FILE_NAME=\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := h100Node(t, nil)
			n.healthy()
			n.write("fabricmanager.cfg", testdata(t, "config/h100-default.cfg")+tc.cfg)
			n.r.out["journalctl -u nvidia-fabricmanager -o json --no-pager -n 100"] = `{"__CURSOR":"s=1","__REALTIME_TIMESTAMP":"1730109601000000","SYSLOG_IDENTIFIER":"nv-fabricmanager","MESSAGE":"Successfully configured all the available GPUs and NVSwitches to route NVLink traffic."}` + "\n"
			n.r.out["journalctl -u nvidia-fabricmanager -o json --no-pager --after-cursor=s=1"] = ""
			if evs := n.poll(0); len(evs) != 0 {
				t.Fatalf("healthy: %s", shorts(evs))
			}
			at := n.now.Add(30 * time.Second)
			n.r.out["journalctl -u nvidia-fabricmanager -o json --no-pager --after-cursor=s=1"] = fmt.Sprintf(`{"__CURSOR":"s=2","__REALTIME_TIMESTAMP":"%d","SYSLOG_IDENTIFIER":"nv-fabricmanager","_PID":"5183","MESSAGE":%q}`+"\n", at.UnixMicro(), msg)
			n.r.out["journalctl -u nvidia-fabricmanager -o json --no-pager --after-cursor=s=2"] = ""
			got := shorts(n.poll(60 * time.Second))
			if !strings.Contains(got, "FabricManagerNVSwitchError:SXID-12020:fatal@0000:07:00.0") {
				t.Fatalf("FM running, its log in the journal: %q, want SXID-12020", got)
			}
			if got := shorts(n.poll(60 * time.Second)); got != "" {
				t.Fatalf("next poll: %q, want nothing (read after the cursor)", got)
			}
		})
	}
}
