package remediate

import (
	"slices"
	"testing"

	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// TestDataGPUsAreUUIDs: .GPUs (a GPUReset's spec.selector.uuids) holds
// GPU UUIDs only. A fault that names a GPU otherwise — the fabric agent's
// PCI fallback, NVLINK-INACTIVE's index, NVSentinel's DCGM index — has
// none: the reset is of every GPU of the drained node, not one the CRD
// refuses (422, the node left cordoned).
func TestDataGPUsAreUUIDs(t *testing.T) {
	const uuidA, uuidB = "GPU-0a1b2c3d-0000-1111-2222-333344445555", "GPU-aaaaaaaa-0000-1111-2222-33334444ffff"
	for name, tc := range map[string]struct {
		entities string
		want     []string
	}{
		"uuid":              {"GPU=" + uuidA, []string{uuidA}},
		"two uuids":         {"GPU=" + uuidA + ",PCI=0000:18:00,GPU=" + uuidB, []string{uuidA, uuidB}},
		"pci address":       {"GPU=0000:18:00,PCI=0000:18:00", nil},
		"index":             {"GPU=index:3", nil},
		"dcgm index":        {"GPU=3", nil},
		"uuid and pci":      {"GPU=" + uuidA + ",GPU=0000:18:00", nil},
		"not a uuid":        {"GPU=GPU-1", nil},
		"no gpu":            {"NVSwitch=0000:05:00", nil},
		"none":              {"", nil},
		"lower-case hex ok": {"GPU=GPU-abcdef01-abcd-abcd-abcd-abcdefabcdef", []string{"GPU-abcdef01-abcd-abcd-abcd-abcdefabcdef"}},
	} {
		t.Run(name, func(t *testing.T) {
			a := &faultlinev1.Action{RecommendedAction: "COMPONENT_RESET", Details: map[string]string{events.DetailEntities: tc.entities}}
			d := (&Handler{}).data(trigger{src: a, cluster: cluster, node: "n1"}, &Template{Group: "gpu-reset"})
			if !slices.Equal(d.GPUs, tc.want) {
				t.Fatalf("GPUs %q, want %q", d.GPUs, tc.want)
			}
			if tc.entities != "" && len(d.Entities) == 0 {
				t.Fatalf("entities dropped: %v", d.Entities)
			}
		})
	}
}
