package remediate

import (
	"context"
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
)

// TestKeyPayloadMismatchDeadLettered: a drain result whose record key names
// another cluster or node than the action is dead-lettered, never
// remediated.
func TestKeyPayloadMismatchDeadLettered(t *testing.T) {
	h, err := New(testConfig(), clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"other/n1", cluster + "/n2"} {
		rec := drained("n1", "d1", "RESTART_VM", nil)
		rec.Key = []byte(key)
		res, err := h.Handle(context.Background(), []*kgo.Record{rec})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Out) != 0 || len(res.Dead) != 1 || !errors.Is(res.Dead[0].Reason, pipeline.ErrKeyMismatch) {
			t.Fatalf("key %q: outputs %d, dead %v", key, len(res.Out), res.Dead)
		}
	}
}
