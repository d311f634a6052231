package fabric

import (
	"strings"
	"testing"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestCatalogCoversTheGuide: every class of the guide's Error Handling
// chapter is in the data — the three Table 17 rows, the Table 18 return
// codes, and a high-availability cell for every A100 mode × failure kind ×
// *_FAILURE_MODE value and for H100 and B200 — with the handling the guide
// gives.
func TestCatalogCoversTheGuide(t *testing.T) {
	c, err := DefaultCatalog()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []struct {
		name           string
		bm, shared, vg datamodels.RecommendedAction
	}{
		{"table17_access", datamodels.RecommendedAction_RESTART_BM, datamodels.RecommendedAction_RESTART_VM, datamodels.RecommendedAction_RESTART_BM},
		{"table17_trunk", datamodels.RecommendedAction_RESTART_BM, datamodels.RecommendedAction_RESTART_VM, datamodels.RecommendedAction_RESTART_BM},
		{"table17_config", datamodels.RecommendedAction_RESTART_BM, datamodels.RecommendedAction_RESTART_VM, datamodels.RecommendedAction_RESTART_BM},
	} {
		x := c.Handling[h.name]
		if x == nil || !x.Fatal || x.Action(ModeBareMetal) != h.bm || x.Action(ModeShared) != h.shared || x.Action(ModeVGPU) != h.vg {
			t.Errorf("handling %s: %+v", h.name, x)
		}
	}
	for _, code := range []string{"FM_ST_BADPARAM", "FM_ST_NOT_SUPPORTED", "FM_ST_NOT_CONFIGURED", "FM_ST_UNINITIALIZED", "FM_ST_IN_USE",
		"FM_ST_GENERIC_ERROR", "FM_ST_TIMEOUT", "FM_ST_VERSION_MISMATCH"} {
		if c.Partitions[code] == nil {
			t.Errorf("Table 18 code %s missing", code)
		}
	}
	if p := c.PartitionByValue(-7); p == nil || p.Name != "FM_ST_IN_USE" {
		t.Errorf("fmReturn -7: %+v", p)
	}
	for _, mode := range []string{ModeBareMetal, ModeShared, ModeVGPU} {
		for _, kind := range []string{"access", "trunk", "nvswitch"} {
			for v := 0; v <= 1; v++ {
				r := c.HARuleFor(PlatformA100, mode, kind, v)
				if r == nil {
					if mode == ModeVGPU && kind == "nvswitch" && v == 1 {
						continue // not supported in vGPU mode (a config event; FM behaves as 0)
					}
					t.Errorf("A100 %s %s mode %d: no cell", mode, kind, v)
					continue
				}
				if v == 1 && r.Bandwidth != "5/6" && kind != "access" {
					t.Errorf("A100 %s %s mode 1: bandwidth %q, want 5/6", mode, kind, r.Bandwidth)
				}
			}
		}
		for _, p := range []string{PlatformH100, PlatformB200} {
			if c.HARuleFor(p, mode, "trunk", 0) != nil {
				t.Errorf("%s has no trunk links, yet a trunk cell", p)
			}
			if r := c.HARuleFor(p, mode, "access", 1); r == nil || r.Code != "FM-HA-ACCESS-NVLINK-INACTIVE" {
				t.Errorf("%s %s access: %+v (the setting is ignored: an inactive NVLink)", p, mode, r)
			}
			if r := c.HARuleFor(p, mode, "nvswitch", 1); r == nil || !r.Fatal {
				t.Errorf("%s %s nvswitch: %+v (GPUs fail fabric registration)", p, mode, r)
			}
		}
	}
	if r := c.HARuleFor(PlatformA100, ModeBareMetal, "trunk", 0); !r.Fatal || r.Action != datamodels.RecommendedAction_RESTART_BM {
		t.Errorf("A100 trunk mode 0 (FM exits): %+v", r)
	}
	if r := c.HARuleFor(PlatformA100, ModeShared, "trunk", 0); r.Fatal || len(r.Partitions) != 5 {
		t.Errorf("A100 shared trunk mode 0 (partitions using trunks removed): %+v", r)
	}
}

// TestCatalogMatch: the messages the rules are for, and the ones they
// must not take (a path naming nvswitch, a transient retry).
func TestCatalogMatch(t *testing.T) {
	c, _ := DefaultCatalog()
	for _, tc := range []struct{ source, level, msg, id string }{
		{"fm", "", "request to query NVSwitch device information from NVSwitch driver failed with error:WARNING Nothing to do [NV_WARN_NOTHING_TO_DO]", "nothing-to-do"},
		{"fm", "", `"/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg" failed! Exit code: 1`, "start-script-exit"},
		{"fm", "ERROR", "access NVLink training failed for GPU physical id 3 link 6", "access-link-training"},
		{"fm", "ERROR", "request to train NVLink connections failed: NVLink connection training failed for GPU physical id 3 link 12", "gpu-link-training"},
		{"fm", "ERROR", "trunk NVLink training failed between NVSwitch pci bus id 00000000:c4:00.0 port 20 and NVSwitch pci bus id 00000000:44:00.0 port 20", "trunk-link-training"},
		{"fm", "WARNING", "failed to open the GPU handle for NVLink training, retrying", ""},
		{"fm", "INFO", "Successfully configured all the available NVSwitches to route GPU NVLink traffic.", "fm-ready"},
		{"fm", "ERROR", "fabric manager config file item: FABRIC_NODE_CONFIG_FILE has an invalid value", "config-item"},
		{"nvlsm", "", "osm_nvlink_port_check: ERR 7A25: port reported LinkDownedCounter increase", "nvlsm-error"},
		{"fm", "ERROR", "osm_nvlink_port_check: ERR 7A25", ""},
	} {
		r := c.Match(tc.source, tc.level, tc.msg)
		got := ""
		if r != nil {
			got = r.ID
		}
		if got != tc.id {
			t.Errorf("%q: rule %q, want %q", tc.msg, got, tc.id)
		}
	}
}

func TestLoadCatalogErrors(t *testing.T) {
	good := string(fmCatalogJSON)
	for _, tc := range []struct{ from, to, msg string }{
		{`"actions": {"bare_metal": "RESTART_BM", "shared": "RESTART_VM", "vgpu": "RESTART_BM"}`, `"actions": {"bare_metal": "REBOOT", "shared": "RESTART_VM", "vgpu": "RESTART_BM"}`, `unknown recommended action "REBOOT"`},
		{`"handling": "table17_trunk", "state"`, `"handling": "table17_trunks", "state"`, `unknown handling "table17_trunks"`},
		{`"marker": "fm_ready"`, `"marker": "fm_readyy"`, `marker "fm_readyy"`},
		{`"source": "nvlsm", "any": [" err "]`, `"source": "nvlsmd", "any": [" err "]`, `source "nvlsmd"`},
		{`"state": "oneoff"}`, `"state": "once"}`, `state "once"`},
	} {
		if !strings.Contains(good, tc.from) {
			t.Fatalf("catalog lacks %q", tc.from)
		}
		_, err := LoadCatalog([]byte(strings.Replace(good, tc.from, tc.to, 1)))
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v", tc.to, err)
		}
	}
}

// TestDetectKind: every recorded input is recognised as its kind.
func TestDetectKind(t *testing.T) {
	for file, kind := range map[string]string{
		"smi/h100-580-k8s-test-infra.txt": KindSMI, "smi/grep-c3-unhealthy.txt": KindSMI, "smi/azure-insufficient-resources.txt": KindSMI,
		"smi/h100-560-layout.txt": KindSMI, "fmlog/gpud-h100-runtime.log": KindFMLog, "journal/gpu-operator-610-nothing-to-do.journal": KindJournal,
		"journal/cube-studio-29-nothing-to-do.journal": KindJournal, "systemctl/failed.show": KindSystemctl,
		"systemctl/bottlerocket-3873-p4d-active.status": KindSystemctl, "systemctl/not-found.status": KindSystemctl,
		"config/a100-shared.cfg": KindFMConfig, "nvlink/h100-remote.txt": KindNVLink, "nvlink/b200-status-inactive.txt": KindNVLink,
		"topo/dgx-a100-dcgm-149.txt": KindTopo, "audit/a100-partitions-csv.txt": KindAudit, "fmpm/h100-shared.json": KindFMPM,
		"exclusion/information.txt": KindGPUInfo, "exclusion/modprobe-nvidia.conf": KindModprobe, "exclusion/smi-list-excluded.txt": KindExcluded,
		"exclusion/gpu_metadata.json": KindGPUMetadata, "telemetry/b200-dcgm-exporter-1.prom": KindTelemetry,
		"nvlsm/constructed-b200-nvlsm.log": KindNVLSMLog, "nvlsm/siderolabs-893-wrapper.log": KindNVLSMLog,
	} {
		if got := DetectKind(testdata(t, file)); got != kind {
			t.Errorf("%s: %q, want %q", file, got, kind)
		}
	}
	if got := DetectKind("hello world\n"); got != "" {
		t.Errorf("plain text: %q", got)
	}
}
