package gateway

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestRecords checks the batch encoding the producer writes: each record
// is its event's key and its event, whole, and no record's bytes reach
// into the next one's (they share one buffer).
func TestRecords(t *testing.T) {
	evs := []*datamodels.HealthEvent{
		{Cluster: "alpha", NodeName: "gpu-node-1", CheckName: "XidCheck", ErrorCode: []string{"XID-79"},
			Metadata: map[string]string{"a": "1", "b": "2"}, ReceivedTimestamp: timestamppb.Now()},
		{Cluster: "alpha", NodeName: "n"}, // the smallest event
		{Cluster: "beta.example", NodeName: "gpu-node-2", Message: string(bytes.Repeat([]byte("x"), 5000)),
			EntitiesImpacted: []*datamodels.Entity{{EntityType: "GPU", EntityValue: "0"}}},
	}
	recs, err := records(evs)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(evs) {
		t.Fatalf("%d records for %d events", len(recs), len(evs))
	}
	for i, ev := range evs {
		if want := events.Key(ev.GetCluster(), ev.GetNodeName()); !bytes.Equal(recs[i].Key, want) {
			t.Errorf("record %d: key %q, want %q", i, recs[i].Key, want)
		}
		got, err := events.Unmarshal(recs[i].Value)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if !proto.Equal(got, ev) {
			t.Errorf("record %d decodes to %v, want %v", i, got, ev)
		}
		if cap(recs[i].Key) != len(recs[i].Key) || cap(recs[i].Value) != len(recs[i].Value) {
			t.Errorf("record %d: key or value can grow into the next record's bytes", i)
		}
	}
}
