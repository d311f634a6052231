package events

import (
	"fmt"
	"testing"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestSetSystemUUID: the machine is stamped where the event has room for
// one more metadata key (an event with the limit's keys would be refused
// whole), replaces a stamp already there, and "" stamps nothing.
func TestSetSystemUUID(t *testing.T) {
	const uuid, limit = "4C4C4544-0042-3510-8052-B4C04F4E3732", 4
	full := map[string]string{}
	for i := range limit {
		full[fmt.Sprint("k", i)] = "v"
	}
	for _, tc := range []struct {
		name string
		meta map[string]string
		uuid string
		want string // "" none
		keys int
	}{
		{"no metadata", nil, uuid, uuid, 1},
		{"room", map[string]string{"pci": "0000:17:00"}, uuid, uuid, 2},
		{"full", full, uuid, "", limit},
		{"stamped before, full", map[string]string{MetaSystemUUID: "other", "a": "1", "b": "2", "c": "3"}, uuid, uuid, limit},
		{"unknown machine", nil, "", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := &datamodels.HealthEvent{Metadata: tc.meta}
			SetSystemUUID(ev, tc.uuid, limit)
			if got := ev.GetMetadata()[MetaSystemUUID]; got != tc.want || len(ev.GetMetadata()) != tc.keys {
				t.Errorf("%s = %q with %d keys, want %q with %d", MetaSystemUUID, got, len(ev.GetMetadata()), tc.want, tc.keys)
			}
		})
	}
}
