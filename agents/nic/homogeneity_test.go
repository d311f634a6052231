package nic

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
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

// clockedCheck is e.check() on a clock that moves step forward before
// each of its polls (through tick).
func (e *env) clockedCheck(step time.Duration) (*Check, func() []string) {
	e.t.Helper()
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	c, err := New(e.cfg, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now: func() time.Time { return now }})
	if err != nil {
		e.t.Fatal(err)
	}
	return c, func() []string {
		now = now.Add(step)
		return poll(e.t, c)
	}
}

// cardFatals are the card events (below peer mode) of a poll's events.
func cardFatals(evs []string) []string {
	var out []string
	for _, s := range evs {
		if strings.HasPrefix(s, "F ") && strings.Contains(s, ": Card ") {
			out = append(out, s)
		}
	}
	return out
}

// TestCardBelowPeersAfterFirstPoll: the card homogeneity check (§4.3) runs
// on every poll, not only a first one: a card that falls below its role's
// peer mode later — a port dead at boot while its peers still waited for
// the SM (nothing looked wrong then), a port stuck in INIT/ARMED or
// LinkErrorRecovery at runtime (§3.2, Appendix A), a card left out of a
// first poll by an unreadable port — is reported fatal once it stays below
// for cardHoldDown, across an agent restart too, and cleared when back.
func TestCardBelowPeersAfterFirstPoll(t *testing.T) {
	const step = cardHoldDown / 2 // two polls below: reported
	t.Run("port dead at boot while links come up", func(t *testing.T) {
		for _, restart := range []bool{false, true} {
			e := setup(t, small())
			for _, d := range []string{"mlx5_0", "mlx5_1", "mlx5_2"} {
				must(t, e.tree.SetPort(d, 1, nictest.Init, nictest.LinkUp))
			}
			must(t, e.tree.SetPort("mlx5_3", 1, nictest.Down, nictest.Polling))
			_, tick := e.clockedCheck(step)
			if got := cardFatals(tick()); got != nil {
				t.Fatalf("first poll (peer mode 0): %q", got)
			}
			for _, d := range []string{"mlx5_0", "mlx5_1", "mlx5_2"} {
				must(t, e.tree.SetPort(d, 1, nictest.Active, nictest.LinkUp))
			}
			if restart {
				_, tick = e.clockedCheck(step)
			}
			var got []string
			for range 3 {
				got = append(got, cardFatals(tick())...)
			}
			wantEvents(t, "peers active", got, []string{"F InfiniBandStateCheck: Card 0000:40:00 (compute) has 0 active ports, expected 1 (peer mode)"})
		}
	})
	t.Run("port stuck in INIT at runtime", func(t *testing.T) {
		for _, phys := range []string{nictest.LinkUp, nictest.LinkErr} {
			e := setup(t, small())
			_, tick := e.clockedCheck(step)
			wantEvents(t, "first poll", tick(), baselines())
			state := nictest.Init
			if phys == nictest.LinkErr {
				state = nictest.Active
			}
			must(t, e.tree.SetPort("mlx5_0", 1, state, phys))
			wantEvents(t, "stuck, poll 1", tick(), []string{"N InfiniBandStateCheck: Port mlx5_0 port 1: state " + strings.SplitN(state, " ", 2)[1] + ", phys_state " + strings.SplitN(phys, " ", 2)[1]})
			wantEvents(t, "stuck, poll 2 (held down)", tick(), nil)
			card := []string{"F InfiniBandStateCheck: Card 0000:10:00 (compute) has 0 active ports, expected 1 (peer mode)"}
			wantEvents(t, "stuck, poll 3", tick(), card)
			wantEvents(t, "stuck, poll 4", tick(), nil)
			wantEvents(t, "stuck, poll 5", tick(), nil)
			must(t, e.tree.SetPort("mlx5_0", 1, nictest.Active, nictest.LinkUp))
			wantEvents(t, "back", tick(), []string{
				"H InfiniBandStateCheck: Card 0000:10:00 (compute) has 1 active ports, back at peer mode 1",
				"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)",
			})
			// A short dip is held down and never reported.
			must(t, e.tree.SetPort("mlx5_0", 1, state, phys))
			tick()
			must(t, e.tree.SetPort("mlx5_0", 1, nictest.Active, nictest.LinkUp))
			tick()
			must(t, e.tree.SetPort("mlx5_0", 1, state, phys))
			if got := cardFatals(tick()); got != nil {
				t.Errorf("dip after a recovery: the hold-down starts again, got %q", got)
			}
		}
	})
	t.Run("PF unreadable on the first poll, sibling down", func(t *testing.T) {
		e := setup(t, dualPF())
		path := filepath.Join(e.tree.PortDir("mlx5_0", 1), "state")
		orig, err := os.ReadFile(path)
		must(t, err)
		must(t, os.WriteFile(path, nil, 0o644))
		must(t, e.tree.SetPort("mlx5_1", 1, nictest.Down, nictest.Polling))
		_, tick := e.clockedCheck(step)
		tick()
		must(t, os.WriteFile(path, orig, 0o644))
		var got []string
		for range 3 {
			got = append(got, cardFatals(tick())...)
		}
		wantEvents(t, "readable", got, []string{"F InfiniBandStateCheck: Card 0000:10:00 (compute) has 1 active ports, expected 2 (peer mode)"})
	})
}

// TestFirstPollWaitsForSM: a first poll without usable state (often right
// after a reboot, the remediation's own) finds ports the subnet manager
// has not activated yet — IB INIT or ARMED, a link still training (DOWN
// and Polling), RoCE INIT/ARMED — while their peers are ACTIVE: normal
// (§3.2), so their card is held down as on any other poll and reported
// only if still short after cardHoldDown. A card short of a port that is
// hard down (DOWN/Disabled) or missing is reported at once (§7.2 Case 3).
func TestFirstPollWaitsForSM(t *testing.T) {
	const step = cardHoldDown / 2
	ib0 := "F InfiniBandStateCheck: Card 0000:10:00 (compute) has 0 active ports, expected 1 (peer mode)"
	// dualPort is small() with a second port on each card, uncabled and
	// Disabled on every one (as mlx5 shows a RoCE port without carrier).
	dualPort := func() nictest.Platform {
		p := small()
		for i := range p.Devices {
			p.Devices[i].Ports = append(p.Devices[i].Ports, nictest.Port{LinkLayer: p.Devices[i].Ports[0].LinkLayer, State: nictest.Down, PhysState: nictest.Disabled})
		}
		return p
	}
	for _, tc := range []struct {
		name        string
		p           nictest.Platform
		dev         string // its port 1 set to state, phys
		state, phys string
		remove      string
		now         bool // reported on the first poll
		card        string
	}{
		{"IB INIT", small(), "mlx5_0", nictest.Init, nictest.LinkUp, "", false, ib0},
		{"IB ARMED", small(), "mlx5_0", nictest.Armed, nictest.LinkUp, "", false, ib0},
		{"IB link training", small(), "mlx5_0", nictest.Down, nictest.Polling, "", false, ib0},
		{"IB INIT, link error recovery", small(), "mlx5_0", nictest.Init, nictest.LinkErr, "", false, ib0},
		{"RoCE INIT", small(), "mlx5_4", nictest.Init, nictest.LinkUp, "", false, "F EthernetStateCheck: Card 0000:50:00 (storage) has 0 active ports, expected 1 (peer mode)"},
		{"RoCE ARMED", small(), "mlx5_4", nictest.Armed, nictest.LinkUp, "", false, "F EthernetStateCheck: Card 0000:50:00 (storage) has 0 active ports, expected 1 (peer mode)"},
		{"IB INIT, peers' second port Disabled too", dualPort(), "mlx5_0", nictest.Init, nictest.LinkUp, "", false, ib0},
		{"RoCE DOWN/Disabled (netdev not up yet)", small(), "mlx5_4", nictest.Down, nictest.Disabled, "", false, "F EthernetStateCheck: Card 0000:50:00 (storage) has 0 active ports, expected 1 (peer mode)"},
		{"RoCE DOWN/Disabled, second ports Disabled", dualPort(), "mlx5_4", nictest.Down, nictest.Disabled, "", false, "F EthernetStateCheck: Card 0000:50:00 (storage) has 0 active ports, expected 1 (peer mode)"},
		{"IB DOWN/Disabled", small(), "mlx5_0", nictest.Down, nictest.Disabled, "", true, ib0},
		{"IB DOWN/Disabled, second ports Disabled", dualPort(), "mlx5_0", nictest.Down, nictest.Disabled, "", true, ib0},
		{"PF missing", dualPF(), "", "", "", "mlx5_1", true, "F InfiniBandStateCheck: Card 0000:10:00 (compute) has 1 active ports, expected 2 (peer mode)"},
		{"PF missing, the other INIT", dualPF(), "mlx5_0", nictest.Init, nictest.LinkUp, "mlx5_1", true, "F InfiniBandStateCheck: Card 0000:10:00 (compute) has 0 active ports, expected 2 (peer mode)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, tc.p)
			if tc.dev != "" {
				must(t, e.tree.SetPort(tc.dev, 1, tc.state, tc.phys))
			}
			if tc.remove != "" {
				must(t, e.tree.Remove(tc.remove))
			}
			_, tick := e.clockedCheck(step)
			var want []string
			if tc.now {
				want = []string{tc.card}
			}
			first := tick()
			wantEvents(t, "first poll", cardFatals(first), want)
			for _, ev := range first {
				if !tc.now && strings.HasPrefix(ev, "F ") {
					t.Errorf("first poll, held down: fatal %q (a port of a held card is no fault yet)", ev)
				}
			}
			wantEvents(t, "held down", cardFatals(tick()), nil)
			if !tc.now {
				want = []string{tc.card}
			} else {
				want = nil
			}
			wantEvents(t, "past the hold-down", cardFatals(tick()), want)
		})
	}
}

// TestCardWithoutPCIAddress: a device whose PCI address cannot be read
// (no device link, no uevent; monitored only when named by
// nic_inclusion_regex_override, its NUMA node unknown) is a card of its
// own, keyed by its name: below its peer mode on a first poll, its port
// is reported with it, as on any card.
func TestCardWithoutPCIAddress(t *testing.T) {
	e := setup(t, small())
	e.cfg.InclusionRegexOverride = "^mlx5_[0-3]$"
	must(t, os.Remove(filepath.Join(e.tree.Root, "class/infiniband/mlx5_0/device")))
	must(t, e.tree.SetPort("mlx5_0", 1, nictest.Down, nictest.Disabled))
	c := e.check()
	got := poll(t, c)
	if n := c.NICs()[0]; n.Name != "mlx5_0" || n.PCIAddress != "" || !n.Monitored {
		t.Fatalf("fixture: %+v", n)
	}
	want := []string{"F InfiniBandStateCheck: Card mlx5_0 (override) has 0 active ports, expected 1 (peer mode)",
		"F InfiniBandStateCheck: Port mlx5_0 port 1: state DOWN, phys_state Disabled"}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("first poll: missing %q in %q", w, got)
		}
	}
}

// TestHeldPortReportedWithItsCard: a first poll holding a card down (its
// port still training or waiting for the SM, TestFirstPollWaitsForSM)
// holds that port's own event too; still unhealthy when the card is
// reported past the hold-down, the port is reported with it — its own
// fault, which stands if the card's is cleared later — and a port that
// comes up within the hold-down sends what any port coming up does, its
// healthy event, no fault. An agent restarted (same boot) mid-hold-down
// keeps the port held and reports it with its card all the same.
func TestHeldPortReportedWithItsCard(t *testing.T) {
	const step = cardHoldDown / 2
	card := "F InfiniBandStateCheck: Card 0000:10:00 (compute) has 0 active ports, expected 1 (peer mode)"
	stateOf := func(evs []string) []string {
		return slices.DeleteFunc(slices.Clone(evs), func(s string) bool {
			return !strings.Contains(s, " InfiniBandStateCheck: ") || !strings.Contains(s, "mlx5_0") && !strings.Contains(s, "0000:10:00")
		})
	}
	for _, tc := range []struct {
		name        string
		state, phys string
		port        string
	}{
		{"DOWN/Polling", nictest.Down, nictest.Polling, "F InfiniBandStateCheck: Port mlx5_0 port 1: state DOWN, phys_state Polling"},
		{"INIT", nictest.Init, nictest.LinkUp, "N InfiniBandStateCheck: Port mlx5_0 port 1: state INIT, phys_state LinkUp"},
	} {
		t.Run(tc.name+", still down", func(t *testing.T) {
			e := setup(t, small())
			must(t, e.tree.SetPort("mlx5_0", 1, tc.state, tc.phys))
			_, tick := e.clockedCheck(step)
			wantEvents(t, "first poll, held down", stateOf(tick()), nil)
			wantEvents(t, "held down", stateOf(tick()), nil)
			wantEvents(t, "past the hold-down", stateOf(tick()), []string{card, tc.port})
			for range 3 {
				wantEvents(t, "steady", stateOf(tick()), nil)
			}
		})
		t.Run(tc.name+", up within the hold-down", func(t *testing.T) {
			e := setup(t, small())
			must(t, e.tree.SetPort("mlx5_0", 1, tc.state, tc.phys))
			_, tick := e.clockedCheck(step / 2)
			wantEvents(t, "first poll, held down", stateOf(tick()), nil)
			must(t, e.tree.SetPort("mlx5_0", 1, nictest.Active, nictest.LinkUp))
			wantEvents(t, "up", stateOf(tick()), []string{"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)"})
			for range 4 {
				wantEvents(t, "steady", stateOf(tick()), nil)
			}
		})
		t.Run(tc.name+", up within the hold-down, uncabled port held with it", func(t *testing.T) {
			// Each card's second port uncabled (Disabled, not on its way
			// up): held with its card, it is no fault once the card is
			// back at its peer mode, as on a card at mode.
			p := small()
			for i := range p.Devices {
				p.Devices[i].Ports = append(p.Devices[i].Ports, nictest.Port{LinkLayer: p.Devices[i].Ports[0].LinkLayer, State: nictest.Down, PhysState: nictest.Disabled})
			}
			e := setup(t, p)
			must(t, e.tree.SetPort("mlx5_0", 1, tc.state, tc.phys))
			_, tick := e.clockedCheck(step / 2)
			wantEvents(t, "first poll, held down", stateOf(tick()), nil)
			must(t, e.tree.SetPort("mlx5_0", 1, nictest.Active, nictest.LinkUp))
			wantEvents(t, "up", stateOf(tick()), []string{"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)"})
			for range 4 {
				wantEvents(t, "steady", stateOf(tick()), nil)
			}
		})
		for _, uncabled := range []string{nictest.Disabled, nictest.Polling} {
			t.Run(tc.name+", still down, uncabled port "+strings.SplitN(uncabled, " ", 2)[1]+" held with it", func(t *testing.T) {
				// Each card's second port uncabled (DOWN and Disabled or
				// Polling on every card): down as on the peers at mode,
				// it is no fault of the card held down either, not
				// reported with it — a fault nothing would ever lift once
				// port 1 comes up.
				p := small()
				for i := range p.Devices {
					p.Devices[i].Ports = append(p.Devices[i].Ports, nictest.Port{LinkLayer: p.Devices[i].Ports[0].LinkLayer, State: nictest.Down, PhysState: uncabled})
				}
				e := setup(t, p)
				must(t, e.tree.SetPort("mlx5_0", 1, tc.state, tc.phys))
				_, tick := e.clockedCheck(step)
				wantEvents(t, "first poll, held down", stateOf(tick()), nil)
				wantEvents(t, "held down", stateOf(tick()), nil)
				wantEvents(t, "past the hold-down", stateOf(tick()), []string{card, tc.port})
				wantEvents(t, "steady", stateOf(tick()), nil)
				must(t, e.tree.SetPort("mlx5_0", 1, nictest.Active, nictest.LinkUp))
				wantEvents(t, "up", stateOf(tick()), []string{
					"H InfiniBandStateCheck: Card 0000:10:00 (compute) has 1 active ports, back at peer mode 1",
					"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)",
				})
				for range 3 {
					wantEvents(t, "steady", stateOf(tick()), nil)
				}
			})
		}
		t.Run(tc.name+", restarted mid-hold-down", func(t *testing.T) {
			e := setup(t, small())
			must(t, e.tree.SetPort("mlx5_0", 1, tc.state, tc.phys))
			now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
			wantEvents(t, "first poll, held down", stateOf(poll(t, clocked(t, e, &now))), nil)
			now = now.Add(step)
			c := clocked(t, e, &now) // same boot: over the persisted state
			wantEvents(t, "restart, held down", stateOf(poll(t, c)), nil)
			now = now.Add(step)
			wantEvents(t, "restart, still held down", stateOf(poll(t, c)), nil)
			now = now.Add(step)
			wantEvents(t, "past the hold-down", stateOf(poll(t, c)), []string{card, tc.port})
			now = now.Add(step)
			wantEvents(t, "steady", stateOf(poll(t, c)), nil)
		})
	}
}

// TestUncabledPortClearedWithItsCard: a card reported below its peer mode
// reports its unhealthy ports with it (§3.4), a port uncabled on every
// card too (a first poll finds port 1 DOWN/Disabled: the card and both
// ports fatal at once). Once the card is back at its peer mode, that port
// — still down as the same port is on its peers at mode — gets a healthy
// event saying so, and is kept as an uncabled port: no fault stands that
// nothing would ever lift. Also after an agent restart over the state,
// and for a card flagged at runtime past the hold-down (its device first
// seen then, its ports reported at once). A
// port down while the same port is ACTIVE on most of the other cards at
// mode (the card itself is not its own peer) stays reported.
func TestUncabledPortClearedWithItsCard(t *testing.T) {
	stateOf := func(evs []string) []string {
		return slices.DeleteFunc(slices.Clone(evs), func(s string) bool {
			return !strings.Contains(s, " InfiniBandStateCheck: ") || !strings.Contains(s, "mlx5_0") && !strings.Contains(s, "0000:10:00")
		})
	}
	dualPort := func(phys string) nictest.Platform {
		p := small()
		for i := range p.Devices {
			p.Devices[i].Ports = append(p.Devices[i].Ports, nictest.Port{LinkLayer: p.Devices[i].Ports[0].LinkLayer, State: nictest.Down, PhysState: phys})
		}
		return p
	}
	for _, uncabled := range []string{nictest.Disabled, nictest.Polling} {
		ph := strings.SplitN(uncabled, " ", 2)[1]
		for _, restart := range []bool{false, true} {
			name := "port 2 DOWN/" + ph
			if restart {
				name += ", restarted"
			}
			t.Run(name, func(t *testing.T) {
				e := setup(t, dualPort(uncabled))
				must(t, e.tree.SetPort("mlx5_0", 1, nictest.Down, nictest.Disabled))
				_, tick := e.clockedCheck(time.Minute)
				wantEvents(t, "first poll", stateOf(tick()), []string{
					"F InfiniBandStateCheck: Card 0000:10:00 (compute) has 0 active ports, expected 1 (peer mode)",
					"F InfiniBandStateCheck: Port mlx5_0 port 1: state DOWN, phys_state Disabled",
					"F InfiniBandStateCheck: Port mlx5_0 port 2: state DOWN, phys_state " + ph,
				})
				wantEvents(t, "steady", stateOf(tick()), nil)
				if restart {
					_, tick = e.clockedCheck(time.Minute)
				}
				must(t, e.tree.SetPort("mlx5_0", 1, nictest.Active, nictest.LinkUp))
				wantEvents(t, "port 1 fixed", stateOf(tick()), []string{
					"H InfiniBandStateCheck: Card 0000:10:00 (compute) has 1 active ports, back at peer mode 1",
					"H InfiniBandStateCheck: Port mlx5_0 port 2: cleared, uncabled as on its peer cards: not a fault",
					"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)",
				})
				for range 3 {
					wantEvents(t, "steady", stateOf(tick()), nil)
				}
				// Cabled later: its healthy event, as any port coming up.
				must(t, e.tree.SetPort("mlx5_0", 2, nictest.Active, nictest.LinkUp))
				wantEvents(t, "port 2 cabled", stateOf(tick()), []string{"H InfiniBandStateCheck: Port mlx5_0 port 2: healthy (ACTIVE, LinkUp)"})
			})
		}
	}
	t.Run("device first seen at runtime, card flagged past the hold-down", func(t *testing.T) {
		// Its ports are first observations on a card below its peer
		// mode: both reported at once, the card past the hold-down.
		p := dualPort(nictest.Disabled)
		d0 := p.Devices[0]
		e := setup(t, p)
		must(t, e.tree.Remove("mlx5_0"))
		_, tick := e.clockedCheck(time.Minute)
		tick()
		d0.Ports[0].State, d0.Ports[0].PhysState = nictest.Down, nictest.Polling
		must(t, e.tree.Add(d0))
		wantEvents(t, "device seen", stateOf(tick()), []string{
			"F InfiniBandStateCheck: Port mlx5_0 port 1: state DOWN, phys_state Polling",
			"F InfiniBandStateCheck: Port mlx5_0 port 2: state DOWN, phys_state Disabled",
		})
		var got []string
		for range 6 {
			got = append(got, stateOf(tick())...)
		}
		wantEvents(t, "past the hold-down", got, []string{"F InfiniBandStateCheck: Card 0000:10:00 (compute) has 0 active ports, expected 1 (peer mode)"})
		must(t, e.tree.SetPort("mlx5_0", 1, nictest.Active, nictest.LinkUp))
		wantEvents(t, "port 1 up", stateOf(tick()), []string{
			"H InfiniBandStateCheck: Card 0000:10:00 (compute) has 1 active ports, back at peer mode 1",
			"H InfiniBandStateCheck: Port mlx5_0 port 2: cleared, uncabled as on its peer cards: not a fault",
			"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)",
		})
		wantEvents(t, "steady", stateOf(tick()), nil)
	})
	// port1DownAndBack takes mlx5_0's port 1 down past the hold-down (its
	// fault, then its card's) and up again (both lifted): nothing of port 2.
	port1DownAndBack := func(t *testing.T, e *env, tick func() []string) {
		t.Helper()
		must(t, e.tree.SetPort("mlx5_0", 1, nictest.Down, nictest.Disabled))
		var got []string
		for range 7 {
			got = append(got, stateOf(tick())...)
		}
		wantEvents(t, "port 1 down", got, []string{
			"F InfiniBandStateCheck: Port mlx5_0 port 1: state DOWN, phys_state Disabled",
			"F InfiniBandStateCheck: Card 0000:10:00 (compute) has 0 active ports, expected 1 (peer mode)",
		})
		must(t, e.tree.SetPort("mlx5_0", 1, nictest.Active, nictest.LinkUp))
		wantEvents(t, "port 1 up", stateOf(tick()), []string{
			"H InfiniBandStateCheck: Card 0000:10:00 (compute) has 1 active ports, back at peer mode 1",
			"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)",
		})
	}
	t.Run("port 1 down at runtime, port 2 never reported", func(t *testing.T) {
		// Port 2 saved uncabled by the first poll (its card at mode):
		// no fault of its to lift when the card is back.
		e := setup(t, dualPort(nictest.Disabled))
		_, tick := e.clockedCheck(time.Minute)
		wantEvents(t, "first poll", stateOf(tick()), []string{"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)"})
		port1DownAndBack(t, e, tick)
	})
	t.Run("port 2 cabled on this card only, its own fault", func(t *testing.T) {
		// mlx5_0 uses both ports, its peers port 1 only (peer mode 1,
		// their port 2 uncabled). Its port 2 losing its cable is its own
		// fault, reported before its card was: port 1 going down and
		// back later does not lift it, however its peers' port 2 stands.
		p := dualPort(nictest.Disabled)
		p.Devices[0].Ports[1].State, p.Devices[0].Ports[1].PhysState = nictest.Active, nictest.LinkUp
		e := setup(t, p)
		_, tick := e.clockedCheck(time.Minute)
		wantEvents(t, "first poll", stateOf(tick()), []string{
			"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)",
			"H InfiniBandStateCheck: Port mlx5_0 port 2: healthy (ACTIVE, LinkUp)",
		})
		must(t, e.tree.SetPort("mlx5_0", 2, nictest.Down, nictest.Disabled))
		wantEvents(t, "port 2 down", stateOf(tick()), []string{"F InfiniBandStateCheck: Port mlx5_0 port 2: state DOWN, phys_state Disabled"})
		port1DownAndBack(t, e, tick)
		wantEvents(t, "steady", stateOf(tick()), nil)
		must(t, e.tree.SetPort("mlx5_0", 2, nictest.Active, nictest.LinkUp))
		wantEvents(t, "port 2 recabled", stateOf(tick()), []string{"H InfiniBandStateCheck: Port mlx5_0 port 2: healthy (ACTIVE, LinkUp)"})
	})
	t.Run("port 2 ACTIVE on most other cards", func(t *testing.T) {
		// Cabled across ports: mlx5_1 and mlx5_2 on port 2, mlx5_3 on
		// port 1 (peer mode 1). mlx5_0's port 2 is down where most of
		// its peers' is up: its fault stands.
		e := setup(t, dualPort(nictest.Disabled))
		for _, d := range []string{"mlx5_1", "mlx5_2"} {
			must(t, e.tree.SetPort(d, 1, nictest.Down, nictest.Disabled))
			must(t, e.tree.SetPort(d, 2, nictest.Active, nictest.LinkUp))
		}
		must(t, e.tree.SetPort("mlx5_0", 1, nictest.Down, nictest.Disabled))
		_, tick := e.clockedCheck(time.Minute)
		wantEvents(t, "first poll", stateOf(tick()), []string{
			"F InfiniBandStateCheck: Card 0000:10:00 (compute) has 0 active ports, expected 1 (peer mode)",
			"F InfiniBandStateCheck: Port mlx5_0 port 1: state DOWN, phys_state Disabled",
			"F InfiniBandStateCheck: Port mlx5_0 port 2: state DOWN, phys_state Disabled",
		})
		must(t, e.tree.SetPort("mlx5_0", 1, nictest.Active, nictest.LinkUp))
		wantEvents(t, "port 1 fixed", stateOf(tick()), []string{
			"H InfiniBandStateCheck: Card 0000:10:00 (compute) has 1 active ports, back at peer mode 1",
			"H InfiniBandStateCheck: Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)",
		})
		wantEvents(t, "steady", stateOf(tick()), nil)
	})
}

// TestRenamedUncabledPortNotCarriedOver: a device renamed (an mlx5 reset,
// then udev's rename) whose port 2 is uncabled as on its peers, never
// reported, is not reported fatal under its new name: only ports reported
// unhealthy under the old name carry their fault over (retirePorts).
func TestRenamedUncabledPortNotCarriedOver(t *testing.T) {
	p := small()
	for i := range p.Devices {
		p.Devices[i].Ports = append(p.Devices[i].Ports, nictest.Port{LinkLayer: p.Devices[i].Ports[0].LinkLayer, State: nictest.Down, PhysState: nictest.Disabled})
	}
	e := setup(t, p)
	c := e.check()
	poll(t, c)
	wantEvents(t, "steady", stateEvents(poll(t, c)), nil)
	renameDevice(t, e.tree, "mlx5_2", "ibp48s0")
	for _, ev := range stateEvents(poll(t, c)) {
		if strings.HasPrefix(ev, "F ") {
			t.Errorf("renamed: %s (an uncabled port never reported is no fault to carry over)", ev)
		}
	}
}

// stateEvents are the link-state check's events, briefly.
func stateEvents(evs []string) []string {
	return slices.DeleteFunc(slices.Clone(evs), func(s string) bool { return !strings.Contains(s, "StateCheck: ") })
}

// TestFirstPollHeldCardBaselined: a card a first poll holds down (a port
// waiting for the SM after a boot) gets the healthy baseline of a card at
// mode once its port is up, as a card at mode on the first poll does: an
// earlier boot's card fault is lifted. Once only.
func TestFirstPollHeldCardBaselined(t *testing.T) {
	e := setup(t, small())
	must(t, e.tree.SetPort("mlx5_0", 1, nictest.Init, nictest.LinkUp))
	c, _ := e.clockedCheck(0)
	const base = "H InfiniBandStateCheck: Card 0000:10:00 (compute) has 1 active ports, at or above peer mode 1 (healthy baseline of a first poll)"
	check := func() []string {
		t.Helper()
		evs, err := c.Check(t.Context())
		must(t, err)
		must(t, c.Commit())
		return briefs(evs)
	}
	if got := check(); slices.Contains(got, base) {
		t.Fatalf("first poll, held down: %q", got)
	}
	must(t, e.tree.SetPort("mlx5_0", 1, nictest.Active, nictest.LinkUp))
	if got := check(); !slices.Contains(got, base) {
		t.Errorf("port up: events %q, want the card's baseline %q", got, base)
	}
	if got := check(); slices.Contains(got, base) {
		t.Errorf("baseline sent again: %q", got)
	}
}

// TestFirstPollRoCENotUpYet: a RoCE port DOWN/Disabled on a first poll
// (its net device not up yet after a boot) holds its card down and is not
// reported at once; still dead past the hold-down, the port is reported
// fatal with its card, and nothing fatal is ever sent when it came up
// meanwhile.
func TestFirstPollRoCENotUpYet(t *testing.T) {
	for _, up := range []bool{false, true} {
		t.Run(fmt.Sprintf("up meanwhile=%v", up), func(t *testing.T) {
			e := setup(t, small())
			must(t, e.tree.SetPort("mlx5_4", 1, nictest.Down, nictest.Disabled))
			_, tick := e.clockedCheck(cardHoldDown / 2)
			for _, ev := range tick() {
				if strings.HasPrefix(ev, "F ") {
					t.Errorf("first poll: fatal %q", ev)
				}
			}
			if up {
				must(t, e.tree.SetPort("mlx5_4", 1, nictest.Active, nictest.LinkUp))
			}
			for _, ev := range tick() {
				if strings.HasPrefix(ev, "F ") {
					t.Errorf("held down: fatal %q", ev)
				}
			}
			var want []string
			if !up {
				want = []string{
					"F EthernetStateCheck: Card 0000:50:00 (storage) has 0 active ports, expected 1 (peer mode)",
					"F EthernetStateCheck: RoCE port mlx5_4 port 1: state DOWN, phys_state Disabled, operstate up",
				}
			}
			got := slices.DeleteFunc(stateEvents(tick()), func(s string) bool { return !strings.HasPrefix(s, "F ") })
			wantEvents(t, "past the hold-down", got, want)
		})
	}
}

// TestFirstPollHeldRoCECardBaselined: TestFirstPollHeldCardBaselined for
// a RoCE port DOWN/Disabled on the first poll after a reboot (its net
// device not up yet). An earlier boot reported the card and the port
// fatal; the new boot's first poll holds the card down and reports
// nothing fatal; the port up within the hold-down, the card's first-poll
// baseline and the port's healthy event lift both faults (nothing else
// would: the reboot discarded the state that knew them), once only, and
// nothing fatal is ever sent.
func TestFirstPollHeldRoCECardBaselined(t *testing.T) {
	e := setup(t, small())
	c := e.check()
	allEvents(t, c)
	must(t, e.tree.SetPort("mlx5_4", 1, nictest.Down, nictest.Disabled))
	var faults []*datamodels.HealthEvent
	for range 2 {
		for _, ev := range allEvents(t, c) {
			if ev.GetIsFatal() {
				faults = append(faults, ev)
			}
		}
		e.now = e.now.Add(cardHoldDown)
	}
	if len(faults) != 2 || !isCard(faults[1]) {
		t.Fatalf("boot-1: faults %q, want the port's, then its card's", briefs(faults))
	}
	portFault, cardFault := faults[0], faults[1]

	e.setBootID("boot-2")
	c = e.check()
	step := func(name string) []*datamodels.HealthEvent {
		t.Helper()
		evs := allEvents(t, c)
		for _, ev := range evs {
			if ev.GetIsFatal() {
				t.Errorf("%s: fatal %q (the card is held down)", name, brief(ev))
			}
		}
		e.now = e.now.Add(cardHoldDown / 4)
		return evs
	}
	if first := step("first poll"); clears(first, cardFault) {
		t.Errorf("first poll: card below peer mode got a healthy baseline")
	}
	step("held down")
	must(t, e.tree.SetPort("mlx5_4", 1, nictest.Active, nictest.LinkUp))
	up := step("port up")
	if !clears(up, cardFault) {
		t.Errorf("port up: no healthy [%s]: boot-1's card fault is never lifted; events %q", events.EntityKey(cardFault), briefs(up))
	}
	if !clears(up, portFault) {
		t.Errorf("port up: no healthy [%s]: boot-1's port fault is never lifted; events %q", events.EntityKey(portFault), briefs(up))
	}
	for i := range 4 {
		if evs := step("steady"); clears(evs, cardFault) {
			t.Errorf("steady poll %d: card baseline sent again: %q", i, briefs(evs))
		}
	}
}

// TestLaterPollRoCEDownReportedAtOnce: only a first poll without usable
// state counts a RoCE port DOWN/Disabled as on its way up. One going
// DOWN/Disabled on a later poll, or found so by the first poll of an
// agent restarted on its state (same boot), is reported fatal at once,
// its card after the hold-down.
func TestLaterPollRoCEDownReportedAtOnce(t *testing.T) {
	const port = "F EthernetStateCheck: RoCE port mlx5_4 port 1: state DOWN, phys_state Disabled, operstate up"
	const card = "F EthernetStateCheck: Card 0000:50:00 (storage) has 0 active ports, expected 1 (peer mode)"
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restart=%v", restart), func(t *testing.T) {
			e := setup(t, small())
			c := e.check()
			poll(t, c)
			must(t, e.tree.SetPort("mlx5_4", 1, nictest.Down, nictest.Disabled))
			if restart {
				c = e.check()
			}
			e.now = e.now.Add(cardHoldDown / 2)
			wantEvents(t, "down", stateEvents(poll(t, c)), []string{port})
			e.now = e.now.Add(cardHoldDown)
			wantEvents(t, "past the hold-down", stateEvents(poll(t, c)), []string{card})
		})
	}
}

// TestFirstPollHeldCardBaselinedAcrossRestart: a card the first poll after
// a reboot holds down (an InfiniBand port waiting for the SM, a RoCE port
// whose net device is not up yet), the agent restarted within the same
// boot before the port is up: once up, the card still gets its first-poll
// baseline, which lifts the card fault the earlier boot raised. The
// restarted agent, resuming from its state, knew nothing of the hold, and
// that fault stood for ever.
func TestFirstPollHeldCardBaselinedAcrossRestart(t *testing.T) {
	for _, tc := range []struct{ name, dev, card, state, phys string }{
		{"InfiniBand waiting for the SM", "mlx5_0", "0000:10:00", nictest.Init, nictest.LinkUp},
		{"RoCE not up yet", "mlx5_4", "0000:50:00", nictest.Down, nictest.Disabled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, small())
			c := e.check()
			allEvents(t, c)
			must(t, e.tree.SetPort(tc.dev, 1, nictest.Down, nictest.Disabled))
			faults := standing{}
			for range 2 {
				faults.add(allEvents(t, c))
				e.now = e.now.Add(cardHoldDown)
			}
			if !slices.ContainsFunc(slices.Collect(maps.Keys(faults)), func(k string) bool { return strings.Contains(k, "PCI="+tc.card) }) {
				t.Fatalf("boot-1: faults %q, want the card's", faults)
			}

			e.setBootID("boot-2")
			must(t, e.tree.SetPort(tc.dev, 1, tc.state, tc.phys))
			for _, step := range []string{"first poll", "restarted"} {
				c = e.check() // the reboot's first poll, then a restart in the same boot
				evs := allEvents(t, c)
				faults.add(evs)
				for _, ev := range evs {
					if ev.GetIsFatal() {
						t.Errorf("%s: fatal %q (the card is held down)", step, brief(ev))
					}
				}
				e.now = e.now.Add(cardHoldDown / 4)
			}
			must(t, e.tree.SetPort(tc.dev, 1, nictest.Active, nictest.LinkUp))
			faults.add(allEvents(t, c))
			if len(faults) > 0 {
				t.Errorf("port up: faults never lifted: %q", faults)
			}
		})
	}
}
