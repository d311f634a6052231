package quarantine

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestActionCarriesGeneratedTime: a decision's action says when its fault
// was generated (events.DetailGeneratedAt), which the drain carries on to
// remediate: a repeat spooled across a reboot and delivered after it is
// decided late, its generated time is not.
func TestActionCarriesGeneratedTime(t *testing.T) {
	h, err := New(DefaultConfig(), clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog})
	if err != nil {
		t.Fatal(err)
	}
	gen := time.Date(2026, 3, 1, 10, 0, 0, 123456789, time.UTC)
	ev := &datamodels.HealthEvent{Id: "e1", NodeName: "n1", CheckName: "XID_ERROR_79", IsFatal: true,
		GeneratedTimestamp: timestamppb.New(gen.In(time.FixedZone("x", 3600)))}
	a := h.newAction(item{ev: ev, cluster: "c1", node: "n1"}, events.KindQuarantine, events.OutcomeApplied, "r", "rule", nil)
	if got := a.Details[events.DetailGeneratedAt]; got != "2026-03-01T10:00:00.123456789Z" {
		t.Fatalf("%s = %q, want the event's generatedTimestamp", events.DetailGeneratedAt, got)
	}
	ev.GeneratedTimestamp = nil
	a = h.newAction(item{ev: ev, cluster: "c1", node: "n1"}, events.KindQuarantine, events.OutcomeApplied, "r", "rule", nil)
	if got, ok := a.Details[events.DetailGeneratedAt]; ok {
		t.Fatalf("no generatedTimestamp: %s = %q", events.DetailGeneratedAt, got)
	}
}
