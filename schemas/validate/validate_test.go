package validate

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

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

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*datamodels.HealthEvent)
		want   string // "" means valid; else the error must contain it
	}{
		{"valid", func(*datamodels.HealthEvent) {}, ""},
		{"no timestamp is fine", func(e *datamodels.HealthEvent) { e.GeneratedTimestamp = nil }, ""},
		{"missing agent", func(e *datamodels.HealthEvent) { e.Agent = "" }, "agent: required"},
		{"missing componentClass", func(e *datamodels.HealthEvent) { e.ComponentClass = "" }, "componentClass: required"},
		{"missing checkName", func(e *datamodels.HealthEvent) { e.CheckName = "" }, "checkName: required"},
		{"missing nodeName", func(e *datamodels.HealthEvent) { e.NodeName = "" }, "nodeName: required"},
		{"bad nodeName", func(e *datamodels.HealthEvent) { e.NodeName = "Node_1" }, "nodeName: \"Node_1\" is not a valid"},
		{"long nodeName", func(e *datamodels.HealthEvent) { e.NodeName = strings.Repeat("a", 254) }, "nodeName: longer than 253"},
		{"long agent", func(e *datamodels.HealthEvent) { e.Agent = strings.Repeat("a", 257) }, "agent: longer than 256"},
		{"long message", func(e *datamodels.HealthEvent) { e.Message = strings.Repeat("m", 8193) }, "message: longer than 8192"},
		{"message not UTF-8", func(e *datamodels.HealthEvent) { e.Message = "bad \xff byte" }, "message: not valid UTF-8"},
		{"metadata not UTF-8", func(e *datamodels.HealthEvent) { e.Metadata["k"] = "\xc3\x28" }, "metadata: a key or value is not valid UTF-8"},
		{"entity not UTF-8", func(e *datamodels.HealthEvent) { e.EntitiesImpacted[0].EntityValue = "\xff" }, "entitiesImpacted[0].entityValue: not valid UTF-8"},
		// Control characters: none in identifiers; in text, tab, newline
		// and carriage return only.
		{"NUL in checkName", func(e *datamodels.HealthEvent) { e.CheckName = "XID\x00" }, "checkName: control character U+0000 at byte 3"},
		{"ESC in agent", func(e *datamodels.HealthEvent) { e.Agent = "a\x1b[31m" }, "agent: control character U+001B"},
		{"newline in checkName", func(e *datamodels.HealthEvent) { e.CheckName = "XID\n2026-11-22 INFO forged" }, "checkName: control character U+000A"},
		{"newline in componentClass", func(e *datamodels.HealthEvent) { e.ComponentClass = "GPU\r" }, "componentClass: control character U+000D"},
		{"control in nodeName", func(e *datamodels.HealthEvent) { e.NodeName = "node\x00" }, "nodeName: control character U+0000"},
		{"C1 control in errorCode", func(e *datamodels.HealthEvent) { e.ErrorCode = []string{"79\u0085"} }, "errorCode[0]: control character U+0085"},
		{"DEL in entity type", func(e *datamodels.HealthEvent) { e.EntitiesImpacted[0].EntityType = "GPU\x7f" }, "entitiesImpacted[0].entityType: control character U+007F"},
		{"newline in entity value", func(e *datamodels.HealthEvent) { e.EntitiesImpacted[0].EntityValue = "GPU-1\n" }, "entitiesImpacted[0].entityValue: control character"},
		{"newline in metadata key", func(e *datamodels.HealthEvent) { e.Metadata["k\nx"] = "v" }, `metadata: key "k\nx" control character U+000A`},
		{"ESC in metadata value", func(e *datamodels.HealthEvent) { e.Metadata["k"] = "\x1b]0;title\a" }, "metadata[k]: control character U+001B"},
		{"newline in metadata value is text", func(e *datamodels.HealthEvent) { e.Metadata["k"] = "line 1\nline 2\ttab" }, ""},
		{"NUL in message", func(e *datamodels.HealthEvent) { e.Message = "XID 79\x00" }, "message: control character U+0000 at byte 6 is not allowed in text"},
		{"newlines in message are text", func(e *datamodels.HealthEvent) { e.Message = "line 1\r\nline 2\ttab" }, ""},
		{"control in id", func(e *datamodels.HealthEvent) { e.Id = "key\n" }, "id: control character"},
		{"control in custom action", func(e *datamodels.HealthEvent) {
			e.RecommendedAction = datamodels.RecommendedAction_CUSTOM
			e.CustomRecommendedAction = "X\x00"
		}, "customRecommendedAction: control character"},
		{"unknown action", func(e *datamodels.HealthEvent) { e.RecommendedAction = 7 }, "recommendedAction: unknown value 7"},
		{"custom without name", func(e *datamodels.HealthEvent) { e.RecommendedAction = datamodels.RecommendedAction_CUSTOM }, "customRecommendedAction: required"},
		{"custom with name", func(e *datamodels.HealthEvent) {
			e.RecommendedAction = datamodels.RecommendedAction_CUSTOM
			e.CustomRecommendedAction = "DRAIN_AND_WAIT"
		}, ""},
		{"unknown strategy", func(e *datamodels.HealthEvent) { e.ProcessingStrategy = 9 }, "processingStrategy: unknown value 9"},
		{"STORE_AND_ANALYSE", func(e *datamodels.HealthEvent) {
			e.ProcessingStrategy = datamodels.ProcessingStrategy_STORE_AND_ANALYSE
		}, ""},
		{"strategy 4 is unknown", func(e *datamodels.HealthEvent) { e.ProcessingStrategy = 4 }, "processingStrategy: unknown value 4"},
		{"RESTART_APP (39) is not NVSentinel's", func(e *datamodels.HealthEvent) { e.RecommendedAction = 39 }, "recommendedAction: unknown value 39"},
		{"empty error code", func(e *datamodels.HealthEvent) { e.ErrorCode = []string{"XID-79", ""} }, "errorCode[1]: must be 1 to 128"},
		{"too many error codes", func(e *datamodels.HealthEvent) { e.ErrorCode = make([]string, 33) }, "errorCode: 33 codes exceed"},
		{"entity without type", func(e *datamodels.HealthEvent) {
			e.EntitiesImpacted = append(e.EntitiesImpacted, &datamodels.Entity{EntityValue: "x"})
		}, "entitiesImpacted[1].entityType: must be 1 to 256"},
		{"entity without value", func(e *datamodels.HealthEvent) { e.EntitiesImpacted[0].EntityValue = "" }, "entitiesImpacted[0].entityValue"},
		{"null entity", func(e *datamodels.HealthEvent) { e.EntitiesImpacted = []*datamodels.Entity{nil} }, "entitiesImpacted[0]: must not be null"},
		{"too many entities", func(e *datamodels.HealthEvent) {
			for range 64 {
				e.EntitiesImpacted = append(e.EntitiesImpacted, &datamodels.Entity{EntityType: "GPU", EntityValue: "x"})
			}
		}, "entitiesImpacted: 65 entities exceed"},
		{"metadata value too long", func(e *datamodels.HealthEvent) { e.Metadata["k"] = strings.Repeat("v", 2049) }, "metadata[k]: value longer than 2048"},
		{"empty metadata key", func(e *datamodels.HealthEvent) { e.Metadata[""] = "v" }, "metadata: key \"\" must be"},
		{"future timestamp", func(e *datamodels.HealthEvent) { e.GeneratedTimestamp = timestamppb.New(testNow.Add(time.Hour)) }, "generatedTimestamp: 2026-11-22T13:00:00Z is more than 5m0s in the future"},
		{"slightly future is fine", func(e *datamodels.HealthEvent) { e.GeneratedTimestamp = timestamppb.New(testNow.Add(time.Minute)) }, ""},
		{"ancient timestamp", func(e *datamodels.HealthEvent) { e.GeneratedTimestamp = timestamppb.New(time.Unix(0, 0)) }, "before the year 2000"},
		{"invalid timestamp", func(e *datamodels.HealthEvent) { e.GeneratedTimestamp = &timestamppb.Timestamp{Nanos: -1} }, "generatedTimestamp: invalid"},
	}
	v := Validator{MaxBatch: 10, MaxFutureSkew: 5 * time.Minute}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := validEvent()
			tt.mutate(ev)
			err := v.ValidateBatch([]*datamodels.HealthEvent{validEvent(), ev}, testNow)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("want error containing %q, got none", tt.want)
			}
			if !strings.HasPrefix(err.Error(), "events[1].") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not name events[1] and %q", err, tt.want)
			}
		})
	}
}

func TestValidateBatchSize(t *testing.T) {
	v := Validator{MaxBatch: 2, MaxFutureSkew: time.Minute}
	if err := v.ValidateBatch(nil, testNow); err == nil || !strings.Contains(err.Error(), "events: at least one event") {
		t.Fatalf("empty batch: %v", err)
	}
	three := []*datamodels.HealthEvent{validEvent(), validEvent(), validEvent()}
	if err := v.ValidateBatch(three, testNow); err == nil || !strings.Contains(err.Error(), "3 events exceed the batch limit of 2") {
		t.Fatalf("oversized batch: %v", err)
	}
}

// TestValidNodeName: the hand-written check agrees with NodeNamePattern.
func TestValidNodeName(t *testing.T) {
	for _, n := range []string{
		"", "a", "-", ".", "a.", ".a", "a..b", "a-", "-a", "a-b", "a--b", "gpu-node-00042", "gpu.node.1",
		"node-1.example.com", "A", "a_b", "a b", "a.-b", "a-.b", "0", "9-9", "a.b-", "é", "a\x00", "x.y.z-0",
	} {
		if got, want := ValidNodeName(n), NodeNamePattern.MatchString(n); got != want {
			t.Errorf("ValidNodeName(%q) = %v, NodeNamePattern says %v", n, got, want)
		}
	}
}

func FuzzValidNodeName(f *testing.F) {
	for _, n := range []string{"gpu-node-00042", "a.b", "a..b", "-a", "A"} {
		f.Add(n)
	}
	f.Fuzz(func(t *testing.T, n string) {
		if got, want := ValidNodeName(n), NodeNamePattern.MatchString(n); got != want {
			t.Errorf("ValidNodeName(%q) = %v, NodeNamePattern says %v", n, got, want)
		}
	})
}

func TestClean(t *testing.T) {
	long := strings.Repeat("é", MaxMetadataVal) // 2 bytes each
	cases := []struct {
		name string
		ev   *datamodels.HealthEvent
		want *datamodels.HealthEvent
	}{
		{"already clean: unchanged",
			&datamodels.HealthEvent{Message: "Xid 79 on 0000:3b:00", Metadata: map[string]string{"k": "v"},
				EntitiesImpacted: []*datamodels.Entity{{EntityType: "PCI", EntityValue: "0000:3b:00"}}},
			&datamodels.HealthEvent{Message: "Xid 79 on 0000:3b:00", Metadata: map[string]string{"k": "v"},
				EntitiesImpacted: []*datamodels.Entity{{EntityType: "PCI", EntityValue: "0000:3b:00"}}}},
		{"control characters and invalid UTF-8 become printable",
			&datamodels.HealthEvent{Message: "a\x15b\nc", Metadata: map[string]string{"line": "x\x7fy\xffz"},
				EntitiesImpacted: []*datamodels.Entity{{EntityType: "PCI", EntityValue: "\x1b[0m"}}},
			&datamodels.HealthEvent{Message: "a b c", Metadata: map[string]string{"line": "x y?z"},
				EntitiesImpacted: []*datamodels.Entity{{EntityType: "PCI", EntityValue: " [0m"}}}},
		{"an empty entity is dropped",
			&datamodels.HealthEvent{EntitiesImpacted: []*datamodels.Entity{{EntityType: "PCI"}, {EntityType: "GPU", EntityValue: "GPU-1"}}},
			&datamodels.HealthEvent{EntitiesImpacted: []*datamodels.Entity{{EntityType: "GPU", EntityValue: "GPU-1"}}}},
		{"over-long text is cut on a rune boundary",
			&datamodels.HealthEvent{Message: strings.Repeat("m", MaxMessageLen+1), Metadata: map[string]string{"k": long}},
			&datamodels.HealthEvent{Message: strings.Repeat("m", MaxMessageLen-3) + "...", Metadata: map[string]string{"k": long[:MaxMetadataVal-4] + "..."}}},
		{"codes: repeated and empty ones dropped, the rest cut to the limit (the event was refused, then dropped)",
			&datamodels.HealthEvent{ErrorCode: append([]string{"DCGM_FR_43", "", "DCGM_FR_43", strings.Repeat("C", MaxErrorCodeLen+1)}, manyCodes(40)...)},
			&datamodels.HealthEvent{ErrorCode: append([]string{"DCGM_FR_43", strings.Repeat("C", MaxErrorCodeLen-3) + "..."}, manyCodes(MaxErrorCodes-2)...)}},
		{"entities past the limit are dropped",
			&datamodels.HealthEvent{EntitiesImpacted: manyGPUs(MaxEntities + 3)},
			&datamodels.HealthEvent{EntitiesImpacted: manyGPUs(MaxEntities)}},
		{"a time before now is kept",
			&datamodels.HealthEvent{GeneratedTimestamp: timestamppb.New(testNow.Add(-time.Hour))},
			&datamodels.HealthEvent{GeneratedTimestamp: timestamppb.New(testNow.Add(-time.Hour))}},
		{"a time after now becomes now",
			&datamodels.HealthEvent{GeneratedTimestamp: timestamppb.New(testNow.Add(time.Hour))},
			&datamodels.HealthEvent{GeneratedTimestamp: timestamppb.New(testNow)}},
		{"a time before 2000 becomes now",
			&datamodels.HealthEvent{GeneratedTimestamp: timestamppb.New(time.Date(1999, 12, 31, 0, 0, 0, 0, time.UTC))},
			&datamodels.HealthEvent{GeneratedTimestamp: timestamppb.New(testNow)}},
	}
	v := Validator{MaxBatch: 1, MaxFutureSkew: time.Minute}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			Clean(tc.ev, testNow)
			if !proto.Equal(tc.ev, tc.want) {
				t.Fatalf("got %v\nwant %v", tc.ev, tc.want)
			}
			tc.ev.Agent, tc.ev.ComponentClass, tc.ev.CheckName, tc.ev.NodeName = "a", "GPU", "c", "n"
			if err := v.Validate(tc.ev, testNow); err != nil {
				t.Fatalf("still refused: %v", err)
			}
		})
	}
}

func manyCodes(n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("CODE_%d", i))
	}
	return out
}

func manyGPUs(n int) []*datamodels.Entity {
	var out []*datamodels.Entity
	for i := range n {
		out = append(out, &datamodels.Entity{EntityType: "GPU", EntityValue: fmt.Sprintf("GPU-%d", i)})
	}
	return out
}
