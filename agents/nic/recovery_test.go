package nic

import (
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/faultline/faultline/agents/nic/nictest"
	"github.com/faultline/faultline/agents/topology"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// The quarantine lifts a fault only on a healthy event of the same check
// and the same entities (events.EntityKey): the tests here follow a fault
// to the event that must clear it and compare the two keys.

// dualPF is 4 compute cards of two PFs each (mlx5_0 … mlx5_7, one IB port
// per PF, card 0x10 … 0x40).
func dualPF() nictest.Platform {
	md := &topology.Metadata{Version: "1.0", GPUs: []topology.GPU{{GPUID: 0, NUMANode: 0}}, NICTopology: map[string][]string{}}
	p := nictest.Platform{Name: "dual-pf", Metadata: md, Want: map[string]string{}}
	for card := 0; card < 4; card++ {
		for fn := 0; fn < 2; fn++ {
			name := fmt.Sprintf("mlx5_%d", card*2+fn)
			p.Devices = append(p.Devices, nictest.Device{Name: name, PCI: fmt.Sprintf("0000:%02x:00.%d", 0x10*(card+1), fn),
				Ports: []nictest.Port{{LinkLayer: nictest.IB}}})
			md.NICTopology[name] = []string{"PXB"}
			p.Want[name] = "compute"
		}
	}
	return p
}

// pollEvents is poll with the events themselves.
func pollEvents(t *testing.T, c *Check) []*datamodels.HealthEvent {
	t.Helper()
	evs, err := c.Check(t.Context())
	must(t, err)
	must(t, c.Commit())
	return slices.DeleteFunc(evs, func(ev *datamodels.HealthEvent) bool { _, ok := ev.GetMetadata()["baseline"]; return ok })
}

// TestFirstPollBaselines: the first poll of a boot sends the healthy event
// of the device-level fault ([NIC=<name>]) of each device present and of
// the card fault ([PCI=<card>, NIC=<each>]) of each card at peer mode,
// which nothing else would send after a reboot: a device that disappeared
// at run time, and a card reported below its peer mode, in the previous
// boot stayed quarantined forever. A card fault raised while one of the
// card's devices was missing names fewer devices than the card holds after
// the reboot: the baseline clears it too.
func TestFirstPollBaselines(t *testing.T) {
	healthy := func(evs []*datamodels.HealthEvent, key string) bool {
		return slices.ContainsFunc(evs, func(ev *datamodels.HealthEvent) bool {
			return ev.GetIsHealthy() && ev.GetCheckName() == "InfiniBandStateCheck" && events.EntityKey(ev) == key
		})
	}
	t.Run("device disappeared, then reboot", func(t *testing.T) {
		e := setup(t, small())
		pollEvents(t, e.check())
		c := e.check()
		pollEvents(t, c)
		must(t, e.tree.Remove("mlx5_2"))
		pollEvents(t, c)
		e.now = e.now.Add(deviceHoldDown)
		fault := only(t, "gone", pollEvents(t, c), func(ev *datamodels.HealthEvent) bool { return ev.GetIsFatal() })
		if events.EntityKey(fault) != "NIC=mlx5_2" {
			t.Fatalf("fault %s [%s]", brief(fault), events.EntityKey(fault))
		}
		must(t, e.tree.Add(small().Devices[2]))
		e.setBootID("boot-2")
		c2 := e.check()
		evs, err := c2.Check(t.Context())
		must(t, err)
		if !healthy(evs, "NIC=mlx5_2") {
			t.Errorf("first poll of boot-2: no healthy InfiniBandStateCheck [NIC=mlx5_2]")
		}
	})
	t.Run("device disappeared, state lost, device back later", func(t *testing.T) {
		e := setup(t, small())
		c := e.check()
		allEvents(t, c)
		must(t, e.tree.Remove("mlx5_2"))
		allEvents(t, c)
		e.now = e.now.Add(deviceHoldDown)
		fault := only(t, "gone", allEvents(t, c), func(ev *datamodels.HealthEvent) bool { return ev.GetIsFatal() })
		// The state file lost (corrupt) while mlx5_2 is gone: the first
		// poll does not know it, the device comes back after it.
		must(t, os.WriteFile(e.cfg.StateFile, []byte("{"), 0o644))
		c = e.check()
		first := allEvents(t, c)
		if n := countHealthy(first, "NIC=mlx5_0"); n != 1 {
			t.Errorf("first poll: %d healthy [NIC=mlx5_0], want 1", n)
		}
		must(t, e.tree.Add(small().Devices[2]))
		back := allEvents(t, c)
		if !clears(back, fault) {
			t.Errorf("device back after a first poll: no healthy [NIC=mlx5_2]: its fatal is never lifted; events %q", briefs(back))
		}
		if n := countHealthy(back, "NIC=mlx5_0"); n != 0 {
			t.Errorf("device back: %d healthy [NIC=mlx5_0] again, want none", n)
		}
		if n := countHealthy(allEvents(t, c), "NIC=mlx5_2"); n != 0 {
			t.Errorf("steady: %d healthy [NIC=mlx5_2] again, want none", n)
		}
	})
	t.Run("card below peer mode, then reboot", func(t *testing.T) {
		e := setup(t, dualPF())
		must(t, e.tree.Remove("mlx5_7"))
		fault := only(t, "boot", pollEvents(t, e.check()), isCard)
		key := events.EntityKey(fault)
		must(t, e.tree.Add(dualPF().Devices[7]))
		e.setBootID("boot-2")
		must(t, e.tree.Remove("mlx5_7")) // the same devices as at the fault
		evs, err := e.check().Check(t.Context())
		must(t, err)
		_ = evs
		// The card still lacks mlx5_7: no baseline for it.
		if healthy(evs, key) {
			t.Errorf("card still below its peer mode got a healthy baseline")
		}
		must(t, e.tree.Add(dualPF().Devices[7]))
		e.setBootID("boot-3")
		evs, err = e.check().Check(t.Context())
		must(t, err)
		if !healthy(evs, "PCI=0000:40:00,NIC=mlx5_6,NIC=mlx5_7") {
			t.Errorf("first poll of boot-3: no healthy card event for 0000:40:00")
		}
		if !healthy(evs, key) {
			t.Errorf("first poll of boot-3: no healthy card event [%s]: the fault of boot-1 is never lifted", key)
		}
	})
}

// countHealthy is how many events of evs are healthy InfiniBandStateCheck
// events of the entities key.
func countHealthy(evs []*datamodels.HealthEvent, key string) int {
	n := 0
	for _, ev := range evs {
		if ev.GetIsHealthy() && ev.GetCheckName() == InfiniBandStateCheck && events.EntityKey(ev) == key {
			n++
		}
	}
	return n
}

// only returns the single event of evs that matches keep.
func only(t *testing.T, step string, evs []*datamodels.HealthEvent, keep func(*datamodels.HealthEvent) bool) *datamodels.HealthEvent {
	t.Helper()
	var got []*datamodels.HealthEvent
	for _, ev := range evs {
		if keep(ev) {
			got = append(got, ev)
		}
	}
	if len(got) != 1 {
		var all []string
		for _, ev := range evs {
			all = append(all, brief(ev)+" ["+events.EntityKey(ev)+"]")
		}
		t.Fatalf("%s: %d matching events, want 1; events: %q", step, len(got), all)
	}
	return got[0]
}

func isCard(ev *datamodels.HealthEvent) bool { return events.Entity(ev, events.EntityPCI) != "" }

// TestCardRecoveryNamesItsFault: the link-state design's §7 Case 3 — a
// dual-PF card's second RDMA device is missing at boot, so the card is
// below its peer mode and reported with the devices seen then. Its
// recovery must name exactly those entities, whatever the card holds by
// then (the missing device back, a device renamed): otherwise the
// quarantine never lifts the card's fault.
func TestCardRecoveryNamesItsFault(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, e *env)
	}{
		{"missing device appears", func(t *testing.T, e *env) { must(t, e.tree.Add(dualPF().Devices[7])) }},
		{"missing device appears, the other renamed", func(t *testing.T, e *env) {
			renameDevice(t, e.tree, "mlx5_6", "ibp64s0f0")
			must(t, e.tree.Add(dualPF().Devices[7]))
		}},
	} {
		for _, restart := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/restart=%v", tc.name, restart), func(t *testing.T) {
				e := setup(t, dualPF())
				must(t, e.tree.Remove("mlx5_7"))
				c := e.check()
				fault := only(t, "boot", pollEvents(t, c), isCard)
				if !fault.GetIsFatal() || events.EntityKey(fault) != "PCI=0000:40:00,NIC=mlx5_6" {
					t.Fatalf("boot: %s [%s], want the card fatal naming mlx5_6", brief(fault), events.EntityKey(fault))
				}
				tc.change(t, e)
				if restart {
					c = e.check()
				}
				back := only(t, "changed", pollEvents(t, c), isCard)
				if !back.GetIsHealthy() || back.GetCheckName() != fault.GetCheckName() || events.EntityKey(back) != events.EntityKey(fault) {
					t.Errorf("recovery %s [%s], want healthy %s [%s]", brief(back), events.EntityKey(back), fault.GetCheckName(), events.EntityKey(fault))
				}
				wantEvents(t, "steady", poll(t, c), nil)
			})
		}
	}
}

// isPortOf selects the port events of one device.
func isPortOf(dev string) func(*datamodels.HealthEvent) bool {
	return func(ev *datamodels.HealthEvent) bool {
		return events.Entity(ev, events.EntityNIC) == dev && events.Entity(ev, events.EntityNICPort) != ""
	}
}

// TestRetiredPortFaultCleared: a port fatal sent under a device name that
// will never be reported again — the device renamed (an mlx5 reset, then
// udev's rename), bonded into a RoCE LAG device, or no longer monitored —
// gets a healthy event of the same check and entities saying why, and the
// port is reported under its new name from then on (still down: a fatal
// there, not an uncabled port suppressed). A device that merely vanishes
// is a fault of its own (§7.3): its port's fatal stands until it is back.
func TestRetiredPortFaultCleared(t *testing.T) {
	p := small()
	var pfs []nictest.Device
	for i, nd := range []string{"ens7f0np0", "ens7f1np1"} {
		name := fmt.Sprintf("mlx5_%d", 6+i)
		pfs = append(pfs, nictest.Device{Name: name, PCI: fmt.Sprintf("0000:70:00.%d", i), Ports: []nictest.Port{{LinkLayer: nictest.Eth, NetDev: nd}}})
		p.Metadata.NICTopology[name] = []string{"NODE", "NODE"}
	}
	p.Devices = append(p.Devices, pfs...)
	p.Metadata.NICTopology["mlx5_bond_0"] = []string{"NODE", "NODE"}
	for _, tc := range []struct {
		name    string
		dev     string   // the device whose port goes down
		alsoOff []string // devices whose port is down from the start
		change  func(t *testing.T, e *env)
		cleared string   // the healthy event under the old entities ("" none)
		now     []string // the events under the new name
	}{
		{"renamed, port up again", "mlx5_2", nil, func(t *testing.T, e *env) {
			must(t, e.tree.SetPort("mlx5_2", 1, nictest.Active, nictest.LinkUp))
			renameDevice(t, e.tree, "mlx5_2", "ibp48s0")
		}, "H InfiniBandStateCheck: Port mlx5_2 port 1: cleared, device renamed to ibp48s0 (its ports are reported under that name now)",
			[]string{"H InfiniBandStateCheck: Port ibp48s0 port 1: healthy (ACTIVE, LinkUp)"}},
		{"renamed, port still down", "mlx5_2", nil, func(t *testing.T, e *env) { renameDevice(t, e.tree, "mlx5_2", "ibp48s0") },
			"H InfiniBandStateCheck: Port mlx5_2 port 1: cleared, device renamed to ibp48s0 (its ports are reported under that name now)",
			[]string{"F InfiniBandStateCheck: Port ibp48s0 port 1: state DOWN, phys_state Disabled"}},
		// Most IB cards down (a fabric outage): the renamed device's card
		// is at its peer mode, yet its port is no uncabled one.
		{"renamed, port still down, card at peer mode", "mlx5_2", []string{"mlx5_1", "mlx5_3"}, func(t *testing.T, e *env) { renameDevice(t, e.tree, "mlx5_2", "ibp48s0") },
			"H InfiniBandStateCheck: Port mlx5_2 port 1: cleared, device renamed to ibp48s0 (its ports are reported under that name now)",
			[]string{"F InfiniBandStateCheck: Port ibp48s0 port 1: state DOWN, phys_state Disabled"}},
		{"bonded into a RoCE LAG", "mlx5_7", nil, func(t *testing.T, e *env) { must(t, e.tree.Bond("bond0", "mlx5_bond_0", pfs...)) },
			"H EthernetStateCheck: RoCE port mlx5_7 port 1: cleared, device bonded into mlx5_bond_0 (RoCE LAG: its ports are reported as that device's now)",
			[]string{"H EthernetStateCheck: RoCE port mlx5_bond_0 port 1: healthy (ACTIVE, LinkUp, operstate up)"}},
		{"excluded", "mlx5_2", nil, func(t *testing.T, e *env) { e.cfg.ExclusionRegex = "^mlx5_2$" },
			"H InfiniBandStateCheck: Port mlx5_2 port 1: cleared, device no longer monitored (excluded: matches nic_exclusion_regex)", nil},
		{"disappeared: a fault of its own", "mlx5_2", nil, func(t *testing.T, e *env) { must(t, e.tree.Remove("mlx5_2")) }, "", nil},
	} {
		for _, restart := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/restart=%v", tc.name, restart), func(t *testing.T) {
				e := setup(t, p)
				c := e.check()
				poll(t, c)
				for _, d := range tc.alsoOff {
					must(t, e.tree.SetPort(d, 1, nictest.Down, nictest.Disabled))
				}
				must(t, e.tree.SetPort(tc.dev, 1, nictest.Down, nictest.Disabled))
				if tc.dev == "mlx5_7" {
					must(t, e.tree.SetOperState("ens7f1np1", "down"))
				}
				fault := only(t, "down", pollEvents(t, c), isPortOf(tc.dev))
				if !fault.GetIsFatal() {
					t.Fatalf("down: %s", brief(fault))
				}
				tc.change(t, e)
				if restart || tc.name == "excluded" {
					c = e.check()
				}
				evs := pollEvents(t, c)
				var old []*datamodels.HealthEvent
				var now []string
				for _, ev := range evs {
					switch {
					case events.EntityKey(ev) == events.EntityKey(fault):
						old = append(old, ev)
					case events.Entity(ev, events.EntityNICPort) != "" && !isDegradation(events.Entity(ev, events.EntityNIC))(ev):
						now = append(now, brief(ev))
					}
				}
				switch {
				case tc.cleared == "" && len(old) > 0:
					t.Errorf("the port's fault cleared: %s", brief(old[0]))
				case tc.cleared != "" && (len(old) != 1 || !old[0].GetIsHealthy() || old[0].GetCheckName() != fault.GetCheckName()):
					t.Errorf("the fault [%s] is not cleared: events %d under its entities, all events: %q", events.EntityKey(fault), len(old), now)
				case tc.cleared != "":
					wantEvents(t, "cleared", []string{brief(old[0])}, []string{tc.cleared})
				}
				wantEvents(t, "under the new name", now, tc.now)
				wantEvents(t, "steady", poll(t, c), nil)
				if tc.cleared == "" {
					// Back under its name and up: the port's own recovery.
					must(t, e.tree.Add(small().Devices[2]))
					back := only(t, "back", pollEvents(t, c), isPortOf(tc.dev))
					if !back.GetIsHealthy() || back.GetCheckName() != fault.GetCheckName() || events.EntityKey(back) != events.EntityKey(fault) {
						t.Errorf("back: %s [%s]", brief(back), events.EntityKey(back))
					}
				}
			})
		}
	}
}

func isDegradation(dev string) func(*datamodels.HealthEvent) bool {
	return func(ev *datamodels.HealthEvent) bool {
		return isPortOf(dev)(ev) && (ev.GetCheckName() == InfiniBandDegradationCheck || ev.GetCheckName() == EthernetDegradationCheck)
	}
}

// cleared asserts that ev clears fault: healthy, same check, same
// entities, and no link_downed error code (the correlator's flap and drop
// rules count any degradation event carrying one as a link-down).
func cleared(t *testing.T, step string, fault, ev *datamodels.HealthEvent) {
	t.Helper()
	if !ev.GetIsHealthy() || ev.GetCheckName() != fault.GetCheckName() || events.EntityKey(ev) != events.EntityKey(fault) {
		t.Errorf("%s: %s [%s] does not clear %s [%s]", step, brief(ev), events.EntityKey(ev), brief(fault), events.EntityKey(fault))
	}
	if slices.Contains(ev.GetErrorCode(), CounterLinkDowned) {
		t.Errorf("%s: healthy event with error code link_downed: %s", step, brief(ev))
	}
}

// TestDegradationFaultCleared: a degradation fatal (Appendix A) is cleared
// by a healthy event of its check and entities once its condition is
// over: a threshold counter back at 0; a link_downed increase once the
// link is up again with no further increase; and, at the latest, by the
// healthy baseline of the first poll after a reboot (the counters restart
// at 0, the state is discarded). A port's degradation fault is one for
// the quarantine whatever the counter, so it is cleared only once no
// counter of the port stands.
func TestDegradationFaultCleared(t *testing.T) {
	t.Run("threshold counter, node rebooted", func(t *testing.T) {
		for _, tc := range []struct{ dev, counter string }{
			{"mlx5_1", CounterExcessiveBufferOverrun},
			{"mlx5_4", CounterRnrNakRetryErr},
		} {
			e := setup(t, small())
			c := e.check()
			poll(t, c)
			must(t, e.tree.SetCounter(tc.dev, 1, tc.counter, 2))
			fault := only(t, "breach", pollEvents(t, c), isDegradation(tc.dev))
			if !fault.GetIsFatal() {
				t.Fatalf("breach: %s", brief(fault))
			}
			must(t, e.tree.SetCounter(tc.dev, 1, tc.counter, 0))
			e.setBootID("boot-2")
			c = e.check()
			cleared(t, "after the reboot", fault, only(t, "after the reboot", pollEvents(t, c), isDegradation(tc.dev)))
			wantEvents(t, "steady", poll(t, c), nil)
			e.setBootID("boot-1")
		}
	})
	t.Run("link_downed, link up again", func(t *testing.T) {
		e := setup(t, small())
		c := e.check()
		poll(t, c)
		must(t, e.tree.SetCounter("mlx5_0", 1, CounterLinkDowned, 1))
		must(t, e.tree.SetPort("mlx5_0", 1, nictest.Down, nictest.Polling))
		fault := only(t, "link down", pollEvents(t, c), isDegradation("mlx5_0"))
		if !fault.GetIsFatal() || !slices.Contains(fault.GetErrorCode(), CounterLinkDowned) {
			t.Fatalf("link down: %s", brief(fault))
		}
		wantEvents(t, "still down", poll(t, c), nil)
		must(t, e.tree.SetPort("mlx5_0", 1, nictest.Active, nictest.LinkUp))
		cleared(t, "up again", fault, only(t, "up again", pollEvents(t, c), isDegradation("mlx5_0")))
		wantEvents(t, "steady", poll(t, c), nil)
		// A flap the state check never saw (up at both polls): cleared
		// at the next poll without a further increase.
		must(t, e.tree.SetCounter("mlx5_0", 1, CounterLinkDowned, 2))
		fault = only(t, "sub-poll flap", pollEvents(t, c), isDegradation("mlx5_0"))
		c = e.check() // across a restart: the breach is in the state file
		cleared(t, "next poll", fault, only(t, "next poll", pollEvents(t, c), isDegradation("mlx5_0")))
	})
	t.Run("cleared only once no counter of the port stands", func(t *testing.T) {
		e := setup(t, small())
		c := e.check()
		poll(t, c)
		must(t, e.tree.SetCounter("mlx5_0", 1, CounterLinkDowned, 1))
		must(t, e.tree.SetCounter("mlx5_0", 1, CounterLocalLinkIntegrity, 3))
		evs := pollEvents(t, c)
		if len(evs) != 2 || !evs[0].GetIsFatal() || !evs[1].GetIsFatal() || events.EntityKey(evs[0]) != events.EntityKey(evs[1]) {
			t.Fatalf("two fatals of one port, want: %d events", len(evs))
		}
		wantEvents(t, "link up, local_link_integrity_errors still 3", poll(t, c), nil)
		must(t, e.tree.SetCounter("mlx5_0", 1, CounterLocalLinkIntegrity, 0))
		cleared(t, "counters reset", evs[0], only(t, "counters reset", pollEvents(t, c), isDegradation("mlx5_0")))
	})
	t.Run("device renamed", func(t *testing.T) {
		e := setup(t, small())
		c := e.check()
		poll(t, c)
		must(t, e.tree.SetCounter("mlx5_2", 1, CounterLocalLinkIntegrity, 3))
		fault := only(t, "breach", pollEvents(t, c), isDegradation("mlx5_2"))
		renameDevice(t, e.tree, "mlx5_2", "ibp48s0")
		evs := pollEvents(t, c)
		cleared(t, "renamed", fault, only(t, "renamed", evs, isDegradation("mlx5_2")))
		if again := only(t, "renamed", evs, isDegradation("ibp48s0")); !again.GetIsFatal() {
			t.Errorf("under the new name: %s, want the counter reported again", brief(again))
		}
	})
}
