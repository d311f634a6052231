package correlate

import (
	"slices"
	"testing"
	"time"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// nicInit is the NIC agent's InfiniBand port in INIT/LinkUp: the link
// trained, waiting for the subnet manager to configure it (non-fatal, action
// NONE: the NIC link-state design's transient states).
func nicInit(cluster, node string, at time.Duration) *datamodels.HealthEvent {
	ev := nicDegraded(cluster, node, at)
	ev.Metadata = map[string]string{"state": "2: INIT", "phys_state": "5: LinkUp"}
	ev.Message = "Port mlx5_0 port 1: state INIT, phys_state LinkUp"
	return ev
}

// TestTransientNICStatesAreNoDown: the NIC agent's non-fatal unhealthy
// state events (ACTIVE/LinkErrorRecovery, INIT or ARMED on InfiniBand) are
// transient, not a link down: they count as no flap and no drop (before,
// each counted like a DOWN: a healthy port's REPLACE_VM).
func TestTransientNICStatesAreNoDown(t *testing.T) {
	s := server(t)
	m, sec := time.Minute, time.Second
	for _, tc := range []struct {
		name  string
		steps func(c string) []step
	}{
		{"error recovery three times in 10m is no flap", func(c string) []step {
			return []step{
				{evs: evs(nicDegraded(c, "n1", 0), nicState(c, "n1", 2*sec, true)), want: none},
				{evs: evs(nicDegraded(c, "n1", 2*m), nicState(c, "n1", 2*m+2*sec, true)), want: none},
				{evs: evs(nicDegraded(c, "n1", 4*m)), want: none},
			}
		}},
		{"error recovery then DOWN is one down", func(c string) []step {
			return []step{
				{evs: evs(nicDegraded(c, "n1", 0), nicState(c, "n1", 1*sec, false), nicState(c, "n1", 30*sec, true)), want: none},
				{evs: evs(nicDegraded(c, "n1", 2*m), nicState(c, "n1", 2*m+1*sec, false), nicState(c, "n1", 2*m+30*sec, true)), want: none},
				{evs: evs(nicDegraded(c, "n1", 4*m), nicState(c, "n1", 4*m+1*sec, false)), want: "RepeatedNICLinkFlap:fault"},
			}
		}},
		{"INIT waiting for the subnet manager is no drop", func(c string) []step {
			return []step{
				{evs: evs(nicInit(c, "n1", 0)), want: none},
				{sweep: 5 * m, want: none},
			}
		}},
		{"DOWN, then INIT: the link trained up, no drop", func(c string) []step {
			return []step{
				{evs: evs(nicState(c, "n1", 0, false), nicInit(c, "n1", 30*sec)), want: none},
				{sweep: 5 * m, want: none},
			}
		}},
		{"error recovery escalated to DOWN is a drop", func(c string) []step {
			return []step{
				{evs: evs(nicDegraded(c, "n1", 0), nicState(c, "n1", 1*sec, false)), want: none},
				{sweep: 5 * m, want: "NICPortDrop:fault"},
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster("transient")
			hs := newHarness(t, s, DefaultRules, nil)
			hs.cluster = c
			runSteps(t, hs, tc.steps(c))
		})
	}
}

// rnrNak is the NIC agent's degradation-check rnr_nak_retry_err above 0
// (fatal, Appendix A): a counter the NIC rules do not read.
func rnrNak(cluster, node string, at time.Duration) *datamodels.HealthEvent {
	ev := linkDowned(cluster, node, at, 1)
	ev.ErrorCode = []string{"rnr_nak_retry_err"}
	ev.Metadata = map[string]string{"counter": "rnr_nak_retry_err", "value": "3"}
	return ev
}

// nvsDegraded is NVSentinel's NIC health monitor's non-fatal unhealthy
// state event (ACTIVE/LinkErrorRecovery) as it enters faultline: like the
// agent's, marked crossings-only by nvsentinel.Normalize
// (events.MetaNICCrossingsOnly). The monitor reports one event per healthy
// <-> unhealthy crossing and none for LinkErrorRecovery -> DOWN (its
// link-state design, §3.4).
func nvsDegraded(cluster, node string, at time.Duration) *datamodels.HealthEvent {
	ev := nicDegraded(cluster, node, at)
	ev.Metadata[events.MetaNICCrossingsOnly] = "1"
	return ev
}

// TestCrossingsOnlyNonFatalNICStateIsDown: a non-fatal unhealthy port
// state event marked crossings-only (NVSentinel's NIC monitor, stamped by
// nvsentinel.Normalize) is a link-down: the monitor reports nothing when
// the port goes on from LinkErrorRecovery to DOWN, so its one event is all
// there is of a port that then stays down, or of each down of a flapping
// one (they were no drop and no flap). The same events unmarked —
// faultline's nic check's, and every one stored before the mark — are none
// (TestTransientNICStatesAreNoDown): they were downs while the rules read
// a mark of the nic check instead, so the history of a correlator
// upgraded before its agents turned non-fatal events into drops and flaps.
func TestCrossingsOnlyNonFatalNICStateIsDown(t *testing.T) {
	s := server(t)
	m, sec := time.Minute, time.Second
	for _, tc := range []struct {
		name  string
		steps func(c string) []step
	}{
		{"NVSentinel: error recovery, then nothing for over hold, is a drop", func(c string) []step {
			return []step{
				{evs: evs(nvsDegraded(c, "n1", 0)), want: none},
				{sweep: 5 * m, want: "NICPortDrop:fault"},
				{evs: evs(nicState(c, "n1", 5*m+10*sec, true)), want: "NICPortDrop:recovery"},
			}
		}},
		{"the same unmarked (faultline's nic check, history before the mark) is no drop", func(c string) []step {
			return []step{
				{evs: evs(nicDegraded(c, "n1", 0)), want: none},
				{sweep: 5 * m, want: none},
			}
		}},
		{"NVSentinel: error recovery and back three times in 10m is a flap", func(c string) []step {
			return []step{
				{evs: evs(nvsDegraded(c, "n1", 0), nicState(c, "n1", 2*sec, true)), want: none},
				{evs: evs(nvsDegraded(c, "n1", 2*m), nicState(c, "n1", 2*m+2*sec, true)), want: none},
				{evs: evs(nvsDegraded(c, "n1", 4*m)), want: "RepeatedNICLinkFlap:fault"},
			}
		}},
		{"the same unmarked (faultline's nic check, history before the mark) is no flap", func(c string) []step {
			return []step{
				{evs: evs(nicDegraded(c, "n1", 0), nicState(c, "n1", 2*sec, true)), want: none},
				{evs: evs(nicDegraded(c, "n1", 2*m), nicState(c, "n1", 2*m+2*sec, true)), want: none},
				{evs: evs(nicDegraded(c, "n1", 4*m)), want: none},
			}
		}},
		{"NVSentinel's error recovery followed by a DOWN is one down", func(c string) []step {
			cycle := func(at time.Duration, back bool) []*datamodels.HealthEvent {
				out := evs(nvsDegraded(c, "n1", at), nicState(c, "n1", at+1*sec, false))
				if back {
					out = append(out, nicState(c, "n1", at+30*sec, true))
				}
				return out
			}
			return []step{
				{evs: cycle(0, true), want: none},
				{evs: cycle(2*m, true), want: none},
				{evs: cycle(4*m, false), want: "RepeatedNICLinkFlap:fault"},
			}
		}},
		{"four nodes' NVSentinel error recovery is a fabric incident, their drops suppressed", func(c string) []step {
			return []step{
				{evs: evs(nvsDegraded(c, "n1", 0), nvsDegraded(c, "n2", 1*sec), nvsDegraded(c, "n3", 2*sec), nvsDegraded(c, "n4", 3*sec)),
					want: "FabricIncident:fault"},
				{sweep: 4*m + 10*sec, want: "NICPortDrop:fault:suppressed,NICPortDrop:fault:suppressed,NICPortDrop:fault:suppressed,NICPortDrop:fault:suppressed"},
			}
		}},
		{"four nodes' unmarked error recovery (the nic check's) is no fabric incident", func(c string) []step {
			return []step{
				{evs: evs(nicDegraded(c, "n1", 0), nicDegraded(c, "n2", 1*sec), nicDegraded(c, "n3", 2*sec), nicDegraded(c, "n4", 3*sec)), want: none},
				{sweep: 1 * m, want: none},
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster("crossings")
			hs := newHarness(t, s, DefaultRules, nil)
			hs.cluster = c
			runSteps(t, hs, tc.steps(c))
		})
	}
}

// TestFabricIncidentFatalAndOwnFamily: FabricIncident counts fatal events
// only (non-fatal SXids are informational), and an incident suppresses only
// the rules over its own signature: an NVSwitch incident, or one of a NIC
// counter the NIC rules do not read (rnr_nak_retry_err: they read only
// link_downed of the degradation checks), is no reason to keep a node's
// dead NIC port from escalating, while a NIC state or link_downed incident
// still suppresses the NIC rules (TestRules' fabric cases).
func TestFabricIncidentFatalAndOwnFamily(t *testing.T) {
	s := server(t)
	m, sec := time.Minute, time.Second
	sx := func(c, node string, at time.Duration, code int, fatal bool) *datamodels.HealthEvent {
		return sxidEv(c, node, "SysLogsSXIDError", at, code, fatal, "", "")
	}
	for _, tc := range []struct {
		name  string
		steps func(c string) []step
	}{
		{"four nodes' non-fatal SXid 20001 is no incident", func(c string) []step {
			return []step{
				{evs: evs(sx(c, "a1", 0, 20001, false), sx(c, "a2", 10*sec, 20001, false)), want: none},
				{evs: evs(sx(c, "a3", 20*sec, 20001, false), sx(c, "a4", 30*sec, 20001, false)), want: none},
				{sweep: 1 * m, want: none},
			}
		}},
		{"an SXid incident does not suppress a NIC port drop", func(c string) []step {
			return []step{
				{evs: evs(sx(c, "a1", 0, 20034, true), sx(c, "a2", 1*sec, 20034, true), sx(c, "a3", 2*sec, 20034, true), sx(c, "a4", 3*sec, 20034, true)),
					want: "FabricIncident:fault"},
				{evs: evs(nicState(c, "n9", 10*sec, false)), want: none},
				{sweep: 5*m + 40*sec, want: "NICPortDrop:fault"},
			}
		}},
		{"an rnr_nak_retry_err incident does not suppress a NIC port drop", func(c string) []step {
			return []step{
				{evs: evs(rnrNak(c, "n1", 0), rnrNak(c, "n2", 1*sec), rnrNak(c, "n3", 2*sec), rnrNak(c, "n4", 3*sec)),
					want: "FabricIncident:fault"},
				{evs: evs(nicState(c, "n9", 10*sec, false)), want: none},
				{sweep: 5*m + 40*sec, want: "NICPortDrop:fault"},
			}
		}},
		{"a link_downed incident suppresses a NIC port drop", func(c string) []step {
			return []step{
				{evs: evs(linkDowned(c, "n1", 0, 1), linkDowned(c, "n2", 1*sec, 1), linkDowned(c, "n3", 2*sec, 1), linkDowned(c, "n4", 3*sec, 1)),
					want: "FabricIncident:fault"},
				{evs: evs(nicState(c, "n9", 10*sec, false)), want: none},
				{sweep: 5*m + 40*sec, want: "NICPortDrop:fault:suppressed"},
			}
		}},
		{"a NIC incident suppresses a NIC port drop", func(c string) []step {
			return []step{
				{evs: evs(nicState(c, "n1", 0, false), nicState(c, "n2", 1*sec, false), nicState(c, "n3", 2*sec, false), nicState(c, "n4", 3*sec, false)),
					want: "FabricIncident:fault"},
				{evs: evs(nicState(c, "n1", 5*sec, true), nicState(c, "n2", 5*sec, true), nicState(c, "n3", 5*sec, true), nicState(c, "n4", 5*sec, true)), want: none},
				{evs: evs(nicState(c, "n9", 10*sec, false)), want: none},
				{sweep: 5*m + 40*sec, want: "NICPortDrop:fault:suppressed"},
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster("fabricfam")
			hs := newHarness(t, s, DefaultRules, nil)
			hs.cluster = c
			runSteps(t, hs, tc.steps(c))
		})
	}
}

// TestSuppressedBySignature: which incident signatures (FABRIC=check|code)
// suppress which shipped rules. The NIC rules read every state-check event
// but only link_downed of the degradation checks (counter_codes), so an
// incident over another NIC counter leaves a dead port live, as an SXid
// incident does.
func TestSuppressedBySignature(t *testing.T) {
	rules, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*Rule{}
	for _, r := range rules {
		byName[r.Name] = r
	}
	for _, tc := range []struct {
		rule, sig string
		want      bool
	}{
		{"NICPortDrop", "InfiniBandStateCheck|", true},
		{"NICPortDrop", "EthernetStateCheck|", true},
		{"NICPortDrop", "InfiniBandDegradationCheck|link_downed", true},
		{"RepeatedNICLinkFlap", "EthernetDegradationCheck|link_downed", true},
		{"NICPortDrop", "InfiniBandDegradationCheck|rnr_nak_retry_err", false},
		{"RepeatedNICLinkFlap", "InfiniBandDegradationCheck|rnr_nak_retry_err", false},
		{"RepeatedNICLinkFlap", "EthernetDegradationCheck|excessive_buffer_overrun_errors", false},
		{"NICPortDrop", "InfiniBandDegradationCheck|", false},
		{"NICPortDrop", "SysLogsSXIDError|SXID-20034", false},
		{"NVSwitchSXidGPUXid", "SysLogsSXIDError|SXID-20034", true},
		{"NVSwitchSXidGPUXid", "SysLogsXIDError|XID-74", true},
		{"NVSwitchSXidGPUXid", "SysLogsXIDError|XID-13", false},
		{"RepeatedXID31OnSameGPU", "SysLogsXIDError|XID-31", true},
		{"RepeatedXIDOnSameGPU", "SysLogsXIDError|XID-13", true},
		{"MultipleRemediations", "SysLogsSXIDError|SXID-20034", true}, // names no checks
	} {
		r := byName[tc.rule]
		if r == nil {
			t.Fatalf("no rule %s", tc.rule)
		}
		if got := r.suppressedBy("c1\x00" + EntityFabric + "=" + tc.sig); got != tc.want {
			t.Errorf("%s suppressed by %s: %v, want %v", tc.rule, tc.sig, got, tc.want)
		}
	}
}

// TestReadChecks: a codes param narrows only its own checks param, and a
// check another param reads whole stays whole.
func TestReadChecks(t *testing.T) {
	got := readChecks(map[string]any{
		"state_checks": []string{"S"}, "counter_checks": []string{"C", "D"}, "counter_codes": []string{"x"},
		"other_checks": []string{"D"}, "more_checks": []string{"C"}, "more_codes": []string{"y"},
		"sticky_codes": []string{"z"}, "window": uint64(1),
	})
	want := map[string][]string{"S": nil, "C": {"x", "y"}, "D": nil}
	if len(got) != len(want) {
		t.Fatalf("readChecks = %v, want %v", got, want)
	}
	for k, w := range want {
		g, ok := got[k]
		slices.Sort(g)
		if !ok || (w == nil) != (g == nil) || !slices.Equal(g, w) {
			t.Errorf("readChecks[%s] = %v, want %v", k, g, w)
		}
	}
}
