package nic

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/agents/nic/nictest"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

func quiet() Options { return Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))} }

// TestSysfsRootNotSysfs: a sysfs_root that is no sysfs (the class
// directory itself, a host /sys mount missing from the pod) is refused at
// start, naming the key; and class/infiniband missing or empty while the
// GPU metadata names NICs and no device was ever known (first start,
// after a reboot) is a poll error: nothing monitored is not healthy.
func TestSysfsRootNotSysfs(t *testing.T) {
	e := setup(t, small())
	for _, root := range []string{filepath.Join(e.tree.Root, "class", "infiniband"), t.TempDir(), filepath.Join(e.dir, "absent")} {
		cfg := e.cfg
		cfg.SysfsRoot = root
		if _, err := New(cfg, quiet()); err == nil || !strings.Contains(err.Error(), "nic.sysfs_root") {
			t.Errorf("sysfs_root %s: err %v, want one naming nic.sysfs_root", root, err)
		}
	}
	ib := filepath.Join(e.tree.Root, "class", "infiniband")
	hidden := filepath.Join(e.dir, "ib-hidden")
	must(t, os.Rename(ib, hidden))
	for i, empty := range []bool{false, true} {
		if empty {
			must(t, os.Mkdir(ib, 0o755))
		}
		e.setBootID(fmt.Sprintf("boot-%d", i+2)) // fresh state: none known
		c := e.check()
		for range 2 {
			evs, err := c.Check(t.Context())
			if !errors.Is(err, ErrNoDevices) || len(evs) > 0 {
				t.Errorf("empty=%v: err %v, events %q; want ErrNoDevices and none", empty, err, briefs(evs))
			}
			must(t, c.Commit())
		}
	}
	must(t, os.Remove(ib))
	must(t, os.Rename(hidden, ib))
	wantEvents(t, "back", poll(t, e.check()), baselines())
}

// allLost and allBack are the events of every device of small() lost
// at once, and present again.
func allLost() (lost, back []string) {
	for i := range 6 {
		check := InfiniBandStateCheck
		if i >= 4 {
			check = EthernetStateCheck
		}
		lost = append(lost, fmt.Sprintf("F %s: NIC mlx5_%d disappeared from /sys/class/infiniband/ - hardware failure", check, i))
		back = append(back, fmt.Sprintf("H %s: NIC mlx5_%d present again in /sys/class/infiniband/", check, i))
	}
	return lost, back
}

// clocked is the check of e with the clock *now.
func clocked(t *testing.T, e *env, now *time.Time) *Check {
	t.Helper()
	opt := quiet()
	opt.Now = func() time.Time { return *now }
	c, err := New(e.cfg, opt)
	must(t, err)
	return c
}

// heldDown polls once, expecting ErrNoDevices and no event.
func heldDown(t *testing.T, step string, c *Check) {
	t.Helper()
	evs, err := c.Check(t.Context())
	if !errors.Is(err, ErrNoDevices) || len(evs) > 0 {
		t.Errorf("%s: err %v, events %q; want ErrNoDevices and none", step, err, briefs(evs))
	}
	must(t, c.Commit())
}

// TestAllKnownDevicesLost: every known device gone at once (mlx5 driver
// crash or unload, a one-HCA node's card or PCIe switch failed) and still
// gone past the hold-down is each device's loss, as one device's: a fatal
// "disappeared" for each, in the running process and in one restarted
// over its state.
func TestAllKnownDevicesLost(t *testing.T) {
	lost, back := allLost()
	for _, empty := range []bool{false, true} {
		for _, restart := range []bool{false, true} {
			t.Run(fmt.Sprintf("empty=%v/restart=%v", empty, restart), func(t *testing.T) {
				e := setup(t, small())
				now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
				c := clocked(t, e, &now)
				poll(t, c)
				ib := filepath.Join(e.tree.Root, "class", "infiniband")
				hidden := filepath.Join(e.dir, "ib-hidden")
				must(t, os.Rename(ib, hidden))
				if empty {
					must(t, os.Mkdir(ib, 0o755))
				}
				if restart {
					c = clocked(t, e, &now)
				}
				heldDown(t, "gone", c)
				now = now.Add(cardHoldDown)
				wantEvents(t, "all lost", poll(t, c), lost)
				now = now.Add(time.Minute)
				wantEvents(t, "reported once", poll(t, c), nil)
				if empty {
					must(t, os.Remove(ib))
				}
				must(t, os.Rename(hidden, ib))
				wantEvents(t, "back", poll(t, c), back)
			})
		}
	}
}

// TestAllKnownDevicesHeldDown: class/infiniband empty or missing while
// devices are known — a MOFED/openibd restart unloads ib_core for a few
// seconds, a restarted agent's host /sys mount gone wrong — is a poll
// error (ErrNoDevices), no event, for cardHoldDown: each known device
// reported lost only then, and nothing at all when the devices are back
// before. Every device "disappeared – hardware failure" (REPLACE_VM) at
// once, then "present again", was sent on every driver restart.
func TestAllKnownDevicesHeldDown(t *testing.T) {
	lost, _ := allLost()
	for _, back := range []bool{false, true} {
		t.Run(fmt.Sprintf("back=%v", back), func(t *testing.T) {
			e := setup(t, small())
			now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
			c := clocked(t, e, &now)
			poll(t, c)
			ib := filepath.Join(e.tree.Root, "class", "infiniband")
			hidden := filepath.Join(e.dir, "ib-hidden")
			must(t, os.Rename(ib, hidden))
			must(t, os.Mkdir(ib, 0o755))
			heldDown(t, "empty", c)
			now = now.Add(cardHoldDown - time.Second)
			heldDown(t, "held down", c)
			if back {
				must(t, os.Remove(ib))
				must(t, os.Rename(hidden, ib))
				wantEvents(t, "back within the hold-down", poll(t, c), nil)
				now = now.Add(time.Second)
				wantEvents(t, "past the hold-down", poll(t, c), nil)
				return
			}
			now = now.Add(time.Second)
			wantEvents(t, "past the hold-down", poll(t, c), lost)
		})
	}
}

// allEvents is one poll's events, baselines included.
func allEvents(t *testing.T, c *Check) []*datamodels.HealthEvent {
	t.Helper()
	evs, err := c.Check(t.Context())
	must(t, err)
	must(t, c.Commit())
	return evs
}

// clears reports whether evs hold a healthy event of fault's check and
// entities (what lifts it in the quarantine).
func clears(evs []*datamodels.HealthEvent, fault *datamodels.HealthEvent) bool {
	return slices.ContainsFunc(evs, func(ev *datamodels.HealthEvent) bool {
		return ev.GetIsHealthy() && ev.GetCheckName() == fault.GetCheckName() && events.EntityKey(ev) == events.EntityKey(fault)
	})
}

// TestUnmonitoredCardFaultCleared: a card fault whose device the agent
// no longer monitors (excluded by the config it restarted with) is lifted
// under the entities it named — after a restart from the state, after a
// reboot by a first poll's baseline — as the card's own recovery is
// checked only over monitored devices.
func TestUnmonitoredCardFaultCleared(t *testing.T) {
	for _, reboot := range []bool{false, true} {
		t.Run(map[bool]string{false: "restart", true: "reboot"}[reboot], func(t *testing.T) {
			e := setup(t, small())
			must(t, e.tree.SetPort("mlx5_3", 1, nictest.Down, nictest.Disabled))
			fault := only(t, "boot", pollEvents(t, e.check()), isCard)
			if !fault.GetIsFatal() {
				t.Fatalf("boot: %s", brief(fault))
			}
			e.cfg.ExclusionRegex = "^mlx5_3$"
			if reboot {
				e.setBootID("boot-2")
			}
			c := e.check()
			if evs := allEvents(t, c); !clears(evs, fault) {
				t.Errorf("card fault [%s] not cleared: %q", events.EntityKey(fault), briefs(evs))
			}
			wantEvents(t, "steady", poll(t, c), nil)
		})
	}
}

// TestDisabledSubCheckFaultsCleared: the faults of a sub-check the agent
// restarted without (nic.checks) get healthy events of their check and
// entities: nothing of that check would ever come to lift them.
func TestDisabledSubCheckFaultsCleared(t *testing.T) {
	e := setup(t, small())
	c := e.check()
	poll(t, c)
	must(t, e.tree.SetPort("mlx5_4", 1, nictest.Down, nictest.Disabled))
	must(t, e.tree.SetOperState("eth4", "down"))
	must(t, e.tree.SetCounter("mlx5_0", 1, CounterLinkDowned, 1))
	evs := pollEvents(t, c)
	state := only(t, "down", evs, isPortOf("mlx5_4"))
	degr := only(t, "flap", evs, isPortOf("mlx5_0"))
	if !state.GetIsFatal() || !degr.GetIsFatal() {
		t.Fatalf("faults: %q", briefs(evs))
	}
	e.cfg.Checks = []string{InfiniBandStateCheck, EthernetDegradationCheck}
	c = e.check()
	evs = pollEvents(t, c)
	for _, f := range []*datamodels.HealthEvent{state, degr} {
		if !clears(evs, f) {
			t.Errorf("%s [%s] not cleared: %q", f.GetCheckName(), events.EntityKey(f), briefs(evs))
		}
	}
	wantEvents(t, "steady", poll(t, c), nil)
}

// TestDisabledStateCheckForgetsHeldPort: a port held with its card by a
// first poll (never reported) is forgotten by a restart without its
// state and degradation checks, as a port reported would be.
func TestDisabledStateCheckForgetsHeldPort(t *testing.T) {
	e := setup(t, small())
	must(t, e.tree.SetPort("mlx5_0", 1, nictest.Init, nictest.LinkUp))
	c := e.check()
	poll(t, c)
	if ps := c.st.Ports[portKey("mlx5_0", 1)]; ps == nil || !ps.Held {
		t.Fatalf("first poll: port not held: %+v", ps)
	}
	e.cfg.Checks = []string{EthernetStateCheck, EthernetDegradationCheck}
	c = e.check()
	wantEvents(t, "restart", poll(t, c), nil)
	if ps := c.st.Ports[portKey("mlx5_0", 1)]; ps != nil {
		t.Errorf("restart without the IB checks: port kept: %+v", ps)
	}
}

// TestCounterAcrossRestartOnLaterPoll: a port first read on a later poll
// of a restarted process (unreadable on its first) compares with the
// earlier process's snapshot: an increase while no agent ran is one down
// ("delta" 1, the increase in "delta_total"), not a flap of 3.
func TestCounterAcrossRestartOnLaterPoll(t *testing.T) {
	e := setup(t, small())
	poll(t, e.check())
	must(t, e.tree.SetCounter("mlx5_0", 1, CounterLinkDowned, 3))
	restore := unreadable(t, filepath.Join(e.tree.PortDir("mlx5_0", 1), "state"))
	c := e.check()
	wantEvents(t, "unreadable", poll(t, c), nil)
	restore(nictest.Active)
	evs := pollEvents(t, c)
	f := only(t, "readable", evs, isDegradation("mlx5_0"))
	if md := f.GetMetadata(); md["delta"] != "1" || md["delta_total"] != "3" {
		t.Errorf("%s: delta %q, delta_total %q; want 1, 3", brief(f), md["delta"], md["delta_total"])
	}
}

// TestKnownDeviceWithoutPortsYet: a known device listed but not readable
// at a restart (ports/ not there yet: a driver reload or hot-plug window)
// is unreadable, not disappeared: no fatal, and no "present again" later.
func TestKnownDeviceWithoutPortsYet(t *testing.T) {
	e := setup(t, small())
	poll(t, e.check())
	ports := filepath.Join(e.tree.Root, "class/infiniband/mlx5_2/ports")
	hidden := filepath.Join(e.dir, "ports-mlx5_2")
	must(t, os.Rename(ports, hidden))
	must(t, os.Mkdir(ports, 0o755))
	c := e.check()
	wantEvents(t, "no ports yet", poll(t, c), nil)
	must(t, os.Remove(ports))
	must(t, os.Rename(hidden, ports))
	wantEvents(t, "ports added", poll(t, c), nil)
	must(t, e.tree.Remove("mlx5_2"))
	wantEvents(t, "removed", e.pollGone(t, c), []string{"F InfiniBandStateCheck: NIC mlx5_2 disappeared from /sys/class/infiniband/ - hardware failure"})
}

// TestKnownDeviceUnreadablePastHoldDown: a known device listed but whose
// discovery keeps failing (EIO on a half-dead HCA) is held down for
// cardHoldDown, then reported lost (as one gone from the list); readable
// again, it is present again.
func TestKnownDeviceUnreadablePastHoldDown(t *testing.T) {
	e := setup(t, small())
	poll(t, e.check())
	ports := filepath.Join(e.tree.Root, "class/infiniband/mlx5_2/ports")
	hidden := filepath.Join(e.dir, "ports-mlx5_2")
	must(t, os.Rename(ports, hidden))
	must(t, os.Mkdir(ports, 0o755))
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	opt := quiet()
	opt.Now = func() time.Time { return now }
	c, err := New(e.cfg, opt)
	must(t, err)
	wantEvents(t, "unreadable", poll(t, c), nil)
	now = now.Add(cardHoldDown - time.Second)
	wantEvents(t, "held down", poll(t, c), nil)
	now = now.Add(time.Second)
	wantEvents(t, "past the hold-down", poll(t, c), []string{"F InfiniBandStateCheck: NIC mlx5_2 disappeared from /sys/class/infiniband/ - hardware failure"})
	now = now.Add(time.Minute)
	wantEvents(t, "reported once", poll(t, c), nil)
	must(t, os.Remove(ports))
	must(t, os.Rename(hidden, ports))
	wantEvents(t, "readable", poll(t, c), []string{"H InfiniBandStateCheck: NIC mlx5_2 present again in /sys/class/infiniband/"})
}

// TestBootIDRequiredWithStateFile: with a state file, a boot id that
// cannot be read (or is empty) is refused at start, naming the key — an
// empty id matching the saved empty id would take a reboot for a restart;
// without a state file it is not needed.
func TestBootIDRequiredWithStateFile(t *testing.T) {
	e := setup(t, small())
	for _, tc := range []struct {
		name string
		id   func()
	}{
		{"missing", func() { e.cfg.BootIDPath = filepath.Join(e.dir, "absent") }},
		{"empty", func() { e.setBootID("") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.id()
			if _, err := New(e.cfg, quiet()); err == nil || !strings.Contains(err.Error(), "nic.boot_id_path") {
				t.Errorf("err %v, want one naming nic.boot_id_path", err)
			}
			cfg := e.cfg
			cfg.StateFile = ""
			if _, err := New(cfg, quiet()); err != nil {
				t.Errorf("without a state file: %v", err)
			}
		})
	}
}

// TestDriverRestartSwapsNames: after a driver restart (openibd) the
// devices come back within the hold-down, named in probe order: mlx5_0
// and mlx5_1 swapped PCI functions. Each is read where it is now (its
// ports, its PCI address), whether a poll saw class/infiniband empty or
// the restart fell between two polls: a cached port path of the old
// function read nothing for ever, and a port going down was never seen;
// the other function's link_downed is no increase of the name's.
func TestDriverRestartSwapsNames(t *testing.T) {
	for _, polled := range []bool{true, false} {
		t.Run(fmt.Sprintf("polled during the restart=%v", polled), func(t *testing.T) {
			e := setup(t, small())
			now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
			must(t, e.tree.SetCounter("mlx5_1", 1, CounterLinkDowned, 7))
			c := clocked(t, e, &now)
			poll(t, c)
			if polled {
				ib := filepath.Join(e.tree.Root, "class", "infiniband")
				hidden := filepath.Join(e.dir, "ib-hidden")
				must(t, os.Rename(ib, hidden))
				must(t, os.Mkdir(ib, 0o755))
				heldDown(t, "driver unloaded", c)
				must(t, os.Remove(ib))
				must(t, os.Rename(hidden, ib))
			}
			devs := small().Devices
			must(t, e.tree.Remove("mlx5_0"))
			must(t, e.tree.Remove("mlx5_1"))
			devs[0].Name, devs[1].Name = devs[1].Name, devs[0].Name
			must(t, e.tree.Add(devs[0]))
			must(t, e.tree.Add(devs[1]))
			// The card's link_downed moved with it: no increase of mlx5_0's.
			must(t, e.tree.SetCounter("mlx5_0", 1, CounterLinkDowned, 7))
			now = now.Add(time.Minute)
			wantEvents(t, "back, swapped", poll(t, c), nil)
			for _, n := range c.NICs() {
				if want := map[string]string{"mlx5_0": devs[1].PCI, "mlx5_1": devs[0].PCI}[n.Name]; want != "" && n.PCIAddress != want {
					t.Errorf("%s: PCI %s, want %s", n.Name, n.PCIAddress, want)
				}
			}
			must(t, e.tree.SetPort("mlx5_0", 1, nictest.Down, nictest.Disabled))
			wantEvents(t, "down", poll(t, c), []string{"F InfiniBandStateCheck: Port mlx5_0 port 1: state DOWN, phys_state Disabled"})
		})
	}
}

// TestSomeDevicesMissingHeldDown: an openibd unload/reload unregisters and
// registers the devices one at a time over seconds, so a poll sees some
// missing, not all. A device missing for less than deviceHoldDown is no
// event (it was "disappeared", REPLACE_VM, at once and "present again" a
// second later); one still missing then is reported disappeared, once, and
// present again when back.
func TestSomeDevicesMissingHeldDown(t *testing.T) {
	e := setup(t, small())
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	c := clocked(t, e, &now)
	poll(t, c)
	must(t, e.tree.Remove("mlx5_1"))
	must(t, e.tree.Remove("mlx5_2"))
	wantEvents(t, "2 of 6 missing", poll(t, c), nil)
	now = now.Add(time.Second)
	must(t, e.tree.Add(small().Devices[1]))
	wantEvents(t, "one back within the hold-down", poll(t, c), nil)
	now = now.Add(deviceHoldDown - 2*time.Second)
	wantEvents(t, "held down", poll(t, c), nil)
	now = now.Add(time.Second)
	wantEvents(t, "past the hold-down", poll(t, c), []string{"F InfiniBandStateCheck: NIC mlx5_2 disappeared from /sys/class/infiniband/ - hardware failure"})
	now = now.Add(time.Minute)
	wantEvents(t, "reported once", poll(t, c), nil)
	must(t, e.tree.Add(small().Devices[2]))
	wantEvents(t, "back", poll(t, c), []string{"H InfiniBandStateCheck: NIC mlx5_2 present again in /sys/class/infiniband/"})
	// Missing again, then back within the hold-down: nothing.
	must(t, e.tree.Remove("mlx5_2"))
	wantEvents(t, "missing again", poll(t, c), nil)
	now = now.Add(10 * time.Second)
	must(t, e.tree.Add(small().Devices[2]))
	wantEvents(t, "back again", poll(t, c), nil)
	now = now.Add(deviceHoldDown)
	wantEvents(t, "stays back", poll(t, c), nil)
}

// TestMissingDeviceReportedAfterRestart: the time a device has been
// missing is not saved, so an agent restarted on its state reports a
// device still missing at its first poll (an agent restarting faster than
// deviceHoldDown never reported a device gone for good); a device missing
// first seen by a running agent is held down.
func TestMissingDeviceReportedAfterRestart(t *testing.T) {
	e := setup(t, small())
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	c := clocked(t, e, &now)
	poll(t, c)
	must(t, e.tree.Remove("mlx5_2"))
	wantEvents(t, "missing, held down", poll(t, c), nil)
	now = now.Add(10 * time.Second)
	c = clocked(t, e, &now)
	wantEvents(t, "restarted", poll(t, c), []string{"F InfiniBandStateCheck: NIC mlx5_2 disappeared from /sys/class/infiniband/ - hardware failure"})
	now = now.Add(deviceHoldDown)
	wantEvents(t, "reported once", poll(t, c), nil)
}

// swapNames re-registers two devices under each other's name, as a driver
// restart that probed them in another order does (mlx5_0 ↔ mlx5_1): each
// PCI function keeps its ports, in the state the given devices hold.
func swapNames(t *testing.T, tree *nictest.Tree, a, b nictest.Device) {
	t.Helper()
	must(t, tree.Remove(a.Name))
	must(t, tree.Remove(b.Name))
	a.Name, b.Name = b.Name, a.Name
	must(t, tree.Add(a))
	must(t, tree.Add(b))
}

// withPort is d with its port 1 in state, phys.
func withPort(d nictest.Device, state, phys string) nictest.Device {
	d.Ports = slices.Clone(d.Ports)
	d.Ports[0].State, d.Ports[0].PhysState = state, phys
	return d
}

// TestDriverRestartSwapsNamesUncabled: dual-PF cards whose second PF is
// uncabled on every card (DOWN/Polling, saved uncabled, not reported). A
// driver restart registers the names in another order on every card
// (mlx5_0 ↔ mlx5_1 change PCI functions), at run time or while the agent
// was down: each port's history goes with its PCI function, so mlx5_0's
// port, now the uncabled PF's, is no healthy→fatal crossing (a
// REPLACE_VM never cleared), and mlx5_1's, now ACTIVE, no recovery. Later
// crossings are judged on the function's own history.
func TestDriverRestartSwapsNamesUncabled(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restarted=%v", restart), func(t *testing.T) {
			p := dualPFUncabled()
			e := setup(t, p)
			c := e.check()
			wantEvents(t, "first poll", stateEvents(poll(t, c)), []string{
				"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)",
				"H InfiniBandStateCheck: Port mlx5_2 port 1: healthy (ACTIVE, LinkUp)",
				"H InfiniBandStateCheck: Port mlx5_4 port 1: healthy (ACTIVE, LinkUp)",
				"H InfiniBandStateCheck: Port mlx5_6 port 1: healthy (ACTIVE, LinkUp)",
			})
			for i := 0; i < len(p.Devices); i += 2 {
				swapNames(t, e.tree, p.Devices[i], p.Devices[i+1])
			}
			if restart {
				c = e.check()
			}
			wantEvents(t, "swapped", poll(t, c), nil)
			wantEvents(t, "steady", poll(t, c), nil)
			must(t, e.tree.SetPort("mlx5_1", 1, nictest.Down, nictest.Disabled))
			must(t, e.tree.SetPort("mlx5_0", 1, nictest.Active, nictest.LinkUp))
			wantEvents(t, "then", stateEvents(poll(t, c)), []string{
				"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)",
				"F InfiniBandStateCheck: Port mlx5_1 port 1: state DOWN, phys_state Disabled",
			})
		})
	}
}

// TestDriverRestartSwapsNamesStandingFault: PF0 of a dual-PF card
// (mlx5_0) reported down, then a driver restart swaps mlx5_0 and mlx5_1
// (at run time or while the agent was down). The fault is lifted under
// mlx5_0, which no longer has it (nothing else would: its port is the
// uncabled PF1's now, never reported), and reported again under mlx5_1,
// PF0's name now, if PF0 is still down; a degradation fault likewise.
func TestDriverRestartSwapsNamesStandingFault(t *testing.T) {
	const why = "cleared, device name now on PCI function 0000:10:00.1 (a driver restart registered the names in another order): its ports are reported under mlx5_1 now"
	for _, restart := range []bool{false, true} {
		for _, fixed := range []bool{false, true} {
			t.Run(fmt.Sprintf("restarted=%v/fixed=%v", restart, fixed), func(t *testing.T) {
				p := dualPFUncabled()
				e := setup(t, p)
				c := e.check()
				poll(t, c)
				must(t, e.tree.SetPort("mlx5_0", 1, nictest.Down, nictest.Disabled))
				must(t, e.tree.SetCounter("mlx5_0", 1, CounterLocalLinkIntegrity, 3))
				evs := pollEvents(t, c)
				if len(evs) != 2 || !evs[0].GetIsFatal() || !evs[1].GetIsFatal() {
					t.Fatalf("PF0 down: %q, want its state and degradation fatals", briefs(evs))
				}
				pf0, pf1 := withPort(p.Devices[0], nictest.Down, nictest.Disabled), p.Devices[1]
				if fixed {
					pf0 = p.Devices[0]
				}
				swapNames(t, e.tree, pf0, pf1)
				if !fixed {
					must(t, e.tree.SetCounter("mlx5_1", 1, CounterLocalLinkIntegrity, 3))
				}
				if restart {
					c = e.check()
				}
				got := pollEvents(t, c)
				for _, fault := range evs {
					cleared(t, "swapped", fault, only(t, "swapped: "+brief(fault), got, func(ev *datamodels.HealthEvent) bool {
						return ev.GetCheckName() == fault.GetCheckName() && events.EntityKey(ev) == events.EntityKey(fault)
					}))
				}
				want := []string{
					"H InfiniBandStateCheck: Port mlx5_0 port 1: " + why,
					"H InfiniBandDegradationCheck: Port mlx5_0 port 1: " + why,
					"F InfiniBandStateCheck: Port mlx5_1 port 1: state DOWN, phys_state Disabled",
					"F InfiniBandDegradationCheck: Port mlx5_1 port 1: local_link_integrity_errors is 3 (threshold > 0)",
				}
				if fixed {
					want[2], want = "H InfiniBandStateCheck: Port mlx5_1 port 1: healthy (ACTIVE, LinkUp)", want[:3]
				}
				slices.Sort(want)
				gotB := briefs(got)
				slices.Sort(gotB)
				wantEvents(t, "swapped", gotB, want)
				wantEvents(t, "steady", poll(t, c), nil)
				if !fixed {
					must(t, e.tree.SetPort("mlx5_1", 1, nictest.Active, nictest.LinkUp))
					wantEvents(t, "PF0 up", stateEvents(poll(t, c)), []string{"H InfiniBandStateCheck: Port mlx5_1 port 1: healthy (ACTIVE, LinkUp)"})
				}
			})
		}
	}
}

// TestDriverRestartSwapsNamesBothFaulted: both PFs of a card reported
// unhealthy (PF0 down, PF1 in INIT), then their names swap: each name's
// fault is lifted first, then its function's reported under it.
func TestDriverRestartSwapsNamesBothFaulted(t *testing.T) {
	p := dualPF()
	e := setup(t, p)
	c := e.check()
	poll(t, c)
	must(t, e.tree.SetPort("mlx5_0", 1, nictest.Down, nictest.Disabled))
	must(t, e.tree.SetPort("mlx5_1", 1, nictest.Init, nictest.LinkUp))
	wantEvents(t, "faults", stateEvents(poll(t, c)), []string{
		"F InfiniBandStateCheck: Port mlx5_0 port 1: state DOWN, phys_state Disabled",
		"N InfiniBandStateCheck: Port mlx5_1 port 1: state INIT, phys_state LinkUp",
	})
	swapNames(t, e.tree, withPort(p.Devices[0], nictest.Down, nictest.Disabled), withPort(p.Devices[1], nictest.Init, nictest.LinkUp))
	wantEvents(t, "swapped", stateEvents(poll(t, c)), []string{
		"H InfiniBandStateCheck: Port mlx5_0 port 1: cleared, device name now on PCI function 0000:10:00.1 (a driver restart registered the names in another order): its ports are reported under mlx5_1 now",
		"H InfiniBandStateCheck: Port mlx5_1 port 1: cleared, device name now on PCI function 0000:10:00.0 (a driver restart registered the names in another order): its ports are reported under mlx5_0 now",
		"N InfiniBandStateCheck: Port mlx5_0 port 1: state INIT, phys_state LinkUp",
		"F InfiniBandStateCheck: Port mlx5_1 port 1: state DOWN, phys_state Disabled",
	})
	wantEvents(t, "steady", poll(t, c), nil)
}

// standing follows the faults a run of polls raised to the healthy event
// of the same check and entities that lifts each (events.EntityKey): what
// is left stands in the quarantine.
type standing map[string]string

func (s standing) add(evs []*datamodels.HealthEvent) {
	for _, ev := range evs {
		key := ev.GetCheckName() + " " + events.EntityKey(ev)
		if ev.GetIsHealthy() {
			delete(s, key)
		} else {
			s[key] = brief(ev)
		}
	}
}

// TestDriverRestartSwapsNamesWithCardRecovery: dual-PF cards, PF1
// uncabled on every card. Card 0x10 is reported below its peers with both
// its ports (PF1's uncabled one with its card): PF0 hard down after a
// boot, or the HCA unreadable past the hold-down. A driver restart fixes
// it and swaps mlx5_0 ↔ mlx5_1 (at run time or while the agent was
// down), or swaps them with PF0 still down, fixed later: the card is back
// at peer mode, and each name's fault is lifted.
// mlx5_0, PF1's name now, was reported fatal again (its port uncabled,
// DOWN/Polling, taken for a fault carried over), never cleared.
func TestDriverRestartSwapsNamesWithCardRecovery(t *testing.T) {
	for _, how := range []string{"PF0 down", "PF0 down, fixed later", "unreadable"} {
		for _, restart := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/restarted=%v", how, restart), func(t *testing.T) {
				p := dualPFUncabled()
				e := setup(t, p)
				faults := standing{}
				if how != "unreadable" {
					must(t, e.tree.SetPort("mlx5_0", 1, nictest.Down, nictest.Disabled))
				} else {
					unreadable(t, filepath.Join(e.tree.PortDir("mlx5_0", 1), "state"))
					unreadable(t, filepath.Join(e.tree.PortDir("mlx5_1", 1), "state"))
				}
				c := e.check()
				for range 14 {
					faults.add(allEvents(t, c))
					e.now = e.now.Add(time.Minute)
				}
				for _, want := range []string{"InfiniBandStateCheck PCI=0000:10:00,NIC=mlx5_0,NIC=mlx5_1", "InfiniBandStateCheck NIC=mlx5_1,NICPort=1"} {
					if _, ok := faults[want]; !ok {
						t.Fatalf("card 0x10: faults %q, want [%s] among them", faults, want)
					}
				}
				if how == "PF0 down, fixed later" {
					// Swapped still down first: PF0's fault is reported
					// under mlx5_1 with its card, which stays below.
					swapNames(t, e.tree, withPort(p.Devices[0], nictest.Down, nictest.Disabled), p.Devices[1])
					faults.add(allEvents(t, c))
					if _, ok := faults["InfiniBandStateCheck NIC=mlx5_1,NICPort=1"]; !ok {
						t.Errorf("swapped, PF0 still down: faults %q, want PF0's under mlx5_1", faults)
					}
					must(t, e.tree.SetPort("mlx5_1", 1, nictest.Active, nictest.LinkUp))
				} else {
					swapNames(t, e.tree, p.Devices[0], p.Devices[1])
				}
				if restart {
					c = e.check()
				}
				for range 3 {
					faults.add(allEvents(t, c))
					e.now = e.now.Add(time.Minute)
				}
				if len(faults) > 0 {
					t.Errorf("fixed and swapped: faults never lifted: %q", faults)
				}
			})
		}
	}
}

// dualPFUncabled is dualPF with every card's PF1 uncabled (DOWN/Polling).
func dualPFUncabled() nictest.Platform {
	p := dualPF()
	for i := 1; i < len(p.Devices); i += 2 {
		p.Devices[i] = withPort(p.Devices[i], nictest.Down, nictest.Polling)
	}
	return p
}
