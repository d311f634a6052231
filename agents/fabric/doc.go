// Package fabric is the node agent's NVIDIA Fabric Manager check: what the
// Fabric Manager User Guide (https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/)
// tells a health monitor to watch on an NVSwitch system.
//
// Each poll collects a Snapshot of the node — the nvidia-fabricmanager
// unit (and its journal while it is down, or always where it is FM's log:
// LOG_USE_SYSLOG=1, LOG_FILE_NAME empty), fabricmanager.cfg, the FM log,
// the NVLSM log and process (HGX B200), nvidia-smi -q, nvidia-smi nvlink
// -s / -R, nvswitch-audit, fmpm -l (Shared NVSwitch and vGPU modes), the
// driver's GPU information files, the exclude lists of modprobe.d and the
// kernel command line, the PCI bus, and NVSwitch telemetry from
// dcgm-exporter (HGX B200) — and an Evaluator turns it into HealthEvents.
// `faultline-agent fabric parse` feeds the same Evaluator from files.
// nvidia-smi's exit 14 (infoROM corrupted: a warning after its whole
// output, topology.SMIWarningExit) with output is read as a success.
//
// The FM log's message classes, the partition return codes (Table 18) and
// the high-availability tables are data (fm_catalog.json); the SXid
// tables are agents/kmsg's (sxid_catalog.json).
//
// Events (agent "faultline-agent"):
//
//	checkName                   errorCode (examples)                      fatal  action
//	FabricManagerService        FM-SERVICE-FAILED|INACTIVE|NOT-INSTALLED   yes    RESTART_BM (service VM: RESTART_VM)
//	FabricManagerConfig         FM-CONFIG-NO-NVSWITCH (NV_WARN_NOTHING_TO_DO on a host without NVSwitch), FM-CONFIG-INVALID-VALUE,
//	                            FM-CONFIG-INVALID-ITEM, FM-CONFIG-HA-MODE-UNSUPPORTED, EXCLUDE-PARAMETER-DEPRECATED   no/yes
//	FabricManagerInit           FM-INIT-FAILURE, FM-INIT-NO-NVSWITCH, FM-INIT-DRIVER-MISMATCH, FM-INIT-NVSWITCH-FAILURE,
//	                            FM-INIT-GPU-FAILURE, FM-INIT-MIG-ENABLED, FM-RESTART-ABORTED          yes    Table 17 per fabric mode
//	FabricManagerNVLinkTraining FM-INIT-ACCESS-LINK-TRAINING-FAILURE, FM-INIT-TRUNK-LINK-TRAINING-FAILURE  yes  Table 17
//	FabricManagerHAMode         FM-HA-* (what FM does under ACCESS/TRUNK/NVSWITCH_FAILURE_MODE, per platform)  per cell
//	FabricManagerNVSwitchError  SXID-N (FM log), port type access/trunk, GPU of the access port     per table  COMPONENT_RESET (access) / RESTART_BM (trunk, always fatal, 10003)
//	FabricManagerPartition      FM-PARTITION-<FM_ST code>, FM-PARTITION-DEGRADED|REMOVED|NONE      per Table 18
//	FabricManagerRuntime        FM-MULTICAST-TEAM-GPU-UNKNOWN                                      no     NONE
//	GPUFabricState              FABRIC-PROBE-FAILURE, FABRIC-PROBE-TIMEOUT                         yes    RESTART_BM
//	GPUFabricHealth             FABRIC-HEALTH-UNHEALTHY, FABRIC-BANDWIDTH-DEGRADED, FABRIC-INCORRECT-CONFIGURATION,
//	                            FABRIC-RECOVERY-IN-PROGRESS (metadata degraded=true)               no
//	GPUNVLinkState              NVLINK-INACTIVE (A100, not in MIG mode)                            no     COMPONENT_RESET
//	GPUExclusion                GPU-EXCLUSION-CANDIDATE, GPU-EXCLUDED, GPU-EXCLUDE-LISTED-NOT-PRESENT, GPU-EXCLUDE-PENDING-REBOOT
//	NVSwitchExclusion           NVSWITCH-EXCLUSION-CANDIDATE, NVSWITCH-EXCLUDED, NVSWITCH-EXCLUDE-LISTED-NOT-PRESENT
//	NVSwitchReachability        NVSWITCH-ROUTING-UNREACHABLE|DEGRADED|ISOLATION-BREACH (nvswitch-audit)
//	NVLSMService, NVLSMLog      NVLSM-NOT-RUNNING, NVLSM-IPC-FAILURE, NVLSM-FATAL, NVLSM-ERROR
//	NVSwitchTelemetry           NVSWITCH-LINK-DOWN, NVSWITCH-RESET-REQUIRED, NVSWITCH-THERMAL-SLOWDOWN, NVSWITCH-LINK-*-ERRORS
//
// Conditions (service, GPU fabric state, exclusions, reachability, ...)
// are reported when they turn bad or change, and with an isHealthy event
// when they clear; FM initialization errors of the log stand until FM logs
// a successful configuration again; other log lines are occurrences.
// agents/README.md has the full table and the cases the node cannot see.
package fabric
