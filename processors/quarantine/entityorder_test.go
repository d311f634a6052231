package quarantine

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// entities lists entities as TYPE, value pairs.
func entities(tv ...string) []*datamodels.Entity {
	var out []*datamodels.Entity
	for i := 0; i+1 < len(tv); i += 2 {
		out = append(out, &datamodels.Entity{EntityType: tv[i], EntityValue: tv[i+1]})
	}
	return out
}

// TestRecoveryInAnotherEntityOrder: a recovery lifts the fault of the same
// entities whatever their order (an agent or a person, as the fleet page
// tells them to, may list them in another one); one of other entities — a
// subset, a superset, another value, the same text split elsewhere by a
// ',' inside a value — does not, but for a healthy NIC port (NIC and
// NICPort), which lifts its device's fault (NIC alone). The stored key
// stays the fault's own.
func TestRecoveryInAnotherEntityOrder(t *testing.T) {
	gpuPCI := entities("GPU", "GPU-x", "PCI", "0000:3b:00")
	for i, c := range []struct {
		name            string
		fault, recovery []*datamodels.Entity
		lifted          bool
	}{
		{"same order", gpuPCI, entities("GPU", "GPU-x", "PCI", "0000:3b:00"), true},
		{"other order", gpuPCI, entities("PCI", "0000:3b:00", "GPU", "GPU-x"), true},
		{"three, reversed", entities("GPU", "GPU-x", "PCI", "0000:3b:00", "NIC", "mlx5_0"), entities("NIC", "mlx5_0", "PCI", "0000:3b:00", "GPU", "GPU-x"), true},
		{"a repeated entity, other order", entities("GPU", "GPU-x", "GPU", "GPU-x", "PCI", "0000:3b:00"), entities("GPU", "GPU-x", "PCI", "0000:3b:00", "GPU", "GPU-x"), true},
		{"a ',' in a value, other order", entities("T", "a,b", "U", "c"), entities("U", "c", "T", "a,b"), true},
		{"a subset", gpuPCI, entities("GPU", "GPU-x"), false},
		{"a superset", gpuPCI, entities("PCI", "0000:3b:00", "GPU", "GPU-x", "NIC", "mlx5_0"), false},
		{"another value", gpuPCI, entities("PCI", "0000:3b:00", "GPU", "GPU-y"), false},
		{"a repeated entity for another", entities("GPU", "GPU-x", "PCI", "0000:3b:00"), entities("GPU", "GPU-x", "GPU", "GPU-x"), false},
		{"the same text split elsewhere", entities("T", "a,b", "U", "c"), entities("T", "a", "U", "c,b"), false},
		// A healthy port names its device: it lifts the device's fault
		// (NVSentinel's "device disappeared" is NIC=mlx5_0 only; after the
		// repair its healthy baselines are per port).
		{"a port of the faulted device", entities("NIC", "mlx5_0"), entities("NIC", "mlx5_0", "NICPort", "1"), true},
		{"a port of the faulted device, other order", entities("NIC", "mlx5_0"), entities("NICPort", "2", "NIC", "mlx5_0"), true},
		{"a port of another device", entities("NIC", "mlx5_0"), entities("NIC", "mlx5_1", "NICPort", "1"), false},
		{"the device, for a port's fault", entities("NIC", "mlx5_0", "NICPort", "1"), entities("NIC", "mlx5_0"), false},
		{"another port", entities("NIC", "mlx5_0", "NICPort", "1"), entities("NIC", "mlx5_0", "NICPort", "2"), false},
		{"a port of a card's device", entities("PCI", "0000:47:00", "NIC", "mlx5_0"), entities("NIC", "mlx5_0", "NICPort", "1"), false},
		// Nothing else is a part: an NVSwitch that needs a reset is not
		// lifted by one of its ports coming up (the fabric agent's telemetry).
		{"a switch's port", entities("NVSwitch", "sw1"), entities("NVSwitch", "sw1", "GPU", "GPU-x", "PCI", "0000:3b:00"), false},
		{"a port alone", entities("NIC", "mlx5_0"), entities("NICPort", "1"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			group := fmt.Sprintf("entorder%d", i)
			node := group + "-1"
			h, k, _ := fakeHandler(t, testConfig(group), group, node)
			f := fatal(node, "XID_ERROR_48", "")
			f.EntitiesImpacted = c.fault
			if acts, _ := handle(t, h, record("c1", f)); kinds(acts) != "quarantine/applied" {
				t.Fatalf("fault: %s", kinds(acts))
			}
			stored := getNode(t, k, node).Annotations[AnnotationState]
			r := healthy(node, "XID_ERROR_48", "")
			r.EntitiesImpacted = c.recovery
			acts, _ := handle(t, h, record("c1", r))
			n := getNode(t, k, node)
			if c.lifted {
				if kinds(acts) != "unquarantine/applied" || n.Spec.Unschedulable || n.Annotations[AnnotationState] != "" {
					t.Fatalf("recovery did not lift: actions %q; unschedulable %v; state %s", kinds(acts), n.Spec.Unschedulable, n.Annotations[AnnotationState])
				}
				return
			}
			if kinds(acts) != "" || !n.Spec.Unschedulable || n.Annotations[AnnotationState] != stored {
				t.Fatalf("recovery of other entities lifted: actions %q; unschedulable %v; state %s (was %s)", kinds(acts), n.Spec.Unschedulable, n.Annotations[AnnotationState], stored)
			}
		})
	}
}

// TestNICDeviceFaultLiftedByPortBaseline: NVSentinel's nic-health-monitor
// reports a vanished device as NIC=mlx5_0 alone; after the repair and
// reboot it sends healthy baselines per port (NIC=mlx5_0, NICPort=1) "to
// clear stale FATAL conditions" and nothing for the device. Before, that
// fault stood for good: the node cordoned until a person uncordoned it.
func TestNICDeviceFaultLiftedByPortBaseline(t *testing.T) {
	h, k, _ := fakeHandler(t, testConfig("nicdev"), "nicdev", "nicdev-1")
	gone := &datamodels.HealthEvent{Agent: "nic-health-monitor", ComponentClass: "NIC", CheckName: "InfiniBandStateCheck",
		IsFatal: true, RecommendedAction: datamodels.RecommendedAction_REPLACE_VM, NodeName: "nicdev-1",
		Message:          "NIC mlx5_0 disappeared from /sys/class/infiniband/ - hardware failure",
		EntitiesImpacted: entities("NIC", "mlx5_0"), GeneratedTimestamp: timestamppb.Now()}
	if acts, _ := handle(t, h, record("c1", gone)); kinds(acts) != "quarantine/applied" {
		t.Fatalf("fault: %s", kinds(acts))
	}
	base := &datamodels.HealthEvent{Agent: "nic-health-monitor", ComponentClass: "NIC", CheckName: "InfiniBandStateCheck",
		IsHealthy: true, NodeName: "nicdev-1", Message: "Port mlx5_0 port 1: healthy (ACTIVE, LinkUp)",
		EntitiesImpacted: entities("NIC", "mlx5_0", "NICPort", "1"), GeneratedTimestamp: timestamppb.Now()}
	acts, _ := handle(t, h, record("c1", base))
	n := getNode(t, k, "nicdev-1")
	if kinds(acts) != "unquarantine/applied" || n.Spec.Unschedulable || n.Annotations[AnnotationState] != "" {
		t.Fatalf("the device's healthy port did not lift its fault: actions %q; unschedulable %v; state %s", kinds(acts), n.Spec.Unschedulable, n.Annotations[AnnotationState])
	}
}

// TestRecoverPortLiftsDevice: Recover and RecoverFlapping (the policy on
// and off) lift a device's fault on a healthy port of it, and only that.
func TestRecoverPortLiftsDevice(t *testing.T) {
	now := time.Now()
	port := []string{"NIC=mlx5_0", "NICPort=1"}
	newState := func() *State {
		st := &State{Faults: map[string]*Fault{}}
		for _, e := range []string{"NIC=mlx5_0", "NIC=mlx5_0,NICPort=2", "NIC=mlx5_1", "PCI=0000:47:00,NIC=mlx5_0"} {
			st.AddFault(FaultKey("C", e), Fault{Check: "C", Entity: e, Since: now, LastSeen: now}, e)
		}
		return st
	}
	want := []string{FaultKey("C", "NIC=mlx5_0")}
	if removed, _ := newState().Recover("C", port, now.Add(time.Second)); !slices.Equal(removed, want) {
		t.Errorf("Recover removed %v, want %v", removed, want)
	}
	for _, p := range []FlapPolicy{{}, {Threshold: 3, Window: time.Hour, Stabilization: time.Hour}} {
		if removed, _, _ := newState().RecoverFlapping("C", port, now.Add(time.Second), now.Add(time.Second), p); !slices.Equal(removed, want) {
			t.Errorf("RecoverFlapping (%+v) removed %v, want %v", p, removed, want)
		}
	}
	// A list kept as a stand-in is matched as it came only.
	st := &State{Faults: map[string]*Fault{}}
	long := "NIC=" + strings.Repeat("x", maxEntityKey)
	st.AddFault(FaultKey("C", long), Fault{Check: "C", Entity: long, Since: now, LastSeen: now}, "e")
	if removed, _ := st.Recover("C", []string{long, "NICPort=1"}, now.Add(time.Second)); len(removed) != 0 {
		t.Errorf("a stand-in matched a port: removed %v", removed)
	}
	if removed, _ := st.Recover("C", []string{long}, now.Add(time.Second)); len(removed) != 1 {
		t.Errorf("a stand-in's own entities: removed %v", removed)
	}
}
