package gateway

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

var testNow = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func validEvent() *datamodels.HealthEvent {
	return &datamodels.HealthEvent{
		Agent: "faultline-agent", ComponentClass: "GPU", CheckName: "SysLogsXIDError",
		IsFatal: true, NodeName: "gpu-node-42", Message: "XID 79",
		RecommendedAction:  datamodels.RecommendedAction_REPLACE_VM,
		ErrorCode:          []string{"XID-79"},
		EntitiesImpacted:   []*datamodels.Entity{{EntityType: "GPU", EntityValue: "GPU-1"}},
		Metadata:           map[string]string{"gpu_index": "0"},
		GeneratedTimestamp: timestamppb.New(testNow.Add(-time.Minute)),
	}
}

func TestStampOverwritesServerFields(t *testing.T) {
	ev := validEvent()
	ev.Cluster, ev.Id, ev.DerivedBy, ev.CauseIds = "other-cluster", "client-id", "rule", []string{"x"}
	ev.GeneratedTimestamp = nil
	recv := timestamppb.New(testNow)
	ev.Submitter = &datamodels.Submitter{Name: "forged", Role: RoleOperator}
	stamp(ev, Caller{Cluster: "alpha", Name: "token:alpha#3", Role: RoleAgent, Node: "gpu-node-42"}, recv)
	if ev.Cluster != "alpha" || ev.Id == "client-id" || ev.Id == "" || ev.DerivedBy != "" || ev.CauseIds != nil {
		t.Fatalf("server-owned fields not stamped: %v", ev)
	}
	if want := (&datamodels.Submitter{Name: "token:alpha#3", Role: RoleAgent, Node: "gpu-node-42"}); !proto.Equal(ev.Submitter, want) {
		t.Fatalf("submitter %v, want the caller's %v (a client's own value is overwritten)", ev.Submitter, want)
	}
	if !proto.Equal(ev.GeneratedTimestamp, recv) || !proto.Equal(ev.ReceivedTimestamp, recv) {
		t.Fatalf("timestamps: generated %v received %v", ev.GeneratedTimestamp, ev.ReceivedTimestamp)
	}
	if ev.ProcessingStrategy != datamodels.ProcessingStrategy_EXECUTE_REMEDIATION {
		t.Fatalf("strategy not normalised: %v", ev.ProcessingStrategy)
	}
	if ev.Id != events.StoredID("alpha", "gpu-node-42", "client-id") {
		t.Fatalf("client id %q stored as %s, want events.StoredID of the cluster, the node and it", "client-id", ev.Id)
	}
	ev2, ev3 := validEvent(), validEvent()
	stamp(ev2, Caller{Cluster: "alpha"}, recv)
	stamp(ev3, Caller{Cluster: "alpha"}, recv)
	if ev3.Id <= ev2.Id {
		t.Fatalf("gateway ids not increasing: %s then %s", ev2.Id, ev3.Id)
	}
}

// TestStampClientIDScope: a client's id is stored per cluster and node, so
// a per-run key set on several nodes' events (or reused by another node's
// credential) never makes them one event, while a resend of one event
// (same cluster, node and id) keeps its stored id.
func TestStampClientIDScope(t *testing.T) {
	stored := func(cluster, node, id string) string {
		ev := validEvent()
		ev.NodeName, ev.Id = node, id
		stamp(ev, Caller{Cluster: cluster}, timestamppb.New(testNow))
		return ev.Id
	}
	first := stored("alpha", "node-a", "run-42")
	tests := []struct {
		name              string
		cluster, node, id string
		same              bool
	}{
		{"resend of the same event", "alpha", "node-a", "run-42", true},
		{"same id on another node", "alpha", "node-b", "run-42", false},
		{"same id and node in another cluster", "beta", "node-a", "run-42", false},
		{"another id on the same node", "alpha", "node-a", "run-43", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := stored(tt.cluster, tt.node, tt.id); (got == first) != tt.same {
				t.Fatalf("%s/%s/%s stored as %s, first event (alpha/node-a/run-42) as %s; same=%v, want %v",
					tt.cluster, tt.node, tt.id, got, first, got == first, tt.same)
			}
		})
	}
}
