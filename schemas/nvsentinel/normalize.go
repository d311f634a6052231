package nvsentinel

import (
	"regexp"
	"strings"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/validate"
)

// The checks NVSentinel's syslog-health-monitor reports, by the names
// faultline's kmsg check reports the same facts under.
const (
	checkXID       = "SysLogsXIDError"
	checkSXID      = "SysLogsSXIDError"
	checkFallenOff = "SysLogsGPUFallenOff"
)

// The checks of NVSentinel's NIC health monitor (nic-health-monitor)
// reporting a port's link state, under the names faultline's nic check
// (agents/nic) uses too.
const (
	checkIBState  = "InfiniBandStateCheck"
	checkEthState = "EthernetStateCheck"
)

// MetaErrorCode is the metadata in which Normalize keeps an event's error
// codes as NVSentinel sent them (comma-separated), when it rewrote them.
const MetaErrorCode = "nvsentinel_error_code"

var (
	// xidCode is an Xid as NVSentinel's Xid parsers write it
	// (DecodedXIDStr): "31", an NVL5 Xid with its subcode
	// "145.RLW_REMAP" (xid/parser/csv.go), or the analyser sidecar's
	// "Xid 79" (xid/xid_handler_test.go).
	xidCode = regexp.MustCompile(`^(?:Xid )?([0-9]+)(?:\.[0-9A-Za-z_]+)?$`)
	// number is an SXid as NVSentinel's SXid handler writes it.
	number = regexp.MustCompile(`^[0-9]+$`)
	// gpuWatch is the checkName of a DCGM health watch, as NVSentinel's
	// gpu-health-monitor and faultline's gpu check both name it
	// (DCGM_HEALTH_WATCH_MEM → GpuMemWatch).
	gpuWatch = regexp.MustCompile(`^Gpu[A-Za-z]+Watch$`)
)

// Normalize gives an event of NVIDIA NVSentinel's syslog-health-monitor
// faultline's vocabulary where it reports the same fact as faultline's
// kmsg check (agents/kmsg's event conventions), so that the correlation
// rules, which match "XID-N", "SXID-N" and a GPU's PCI address or UUID,
// count it. Both doors of NVSentinel's events call it: the agent's relay
// (agents/relay) and the gateway's HealthEventOccurredV1 — after giving
// the event its id, which is thus derived from the event as the monitor
// sent it (a resend gets the same id either way: Normalize is a function
// of the event).
//
// What the monitor sends (github.com/NVIDIA/NVSentinel,
// health-monitors/syslog-health-monitor/pkg/…) and what it becomes:
//
//   - SysLogsXIDError (xid/xid_handler.go, xid/parser/csv.go): errorCode
//     the bare number ("31"), an NVL5 Xid's "145.RLW_REMAP" or the
//     sidecar's "Xid 79" → "XID-31", "XID-145", "XID-79"; entity PCI
//     ("0000:03:00", the line's address cut at the function, case as
//     printed) → NormalizePCI's "0000:03:00"; GPU_UUID (GPU in older
//     releases; a GPU index → metadata gpu_index) → GPU; the extra entities of Xid
//     13 (GPC, TPC, SM) and 74 (NVLINK, REG0…REG6) → metadata (lower-case
//     type), so the event's entity key is the GPU's, as the kmsg check's.
//   - SysLogsSXIDError (sxid/sxid_handler.go): errorCode "20034" →
//     "SXID-20034"; entities NVSWITCH (switch index), PCI (the switch's
//     address), NVLINK, GPU (the GPU's index, not its UUID) and GPU_UUID →
//     NVSwitch=<switch PCI with function>, GPU=<UUID>, and metadata
//     pci_bus_id, link, gpu_uuid, gpu_index, nvswitch_index.
//   - SysLogsGPUFallenOff (gpufallen/gpufallen_handler.go): errorCode
//     "GPU_FALLEN_OFF_BUS" → "GPU-FALLEN-OFF-BUS"; PCI normalised; PCI_ID
//     → metadata pci_id.
//
// And of NVSentinel's NIC health monitor (its link-state design: one event
// per port per healthy <-> unhealthy crossing, entities NIC and NICPort,
// none for an unhealthy -> unhealthy change such as LinkErrorRecovery ->
// DOWN):
//
//   - InfiniBandStateCheck, EthernetStateCheck naming a NICPort → metadata
//     events.MetaNICCrossingsOnly "1", so the NIC rules take its non-fatal
//     unhealthy event (LinkErrorRecovery, INIT, ARMED) for a link-down:
//     nothing follows it when the port then goes DOWN. faultline's nic
//     check, which reports that escalation, sends its events unmarked (not
//     through here). Left unmarked where the event has no room for one
//     more key (validate.MaxMetadata): refused, the batch would be lost.
//
// And of NVSentinel's gpu-health-monitor (health-monitors/gpu-health-monitor/
// gpu_health_monitor/platform_connector/platform_connector.py,
// health_event_occurred), whose DCGM health watches have faultline's gpu
// check's checkNames (GpuMemWatch, …) and errorCodes (DCGM_FR_…) already:
//
//   - Gpu<Watch>Watch naming its GPU as GPU=<index>, PCI and GPU_UUID (a
//     fault and its clear alike) → GPU=<UUID>, the PCI normalised, metadata
//     gpu_index: the drain scopes a COMPONENT_RESET (a volatile DBE's) to the
//     pods of its GPU entities' UUIDs and the remediation's GPUReset selects
//     them — an index selects nothing. Without a GPU_UUID (the monitor's
//     metadata lacked it) the event is left as it is: its index is all that
//     tells its GPU apart, and an entity-less healthy event would clear the
//     check on every GPU. The NVSwitch watches' events (NVSWITCH=<index>,
//     STORE_ONLY) are left as they are.
//
// Not rewritten, as no faultline rule reads them: NVSentinel's
// SysLogsNICDriverError codes (syslog-health-monitor pkg/nicdriver/config.go:
// the pattern's name, "cmd_exec_timeout", "netdev_watchdog", …, where the kmsg
// check writes MLX5-CMD-TIMEOUT, MLX5-TX-TIMEOUT, …) stay as a migrated
// fleet's quarantine rules match them, and GpuDcgmConnectivityFailure's
// "DCGM_CONNECTIVITY_ERROR".
//
// Rewritten codes are kept as sent in metadata MetaErrorCode. An event of
// any other check, or already in faultline's vocabulary (a faultline
// agent's), is left as it is. The monitor's generatedTimestamp is the time
// it read the journal, not the kernel line's (time.Now() in each handler;
// the journal's MESSAGE it parses has no time), so it is kept.
func Normalize(ev *datamodels.HealthEvent) {
	if ev == nil {
		return
	}
	switch ev.GetCheckName() {
	case checkXID:
		if renameCodes(ev, func(c string) string {
			if m := xidCode.FindStringSubmatch(c); m != nil {
				return "XID-" + m[1]
			}
			return c
		}) || hasNVSentinelGPUEntities(ev) {
			gpuEntities(ev)
		}
	case checkSXID:
		renameCodes(ev, func(c string) string {
			if number.MatchString(c) {
				return "SXID-" + c
			}
			return c
		})
		sxidEntities(ev)
	case checkFallenOff:
		if renameCodes(ev, func(c string) string {
			if c == "GPU_FALLEN_OFF_BUS" {
				return "GPU-FALLEN-OFF-BUS"
			}
			return c
		}) || hasNVSentinelGPUEntities(ev) {
			gpuEntities(ev)
		}
	case checkIBState, checkEthState:
		if _, ok := ev.Metadata[events.MetaNICCrossingsOnly]; hasEntity(ev, events.EntityNICPort) && (ok || len(ev.Metadata) < validate.MaxMetadata) {
			if ev.Metadata == nil {
				ev.Metadata = map[string]string{}
			}
			ev.Metadata[events.MetaNICCrossingsOnly] = "1"
		}
	default:
		if gpuWatch.MatchString(ev.GetCheckName()) && hasEntity(ev, "GPU_UUID") {
			gpuEntities(ev)
		}
	}
}

// hasEntity reports whether the event names an entity of type typ.
func hasEntity(ev *datamodels.HealthEvent, typ string) bool {
	for _, e := range ev.GetEntitiesImpacted() {
		if e.GetEntityType() == typ {
			return true
		}
	}
	return false
}

// renameCodes rewrites the event's error codes with rename and reports
// whether any changed (the codes as sent then go to MetaErrorCode).
func renameCodes(ev *datamodels.HealthEvent, rename func(string) string) bool {
	changed := false
	out := make([]string, len(ev.GetErrorCode()))
	for i, c := range ev.GetErrorCode() {
		out[i] = rename(c)
		changed = changed || out[i] != c
	}
	if !changed {
		return false
	}
	setMeta(ev, MetaErrorCode, strings.Join(ev.GetErrorCode(), ","))
	ev.ErrorCode = out
	return true
}

// hasNVSentinelGPUEntities reports whether a GPU event names its GPU as
// NVSentinel does (a GPU_UUID entity, a PCI address not in NormalizePCI's
// form, or an entity faultline does not use).
func hasNVSentinelGPUEntities(ev *datamodels.HealthEvent) bool {
	for _, e := range ev.GetEntitiesImpacted() {
		switch e.GetEntityType() {
		case events.EntityGPU:
			if number.MatchString(e.GetEntityValue()) {
				return true
			}
		case events.EntityPCI:
			if events.NormalizePCI(e.GetEntityValue(), false) != e.GetEntityValue() {
				return true
			}
		default:
			return true
		}
	}
	return false
}

// gpuEntities names an Xid's or fallen-off GPU as the kmsg check does:
// PCI=<dddd:bb:dd>, GPU=<UUID>; a GPU index and other entities go to
// metadata.
func gpuEntities(ev *datamodels.HealthEvent) {
	out := make([]*datamodels.Entity, 0, 2)
	for _, e := range ev.GetEntitiesImpacted() {
		typ, val := e.GetEntityType(), e.GetEntityValue()
		switch typ {
		case "": // left for the validator to name
			out = append(out, e)
		case events.EntityPCI:
			out = append(out, &datamodels.Entity{EntityType: events.EntityPCI, EntityValue: events.NormalizePCI(val, false)})
		case events.EntityGPU, "GPU_UUID":
			if number.MatchString(val) { // an index, not the UUID
				setMeta(ev, "gpu_index", val)
				continue
			}
			out = append(out, &datamodels.Entity{EntityType: events.EntityGPU, EntityValue: val})
		default:
			setMeta(ev, strings.ToLower(typ), val)
		}
	}
	ev.EntitiesImpacted = out
}

// sxidEntities names an SXid's NVSwitch and GPU as the kmsg check does:
// NVSwitch=<switch PCI>, GPU=<UUID>, the rest in metadata. An event
// without NVSentinel's PCI or NVSWITCH entity is left as it is.
func sxidEntities(ev *datamodels.HealthEvent) {
	var pci, uuid string
	nvs := false
	for _, e := range ev.GetEntitiesImpacted() {
		switch e.GetEntityType() {
		case events.EntityPCI:
			pci = e.GetEntityValue()
			nvs = true
		case "NVSWITCH":
			setMeta(ev, "nvswitch_index", e.GetEntityValue())
			nvs = true
		case "NVLINK":
			setMeta(ev, "link", e.GetEntityValue())
		case "GPU_UUID":
			uuid = e.GetEntityValue()
		case events.EntityGPU:
			if number.MatchString(e.GetEntityValue()) {
				setMeta(ev, "gpu_index", e.GetEntityValue())
			} else {
				uuid = e.GetEntityValue()
			}
		}
	}
	if !nvs {
		return
	}
	var out []*datamodels.Entity
	if pci != "" {
		pci = events.NormalizePCI(pci, true)
		setMeta(ev, "pci_bus_id", pci)
		out = append(out, &datamodels.Entity{EntityType: events.EntityNVSwitch, EntityValue: pci})
	}
	if uuid != "" {
		setMeta(ev, "gpu_uuid", uuid)
		out = append(out, &datamodels.Entity{EntityType: events.EntityGPU, EntityValue: uuid})
	}
	ev.EntitiesImpacted = out
}

// setMeta sets metadata k to v unless the event already has k.
func setMeta(ev *datamodels.HealthEvent, k, v string) {
	if ev.Metadata == nil {
		ev.Metadata = map[string]string{}
	}
	if _, ok := ev.Metadata[k]; !ok {
		ev.Metadata[k] = v
	}
}
