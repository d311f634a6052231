package nvsentinel

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/validate"
)

// The events below are NVSentinel's syslog-health-monitor's, as its
// handlers build them and its tests assert them
// (github.com/NVIDIA/NVSentinel health-monitors/syslog-health-monitor/,
// read at the fork KaivalyaMDabhadkar/NVSentinel 5ada458, 2026-08-05):
// pkg/xid/xid_handler.go createHealthEventFromResponse (PCI entity cut at
// the function, GPU_UUID, Message the journal line, metadata
// chassis_serial), pkg/xid/parser/csv.go (errorCode "31", NVL5
// "145.RLW_REMAP"), pkg/xid/xid_handler_test.go (the sidecar's "Xid 79";
// Xid 74's NVLINK/REGn entities, getXID74Metadata),
// pkg/sxid/sxid_handler.go and sxid_handler_test.go TestProcessLineWithGPU
// (NVSWITCH, PCI, NVLINK, GPU index, GPU_UUID; errorCode "24007"),
// pkg/gpufallen/gpufallen_handler.go and its test (PCI with function,
// PCI_ID, "GPU_FALLEN_OFF_BUS").

func nvEvent(check, code, msg string, ents ...string) *datamodels.HealthEvent {
	ev := &datamodels.HealthEvent{Version: 1, Agent: "syslog-health-monitor", ComponentClass: "GPU", CheckName: check,
		IsFatal: true, Message: msg, RecommendedAction: datamodels.RecommendedAction_RESTART_VM, ErrorCode: []string{code},
		Metadata:           map[string]string{"chassis_serial": "1653123456789"},
		GeneratedTimestamp: timestamppb.New(time.Date(2026, 8, 5, 7, 45, 1, 0, time.UTC)), NodeName: "gpu-node-1"}
	for i := 0; i+1 < len(ents); i += 2 {
		ev.EntitiesImpacted = append(ev.EntitiesImpacted, &datamodels.Entity{EntityType: ents[i], EntityValue: ents[i+1]})
	}
	return ev
}

// nicEvent is NVSentinel's NIC health monitor's port state event (its
// link-state design, §13.1 and §3: agent nic-health-monitor, entities NIC
// and NICPort; a non-fatal one for LinkErrorRecovery, INIT, ARMED).
func nicEvent(check string, fatal bool, msg string, ents ...string) *datamodels.HealthEvent {
	ev := nvEvent(check, "", msg, ents...)
	ev.Agent, ev.ComponentClass, ev.ErrorCode, ev.Metadata = "nic-health-monitor", "NIC", nil, nil
	ev.IsFatal, ev.RecommendedAction = fatal, datamodels.RecommendedAction_NONE
	if fatal {
		ev.RecommendedAction = datamodels.RecommendedAction_REPLACE_VM
	}
	return ev
}

// fullMetadata gives ev validate.MaxMetadata metadata keys: the most the
// gateway takes.
func fullMetadata(ev *datamodels.HealthEvent) {
	ev.Metadata = map[string]string{}
	for i := range validate.MaxMetadata {
		ev.Metadata[fmt.Sprintf("k%d", i)] = "v"
	}
}

func TestNormalize(t *testing.T) {
	const uuid = "GPU-455d8f70-2051-db6c-0430-ffc457bff834"
	xid31 := "NVRM: Xid (PCI:0000:03:00): 31, pid=91237, name=python3, Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f6b_8a000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"
	with := func(ev *datamodels.HealthEvent, f func(*datamodels.HealthEvent)) *datamodels.HealthEvent {
		ev = proto.Clone(ev).(*datamodels.HealthEvent)
		f(ev)
		return ev
	}
	// NVSentinel's gpu-health-monitor's DCGM health watch events
	// (health-monitors/gpu-health-monitor/gpu_health_monitor/
	// platform_connector/platform_connector.py health_event_occurred: GPU
	// index, PCI and GPU_UUID entities; its DCGM error map sends a volatile
	// DBE as COMPONENT_RESET).
	dcgm := func(ev *datamodels.HealthEvent) *datamodels.HealthEvent {
		ev.Agent, ev.RecommendedAction = "gpu-health-monitor", datamodels.RecommendedAction_COMPONENT_RESET
		return ev
	}
	healthy := func(ev *datamodels.HealthEvent) {
		ev.IsHealthy, ev.IsFatal, ev.RecommendedAction = true, false, datamodels.RecommendedAction_NONE
	}
	dbe := "Detected 1 volatile double-bit ECC error(s) in GPU 7."
	for _, tc := range []struct {
		name   string
		in     *datamodels.HealthEvent
		want   *datamodels.HealthEvent
		entity string // events.EntityKey of the result
	}{
		{"Xid 31: bare number, PCI and GPU_UUID",
			nvEvent("SysLogsXIDError", "31", xid31, "PCI", "0000:03:00", "GPU_UUID", uuid),
			with(nvEvent("SysLogsXIDError", "XID-31", xid31, "PCI", "0000:03:00", "GPU", uuid), func(ev *datamodels.HealthEvent) {
				ev.Metadata[MetaErrorCode] = "31"
			}), "PCI=0000:03:00,GPU=" + uuid},
		{"Xid 79 of the analyser sidecar, upper-case PCI, no UUID",
			nvEvent("SysLogsXIDError", "Xid 79", "NVRM: Xid (PCI:0000:3B:00.0): 79, pid=12345, name=test-process", "PCI", "0000:3B:00"),
			with(nvEvent("SysLogsXIDError", "XID-79", "NVRM: Xid (PCI:0000:3B:00.0): 79, pid=12345, name=test-process", "PCI", "0000:3b:00"), func(ev *datamodels.HealthEvent) {
				ev.Metadata[MetaErrorCode] = "Xid 79"
			}), "PCI=0000:3b:00"},
		{"NVL5 Xid 145 with its subcode",
			nvEvent("SysLogsXIDError", "145.RLW_REMAP", "NVRM: Xid (PCI:0000:00:08.0): 145, RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000082 0x00000040 0x00000000 0x00000000 0x00000000 0x00000000)", "PCI", "0000:00:08"),
			with(nvEvent("SysLogsXIDError", "XID-145", "NVRM: Xid (PCI:0000:00:08.0): 145, RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000082 0x00000040 0x00000000 0x00000000 0x00000000 0x00000000)", "PCI", "0000:00:08"), func(ev *datamodels.HealthEvent) {
				ev.Metadata[MetaErrorCode] = "145.RLW_REMAP"
			}), "PCI=0000:00:08"},
		{"Xid 74: its NVLINK and register entities go to metadata, the entity is the GPU",
			nvEvent("SysLogsXIDError", "74", "NVRM: Xid (PCI:0000:03:00): 74, pid=1, NVLink: fatal error detected on link 14(0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
				"PCI", "0000:03:00", "GPU_UUID", uuid, "NVLINK", "14", "REG0", "0x00000000"),
			with(nvEvent("SysLogsXIDError", "XID-74", "NVRM: Xid (PCI:0000:03:00): 74, pid=1, NVLink: fatal error detected on link 14(0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
				"PCI", "0000:03:00", "GPU", uuid), func(ev *datamodels.HealthEvent) {
				ev.Metadata[MetaErrorCode] = "74"
				ev.Metadata["nvlink"] = "14"
				ev.Metadata["reg0"] = "0x00000000"
			}), "PCI=0000:03:00,GPU=" + uuid},
		{"Xid naming the GPU by index and UUID: the index goes to metadata",
			nvEvent("SysLogsXIDError", "79", "xid 79", "GPU", "0", "GPU_UUID", "GPU-3f2a"),
			with(nvEvent("SysLogsXIDError", "XID-79", "xid 79", "GPU", "GPU-3f2a"), func(ev *datamodels.HealthEvent) {
				ev.Metadata[MetaErrorCode] = "79"
				ev.Metadata["gpu_index"] = "0"
			}), "GPU=GPU-3f2a"},
		{"the GPU reset failure keeps its code, its GPU is renamed",
			nvEvent("SysLogsXIDError", "GPU_RESET_FAILURE", "GPU reset failed, proceeding with a node reboot", "PCI", "000b:00:00", "GPU_UUID", "GPU-123"),
			nvEvent("SysLogsXIDError", "GPU_RESET_FAILURE", "GPU reset failed, proceeding with a node reboot", "PCI", "000b:00:00", "GPU", "GPU-123"),
			"PCI=000b:00:00,GPU=GPU-123"},
		{"SXid: the switch by its PCI address, the GPU by its UUID",
			nvEvent("SysLogsSXIDError", "24007", "[ 1108.858286] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)",
				"NVSWITCH", "0", "PCI", "0000:c3:00.0", "NVLINK", "28", "GPU", "1", "GPU_UUID", "GPU-aaaabbbb-cccc-dddd-eeee-ffffffffffff"),
			with(nvEvent("SysLogsSXIDError", "SXID-24007", "[ 1108.858286] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)",
				"NVSwitch", "0000:c3:00.0", "GPU", "GPU-aaaabbbb-cccc-dddd-eeee-ffffffffffff"), func(ev *datamodels.HealthEvent) {
				ev.Metadata[MetaErrorCode] = "24007"
				ev.Metadata["nvswitch_index"] = "0"
				ev.Metadata["pci_bus_id"] = "0000:c3:00.0"
				ev.Metadata["link"] = "28"
				ev.Metadata["gpu_index"] = "1"
				ev.Metadata["gpu_uuid"] = "GPU-aaaabbbb-cccc-dddd-eeee-ffffffffffff"
			}), "NVSwitch=0000:c3:00.0,GPU=GPU-aaaabbbb-cccc-dddd-eeee-ffffffffffff"},
		{"GPU fallen off the bus",
			nvEvent("SysLogsGPUFallenOff", "GPU_FALLEN_OFF_BUS", "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the bus",
				"PCI", "0000:b3:00.0", "PCI_ID", "10de:26b5"),
			with(nvEvent("SysLogsGPUFallenOff", "GPU-FALLEN-OFF-BUS", "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the bus",
				"PCI", "0000:b3:00"), func(ev *datamodels.HealthEvent) {
				ev.Metadata[MetaErrorCode] = "GPU_FALLEN_OFF_BUS"
				ev.Metadata["pci_id"] = "10de:26b5"
			}), "PCI=0000:b3:00"},
		{"DCGM volatile DBE (COMPONENT_RESET): the GPU by its UUID, its index to metadata",
			dcgm(nvEvent("GpuMemWatch", "DCGM_FR_VOLATILE_DBE_DETECTED", dbe, "GPU", "7", "PCI", "0000:17:00.0", "GPU_UUID", uuid)),
			dcgm(with(nvEvent("GpuMemWatch", "DCGM_FR_VOLATILE_DBE_DETECTED", dbe, "PCI", "0000:17:00", "GPU", uuid), func(ev *datamodels.HealthEvent) {
				ev.Metadata["gpu_index"] = "7"
			})), "PCI=0000:17:00,GPU=" + uuid},
		{"DCGM watch cleared: its GPU named as the fault's",
			with(dcgm(nvEvent("GpuMemWatch", "DCGM_FR_VOLATILE_DBE_DETECTED", "GPU Mem watch no longer reports DCGM_FR_VOLATILE_DBE_DETECTED",
				"GPU", "7", "PCI", "0000:17:00.0", "GPU_UUID", uuid)), healthy),
			with(dcgm(nvEvent("GpuMemWatch", "DCGM_FR_VOLATILE_DBE_DETECTED", "GPU Mem watch no longer reports DCGM_FR_VOLATILE_DBE_DETECTED",
				"PCI", "0000:17:00", "GPU", uuid)), func(ev *datamodels.HealthEvent) {
				healthy(ev)
				ev.Metadata["gpu_index"] = "7"
			}), "PCI=0000:17:00,GPU=" + uuid},
		{"DCGM watch without the GPU's UUID keeps its index: nothing else tells the GPU",
			dcgm(nvEvent("GpuPcieWatch", "DCGM_FR_PCI_REPLAY_RATE", "replays", "GPU", "3", "PCI", "0000:2a:00.0")),
			dcgm(nvEvent("GpuPcieWatch", "DCGM_FR_PCI_REPLAY_RATE", "replays", "GPU", "3", "PCI", "0000:2a:00.0")),
			"GPU=3,PCI=0000:2a:00.0"},
		{"DCGM NVSwitch watch is left as it is",
			dcgm(nvEvent("GpuNvswitchFatalWatch", "DCGM_FR_NVSWITCH_FATAL_ERROR", "fatal", "NVSWITCH", "2")),
			dcgm(nvEvent("GpuNvswitchFatalWatch", "DCGM_FR_NVSWITCH_FATAL_ERROR", "fatal", "NVSWITCH", "2")), "NVSWITCH=2"},
		{"faultline's gpu check's event is left as it is",
			with(nvEvent("GpuMemWatch", "DCGM_FR_VOLATILE_DBE_DETECTED", dbe, "GPU", uuid, "PCI", "00000000:17:00.0"), func(ev *datamodels.HealthEvent) { ev.Agent = "faultline-agent" }),
			with(nvEvent("GpuMemWatch", "DCGM_FR_VOLATILE_DBE_DETECTED", dbe, "GPU", uuid, "PCI", "00000000:17:00.0"), func(ev *datamodels.HealthEvent) { ev.Agent = "faultline-agent" }),
			"GPU=" + uuid + ",PCI=00000000:17:00.0"},
		{"NVSentinel's NIC driver pattern names are left as sent",
			nvEvent("SysLogsNICDriverError", "cmd_exec_timeout", "mlx5_core 0000:0c:00.0: wait_func:1185:(pid 0): CREATE_CQ(0x400) timeout. Will cause a leak of a command resource", "NIC", "mlx5_0"),
			nvEvent("SysLogsNICDriverError", "cmd_exec_timeout", "mlx5_core 0000:0c:00.0: wait_func:1185:(pid 0): CREATE_CQ(0x400) timeout. Will cause a leak of a command resource", "NIC", "mlx5_0"),
			"NIC=mlx5_0"},
		{"a healthy event without entities (the monitor's reboot clear) is left as it is",
			nvEvent("SysLogsXIDError", "", "No Health Failures"),
			nvEvent("SysLogsXIDError", "", "No Health Failures"), ""},
		{"a faultline agent's Xid is left as it is",
			with(nvEvent("SysLogsXIDError", "XID-31", xid31, "PCI", "0000:03:00", "GPU", uuid), func(ev *datamodels.HealthEvent) { ev.Agent = "faultline-agent" }),
			with(nvEvent("SysLogsXIDError", "XID-31", xid31, "PCI", "0000:03:00", "GPU", uuid), func(ev *datamodels.HealthEvent) { ev.Agent = "faultline-agent" }),
			"PCI=0000:03:00,GPU=" + uuid},
		{"NVSentinel's NIC port state event, non-fatal: marked crossings-only (a link-down for the NIC rules)",
			nicEvent("InfiniBandStateCheck", false, "Port mlx5_0 port 1: state ACTIVE, phys_state LinkErrorRecovery", "NIC", "mlx5_0", "NICPort", "1"),
			with(nicEvent("InfiniBandStateCheck", false, "Port mlx5_0 port 1: state ACTIVE, phys_state LinkErrorRecovery", "NIC", "mlx5_0", "NICPort", "1"), func(ev *datamodels.HealthEvent) {
				ev.Metadata = map[string]string{events.MetaNICCrossingsOnly: "1"}
			}), "NIC=mlx5_0,NICPort=1"},
		{"NVSentinel's RoCE port DOWN: marked, its metadata kept",
			with(nicEvent("EthernetStateCheck", true, "RoCE port mlx5_2 port 1: state DOWN, phys_state Disabled, operstate down", "NIC", "mlx5_2", "NICPort", "1"), func(ev *datamodels.HealthEvent) {
				ev.Metadata = map[string]string{"operstate": "down"}
			}),
			with(nicEvent("EthernetStateCheck", true, "RoCE port mlx5_2 port 1: state DOWN, phys_state Disabled, operstate down", "NIC", "mlx5_2", "NICPort", "1"), func(ev *datamodels.HealthEvent) {
				ev.Metadata = map[string]string{"operstate": "down", events.MetaNICCrossingsOnly: "1"}
			}), "NIC=mlx5_2,NICPort=1"},
		{"a crossings-only mark sent as another value is set to 1",
			with(nicEvent("InfiniBandStateCheck", false, "Port mlx5_0 port 1: state INIT, phys_state LinkUp", "NIC", "mlx5_0", "NICPort", "1"), func(ev *datamodels.HealthEvent) {
				ev.Metadata = map[string]string{events.MetaNICCrossingsOnly: "0"}
			}),
			with(nicEvent("InfiniBandStateCheck", false, "Port mlx5_0 port 1: state INIT, phys_state LinkUp", "NIC", "mlx5_0", "NICPort", "1"), func(ev *datamodels.HealthEvent) {
				ev.Metadata = map[string]string{events.MetaNICCrossingsOnly: "1"}
			}), "NIC=mlx5_0,NICPort=1"},
		{"NVSentinel's device-level NIC event (no port) is left as it is",
			nicEvent("InfiniBandStateCheck", true, "NIC mlx5_3 disappeared from /sys/class/infiniband/ - hardware failure", "NIC", "mlx5_3"),
			nicEvent("InfiniBandStateCheck", true, "NIC mlx5_3 disappeared from /sys/class/infiniband/ - hardware failure", "NIC", "mlx5_3"),
			"NIC=mlx5_3"},
		{"a NIC port state event with no room for another key is left unmarked",
			with(nicEvent("InfiniBandStateCheck", false, "Port mlx5_0 port 1: state INIT, phys_state LinkUp", "NIC", "mlx5_0", "NICPort", "1"), fullMetadata),
			with(nicEvent("InfiniBandStateCheck", false, "Port mlx5_0 port 1: state INIT, phys_state LinkUp", "NIC", "mlx5_0", "NICPort", "1"), fullMetadata),
			"NIC=mlx5_0,NICPort=1"},
		{"another check is left as it is",
			nvEvent("GpuXidError", "31", "xid", "GPU", "0"),
			nvEvent("GpuXidError", "31", "xid", "GPU", "0"), "GPU=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := proto.Clone(tc.in).(*datamodels.HealthEvent)
			Normalize(got)
			if !proto.Equal(got, tc.want) {
				t.Fatalf("Normalize:\n got %s\nwant %s", protojson.Format(got), protojson.Format(tc.want))
			}
			if k := events.EntityKey(got); k != tc.entity {
				t.Errorf("entity key %q, want %q", k, tc.entity)
			}
			again := proto.Clone(got).(*datamodels.HealthEvent)
			if Normalize(again); !proto.Equal(again, got) {
				t.Errorf("not idempotent:\n once  %s\ntwice %s", protojson.Format(got), protojson.Format(again))
			}
		})
	}
}
