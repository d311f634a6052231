package quarantine

import (
	"fmt"
	"testing"

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
// ',' inside a value — does not. The stored key stays the fault's own.
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
