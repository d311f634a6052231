package correlate

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/nvsentinel"
)

// relayed is an event of NVSentinel's syslog-health-monitor as the relay
// (or the gateway's HealthEventOccurredV1) passes it on: its id derived
// from the event as sent, then normalised (nvsentinel.Normalize), then
// stamped with the cluster. ents are type, value pairs, as the monitor
// builds them (health-monitors/syslog-health-monitor/pkg/xid/xid_handler.go
// and pkg/sxid/sxid_handler.go in github.com/NVIDIA/NVSentinel).
func relayed(cluster, node, check string, at time.Duration, code string, ents ...string) *datamodels.HealthEvent {
	ev := &datamodels.HealthEvent{Version: 1, Agent: "syslog-health-monitor", ComponentClass: "GPU", CheckName: check,
		IsFatal: true, RecommendedAction: datamodels.RecommendedAction_RESTART_VM, ErrorCode: []string{code},
		Message:            "NVRM: Xid (PCI:0000:17:00): " + code + ", pid=91237, name=python3",
		GeneratedTimestamp: timestamppb.New(base.Add(at)), NodeName: node,
		ProcessingStrategy: datamodels.ProcessingStrategy_EXECUTE_REMEDIATION}
	for i := 0; i+1 < len(ents); i += 2 {
		ev.EntitiesImpacted = append(ev.EntitiesImpacted, &datamodels.Entity{EntityType: ents[i], EntityValue: ents[i+1]})
	}
	ev.Id = events.OccurrenceID(ev)
	nvsentinel.Normalize(ev)
	ev.Cluster = cluster
	return ev
}

// TestNVSentinelEventsCount: the Xid rules count NVSentinel's syslog
// monitor's events, relayed or sent to the gateway directly — its Xid
// "31" on PCI "0000:17:00" / GPU_UUID is the kmsg check's XID-31 on
// PCI=0000:17:00,GPU=…, and its SXid names the GPU by index and UUID —
// alone (an NVSentinel-only fleet) and beside the kmsg check's events (a
// fleet migrating from NVSentinel).
func TestNVSentinelEventsCount(t *testing.T) {
	s := server(t)
	const gpu, pci = "GPU-1", "0000:17:00" // xid()'s GPU
	h := time.Hour
	nvXid := func(c string, at time.Duration, code int, extra ...string) *datamodels.HealthEvent {
		return relayed(c, "n1", "SysLogsXIDError", at, fmt.Sprint(code), append([]string{"PCI", pci, "GPU_UUID", gpu}, extra...)...)
	}
	for _, tc := range []struct {
		name  string
		steps func(c string) [][]*datamodels.HealthEvent
		want  string
	}{
		{"two NVSentinel Xid 31s on one GPU within 24h", func(c string) [][]*datamodels.HealthEvent {
			return [][]*datamodels.HealthEvent{{nvXid(c, 0, 31)}, {nvXid(c, 3*h, 31)}}
		}, "RepeatedXID31OnSameGPU:fault"},
		{"an NVSentinel Xid 31 then the kmsg check's on the same GPU", func(c string) [][]*datamodels.HealthEvent {
			return [][]*datamodels.HealthEvent{{nvXid(c, 0, 31)}, {xid(c, "n1", 3*h, 31, false, 1)}}
		}, "RepeatedXID31OnSameGPU:fault"},
		{"NVSentinel's Xid 31 named by PCI alone (no UUID known yet), then with it", func(c string) [][]*datamodels.HealthEvent {
			return [][]*datamodels.HealthEvent{{relayed(c, "n1", "SysLogsXIDError", 0, "31", "PCI", "0000:17:00")}, {nvXid(c, 3*h, 31)}}
		}, "RepeatedXID31OnSameGPU:fault"},
		{"one NVSentinel Xid 31 is not a repeat", func(c string) [][]*datamodels.HealthEvent {
			return [][]*datamodels.HealthEvent{{nvXid(c, 0, 31)}}
		}, none},
		{"NVSentinel's SXid on the GPU's link (GPU index 1, its UUID) and the GPU's Xid 74: one incident", func(c string) [][]*datamodels.HealthEvent {
			sx := relayed(c, "n1", "SysLogsSXIDError", 0, "24007",
				"NVSWITCH", "0", "PCI", "0000:c3:00.0", "NVLINK", "28", "GPU", "1", "GPU_UUID", gpu)
			sx.ComponentClass = "NVSWITCH"
			return [][]*datamodels.HealthEvent{{sx, nvXid(c, 100*time.Millisecond, 74, "NVLINK", "14", "REG0", "0x00000000")}}
		}, ruleSXid + ":fault"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster("nvs")
			hs := newHarness(t, s, DefaultRules, nil)
			if d := describe(hs.batches(tc.steps(c))); d != tc.want {
				t.Fatalf("derived %q, want %q", d, tc.want)
			}
		})
	}
}
