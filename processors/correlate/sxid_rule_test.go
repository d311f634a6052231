package correlate

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// sxidEv is an NVSwitch SXid event naming the GPU on its access port, as
// the kmsg check (SysLogsSXIDError) or the fabric check's FM log reader
// (FabricManagerNVSwitchError) sends it; gpu "" leaves the GPU entity out
// (gpuPCI then names it through metadata gpu_pci).
func sxidEv(cluster, node, check string, at time.Duration, code int, fatal bool, gpu, gpuPCI string) *datamodels.HealthEvent {
	ents := []*datamodels.Entity{{EntityType: "NVSwitch", EntityValue: "0000:07:00.0"}}
	if gpu != "" {
		ents = append(ents, &datamodels.Entity{EntityType: "GPU", EntityValue: gpu})
	}
	md := map[string]string{"port": "46", "port_type": "access"}
	if gpuPCI != "" {
		md["gpu_pci"] = gpuPCI
	}
	action := datamodels.RecommendedAction_NONE
	if fatal {
		action = datamodels.RecommendedAction_COMPONENT_RESET
	}
	return &datamodels.HealthEvent{Version: 1, Agent: "faultline-agent", ComponentClass: "NVSwitch", CheckName: check,
		IsFatal: fatal, ErrorCode: []string{fmt.Sprintf("SXID-%d", code)}, EntitiesImpacted: ents, Metadata: md,
		RecommendedAction: action, GeneratedTimestamp: timestamppb.New(base.Add(at)), NodeName: node, Cluster: cluster}
}

// xidOn is a kmsg Xid event on a GPU (uuid "" when the driver had not
// printed it: the event then names the GPU by PCI only).
func xidOn(cluster, node string, at time.Duration, code int, uuid, pci string) *datamodels.HealthEvent {
	ents := []*datamodels.Entity{{EntityType: "PCI", EntityValue: pci}}
	if uuid != "" {
		ents = append(ents, &datamodels.Entity{EntityType: "GPU", EntityValue: uuid})
	}
	return &datamodels.HealthEvent{Version: 1, Agent: "faultline-agent", ComponentClass: "GPU", CheckName: "SysLogsXIDError",
		IsFatal: true, ErrorCode: []string{fmt.Sprintf("XID-%d", code)}, EntitiesImpacted: ents,
		Metadata: map[string]string{"count": "1"}, RecommendedAction: datamodels.RecommendedAction_COMPONENT_RESET,
		GeneratedTimestamp: timestamppb.New(base.Add(at)), NodeName: node, Cluster: cluster}
}

const ruleSXid = "NVSwitchSXidGPUXid"

// only keeps the derived events of one rule.
func only(rule string, d []*datamodels.HealthEvent) []*datamodels.HealthEvent {
	var out []*datamodels.HealthEvent
	for _, ev := range d {
		if ev.GetDerivedBy() == rule {
			out = append(out, ev)
		}
	}
	return out
}

// TestSXidXidIncident runs the NVSwitchSXidGPUXid rule against a real
// ClickHouse: an SXid and the Xid 74/45 it causes on the GPU of its access
// port are one verdict whose causes are both; an Xid alone, an SXid on
// another GPU, an SXid that causes no Xid, or one out of the window are
// not; an SXid read later from the FM log is joined by the sweep; the
// verdict stands once and recovers.
func TestSXidXidIncident(t *testing.T) {
	s := server(t)
	const (
		gpu0, pci0 = "GPU-257d8671-d0e6-d1a7-dea9-952249a668fa", "0000:1b:00"
		gpu1, pci1 = "GPU-cc7d93b3-73f8-5028-287a-9e617839550e", "0000:43:00"
	)
	m, sec := time.Minute, time.Second
	type step struct {
		evs   []*datamodels.HealthEvent
		sweep time.Duration
		want  string
		// causes: indexes (into all events sent so far) of the verdict's causes
		causes []int
	}
	cases := []struct {
		name  string
		steps func(c string) []step
	}{
		{"kernel-log order: SXid then Xid 74 and 45: one verdict, at the Xid 74, caused by the SXid and the Xid", func(c string) []step {
			return []step{{evs: []*datamodels.HealthEvent{
				sxidEv(c, "n1", "SysLogsSXIDError", 0, 20034, true, gpu0, pci0),
				xidOn(c, "n1", 100*time.Millisecond, 74, gpu0, pci0),
				xidOn(c, "n1", 2*sec, 45, gpu0, pci0),
			}, want: ruleSXid + ":fault", causes: []int{0, 1}}}
		}},
		{"an Xid alone is not an SXid incident", func(c string) []step {
			return []step{{evs: []*datamodels.HealthEvent{xidOn(c, "n1", 0, 74, gpu0, pci0), xidOn(c, "n1", sec, 45, gpu0, pci0)}, want: none}}
		}},
		{"an SXid on another GPU's port does not join", func(c string) []step {
			return []step{{evs: []*datamodels.HealthEvent{sxidEv(c, "n1", "SysLogsSXIDError", 0, 20034, true, gpu1, pci1), xidOn(c, "n1", sec, 74, gpu0, pci0)}, want: none}}
		}},
		{"an SXid on another node does not join", func(c string) []step {
			return []step{{evs: []*datamodels.HealthEvent{sxidEv(c, "n2", "SysLogsSXIDError", 0, 20034, true, gpu0, pci0), xidOn(c, "n1", sec, 74, gpu0, pci0)}, want: none}}
		}},
		{"a non-fatal SXid joins only if it causes Xid 45 (12028, not 20001)", func(c string) []step {
			return []step{
				{evs: []*datamodels.HealthEvent{sxidEv(c, "n1", "SysLogsSXIDError", 0, 20001, false, gpu0, pci0), xidOn(c, "n1", sec, 45, gpu0, pci0)}, want: none},
				{evs: []*datamodels.HealthEvent{sxidEv(c, "n1", "SysLogsSXIDError", 10*sec, 12028, false, gpu0, pci0), xidOn(c, "n1", 11*sec, 45, gpu0, pci0)},
					want: ruleSXid + ":fault", causes: []int{1, 2, 3}},
			}
		}},
		{"window edge: an SXid exactly 5m before the Xid does not count", func(c string) []step {
			return []step{
				{evs: []*datamodels.HealthEvent{sxidEv(c, "n1", "SysLogsSXIDError", 0, 20034, true, gpu0, pci0)}, want: none},
				{evs: []*datamodels.HealthEvent{xidOn(c, "n1", 5*m, 74, gpu0, pci0)}, want: none},
				{evs: []*datamodels.HealthEvent{xidOn(c, "n1", 5*m-1*sec, 45, gpu0, pci0)}, want: ruleSXid + ":fault", causes: []int{0, 2}},
			}
		}},
		{"FM-log SXid read after the Xid: the sweep joins them", func(c string) []step {
			return []step{
				{evs: []*datamodels.HealthEvent{xidOn(c, "n1", 0, 74, gpu0, pci0), xidOn(c, "n1", sec, 45, gpu0, pci0)}, want: none},
				// the fabric check reads the FM log on its next poll
				{evs: []*datamodels.HealthEvent{sxidEv(c, "n1", "FabricManagerNVSwitchError", -1*sec, 20034, true, gpu0, pci0)}, want: none},
				{sweep: 30 * sec, want: ruleSXid + ":fault", causes: []int{0, 1, 2}},
				// the verdict stands: more Xids of the incident add nothing
				{evs: []*datamodels.HealthEvent{xidOn(c, "n1", 40*sec, 45, gpu0, pci0)}, want: none},
				{sweep: 5*m + 39*sec, want: none},
				// quiet for the window and the stabilization: recovered
				{sweep: 15*m + 41*sec, want: ruleSXid + ":recovery"},
			}
		}},
		{"a GPU known by PCI only: the SXid's gpu_pci names it", func(c string) []step {
			return []step{{evs: []*datamodels.HealthEvent{
				sxidEv(c, "n1", "FabricManagerNVSwitchError", 0, 12020, true, "", pci0),
				xidOn(c, "n1", sec, 74, "", pci0),
			}, want: ruleSXid + ":fault", causes: []int{0, 1}}}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster("sxid")
			hs := newHarness(t, s, DefaultRules, nil)
			hs.cluster = c
			var sent []*datamodels.HealthEvent
			for i, st := range tc.steps(c) {
				var got []*datamodels.HealthEvent
				if st.evs != nil {
					sent = append(sent, st.evs...)
					got = hs.batch(records(t, st.evs)...)
				} else {
					got = hs.sweep(st.sweep)
				}
				got = only(ruleSXid, got)
				if d := describe(got); d != st.want {
					t.Fatalf("step %d: derived %q, want %q", i, d, st.want)
				}
				if st.causes == nil {
					continue
				}
				var want []string
				for _, j := range st.causes {
					want = append(want, sent[j].GetId())
				}
				slices.Sort(want)
				if !slices.Equal(got[0].GetCauseIds(), want) {
					t.Fatalf("step %d: causes %v, want %v", i, got[0].GetCauseIds(), want)
				}
				if got[0].GetRecommendedAction() != datamodels.RecommendedAction_COMPONENT_RESET || !got[0].GetIsFatal() {
					t.Errorf("verdict action %s fatal %v", got[0].GetRecommendedAction(), got[0].GetIsFatal())
				}
				if ents := got[0].GetEntitiesImpacted(); ents[len(ents)-1].GetEntityValue() != gpu0 && ents[0].GetEntityValue() != pci0 {
					t.Errorf("verdict entities %v", ents)
				}
			}
		})
	}
}
