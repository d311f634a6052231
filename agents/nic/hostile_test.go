package nic

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/agents/nic/nictest"
)

// unreadable makes a sysfs file fail to read (EISDIR), as a file that
// answers EIO while the firmware is busy or a reset is under way; the
// returned func restores it with v.
func unreadable(t *testing.T, path string) func(v string) {
	t.Helper()
	must(t, os.Remove(path))
	must(t, os.Mkdir(path, 0o755))
	return func(v string) {
		t.Helper()
		must(t, os.Remove(path))
		must(t, os.WriteFile(path, []byte(v+"\n"), 0o644))
	}
}

// TestCounterReadFailureKeepsSnapshot: a link_downed read that fails for a
// poll (a firmware query that times out, often during the very link trouble
// the counter counts) must not forget the last reading: the increase seen
// at the next good read is reported (Appendix A: link_downed delta > 0).
func TestCounterReadFailureKeepsSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name    string
		counter string
		dir     string
	}{
		{"link_downed", CounterLinkDowned, "counters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, small())
			c := e.check()
			poll(t, c)
			restore := unreadable(t, filepath.Join(e.tree.PortDir("mlx5_0", 1), tc.dir, tc.counter))
			wantEvents(t, "unreadable", poll(t, c), nil)
			restore("1")
			wantEvents(t, "readable again, increased", poll(t, c), []string{
				"F InfiniBandDegradationCheck: Port mlx5_0 port 1: link_downed increased by 1 (now 1)"})
			// Across a restart too: the snapshot persisted while unreadable.
			restore = unreadable(t, filepath.Join(e.tree.PortDir("mlx5_0", 1), tc.dir, tc.counter))
			poll(t, c)
			restore("3")
			wantEvents(t, "after restart", poll(t, e.check()), []string{
				"F InfiniBandDegradationCheck: Port mlx5_0 port 1: link_downed increased by 2 (now 3) while the agent was not running: counted as one down (when each happened is not known)"})
		})
	}
}

// TestPortStateUnreadableOrGarbled: a state or phys_state that cannot be
// read, or holds no "<id>: <name>" (empty, truncated), says nothing about
// the port: no transition, no duplicate fatal, and no card below its peer
// mode on a first poll (a false REPLACE_VM; §4.1.2 prefers missing a
// failure to a false REPLACE_VM).
func TestPortStateUnreadableOrGarbled(t *testing.T) {
	type bad struct {
		file, v string // v "" with unreadable: EISDIR
		unread  bool
	}
	for _, tc := range []struct {
		name string
		bad  bad
	}{
		{"state unreadable", bad{file: "state", unread: true}},
		{"phys_state unreadable", bad{file: "phys_state", unread: true}},
		{"state empty", bad{file: "state", v: ""}},
		{"state truncated", bad{file: "state", v: "4"}},
		{"phys_state whitespace", bad{file: "phys_state", v: " \n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, small())
			path := filepath.Join(e.tree.PortDir("mlx5_1", 1), tc.bad.file)
			orig, err := os.ReadFile(path)
			must(t, err)
			spoil := func() func() {
				if tc.bad.unread {
					r := unreadable(t, path)
					return func() { r(string(orig[:len(orig)-1])) }
				}
				must(t, os.WriteFile(path, []byte(tc.bad.v), 0o644))
				return func() { must(t, os.WriteFile(path, orig, 0o644)) }
			}
			// First poll: the unreadable port is not counted against its card.
			restore := spoil()
			c := e.check()
			wantEvents(t, "first poll", poll(t, c), without(baselines(), "mlx5_1"))
			restore()
			wantEvents(t, "readable", poll(t, c), []string{"H InfiniBandStateCheck: Port mlx5_1 port 1: healthy (ACTIVE, LinkUp)",
				degrBaseline(InfiniBandDegradationCheck, "mlx5_1")})
			// Healthy port: a bad read is no transition.
			restore = spoil()
			wantEvents(t, "healthy, bad read", poll(t, c), nil)
			restore()
			wantEvents(t, "healthy again", poll(t, c), nil)
			// Fatal port: a bad read between two DOWN reads is no second fatal.
			must(t, e.tree.SetPort("mlx5_1", 1, nictest.Down, nictest.Polling))
			wantEvents(t, "down", poll(t, c), []string{"F InfiniBandStateCheck: Port mlx5_1 port 1: state DOWN, phys_state Polling"})
			orig, err = os.ReadFile(path)
			must(t, err)
			restore = spoil()
			wantEvents(t, "down, bad read", poll(t, c), nil)
			restore()
			wantEvents(t, "still down", poll(t, c), nil)
		})
	}
}

// TestDeviceWithoutPortsYet: a device caught between its class link and its
// ports (the IB core adds ports/ after the device: a driver load, reload or
// hot-plug) is not cached portless: it is read again once its ports exist,
// and is no card with 0 active ports on a first poll.
func TestDeviceWithoutPortsYet(t *testing.T) {
	e := setup(t, small())
	ports := filepath.Join(e.tree.Root, "class/infiniband/mlx5_2/ports")
	hidden := filepath.Join(e.dir, "ports-mlx5_2")
	must(t, os.Rename(ports, hidden))
	must(t, os.Mkdir(ports, 0o755))
	c := e.check()
	wantEvents(t, "first poll, no ports yet", poll(t, c), without(baselines(), "mlx5_2"))
	must(t, os.Remove(ports))
	must(t, os.Rename(hidden, ports))
	wantEvents(t, "ports added", poll(t, c), []string{"H InfiniBandStateCheck: Port mlx5_2 port 1: healthy (ACTIVE, LinkUp)",
		degrBaseline(InfiniBandDegradationCheck, "mlx5_2")})
	must(t, e.tree.SetPort("mlx5_2", 1, nictest.Down, nictest.Disabled))
	wantEvents(t, "down", poll(t, c), []string{"F InfiniBandStateCheck: Port mlx5_2 port 1: state DOWN, phys_state Disabled"})
}

// renameDevice renames an IB device as the kernel does (ib_device_rename:
// rdma-core's udev rule turning mlx5_N into ibpXsY, `rdma dev set name`):
// same PCI function, new class name.
func renameDevice(t *testing.T, tree *nictest.Tree, from, to string) {
	t.Helper()
	link := filepath.Join(tree.Root, "class/infiniband", from)
	target, err := os.Readlink(link)
	must(t, err)
	real, err := filepath.EvalSymlinks(link)
	must(t, err)
	must(t, os.Rename(real, filepath.Join(filepath.Dir(real), to)))
	must(t, os.Remove(link))
	must(t, os.Symlink(filepath.Join(filepath.Dir(target), to), filepath.Join(tree.Root, "class/infiniband", to)))
}

// TestRenamedDeviceIsNotDisappeared: a device renamed in place (same PCI
// function now listed under another name) did not fall off the bus (§7:
// disappearance is a hardware failure): no fatal for the old name, which
// would never be cleared, at runtime or across a restart.
func TestRenamedDeviceIsNotDisappeared(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(map[bool]string{false: "runtime", true: "across restart"}[restart], func(t *testing.T) {
			e := setup(t, small())
			c := e.check()
			poll(t, c)
			renameDevice(t, e.tree, "mlx5_2", "ibp48s0")
			if restart {
				c = e.check()
			}
			wantEvents(t, "renamed", poll(t, c), []string{"H InfiniBandStateCheck: Port ibp48s0 port 1: healthy (ACTIVE, LinkUp)",
				degrBaseline(InfiniBandDegradationCheck, "ibp48s0")})
			// A real disappearance is still one.
			must(t, e.tree.Remove("ibp48s0"))
			wantEvents(t, "removed", e.pollGone(t, c), []string{"F InfiniBandStateCheck: NIC ibp48s0 disappeared from /sys/class/infiniband/ - hardware failure"})
		})
	}
}

// TestDisappearedThenBackRenamed: a device reported gone that comes back on
// its PCI function under another name (an mlx5 reset, then udev's rename)
// gets its NIC fatal cleared.
func TestDisappearedThenBackRenamed(t *testing.T) {
	e := setup(t, small())
	c := e.check()
	poll(t, c)
	must(t, e.tree.Remove("mlx5_2"))
	wantEvents(t, "removed", e.pollGone(t, c), []string{"F InfiniBandStateCheck: NIC mlx5_2 disappeared from /sys/class/infiniband/ - hardware failure"})
	d := small().Devices[2]
	d.Name = "ibp48s0"
	must(t, e.tree.Add(d))
	c = e.check() // across a restart: the PCI function comes from the state file
	wantEvents(t, "back renamed", poll(t, c), []string{
		"H InfiniBandStateCheck: NIC mlx5_2 present again in /sys/class/infiniband/ as ibp48s0",
		"H InfiniBandStateCheck: Port ibp48s0 port 1: healthy (ACTIVE, LinkUp)",
		degrBaseline(InfiniBandDegradationCheck, "ibp48s0")})
	wantEvents(t, "steady", poll(t, c), nil)
}

// TestExcludedDeviceForgotten: a known device the agent no longer monitors
// (excluded by the config it restarted with) is forgotten: a fatal sent
// when it disappeared is cleared once it is back — nothing else would
// clear it, and the node stayed quarantined for a device the agent does
// not watch — and its later loss is not reported.
func TestExcludedDeviceForgotten(t *testing.T) {
	const gone = "F InfiniBandStateCheck: NIC mlx5_2 disappeared from /sys/class/infiniband/ - hardware failure"
	for _, tc := range []struct {
		name     string
		removed  bool   // mlx5_2 disappeared (reported) before the restart
		exclude  string // nic_exclusion_regex after the restart
		wantBack []string
	}{
		{"back, now excluded", true, "^mlx5_2$", []string{
			"H InfiniBandStateCheck: NIC mlx5_2 present again in /sys/class/infiniband/, no longer monitored (excluded: matches nic_exclusion_regex)"}},
		{"back, still monitored", true, DefaultConfig().ExclusionRegex, []string{
			"H InfiniBandStateCheck: NIC mlx5_2 present again in /sys/class/infiniband/"}},
		{"never gone, now excluded", false, "^mlx5_2$", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, small())
			c := e.check()
			poll(t, c)
			if tc.removed {
				must(t, e.tree.Remove("mlx5_2"))
				wantEvents(t, "removed", e.pollGone(t, c), []string{gone})
				must(t, e.tree.Add(small().Devices[2]))
			}
			e.cfg.ExclusionRegex = tc.exclude
			c = e.check()
			wantEvents(t, "after restart", poll(t, c), tc.wantBack)
			wantEvents(t, "steady", poll(t, c), nil)
			// Removed again: reported only while it is monitored.
			must(t, e.tree.Remove("mlx5_2"))
			var want []string
			if tc.exclude == DefaultConfig().ExclusionRegex {
				want = []string{gone}
			}
			wantEvents(t, "removed again", e.pollGone(t, c), want)
		})
	}
}

// TestRoCEBondIsNotDisappeared: both PFs of a dual-port card enslaved to
// one bond make mlx5 activate RoCE LAG: their RDMA devices go and one,
// mlx5_bond_0, is registered on the first PF's function. The first PF's
// device looks renamed; the second PF's vanished, its function still on
// the bus — configuration, not a hardware loss: no fatal. A bonded PF
// whose function leaves the bus is still one.
func TestRoCEBondIsNotDisappeared(t *testing.T) {
	p := small()
	var pfs []nictest.Device
	for i, nd := range []string{"ens7f0np0", "ens7f1np1"} {
		name := fmt.Sprintf("mlx5_%d", 6+i)
		pfs = append(pfs, nictest.Device{Name: name, PCI: fmt.Sprintf("0000:70:00.%d", i), Ports: []nictest.Port{{LinkLayer: nictest.Eth, NetDev: nd}}})
		p.Metadata.NICTopology[name] = []string{"NODE", "NODE"}
		p.Want[name] = "storage"
	}
	p.Devices = append(p.Devices, pfs...)
	p.Metadata.NICTopology["mlx5_bond_0"] = []string{"NODE", "NODE"}
	const bondPort = "H EthernetStateCheck: RoCE port mlx5_bond_0 port 1: healthy (ACTIVE, LinkUp, operstate up)"
	bondCounters := degrBaseline(EthernetDegradationCheck, "mlx5_bond_0")
	for _, tc := range []struct {
		name    string
		restart bool
		change  func(t *testing.T, e *env)
		want    []string
		gone    bool // a device no longer listed: held down first
	}{
		{"bonded at runtime", false, func(t *testing.T, e *env) { must(t, e.tree.Bond("bond0", "mlx5_bond_0", pfs...)) }, []string{bondPort, bondCounters}, false},
		{"bonded across a restart", true, func(t *testing.T, e *env) { must(t, e.tree.Bond("bond0", "mlx5_bond_0", pfs...)) }, []string{bondPort, bondCounters}, false},
		{"reported gone by an older agent, cleared", true, func(t *testing.T, e *env) {
			must(t, e.tree.Bond("bond0", "mlx5_bond_0", pfs...))
			st, _, _ := loadState(e.cfg.StateFile, "boot-1")
			st.Disappeared = []string{"mlx5_7"}
			var last []byte
			must(t, st.save(e.cfg.StateFile, &last))
		}, []string{"H EthernetStateCheck: NIC mlx5_7 present again in /sys/class/infiniband/ in mlx5_bond_0 (RoCE LAG: its PF bonded with mlx5_bond_0's)", bondPort, bondCounters}, false},
		{"enslaved without LAG, a PF off the bus", false, func(t *testing.T, e *env) {
			must(t, e.tree.Enslave("bond0", pfs[0].PCI, pfs[1].PCI))
			must(t, e.tree.Remove("mlx5_7"))
		}, []string{"F EthernetStateCheck: NIC mlx5_7 disappeared from /sys/class/infiniband/ - hardware failure"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, p)
			c := e.check()
			poll(t, c)
			tc.change(t, e)
			if tc.restart {
				c = e.check()
			}
			got := poll
			if tc.gone {
				got = e.pollGone
			}
			wantEvents(t, "changed", got(t, c), tc.want)
			wantEvents(t, "steady", poll(t, c), nil)
		})
	}
}

// TestPortUnreadablePastHoldDown: a port whose state cannot be read poll
// after poll (a hung mlx5 HCA answering EIO/ETIMEDOUT while the device
// still lists) is held down for cardHoldDown, then reported fatal, once,
// across a restart too, and counted inactive for its card (reported below
// its peer mode once that has stayed so for cardHoldDown); readable again,
// the port and its card are cleared.
func TestPortUnreadablePastHoldDown(t *testing.T) {
	e := setup(t, small())
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	c := clocked(t, e, &now)
	poll(t, c)
	restore := unreadable(t, filepath.Join(e.tree.PortDir("mlx5_1", 1), "state"))
	wantEvents(t, "unreadable", poll(t, c), nil)
	now = now.Add(cardHoldDown - time.Second)
	wantEvents(t, "held down", poll(t, c), nil)
	now = now.Add(time.Second)
	got := poll(t, c)
	if len(got) != 1 || !strings.HasPrefix(got[0], "F InfiniBandStateCheck: Port mlx5_1 port 1: state unreadable: read ") {
		t.Fatalf("past the hold-down: got %q, want the port's fatal", got)
	}
	now = now.Add(time.Minute)
	wantEvents(t, "reported once", poll(t, c), nil)
	c = clocked(t, e, &now) // a restart: the fault stands, not sent again
	wantEvents(t, "restarted", poll(t, c), nil)
	now = now.Add(cardHoldDown)
	wantEvents(t, "restarted, past the hold-down", poll(t, c), nil)
	now = now.Add(cardHoldDown)
	wantEvents(t, "card below its peers", poll(t, c), []string{"F InfiniBandStateCheck: Card 0000:20:00 (compute) has 0 active ports, expected 1 (peer mode)"})
	restore("4: ACTIVE")
	wantEvents(t, "readable", poll(t, c), []string{
		"H InfiniBandStateCheck: Card 0000:20:00 (compute) has 1 active ports, back at peer mode 1",
		"H InfiniBandStateCheck: Port mlx5_1 port 1: healthy (ACTIVE, LinkUp)",
	})
	// A short bad patch is never reported.
	restore = unreadable(t, filepath.Join(e.tree.PortDir("mlx5_1", 1), "state"))
	now = now.Add(cardHoldDown - time.Second)
	wantEvents(t, "bad read", poll(t, c), nil)
	restore("4: ACTIVE")
	now = now.Add(time.Minute)
	wantEvents(t, "good read", poll(t, c), nil)
	restore = unreadable(t, filepath.Join(e.tree.PortDir("mlx5_1", 1), "state"))
	now = now.Add(time.Minute)
	wantEvents(t, "bad read again: the hold-down starts again", poll(t, c), nil)
}

// TestUnreadableUncabledPortClearedWithItsCard: an HCA unreadable past the
// hold-down reports both ports fatal and its card below its peers; once it
// reads again, port 1 ACTIVE and port 2 uncabled as on its peer cards, port
// 2's fatal (the card's failure to read, not a link fault it saw) is
// cleared with the card: it stood for ever, the node quarantined.
func TestUnreadableUncabledPortClearedWithItsCard(t *testing.T) {
	p := small()
	for i := range p.Devices {
		p.Devices[i].Ports = append(p.Devices[i].Ports, nictest.Port{LinkLayer: p.Devices[i].Ports[0].LinkLayer, State: nictest.Down, PhysState: nictest.Disabled})
	}
	e := setup(t, p)
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	r1 := unreadable(t, filepath.Join(e.tree.PortDir("mlx5_0", 1), "state"))
	r2 := unreadable(t, filepath.Join(e.tree.PortDir("mlx5_0", 2), "state"))
	c := clocked(t, e, &now) // hung from boot: the first poll cannot read them
	var faults []string
	for range 14 {
		faults = append(faults, stateEvents(poll(t, c))...)
		now = now.Add(time.Minute)
	}
	if !slices.Contains(faults, "F InfiniBandStateCheck: Card 0000:10:00 (compute) has 0 active ports, expected 1 (peer mode)") ||
		!slices.ContainsFunc(faults, func(s string) bool {
			return strings.HasPrefix(s, "F InfiniBandStateCheck: Port mlx5_0 port 2: state unreadable")
		}) {
		t.Fatalf("unreadable from boot: %q, want the card's and each port's fatal", faults)
	}
	r1("4: ACTIVE")
	r2("1: DOWN")
	got := stateEvents(poll(t, c))
	if !slices.Contains(got, "H InfiniBandStateCheck: Port mlx5_0 port 2: cleared, uncabled as on its peer cards: not a fault") {
		t.Fatalf("readable again: %q, want port 2 cleared with its card", got)
	}
}

// TestUnreadableCabledPortNotCleared: a port cabled on this card only (its
// peers' is uncabled) that was ACTIVE before its HCA hung and reads DOWN
// once the HCA is back lost its link: its fatal stands when its card
// recovers, not cleared as uncabled.
func TestUnreadableCabledPortNotCleared(t *testing.T) {
	p := small()
	for i := range p.Devices {
		st, ph := nictest.Down, nictest.Disabled
		if i == 0 {
			st, ph = nictest.Active, nictest.LinkUp
		}
		p.Devices[i].Ports = append(p.Devices[i].Ports, nictest.Port{LinkLayer: p.Devices[i].Ports[0].LinkLayer, State: st, PhysState: ph})
	}
	e := setup(t, p)
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	c := clocked(t, e, &now)
	poll(t, c)
	r1 := unreadable(t, filepath.Join(e.tree.PortDir("mlx5_0", 1), "state"))
	r2 := unreadable(t, filepath.Join(e.tree.PortDir("mlx5_0", 2), "state"))
	for range 14 {
		now = now.Add(time.Minute)
		poll(t, c)
	}
	r1("4: ACTIVE")
	r2("1: DOWN")
	must(t, e.tree.SetPort("mlx5_0", 2, nictest.Down, nictest.Disabled))
	now = now.Add(time.Minute)
	for _, ev := range stateEvents(poll(t, c)) {
		if strings.Contains(ev, "port 2") && strings.HasPrefix(ev, "H ") {
			t.Errorf("back, port 2 down: %s (its link was lost: the fault stands)", ev)
		}
	}
}
