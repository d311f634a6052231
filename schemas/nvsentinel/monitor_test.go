package nvsentinel

import (
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestFieldNumbersMatchSnapshot: the stand-in monitor's field numbers and
// enum values are NVSentinel's (the snapshot), not faultline's.
func TestFieldNumbersMatchSnapshot(t *testing.T) {
	nv, err := parseContract("testdata/datamodels.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		block, name string
		n           int
	}{
		{"message HealthEvents", "version", fieldEventsVersion}, {"message HealthEvents", "events", fieldEventsEvents},
		{"message HealthEvent", "version", fieldVersion}, {"message HealthEvent", "agent", fieldAgent},
		{"message HealthEvent", "componentClass", fieldComponentClass}, {"message HealthEvent", "checkName", fieldCheckName},
		{"message HealthEvent", "isFatal", fieldIsFatal}, {"message HealthEvent", "isHealthy", fieldIsHealthy},
		{"message HealthEvent", "message", fieldMessage}, {"message HealthEvent", "recommendedAction", fieldRecommendedAction},
		{"message HealthEvent", "errorCode", fieldErrorCode}, {"message HealthEvent", "entitiesImpacted", fieldEntitiesImpacted},
		{"message HealthEvent", "metadata", fieldMetadata}, {"message HealthEvent", "generatedTimestamp", fieldGeneratedTimestamp},
		{"message HealthEvent", "nodeName", fieldNodeName}, {"message HealthEvent", "quarantineOverrides", fieldQuarantineOverrides},
		{"message HealthEvent", "drainOverrides", fieldDrainOverrides}, {"message HealthEvent", "processingStrategy", fieldProcessingStrategy},
		{"message HealthEvent", "id", fieldID}, {"message HealthEvent", "customRecommendedAction", fieldCustomRecommendedAction},
		{"message Entity", "entityType", fieldEntityType}, {"message Entity", "entityValue", fieldEntityValue},
		{"message BehaviourOverrides", "force", fieldForce}, {"message BehaviourOverrides", "skip", fieldSkip},
		{"enum ProcessingStrategy", "UNSPECIFIED", StrategyUnspecified}, {"enum ProcessingStrategy", "EXECUTE_REMEDIATION", StrategyExecuteRemediation},
		{"enum ProcessingStrategy", "STORE_ONLY", StrategyStoreOnly}, {"enum ProcessingStrategy", "STORE_AND_ANALYSE", StrategyStoreAndAnalyse},
		{"enum RecommendedAction", "NONE", ActionNone}, {"enum RecommendedAction", "COMPONENT_RESET", ActionComponentReset},
		{"enum RecommendedAction", "CONTACT_SUPPORT", ActionContactSupport}, {"enum RecommendedAction", "RESTART_VM", ActionRestartVM},
		{"enum RecommendedAction", "RESTART_BM", ActionRestartBM}, {"enum RecommendedAction", "REPLACE_VM", ActionReplaceVM},
		{"enum RecommendedAction", "CUSTOM", ActionCustom},
	} {
		b := nv.blocks[c.block]
		if b == nil {
			t.Fatalf("%s not in the snapshot", c.block)
		}
		if m, ok := b.members[c.name]; !ok || m.number != c.n {
			t.Errorf("%s.%s: the stand-in uses %d, the snapshot says %v", c.block, c.name, c.n, m.String(c.name))
		}
	}
}

// TestEncodeDecodesAsHealthEvents: what the stand-in writes from the field
// numbers is, decoded with faultline's generated code, the same events.
func TestEncodeDecodesAsHealthEvents(t *testing.T) {
	at := time.Date(2026, 11, 22, 10, 15, 30, 123456789, time.UTC)
	ev := Event{
		Version: 1, Agent: "syslog-health-monitor", ComponentClass: "GPU", CheckName: "SysLogsXIDError",
		IsFatal: true, Message: "XID 79 GPU has fallen off the bus", RecommendedAction: ActionReplaceVM,
		ErrorCode: []string{"79"}, Entities: []Entity{{"GPU", "0"}, {"GPU_UUID", "GPU-3f2a"}},
		Metadata: map[string]string{"b": "2", "a": "1"}, GeneratedTimestamp: at, NodeName: "gpu-node-42",
		QuarantineOverrides: &Overrides{Force: true}, DrainOverrides: &Overrides{Skip: true},
		ProcessingStrategy: StrategyStoreAndAnalyse, ID: "key-1", CustomRecommendedAction: "X",
	}
	b := Encode(1, []Event{ev, {Agent: "a", IsHealthy: true}})
	var got datamodels.HealthEvents
	if err := proto.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := &datamodels.HealthEvents{Version: 1, Events: []*datamodels.HealthEvent{{
		Version: 1, Agent: ev.Agent, ComponentClass: "GPU", CheckName: ev.CheckName, IsFatal: true, Message: ev.Message,
		RecommendedAction: datamodels.RecommendedAction_REPLACE_VM, ErrorCode: []string{"79"},
		EntitiesImpacted:   []*datamodels.Entity{{EntityType: "GPU", EntityValue: "0"}, {EntityType: "GPU_UUID", EntityValue: "GPU-3f2a"}},
		Metadata:           map[string]string{"a": "1", "b": "2"},
		GeneratedTimestamp: timestamppb.New(at), NodeName: "gpu-node-42",
		QuarantineOverrides: &datamodels.BehaviourOverrides{Force: true}, DrainOverrides: &datamodels.BehaviourOverrides{Skip: true},
		ProcessingStrategy: datamodels.ProcessingStrategy_STORE_AND_ANALYSE, Id: "key-1", CustomRecommendedAction: "X",
	}, {Agent: "a", IsHealthy: true}}}
	if !proto.Equal(&got, want) {
		t.Fatalf("decoded\n%v\nwant\n%v", &got, want)
	}
	if len(got.ProtoReflect().GetUnknown()) != 0 || len(got.Events[0].ProtoReflect().GetUnknown()) != 0 {
		t.Fatal("fields faultline does not know")
	}
	// Deterministic: map entries in key order.
	if string(Encode(1, []Event{ev})) != string(Encode(1, []Event{ev})) {
		t.Fatal("encoding not deterministic")
	}
	// proto3: a zero event is an empty message.
	if n, typ, l := protowire.ConsumeTag(Encode(0, []Event{{}})); n != fieldEventsEvents || typ != protowire.BytesType || l != 1 {
		t.Fatalf("empty event encoded as field %d type %d", n, typ)
	}
}
