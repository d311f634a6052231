package fabric

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// event is the part of a printed event the scenario tables assert.
type event struct {
	Check    string            `json:"checkName"`
	Codes    []string          `json:"errorCode"`
	Fatal    bool              `json:"isFatal"`
	Healthy  bool              `json:"isHealthy"`
	Action   string            `json:"recommendedAction"`
	Entities []entity          `json:"entitiesImpacted"`
	Meta     map[string]string `json:"metadata"`
}

type entity struct {
	Type  string `json:"entityType"`
	Value string `json:"entityValue"`
}

// short is "Check:CODE:fatal|nonfatal|healthy:ACTION@firstEntity".
func (e event) short() string {
	sev := "nonfatal"
	switch {
	case e.Healthy:
		sev = "healthy"
	case e.Fatal:
		sev = "fatal"
	}
	code := ""
	if len(e.Codes) > 0 {
		code = e.Codes[0]
	}
	ent := ""
	if len(e.Entities) > 0 {
		ent = e.Entities[0].Value
	}
	return e.Check + ":" + code + ":" + sev + ":" + e.Action + "@" + ent
}

// parse runs `fabric parse` with args (file names relative to testdata)
// and returns the printed lines and the decoded events.
func parse(t *testing.T, args ...string) ([]byte, []event) {
	t.Helper()
	var full []string
	if !strings.Contains(strings.Join(args, " "), "--now") {
		full = append(full, "--now", "2024-10-28T12:00:00Z")
	}
	for _, a := range args {
		if !strings.HasPrefix(a, "-") && strings.Contains(a, "/") {
			a = filepath.Join("testdata", a)
		}
		full = append(full, a)
	}
	var out bytes.Buffer
	if err := ParseCommand(append([]string{"--utc", "--year", "2024"}, full...), &out); err != nil {
		t.Fatalf("fabric parse %v: %v", args, err)
	}
	var evs []event
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if l == "" {
			continue
		}
		var e event
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		evs = append(evs, e)
	}
	return out.Bytes(), evs
}

// TestScenarios: every case of the guide, and the edge cases of real
// outputs, on recorded (or guide-built) outputs of HGX A100 (one and two
// baseboards), HGX H100 and HGX B200. Each scenario's full output is also
// a golden file (testdata/scenarios/NAME.golden.jsonl).
func TestScenarios(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want []string
		meta map[int]map[string]string // event index → metadata it must carry
	}{
		// --- the FM service ---
		{"nothing-to-do-no-nvswitch", []string{"--nvswitches", "0", "journal/gpu-operator-610-nothing-to-do.journal"},
			[]string{"FabricManagerConfig:FM-CONFIG-NO-NVSWITCH:nonfatal:NONE@nvidia-fabricmanager"}, nil},
		{"nothing-to-do-with-nvswitch", []string{"--nvswitches", "4", "journal/cube-studio-29-nothing-to-do.journal"},
			[]string{"FabricManagerInit:FM-INIT-NO-NVSWITCH:fatal:RESTART_BM@nvidia-fabricmanager"}, nil},
		{"failed-unit-no-nvswitch", []string{"--nvswitches", "0", "systemctl/failed-exit-code.status"},
			[]string{"FabricManagerConfig:FM-CONFIG-NO-NVSWITCH:nonfatal:NONE@nvidia-fabricmanager",
				"FabricManagerConfig:FM-CONFIG-NO-NVSWITCH:nonfatal:NONE@nvidia-fabricmanager"}, nil},
		{"failed-unit-with-nvswitch", []string{"--nvswitches", "6", "--platform", "a100", "config/a100-bare-metal-degraded.cfg", "systemctl/failed.show"},
			[]string{"FabricManagerService:FM-SERVICE-FAILED:fatal:RESTART_BM@nvidia-fabricmanager"},
			map[int]map[string]string{0: {"cuda_jobs": "ABORT_CUDA_JOBS_ON_FM_EXIT=1: all running CUDA jobs are aborted when FM exits."}}},
		{"not-installed", []string{"--nvswitches", "4", "systemctl/not-found.status"},
			[]string{"FabricManagerService:FM-SERVICE-NOT-INSTALLED:fatal:RESTART_BM@nvidia-fabricmanager"}, nil},
		{"forking-parent-success-is-healthy", []string{"--nvswitches", "4", "systemctl/forking-parent-success.status"}, nil, nil},
		{"truncated-process-name-is-healthy", []string{"--nvswitches", "6", "systemctl/bottlerocket-3873-p4d-active.status"}, nil, nil},
		{"b200-fm-running", []string{"--nvlink-bridges", "4", "systemctl/bottlerocket-142-b200-active.status"}, nil, nil},
		{"b200-fm-and-nvlsm-running", []string{"--nvlink-bridges", "4", "systemctl/b200-fm-and-nvlsm.status"}, nil, nil},
		// --- Error Handling: FM initialization (Table 17) and HA modes ---
		{"a100-two-baseboards-bare-metal", []string{"--nvswitches", "12", "config/a100-bare-metal-degraded.cfg", "smi/hgx-a100-2bb.txt",
			"nvlink/a100-2bb-remote.txt", "fmlog/constructed-a100-2bb-init.log"},
			[]string{
				"FabricManagerNVLinkTraining:FM-INIT-ACCESS-LINK-TRAINING-FAILURE:nonfatal:RESTART_BM@GPU-a100b000-0000-0000-0000-000000000002",
				"FabricManagerHAMode:FM-HA-ACCESS-GPU-REMOVED:fatal:RESTART_BM@GPU-a100b000-0000-0000-0000-000000000002",
				"GPUExclusion:GPU-EXCLUSION-CANDIDATE:nonfatal:RUN_DCGMEUD@GPU-a100b000-0000-0000-0000-000000000002",
				"FabricManagerNVLinkTraining:FM-INIT-TRUNK-LINK-TRAINING-FAILURE:nonfatal:RESTART_BM@0000:c4:00.0",
				"FabricManagerHAMode:FM-HA-TRUNK-NVSWITCH-PAIR-DISABLED:nonfatal:CONTACT_SUPPORT@0000:c4:00.0",
				"FabricManagerNVSwitchError:SXID-12001:fatal:RESTART_BM@0000:c5:00.0",
				"FabricManagerNVSwitchError:SXID-12020:fatal:RESTART_BM@0000:c6:00.0",
				"FabricManagerNVSwitchError:SXID-20034:fatal:COMPONENT_RESET@0000:c8:00.0",
			},
			map[int]map[string]string{4: {"bandwidth_fraction": "5/6", "config_value": "1", "config_value_source": "fabricmanager.cfg"},
				5: {"port_type": "trunk"}, 6: {"port_type": "access", "table_class": "always_fatal"},
				7: {"port_type": "access", "gpu_uuid": "GPU-a100b000-0000-0000-0000-000000000003", "gpu_pci": "0000:4e:00", "expected_gpu_xids": "XID-74,XID-45"}}},
		{"a100-shared-nvswitch-init", []string{"--nvswitches", "12", "config/a100-shared.cfg", "smi/hgx-a100-2bb.txt", "fmlog/constructed-shared-init.log"},
			[]string{
				"FabricManagerInit:FM-INIT-MIG-ENABLED:fatal:RESTART_VM@physical:4",
				"FabricManagerInit:FM-INIT-NVSWITCH-FAILURE:nonfatal:RESTART_VM@0000:c9:00.0",
				"FabricManagerHAMode:FM-HA-NVSWITCH-PARTITIONS-REMOVED:nonfatal:CONTACT_SUPPORT@0000:c9:00.0",
				"NVSwitchExclusion:NVSWITCH-EXCLUSION-CANDIDATE:nonfatal:CONTACT_SUPPORT@0000:c9:00.0",
				"FabricManagerInit:FM-INIT-GPU-FAILURE:nonfatal:RESTART_VM@physical:6",
				"FabricManagerHAMode:FM-HA-GPU-PARTITIONS-EXCLUDED:nonfatal:CONTACT_SUPPORT@physical:6",
				"GPUExclusion:GPU-EXCLUSION-CANDIDATE:nonfatal:RUN_DCGMEUD@physical:6",
				"FabricManagerInit::healthy:NONE@physical:4",
				"FabricManagerInit:FM-RESTART-ABORTED:fatal:RESTART_VM@nvidia-fabricmanager",
			},
			map[int]map[string]string{1: {"nvswitch_uuid": "SWX-9b3c0f21-71d2-4d0e-8c55-0e1d2a3b4c5d", "stay_resident": "FM_STAY_RESIDENT_ON_FAILURES=1: the service keeps running, partition activation/deactivation is not supported"}}},
		{"h100-init-errors", []string{"--nvswitches", "4", "config/h100-default.cfg", "smi/hgx-h100-topology.txt", "fmlog/constructed-h100.log"},
			[]string{
				"FabricManagerNVLinkTraining:FM-INIT-ACCESS-LINK-TRAINING-FAILURE:nonfatal:RESTART_BM@GPU-d100a000-0000-0000-0000-000000000002",
				"FabricManagerHAMode:FM-HA-ACCESS-NVLINK-INACTIVE:nonfatal:COMPONENT_RESET@GPU-d100a000-0000-0000-0000-000000000002",
				"GPUExclusion:GPU-EXCLUSION-CANDIDATE:nonfatal:RUN_DCGMEUD@GPU-d100a000-0000-0000-0000-000000000002",
				"FabricManagerNVSwitchError:SXID-12020:fatal:RESTART_BM@0000:07:00.0",
				"FabricManagerNVSwitchError:SXID-20001:nonfatal:NONE@0000:08:00.0",
				"FabricManagerInit:FM-INIT-DRIVER-MISMATCH:fatal:CONTACT_SUPPORT@nvidia-fabricmanager",
				"FabricManagerInit:FM-INIT-FAILURE:fatal:RESTART_BM@nvidia-fabricmanager",
			}, map[int]map[string]string{1: {"config_value": "1", "consequence": "H100 ignores ACCESS_LINK_FAILURE_MODE: on an access link failure nvidia-smi shows an inactive NVLink on the GPU."}}},
		{"vgpu-config-errors", []string{"--nvswitches", "12", "config/vgpu-bad.cfg"},
			[]string{"FabricManagerConfig:FM-CONFIG-INVALID-VALUE:nonfatal:CONTACT_SUPPORT@nvidia-fabricmanager",
				"FabricManagerConfig:FM-CONFIG-HA-MODE-UNSUPPORTED:nonfatal:CONTACT_SUPPORT@nvidia-fabricmanager"}, nil},
		{"h100-nvswitch-missing", []string{"--nvswitches", "3", "smi/hgx-h100-topology.txt"},
			[]string{"FabricManagerHAMode:FM-HA-NVSWITCH-UNAVAILABLE:fatal:RESTART_BM@nvidia-fabricmanager"}, nil},
		{"a100-one-nvswitch-missing-mode1", []string{"--nvswitches", "11", "config/a100-bare-metal-degraded.cfg", "smi/hgx-a100-2bb.txt"},
			[]string{"FabricManagerHAMode:FM-HA-NVSWITCH-PAIR-DISABLED:nonfatal:CONTACT_SUPPORT@nvidia-fabricmanager"}, nil},
		{"a100-two-nvswitches-missing-fall-back", []string{"--nvswitches", "10", "config/a100-bare-metal-degraded.cfg", "smi/hgx-a100-2bb.txt"},
			[]string{"FabricManagerHAMode:FM-HA-NVSWITCH-FM-ABORTED:fatal:RESTART_BM@nvidia-fabricmanager"}, nil},
		// --- NVLink state (access link failures as nvidia-smi shows them) ---
		{"h100-inactive-nvlink", []string{"--nvswitches", "4", "smi/hgx-h100-topology.txt", "nvlink/h100-status-inactive.txt"},
			[]string{"FabricManagerHAMode:FM-HA-ACCESS-NVLINK-INACTIVE:nonfatal:COMPONENT_RESET@GPU-d100a000-0000-0000-0000-000000000003"}, nil},
		{"b200-inactive-nvlink", []string{"--nvlink-bridges", "4", "smi/b200-580-k8s-test-infra.txt", "nvlink/b200-status-inactive.txt"},
			[]string{"FabricManagerHAMode:FM-HA-ACCESS-NVLINK-INACTIVE:nonfatal:COMPONENT_RESET@GPU-00000005-0000-0000-0000-000000000005"}, nil},
		{"a100-inactive-nvlink-mig-is-expected", []string{"--nvswitches", "6", "smi/a100-535-layout.txt", "nvlink/a100-status-inactive.txt"},
			[]string{"GPUNVLinkState:NVLINK-INACTIVE:nonfatal:COMPONENT_RESET@GPU-a100a100-0000-0000-0000-000000000002"},
			map[int]map[string]string{0: {"inactive_links": "6,7"}}},
		// --- SXid to GPU ---
		{"h100-sxid-access-port", []string{"--nvswitches", "4", "smi/hgx-h100-topology.txt", "nvlink/h100-remote.txt", "fmlog/constructed-h100-sxid-access.log"},
			[]string{"FabricManagerNVSwitchError:SXID-20034:fatal:COMPONENT_RESET@0000:07:00.0",
				"FabricManagerNVSwitchError:SXID-20001:nonfatal:NONE@0000:05:00.0"},
			map[int]map[string]string{0: {"gpu_uuid": "GPU-257d8671-d0e6-d1a7-dea9-952249a668fa", "gpu_link": "0", "gpu_pci": "0000:1b:00", "port_type": "access"},
				1: {"gpu_uuid": "GPU-257d8671-d0e6-d1a7-dea9-952249a668fa", "gpu_link": "15"}}},
		{"a100-shared-sxid-ports", []string{"--nvswitches", "12", "config/a100-shared.cfg", "smi/hgx-a100-2bb.txt", "nvlink/a100-2bb-remote.txt", "fmlog/constructed-a100-sxid.log"},
			[]string{"FabricManagerNVSwitchError:SXID-12001:fatal:RESTART_VM@0000:c5:00.0",
				"FabricManagerNVSwitchError:SXID-12020:fatal:RESTART_BM@0000:c6:00.0",
				"FabricManagerNVSwitchError:SXID-20034:fatal:RESTART_VM@0000:c8:00.0"},
			map[int]map[string]string{0: {"port_type": "trunk"}, 2: {"port_type": "access"}}},
		{"a100-sxid-access-port-fm-down", []string{"--nvswitches", "12", "config/a100-bare-metal-degraded.cfg", "smi/hgx-a100-2bb.txt", "nvlink/a100-2bb-remote.txt",
			"systemctl/failed.show", "fmlog/constructed-a100-sxid.log"},
			[]string{"FabricManagerNVSwitchError:SXID-12001:fatal:RESTART_BM@0000:c5:00.0",
				"FabricManagerNVSwitchError:SXID-12020:fatal:RESTART_BM@0000:c6:00.0",
				"FabricManagerNVSwitchError:SXID-20034:fatal:RESTART_BM@0000:c8:00.0",
				"FabricManagerService:FM-SERVICE-FAILED:fatal:RESTART_BM@nvidia-fabricmanager"}, nil},
		{"gpud-field-log", []string{"--nvswitches", "4", "fmlog/gpud-h100-runtime.log", "fmlog/gpud-log-matcher-examples.log"},
			[]string{"FabricManagerNVSwitchError:SXID-12028:nonfatal:RESTART_VM@0000:86:00.0",
				"FabricManagerNVSwitchError:SXID-20034:fatal:COMPONENT_RESET@0000:86:00.0",
				"FabricManagerNVSwitchError:SXID-12028:nonfatal:RESTART_VM@0000:86:00.0",
				"FabricManagerRuntime:FM-MULTICAST-TEAM-GPU-UNKNOWN:nonfatal:NONE@nvidia-fabricmanager"},
			map[int]map[string]string{0: {"port": "61", "switch_physical_id": "3", "expected_gpu_xids": "XID-45", "port_type": "unknown"}}},
		{"fm590-nodeid-sxid", []string{"--nvswitches", "4", "journal/field-590-nodeid-sxid.journal", "fmlog/constructed-590-nodeid-sxid.log"},
			[]string{"FabricManagerNVSwitchError:SXID-22013:nonfatal:NONE@0000:08:00.0",
				"FabricManagerNVSwitchError:SXID-22013:nonfatal:NONE@0000:08:00.0",
				"FabricManagerNVSwitchError:SXID-20034:fatal:COMPONENT_RESET@0000:08:00.0"},
			map[int]map[string]string{0: {"node_id": "0", "port": "60", "switch_physical_id": "3"}, 2: {"node_id": "0", "port": "61"}}},
		// --- GPU fabric state (nvidia-smi -q) ---
		{"completed-insufficient-resources", []string{"smi/azure-insufficient-resources.txt"},
			[]string{"GPUFabricState:FABRIC-PROBE-FAILURE:fatal:RESTART_BM@index:0"}, map[int]map[string]string{0: {"fabric_attached": "false"}}},
		{"completed-success-unhealthy-is-degraded", []string{"smi/grep-c3-unhealthy.txt"},
			[]string{"GPUFabricHealth:FABRIC-HEALTH-UNHEALTHY:nonfatal:NONE@index:0"}, map[int]map[string]string{0: {"degraded": "true"}}},
		{"mixed-status-fragments", []string{"smi/grep-a2-mixed-status.txt"},
			[]string{"GPUFabricState:FABRIC-PROBE-FAILURE:fatal:RESTART_BM@GPU-8a1a1111-0000-0000-0000-000000000001"}, nil},
		{"all-na-no-nvlink", []string{"smi/pcie-no-nvswitch.txt"}, nil, nil},
		{"h100-580-real-healthy", []string{"--nvswitches", "4", "smi/h100-580-k8s-test-infra.txt"}, nil, nil},
		{"b200-580-real-healthy", []string{"--nvlink-bridges", "4", "smi/b200-580-k8s-test-infra.txt"}, nil, nil},
		{"in-progress-past-fm-start-up", []string{"--nvswitches", "4", "systemctl/active.show", "smi/h100-560-layout.txt"},
			[]string{"GPUFabricState:FABRIC-PROBE-TIMEOUT:fatal:RESTART_BM@GPU-d100d100-0000-0000-0000-000000000002",
				"GPUFabricHealth:FABRIC-BANDWIDTH-DEGRADED:nonfatal:NONE@GPU-d100d100-0000-0000-0000-000000000006"},
			map[int]map[string]string{0: {"pending_since_source": "FM start-up", "fabric_status": "N/A"}}},
		{"in-progress-first-seen-then-timeout", []string{"--nvswitches", "4", "--now", "2024-10-28T10:21:31Z", "smi/h100-550-mixed.txt", "smi/h100-550-mixed.txt"},
			[]string{"GPUFabricState:FABRIC-PROBE-FAILURE:fatal:RESTART_BM@GPU-11111111-0000-0000-0000-00000000003a",
				"GPUFabricHealth:FABRIC-HEALTH-UNHEALTHY:nonfatal:NONE@GPU-11111111-0000-0000-0000-00000000003a",
				"GPUFabricHealth:FABRIC-BANDWIDTH-DEGRADED:nonfatal:NONE@GPU-11111111-0000-0000-0000-00000000005d",
				"GPUFabricState:FABRIC-PROBE-TIMEOUT:fatal:RESTART_BM@GPU-11111111-0000-0000-0000-00000000002a"}, nil},
		// --- exclusion ---
		{"gpu-exclusion", []string{"--nvswitches", "4", "smi/hgx-h100-topology.txt", "exclusion/information.txt", "exclusion/modprobe-nvidia.conf",
			"exclusion/smi-list-excluded.txt", "exclusion/gpu_metadata-missing.json"},
			[]string{"FabricManagerConfig:EXCLUDE-PARAMETER-DEPRECATED:nonfatal:NONE@nvidia.ko",
				"GPUExclusion:GPU-EXCLUDED:nonfatal:NONE@GPU-cc7d93b3-73f8-5028-287a-9e617839550e",
				"GPUExclusion:GPU-EXCLUDE-LISTED-NOT-PRESENT:nonfatal:NONE@GPU-d100a000-0000-0000-0000-000000000009",
				"GPUExclusion:GPU-EXCLUSION-CANDIDATE:fatal:RESTART_BM@GPU-d100a000-0000-0000-0000-00000000000b"}, nil},
		{"gpu-exclusion-pending-reboot", []string{"--nvswitches", "4", "smi/hgx-h100-topology.txt", "exclusion/modprobe-pending.conf"},
			[]string{"GPUExclusion:GPU-EXCLUDE-PENDING-REBOOT:nonfatal:NONE@GPU-257d8671-d0e6-d1a7-dea9-952249a668fa"}, nil},
		// --- partitions and reachability ---
		{"audit-guide-example-healthy", []string{"--nvswitches", "6", "smi/a100-535-layout.txt", "audit/guide-a100-8gpu.txt"}, nil, nil},
		{"audit-degraded", []string{"--nvswitches", "6", "smi/a100-535-layout.txt", "audit/a100-degraded.txt"},
			[]string{"NVSwitchReachability:NVSWITCH-ROUTING-DEGRADED:nonfatal:CONTACT_SUPPORT@physical:3",
				"NVSwitchReachability:NVSWITCH-ROUTING-DEGRADED:nonfatal:CONTACT_SUPPORT@physical:4",
				"NVSwitchReachability:NVSWITCH-ROUTING-DEGRADED:nonfatal:CONTACT_SUPPORT@physical:5",
				"NVSwitchReachability:NVSWITCH-ROUTING-UNREACHABLE:fatal:RESTART_BM@physical:6",
				"NVSwitchReachability:NVSWITCH-ROUTING-UNREACHABLE:fatal:RESTART_BM@physical:7",
				"NVSwitchReachability:NVSWITCH-ROUTING-DEGRADED:nonfatal:CONTACT_SUPPORT@physical:8"}, nil},
		{"shared-partitions", []string{"--nvswitches", "6", "config/a100-shared.cfg", "smi/a100-535-layout.txt", "fmpm/a100-shared-degraded.json", "audit/a100-partitions-csv.txt"},
			[]string{"NVSwitchReachability:NVSWITCH-ROUTING-ISOLATION-BREACH:fatal:CONTACT_SUPPORT@physical:4",
				"NVSwitchReachability:NVSWITCH-ROUTING-ISOLATION-BREACH:fatal:CONTACT_SUPPORT@physical:8",
				"FabricManagerPartition:FM-PARTITION-DEGRADED:nonfatal:CONTACT_SUPPORT@7",
				"FabricManagerPartition:FM-PARTITION-REMOVED:nonfatal:CONTACT_SUPPORT@nvidia-fabricmanager"},
			map[int]map[string]string{3: {"removed_partitions": "12"}}},
		{"h100-shared-partitions-default", []string{"--nvswitches", "4", "config/a100-shared.cfg", "smi/hgx-h100-topology.txt", "fmpm/h100-shared.json"}, nil, nil},
		{"audit-not-on-b200", []string{"--nvlink-bridges", "4", "smi/b200-580-k8s-test-infra.txt", "audit/a100-degraded.txt"}, nil, nil},
		{"partition-return-codes", []string{"--nvswitches", "12", "config/a100-shared.cfg", "fmlog/constructed-partitions.log"},
			[]string{"FabricManagerPartition:FM-PARTITION-IN_USE:nonfatal:NONE@3",
				"FabricManagerPartition:FM-PARTITION-TIMEOUT:nonfatal:CONTACT_SUPPORT@5",
				"FabricManagerPartition:FM-PARTITION-NVLINK_ERROR:fatal:RESTART_VM@7"}, nil},
		// --- HGX B200: NVLSM and NVSwitch telemetry ---
		{"b200-nvlsm-missing", []string{"--platform", "b200", "--nvswitches", "0", "fmlog/constructed-b200-nvlsm-missing.log"},
			[]string{"NVLSMService:NVLSM-IPC-FAILURE:fatal:RESTART_BM@nvidia-fabricmanager",
				"FabricManagerInit:FM-INIT-NO-NVSWITCH:fatal:RESTART_BM@nvidia-fabricmanager"}, nil},
		{"b200-nvlsm-log", []string{"--platform", "b200", "nvlsm/constructed-b200-nvlsm.log", "nvlsm/siderolabs-893-wrapper.log"},
			[]string{"NVLSMLog:NVLSM-ERROR:nonfatal:NONE@nvidia-fabricmanager", "NVLSMService:NVLSM-FATAL:fatal:RESTART_BM@nvidia-fabricmanager"}, nil},
		{"b200-telemetry", []string{"--platform", "b200", "smi/b200-580-k8s-test-infra.txt", "telemetry/b200-dcgm-exporter-1.prom", "telemetry/b200-dcgm-exporter-2.prom"},
			[]string{"NVSwitchTelemetry:NVSWITCH-LINK-REPLAY-ERRORS:nonfatal:NONE@nvswitch0",
				"NVSwitchTelemetry:NVSWITCH-LINK-DOWN:fatal:COMPONENT_RESET@nvswitch0",
				"NVSwitchTelemetry:NVSWITCH-THERMAL-SLOWDOWN:nonfatal:NONE@nvswitch1"},
			map[int]map[string]string{0: {"delta": "3", "port": "5"}, 1: {"remote_pci": "0000:96:00.0", "port": "11"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw, evs := parse(t, tc.args...)
			var got []string
			for _, e := range evs {
				got = append(got, e.short())
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Fatalf("events:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
			for i, m := range tc.meta {
				for k, v := range m {
					if evs[i].Meta[k] != v {
						t.Errorf("event %d metadata %s = %q, want %q", i, k, evs[i].Meta[k], v)
					}
				}
			}
			golden(t, filepath.Join("testdata/scenarios", tc.name+".golden.jsonl"), raw)
		})
	}
}
