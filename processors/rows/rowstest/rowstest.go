// Package rowstest has the fixtures of the tests of processors/rows and of
// the roles that write or read its rows: the round-trip events and actions
// (testdata of processors/rows) and the records the gateway and the
// processors produce for them.
package rowstest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// testdata is processors/rows/testdata, wherever the test runs.
func testdata(file string) string {
	_, here, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(here), "..", "testdata", file)
}

// LoadJSON reads a JSON array of protobuf messages from
// processors/rows/testdata.
func LoadJSON[T proto.Message](t testing.TB, file string, newMsg func() T) []T {
	t.Helper()
	b, err := os.ReadFile(testdata(file))
	if err != nil {
		t.Fatal(err)
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(b, &raws); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	out := make([]T, len(raws))
	for i, r := range raws {
		out[i] = newMsg()
		if err := protojson.Unmarshal(r, out[i]); err != nil {
			t.Fatalf("%s[%d]: %v", file, i, err)
		}
	}
	return out
}

// Events are the round-trip events (testdata/roundtrip_events.json).
func Events(t testing.TB) []*datamodels.HealthEvent {
	return LoadJSON(t, "roundtrip_events.json", func() *datamodels.HealthEvent { return &datamodels.HealthEvent{} })
}

// Actions are the round-trip actions (testdata/roundtrip_actions.json).
func Actions(t testing.TB) []*faultlinev1.Action {
	return LoadJSON(t, "roundtrip_actions.json", func() *faultlinev1.Action { return &faultlinev1.Action{} })
}

// EventRecord is the record the gateway produces for ev.
func EventRecord(t testing.TB, ev *datamodels.HealthEvent) *kgo.Record {
	v, err := events.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return &kgo.Record{Topic: events.TopicEvents, Key: events.Key(ev.GetCluster(), ev.GetNodeName()), Value: v}
}

// ActionRecord is the record a processor produces for a.
func ActionRecord(t testing.TB, a *faultlinev1.Action) *kgo.Record {
	v, err := events.MarshalAction(a)
	if err != nil {
		t.Fatal(err)
	}
	return &kgo.Record{Topic: events.TopicActions, Key: events.Key(a.GetCluster(), a.GetNode()), Value: v}
}

// GenEvents returns n distinct events of cluster c spread over 10 nodes,
// the j-th (from from) at base + j seconds.
func GenEvents(c string, from, n int, base time.Time) []*datamodels.HealthEvent {
	out := make([]*datamodels.HealthEvent, n)
	for i := range n {
		j := from + i
		ts := timestamppb.New(base.Add(time.Duration(j) * time.Second))
		out[i] = &datamodels.HealthEvent{
			Version: 1, Agent: "test", ComponentClass: "GPU", CheckName: "SysLogsXIDError",
			IsFatal: j%3 == 0, Message: fmt.Sprintf("event %d", j), ErrorCode: []string{"XID-79"},
			EntitiesImpacted:   []*datamodels.Entity{{EntityType: "GPU", EntityValue: fmt.Sprintf("GPU-%d", j%8)}},
			GeneratedTimestamp: ts, ReceivedTimestamp: ts,
			NodeName: fmt.Sprintf("node-%02d", j%10), Cluster: c, Id: fmt.Sprintf("%s-ev-%06d", c, j),
		}
	}
	return out
}
