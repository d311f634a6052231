package nic

import (
	"fmt"
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
	return evs
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
					case events.Entity(ev, events.EntityNICPort) != "":
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
