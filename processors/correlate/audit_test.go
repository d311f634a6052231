package correlate

import (
	"testing"
	"time"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// runSteps runs steps (as TestRules does) on a fresh harness and cluster.
func runSteps(t *testing.T, hs *harness, steps []step) {
	t.Helper()
	for i, st := range steps {
		var got []*datamodels.HealthEvent
		if st.evs != nil || st.acts != nil {
			recs := records(t, st.evs)
			for _, a := range st.acts {
				recs = append(recs, actRecord(t, a))
			}
			got = hs.batch(recs...)
		} else {
			got = hs.sweep(st.sweep)
		}
		if d := describe(got); d != st.want {
			t.Fatalf("step %d: derived %q, want %q", i, d, st.want)
		}
	}
}

// nicDegraded is the NIC agent's non-fatal unhealthy state event: the port
// left ACTIVE/LinkUp for a state that is not DOWN (LinkErrorRecovery, INIT).
func nicDegraded(cluster, node string, at time.Duration) *datamodels.HealthEvent {
	ev := nicState(cluster, node, at, false)
	ev.IsFatal, ev.RecommendedAction = false, datamodels.RecommendedAction_NONE
	ev.Metadata = map[string]string{"state": "4: ACTIVE", "phys_state": "6: LinkErrorRecovery"}
	ev.Message = "Port mlx5_0 port 1: state ACTIVE, phys_state LinkErrorRecovery"
	return ev
}

// TestFlapCountsLinkDowns: RepeatedNICLinkFlap counts link-downs — the
// state check's unhealthy reports and the link_downed increases — not
// the NIC agent's escalation: a port going ACTIVE → LinkErrorRecovery →
// DOWN is reported as two unhealthy events (non-fatal, then fatal) and
// went down once.
func TestFlapCountsLinkDowns(t *testing.T) {
	s := server(t)
	m, sec := time.Minute, time.Second
	t.Run("an escalation within unhealthy is not another down", func(t *testing.T) {
		c := newCluster("flapx")
		hs := newHarness(t, s, DefaultRules, nil)
		hs.cluster = c
		runSteps(t, hs, []step{
			// one link-down: error recovery, then DOWN (counter +1), back up
			{evs: evs(nicDegraded(c, "n1", 0), nicState(c, "n1", 1*sec, false), linkDowned(c, "n1", 2*sec, 1)), want: none},
			{evs: evs(nicState(c, "n1", 30*sec, true)), want: none},
			// a second link-down
			{evs: evs(nicState(c, "n1", 2*m, false), linkDowned(c, "n1", 2*m+1*sec, 1)), want: none},
			{evs: evs(nicState(c, "n1", 2*m+30*sec, true)), want: none},
			// the third is a flap
			{evs: evs(nicState(c, "n1", 4*m, false)), want: "RepeatedNICLinkFlap:fault"},
		})
	})
}

// TestXidGPUKnownByPCIOnly: the kmsg agent names a GPU "PCI=…" alone until
// it knows the GPU's UUID (the driver's NVRM line or the topology metadata)
// and "PCI=…,GPU=GPU-…" afterwards; both are the same GPU, and its repeated
// Xids count together. A GPU at the same PCI address with another UUID (a
// replaced board) is another GPU.
func TestXidGPUKnownByPCIOnly(t *testing.T) {
	s := server(t)
	m, h := time.Minute, time.Hour
	pciOnly := func(ev *datamodels.HealthEvent) *datamodels.HealthEvent {
		ev.EntitiesImpacted = ev.EntitiesImpacted[:1]
		return ev
	}
	otherBoard := func(ev *datamodels.HealthEvent) *datamodels.HealthEvent {
		ev.EntitiesImpacted[1].EntityValue = "GPU-2"
		return ev
	}
	t.Run("xid 31 count", func(t *testing.T) {
		c := newCluster("xidpci")
		hs := newHarness(t, s, DefaultRules, nil)
		hs.cluster = c
		runSteps(t, hs, []step{
			{evs: evs(pciOnly(xid(c, "n1", 0, 31, false, 1))), want: none},
			{evs: evs(xid(c, "n1", 1*h, 31, false, 1)), want: "RepeatedXID31OnSameGPU:fault"},
			{evs: evs(xid(c, "n2", 0, 31, false, 1)), want: none},
			{evs: evs(otherBoard(xid(c, "n2", 1*h, 31, false, 1))), want: none},
		})
	})
	t.Run("xid bursts", func(t *testing.T) {
		c := newCluster("xidpci")
		hs := newHarness(t, s, DefaultRules, nil)
		hs.cluster = c
		runSteps(t, hs, []step{
			{evs: evs(pciOnly(xid(c, "n1", 0, 48, true, 1))), want: none},
			{evs: evs(pciOnly(xid(c, "n1", 10*m, 48, true, 1))), want: none},
			{evs: evs(xid(c, "n1", 20*m, 48, true, 1)), want: none},
			{evs: evs(xid(c, "n1", 30*m, 48, true, 1)), want: none},
			{evs: evs(xid(c, "n1", 40*m, 48, true, 1)), want: "RepeatedXIDOnSameGPU:fault"},
		})
	})
}
