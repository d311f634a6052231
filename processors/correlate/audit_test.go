package correlate

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

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
// It carries no crossings-only mark (events.MetaNICCrossingsOnly): the
// agent reports an escalation to DOWN as an event of its own.
func nicDegraded(cluster, node string, at time.Duration) *datamodels.HealthEvent {
	ev := nicState(cluster, node, at, false)
	ev.IsFatal, ev.RecommendedAction = false, datamodels.RecommendedAction_NONE
	ev.Metadata = map[string]string{"state": "4: ACTIVE", "phys_state": "6: LinkErrorRecovery"}
	ev.Message = "Port mlx5_0 port 1: state ACTIVE, phys_state LinkErrorRecovery"
	return ev
}

// TestFlapCountsLinkDowns: RepeatedNICLinkFlap counts link-downs — a
// port's healthy → unhealthy transitions and the link_downed increases —
// not every unhealthy report: unhealthy events with no healthy one between
// are one down. The NIC agent's escalation (ACTIVE → LinkErrorRecovery →
// DOWN, two unhealthy events, non-fatal then fatal), its DOWN reported
// again (it restarted between spooling the event and saving its state: a
// new id and time) and NVSentinel's NIC monitor's report of the same DOWN
// beside the agent's each went down once.
func TestFlapCountsLinkDowns(t *testing.T) {
	s := server(t)
	m, sec, ms := time.Minute, time.Second, time.Millisecond
	// again is ev reported a second time under its own id, shift later.
	again := func(ev *datamodels.HealthEvent, shift time.Duration) *datamodels.HealthEvent {
		c := proto.Clone(ev).(*datamodels.HealthEvent)
		c.Id = ""
		c.GeneratedTimestamp = timestamppb.New(ev.GetGeneratedTimestamp().AsTime().Add(shift))
		return c
	}
	// twoSources is a flap at at as faultline's nic check and NVSentinel's
	// NIC monitor (polling 400ms later) both report it: their DOWNs, then
	// their UPs 20s later.
	twoSources := func(c string, at time.Duration) []*datamodels.HealthEvent {
		d, u := nicState(c, "n1", at, false), nicState(c, "n1", at+20*sec, true)
		return evs(d, again(d, 400*ms), u, again(u, 400*ms))
	}
	for _, tc := range []struct {
		name  string
		steps func(c string) []step
	}{
		{"an escalation within unhealthy is not another down", func(c string) []step {
			return []step{
				// one link-down: error recovery, then DOWN (counter +1), back up
				{evs: evs(nicDegraded(c, "n1", 0), nicState(c, "n1", 1*sec, false), linkDowned(c, "n1", 2*sec, 1)), want: none},
				{evs: evs(nicState(c, "n1", 30*sec, true)), want: none},
				// a second link-down
				{evs: evs(nicState(c, "n1", 2*m, false), linkDowned(c, "n1", 2*m+1*sec, 1)), want: none},
				{evs: evs(nicState(c, "n1", 2*m+30*sec, true)), want: none},
				// the third is a flap
				{evs: evs(nicState(c, "n1", 4*m, false)), want: "RepeatedNICLinkFlap:fault"},
			}
		}},
		{"a DOWN reported again before an UP is one down", func(c string) []step {
			d := nicState(c, "n1", 0, false)
			return []step{
				{evs: evs(d), want: none},
				// the agent restarted before saving its state: the DOWN again
				{evs: evs(again(d, 5*sec)), want: none},
				{evs: evs(nicState(c, "n1", 30*sec, true)), want: none},
				{evs: evs(nicState(c, "n1", 2*m, false)), want: none},
				{evs: evs(nicState(c, "n1", 2*m+30*sec, true)), want: none},
				{evs: evs(nicState(c, "n1", 4*m, false)), want: "RepeatedNICLinkFlap:fault"},
			}
		}},
		{"two sources' DOWNs for one flap are one down", func(c string) []step {
			return []step{
				{evs: twoSources(c, 0), want: none},
				{evs: twoSources(c, 2*m), want: none},
				{evs: twoSources(c, 4*m), want: "RepeatedNICLinkFlap:fault"},
			}
		}},
		{"two sources' DOWNs in separate batches are one down", func(c string) []step {
			var out []step
			for i, at := range []time.Duration{0, 2 * m, 4 * m} {
				f := twoSources(c, at)
				want := none
				if i == 2 {
					want = "RepeatedNICLinkFlap:fault"
				}
				out = append(out, step{evs: f[:1], want: want}, step{evs: f[1:2], want: none}, step{evs: f[2:], want: none})
			}
			return out
		}},
		{"a sub-second flap seen by two sources is one down", func(c string) []step {
			// the port down for 300ms: each source's DOWN falls within it,
			// each source's UP at its next poll, after it
			flap := func(at time.Duration) []*datamodels.HealthEvent {
				d, u := nicState(c, "n1", at, false), nicState(c, "n1", at+1*sec, true)
				return evs(d, again(d, 200*ms), u, again(u, 200*ms))
			}
			return []step{
				{evs: flap(0), want: none},
				{evs: flap(2 * m), want: none},
				{evs: flap(4 * m), want: "RepeatedNICLinkFlap:fault"},
			}
		}},
		{"NVSentinel's degradation events name no link_downed code: not added to the agent's increases", func(c string) []step {
			// health-monitors/nic-health-monitor/pkg/checks/counter/evaluator.go
			// recordBreach: checks.NewHealthEvent sets no errorCode, the
			// counter is in the message only.
			nv := func(at time.Duration) *datamodels.HealthEvent {
				ev := linkDowned(c, "n1", at, 1)
				ev.ErrorCode, ev.Metadata = nil, nil
				ev.Message = "Port mlx5_0 port 1: link_downed - link down events (value=9, delta=1, rate=0.00/interval)"
				ev.RecommendedAction = datamodels.RecommendedAction_REPLACE_VM
				return ev
			}
			return []step{
				{evs: evs(linkDowned(c, "n1", 0, 1), nv(400*ms)), want: none},
				{evs: evs(linkDowned(c, "n1", 2*m, 1), nv(2*m+400*ms)), want: none},
				{evs: evs(linkDowned(c, "n1", 4*m, 1)), want: "RepeatedNICLinkFlap:fault"},
			}
		}},
		{"a healthy event naming link_downed is no link-down", func(c string) []step {
			// a source clearing its counter fault that keeps the
			// counter's name in errorCode (the nic agent names none)
			cleared := func(at time.Duration) *datamodels.HealthEvent {
				ev := linkDowned(c, "n1", at, 1)
				ev.IsHealthy, ev.IsFatal = true, false
				return ev
			}
			return []step{
				{evs: evs(cleared(0)), want: none},
				{evs: evs(cleared(1 * m)), want: none},
				{evs: evs(cleared(2 * m)), want: none},
			}
		}},
		{"a healthy event naming link_downed is no recovery attempt", func(c string) []step {
			cleared := linkDowned(c, "n1", 1*m, 1)
			cleared.IsHealthy, cleared.IsFatal = true, false
			return []step{
				{evs: evs(nicState(c, "n1", 0, false)), want: none},
				{evs: evs(cleared), want: none},
				{sweep: 5 * m, want: "NICPortDrop:fault"},
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster("flapx")
			hs := newHarness(t, s, DefaultRules, nil)
			hs.cluster = c
			runSteps(t, hs, tc.steps(c))
		})
	}
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
