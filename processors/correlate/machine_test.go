package correlate

import (
	"testing"
	"time"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/validate"
)

// on stamps ev with the machine its agent runs on (events.MetaSystemUUID);
// "" leaves it naming none.
func on(machine string, ev *datamodels.HealthEvent) *datamodels.HealthEvent {
	events.SetSystemUUID(ev, machine, validate.MaxMetadata)
	return ev
}

// TestWindowsCountTheTriggersMachine: a Node object kept across a machine
// swap (the new machine's kubelet registers under the same name) carries
// the earlier machine's events under its name, PCI addresses and port
// names. A window counts only the trigger's machine's events, and those
// that name no machine (senders that do not stamp one), so a healthy new
// machine is not judged on its predecessor's faults: each case's step
// that would reach the threshold with the earlier machine's events derives
// nothing, and the new machine's own repeats still do.
func TestWindowsCountTheTriggersMachine(t *testing.T) {
	s := server(t)
	m, sec, h := time.Minute, time.Second, time.Hour
	const was, is = "4C4C4544-0042-3510-8052-B4C04F4E3732", "4C4C4544-0051-4410-8034-C3C04F4E3732"
	cases := []struct {
		name  string
		steps func(c string) []step
	}{
		{"xid 31 count", func(c string) []step {
			return []step{
				{evs: evs(on(was, xid(c, "n1", 0, 31, false, 1))), want: none},
				{evs: evs(on(is, xid(c, "n1", 1*h, 31, false, 1))), want: none},
				{evs: evs(on(is, xid(c, "n1", 2*h, 31, false, 1))), want: "RepeatedXID31OnSameGPU:fault"},
			}
		}},
		{"xid 31 count: an event naming no machine counts for any", func(c string) []step {
			return []step{
				{evs: evs(xid(c, "n1", 0, 31, false, 1)), want: none},
				{evs: evs(on(is, xid(c, "n1", 1*h, 31, false, 1))), want: "RepeatedXID31OnSameGPU:fault"},
			}
		}},
		{"xid bursts", func(c string) []step {
			var st []step
			for i := range 4 {
				st = append(st, step{evs: evs(on(was, xid(c, "n1", time.Duration(i)*10*m, 48, true, 1))), want: none})
			}
			for i := range 5 {
				want := none
				if i == 4 {
					want = "RepeatedXIDOnSameGPU:fault"
				}
				st = append(st, step{evs: evs(on(is, xid(c, "n1", 40*m+time.Duration(i)*10*m, 48, true, 1))), want: want})
			}
			return st
		}},
		{"flap", func(c string) []step {
			down := func(mc string, at time.Duration) []*datamodels.HealthEvent {
				return evs(on(mc, nicState(c, "n1", at, false)), on(mc, nicState(c, "n1", at+10*sec, true)))
			}
			return []step{
				{evs: append(down(was, 0), down(was, 1*m)...), want: none},
				{evs: down(is, 2*m), want: none},
				{evs: down(is, 3*m), want: none},
				{evs: down(is, 4*m), want: "RepeatedNICLinkFlap:fault"},
			}
		}},
		{"flap: the new machine's first down follows the earlier machine's down", func(c string) []step {
			return []step{
				{evs: evs(on(was, nicState(c, "n1", 0, false))), want: none},
				// no healthy event between, but another machine's: a down
				{evs: evs(on(is, nicState(c, "n1", 1*m, false))), want: none},
				{evs: evs(on(is, nicState(c, "n1", 2*m, true)), on(is, nicState(c, "n1", 3*m, false))), want: none},
				{evs: evs(on(is, nicState(c, "n1", 4*m, true)), on(is, nicState(c, "n1", 5*m, false))), want: "RepeatedNICLinkFlap:fault"},
			}
		}},
		{"flap: a down reported again by a sender naming no machine is no second down", func(c string) []step {
			return []step{
				{evs: append(flap(c, "n1", 0), on(is, nicState(c, "n1", 1*m, false))), want: none},
				{evs: evs(nicState(c, "n1", 1*m+sec, false)), want: none},
				{evs: evs(on(is, nicState(c, "n1", 2*m, true))), want: none},
				{evs: evs(on(is, nicState(c, "n1", 3*m, false))), want: "RepeatedNICLinkFlap:fault"},
			}
		}},
		{"sxid and xid", func(c string) []step {
			const pci = "0000:18:00.0"
			return []step{
				{evs: evs(on(was, sxidEv(c, "n1", "SysLogsSXIDError", 0, 24007, true, "", pci))), want: none},
				{evs: evs(on(is, xidOn(c, "n1", 1*m, 74, "", pci))), want: none},
				{evs: evs(on(is, sxidEv(c, "n1", "SysLogsSXIDError", 20*m, 24007, true, "", pci)), on(is, xidOn(c, "n1", 20*m+20*sec, 74, "", pci))),
					want: ruleSXid + ":fault"},
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster("machine")
			hs := newHarness(t, s, DefaultRules, nil)
			hs.cluster = c
			runSteps(t, hs, tc.steps(c))
		})
	}
}

// TestSweepNamesTheNodesMachine: a sweep evaluates a node's windows for
// the machine the node reports now, its newest event naming one. Once a
// machine swapped in under a kept Node object has reported, its
// predecessor's port left DOWN starts no NICPortDrop and its
// predecessor's standing verdict recovers; before it has, a verdict
// derived from the predecessor's events names the predecessor (which the
// quarantine role does not act on on a node reporting another machine).
func TestSweepNamesTheNodesMachine(t *testing.T) {
	s := server(t)
	m, h := time.Minute, time.Hour
	const was, is = "4C4C4544-0042-3510-8052-B4C04F4E3732", "4C4C4544-0051-4410-8034-C3C04F4E3732"
	// up is the new machine's first report: another port, up.
	up := func(c string, at time.Duration) *datamodels.HealthEvent {
		ev := on(is, nicState(c, "n1", at, true))
		ev.EntitiesImpacted = portEnts("mlx5_1", 1)
		return ev
	}
	cases := []struct {
		name  string
		steps func(c string) []step
		names string // the machine the last verdict names
	}{
		{"port drop: the new machine has reported", func(c string) []step {
			return []step{
				{evs: evs(on(was, nicState(c, "n1", 0, false))), want: none},
				{evs: evs(up(c, 1*m)), want: none},
				{sweep: 5 * m, want: none},
				{sweep: 10 * m, want: none},
			}
		}, ""},
		{"port drop: the new machine has not reported", func(c string) []step {
			return []step{
				{evs: evs(on(was, nicState(c, "n1", 0, false))), want: none},
				{sweep: 5 * m, want: "NICPortDrop:fault"},
			}
		}, was},
		{"port drop: the same machine", func(c string) []step {
			return []step{
				{evs: evs(on(is, nicState(c, "n1", 0, false))), want: none},
				{evs: evs(up(c, 1*m)), want: none},
				{sweep: 5 * m, want: "NICPortDrop:fault"},
			}
		}, is},
		{"a standing verdict recovers once the new machine reports", func(c string) []step {
			return []step{
				{evs: evs(on(was, xid(c, "n1", 0, 31, false, 1))), want: none},
				{evs: evs(on(was, xid(c, "n1", 10*m, 31, false, 1))), want: "RepeatedXID31OnSameGPU:fault"},
				{sweep: 2 * h, want: none},
				{evs: evs(up(c, 3*h)), want: none},
				{sweep: 3*h + m, want: "RepeatedXID31OnSameGPU:recovery"},
			}
		}, is},
		{"a standing verdict recovers: the new machine's report older than the hour read first", func(c string) []step {
			return []step{
				{evs: evs(on(was, xid(c, "n1", 0, 31, false, 1))), want: none},
				{evs: evs(on(was, xid(c, "n1", 10*m, 31, false, 1))), want: "RepeatedXID31OnSameGPU:fault"},
				{evs: evs(up(c, 20*m)), want: none},
				{sweep: 3 * h, want: "RepeatedXID31OnSameGPU:recovery"},
			}
		}, is},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster("sweepmachine")
			hs := newHarness(t, s, DefaultRules, nil)
			hs.cluster = c
			runSteps(t, hs, tc.steps(c))
			if tc.names == "" {
				return
			}
			last := hs.derived[len(hs.derived)-1]
			if got := last.GetMetadata()[events.MetaSystemUUID]; got != tc.names {
				t.Fatalf("%s %s names machine %q, want %q", last.GetDerivedBy(), describe(evs(last)), got, tc.names)
			}
		})
	}
}

// TestReadsMachine: the sweep names a machine only for the node and entity
// rules whose query reads the trigger's machine; a cluster rule, a rule
// that does not read it (MultipleRemediations, a custom rule) count as
// before.
func TestReadsMachine(t *testing.T) {
	rules, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{
		"RepeatedNICLinkFlap": true, "NICPortDrop": true, "RepeatedXIDOnSameGPU": true, "RepeatedXID31OnSameGPU": true,
		ruleSXid: true, "MultipleRemediations": false, "FabricIncident": false,
	}
	for _, r := range rules {
		if w, ok := want[r.Name]; !ok || r.readsMachine != w {
			t.Errorf("rule %s: readsMachine %v, want %v (known %v)", r.Name, r.readsMachine, w, ok)
		}
	}
	custom, err := ParseRules([]byte(`
[[rule]]
name = "Custom"
trigger = "event.checkName == 'X'"
window = "10m"
threshold = 1
query = "SELECT tid, 1.0 AS value, emptyArrayString() AS cause_ids, toUInt64(0) AS last_ms FROM triggers -- machine"
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if custom[0].readsMachine {
		t.Error("a rule whose query names machine only in a comment reads it")
	}
}
