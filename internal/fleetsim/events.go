package fleetsim

import (
	"fmt"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// The events a node agent sends, for load scenarios (loadtest/fleet):
// each is what faultline-agent's check would report.

// GPUID is the UUID-like id of GPU g.
func GPUID(g int) string { return gpu(g) }

// Healthy is a check's periodic all-clear for GPU g (GpuThermalWatch).
func Healthy(node string, g int) *datamodels.HealthEvent {
	ev := event(node, "GPU", "GpuThermalWatch", false, "GPU temperature back in range",
		datamodels.RecommendedAction_NONE, nil, entity(events.EntityGPU, gpu(g)))
	ev.IsHealthy = true
	return ev
}

// Recovered is the all-clear of fault's check on the same entities: what
// its agent reports once the check passes again.
func Recovered(fault *datamodels.HealthEvent) *datamodels.HealthEvent {
	ev := event(fault.GetNodeName(), fault.GetComponentClass(), fault.GetCheckName(), false, fault.GetCheckName()+" passes again",
		datamodels.RecommendedAction_NONE, nil, fault.GetEntitiesImpacted()...)
	ev.IsHealthy = true
	return ev
}

// PortUp is an InfiniBand port's healthy state event.
func PortUp(node string, nic int) *datamodels.HealthEvent {
	n := fmt.Sprintf("mlx5_%d", nic)
	ev := event(node, "NIC", "InfiniBandStateCheck", false, "Port "+n+" port 1: state ACTIVE, phys_state LinkUp",
		datamodels.RecommendedAction_NONE, nil, entity(events.EntityNIC, n), entity(events.EntityNICPort, n+"/1"))
	ev.IsHealthy = true
	return ev
}

// PortDown is an InfiniBand port going down (fatal, REPLACE_VM: the node
// agent's report; the correlator decides flaps and drops).
func PortDown(node string, nic int) *datamodels.HealthEvent {
	n := fmt.Sprintf("mlx5_%d", nic)
	return event(node, "NIC", "InfiniBandStateCheck", true, "Port "+n+" port 1: state DOWN, phys_state Disabled",
		datamodels.RecommendedAction_REPLACE_VM, nil, entity(events.EntityNIC, n), entity(events.EntityNICPort, n+"/1"))
}

// LinkDowned is a link_downed counter increase on a port (not fatal).
func LinkDowned(node string, nic int) *datamodels.HealthEvent {
	n := fmt.Sprintf("mlx5_%d", nic)
	ev := event(node, "NIC", "InfiniBandDegradationCheck", false, "Port "+n+" port 1: link_downed +1",
		datamodels.RecommendedAction_NONE, []string{"link_downed"}, entity(events.EntityNIC, n), entity(events.EntityNICPort, n+"/1"))
	ev.Metadata = map[string]string{"delta": "1"}
	return ev
}

// Xid is an Xid error on GPU g; fatal for the codes that mean the GPU is
// lost (48, 79, 94, 95, 119), not for 13 or 31.
func Xid(node string, g, code int) *datamodels.HealthEvent {
	fatal := code == 48 || code == 79 || code == 94 || code == 95 || code == 119
	action := datamodels.RecommendedAction_NONE
	if fatal {
		action = datamodels.RecommendedAction_RESTART_BM
	}
	return event(node, "GPU", "SysLogsXIDError", fatal, fmt.Sprintf("NVRM: Xid (PCI:0000:%02x:00): %d", 0x18+g, code),
		action, []string{fmt.Sprintf("XID-%d", code)}, entity(events.EntityGPU, gpu(g)))
}

// ConformanceDrift is a node whose configuration fingerprint no longer
// matches its pool's (not fatal: an operator looks, nothing is cordoned).
func ConformanceDrift(node, what string) *datamodels.HealthEvent {
	return event(node, "Node", "NodeConformanceCheck", false, "conformance drift: "+what,
		datamodels.RecommendedAction_NONE, []string{"CONFORMANCE-DRIFT"})
}

// FabricUnhealthy is the fabric check's report that GPU g's NVLink fabric
// health is degraded (GPUFabricHealth FABRIC-HEALTH-UNHEALTHY, as
// agents/fabric reports it from nvidia-smi -q: not fatal, watched).
func FabricUnhealthy(node string, g int) *datamodels.HealthEvent {
	ev := event(node, "GPU", "GPUFabricHealth", false,
		fmt.Sprintf("GPU %s fabric health is degraded: summary Unhealthy, route unhealthy True (registration Completed/Success)", gpu(g)),
		datamodels.RecommendedAction_NONE, []string{"FABRIC-HEALTH-UNHEALTHY"}, entity(events.EntityGPU, gpu(g)))
	ev.Metadata = map[string]string{"degraded": "true"}
	return ev
}
