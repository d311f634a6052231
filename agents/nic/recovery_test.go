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
