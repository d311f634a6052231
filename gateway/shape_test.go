package gateway

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// emptyEvents is n empty events in the wire form of SubmitEventsRequest:
// two bytes each, which decode into a 336-byte struct each.
func emptyEvents(n int) []byte {
	b := make([]byte, 0, 2*n)
	for range n {
		b = append(b, 0x0a, 0x00)
	}
	return b
}

func manyEntities(events, entities int) *faultlinev1.SubmitEventsRequest {
	req := &faultlinev1.SubmitEventsRequest{}
	for range events {
		ev := validEvent()
		ev.EntitiesImpacted = nil
		for range entities {
			ev.EntitiesImpacted = append(ev.EntitiesImpacted, &datamodels.Entity{EntityType: "GPU", EntityValue: "x"})
		}
		req.Events = append(req.Events, ev)
	}
	return req
}

// metadataEntry is a request of one event whose metadata has one entry of
// the given fields (number, wire type, encoded value).
func metadataEntry(fields ...[]byte) []byte {
	var entry []byte
	for _, f := range fields {
		entry = append(entry, f...)
	}
	num := (&datamodels.HealthEvent{}).ProtoReflect().Descriptor().Fields().ByName("metadata").Number()
	ev := protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), entry)
	return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), ev)
}

func field(num protowire.Number, typ protowire.Type, val []byte) []byte {
	return append(protowire.AppendTag(nil, num, typ), val...)
}

func TestShape(t *testing.T) {
	l := shapeLimits{maxEvents: 1000}
	md := (&faultlinev1.SubmitEventsRequest{}).ProtoReflect().Descriptor()
	nv := (&datamodels.HealthEvents{}).ProtoReflect().Descriptor()
	codes := validEvent()
	codes.ErrorCode = make([]string, 33)
	for i := range codes.ErrorCode {
		codes.ErrorCode[i] = "c"
	}
	meta := validEvent()
	for i := range 70 {
		meta.Metadata[strings.Repeat("k", i+1)] = "v"
	}
	tests := []struct {
		name string
		msg  proto.Message // encoded as protobuf and as JSON
		wire []byte        // protobuf only
		json string        // JSON only
		want string        // "" = accepted
	}{
		{name: "a valid batch", msg: &faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{validEvent(), validEvent()}}},
		{name: "1000 events", msg: manyEntities(1000, 1)},
		{name: "1001 events", msg: manyEntities(1001, 1), want: "events: 1001 events exceed the batch limit of 1000"},
		{name: "2 million empty events", wire: emptyEvents(2 << 20), want: "events: 2097152 events exceed the batch limit of 1000"},
		{name: "64 entities", msg: manyEntities(2, 64)},
		{name: "65 entities in event 1", msg: &faultlinev1.SubmitEventsRequest{Events: append(manyEntities(1, 1).Events, manyEntities(1, 65).Events...)},
			want: "events[1].entitiesImpacted: 65 entities exceed the limit of 64"},
		{name: "33 error codes", msg: &faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{codes}}, want: "events[0].errorCode: 33 codes exceed the limit of 32"},
		{name: "71 metadata keys", msg: &faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{meta}}, want: "events[0].metadata: 71 keys exceed the limit of 64"},
		{name: "a metadata entry", wire: metadataEntry(field(1, protowire.BytesType, []byte{1, 'k'}), field(2, protowire.BytesType, []byte{1, 'v'}))},
		{name: "a metadata entry with an unknown field", wire: metadataEntry(field(1, protowire.BytesType, []byte{1, 'k'}), field(3, protowire.VarintType, []byte{7}))},
		{name: "a metadata key as fixed32 (FuzzCodecMatchesProto's find)", wire: metadataEntry(field(1, protowire.Fixed32Type, []byte("0000"))),
			want: "events[0].metadata: a map entry's key has wire type 5, want 2"},
		{name: "a metadata value as varint", wire: metadataEntry(field(1, protowire.BytesType, []byte{1, 'k'}), field(2, protowire.VarintType, []byte{3})),
			want: "events[0].metadata: a map entry's value has wire type 0, want 2"},
		{name: "NVSentinel's request", msg: &datamodels.HealthEvents{Version: 1, Events: manyEntities(1001, 0).Events}, want: "events: 1001 events exceed the batch limit of 1000"},
		{name: "JSON: empty objects", json: `{"events":[` + strings.Repeat(`{},`, 1000) + `{}]}`, want: "events: 1001 events exceed"},
		{name: "JSON: proto field name, escaped key, odd spacing", json: "{ \"\\u0065vents\" :\n[" + strings.Repeat(`{ "entitiesImpacted" : [ {} , {"entityType":"a]}"} ] } ,`, 1000) + `{}]}`, want: "events: 1001 events exceed"},
		{name: "JSON: entities behind strings with brackets", json: `{"events":[{"message":"[{\"x\":[","entitiesImpacted":[` + strings.Repeat(`{},`, 64) + `{}]}]}`, want: "events[0].entitiesImpacted: 65 entities exceed the limit of 64"},
		{name: "JSON: unknown fields are skipped whole", json: `{"junk":[[[[` + strings.Repeat(`{},`, 5000) + `{}]]]],"events":[{}]}`},
		{name: "JSON: null events", json: `{"events":null}`},
		{name: "JSON: broken structure is left to protojson", json: `{"events":[{},{]`},
		{name: "JSON: events before a cut end still count", json: `{"events":[` + strings.Repeat(`{},`, 1001), want: "events exceed the batch limit of 1000"},
		{name: "JSON: events before a broken one still count", json: `{"events":[` + strings.Repeat(`{},`, 1000) + `{]}`, want: "events: 1001 events exceed"},
		{name: "JSON: entities before a broken end still count", json: `{"events":[{"entitiesImpacted":[` + strings.Repeat(`{},`, 65) + `x`, want: "entities exceed the limit of 64"},
		{name: "protobuf: cut short after the events", wire: append(emptyEvents(2000), 0x80), want: "not protobuf"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check := func(kind string, err error) {
				t.Helper()
				switch {
				case tt.want == "" && err != nil:
					t.Fatalf("%s: refused: %v", kind, err)
				case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
					t.Fatalf("%s: got %v, want %q", kind, err, tt.want)
				}
			}
			d := md
			if tt.msg != nil {
				d = tt.msg.ProtoReflect().Descriptor()
				if d.FullName() == nv.FullName() {
					d = nv
				}
			}
			if tt.msg != nil || tt.wire != nil {
				b := tt.wire
				if tt.msg != nil {
					b, _ = proto.Marshal(tt.msg)
				}
				check("protobuf", l.checkProto(b, d, ""))
			}
			if tt.msg != nil || tt.json != "" {
				j := []byte(tt.json)
				if tt.msg != nil {
					j, _ = protojson.Marshal(tt.msg)
				}
				check("JSON", l.checkJSON(j, d))
			}
		})
	}
}

// TestShapeAllocatesNothingPerElement: refusing 2 million empty events
// costs no allocation per event (decoding them cost ~790 MB).
func TestShapeAllocatesNothingPerElement(t *testing.T) {
	l := shapeLimits{maxEvents: 1000}
	md := (&faultlinev1.SubmitEventsRequest{}).ProtoReflect().Descriptor()
	wire := emptyEvents(2 << 20)
	js := []byte(`{"events":[` + strings.Repeat(`{},`, 1<<20) + `{}]}`)
	if n := testing.AllocsPerRun(3, func() { _ = l.checkProto(wire, md, "") }); n > 10 {
		t.Errorf("protobuf check: %v allocations", n)
	}
	if n := testing.AllocsPerRun(3, func() { _ = l.checkJSON(js, md) }); n > 10*1000 {
		t.Errorf("JSON check: %v allocations (a few per walked event at most)", n)
	}
}

// FuzzShapeJSON: the JSON shape check never panics, and never refuses a
// body that protojson decodes into a message within the limits.
func FuzzShapeJSON(f *testing.F) {
	f.Add([]byte(`{"events":[{"entitiesImpacted":[{"entityType":"a"}],"metadata":{"a":"b"}}]}`))
	f.Add([]byte(`{"\u0065vents":[{},{}]}`))
	f.Add([]byte(`{"events":[{"message":"]}\"{["}]}`))
	l := shapeLimits{maxEvents: 3}
	f.Fuzz(func(t *testing.T, b []byte) {
		req := &faultlinev1.SubmitEventsRequest{}
		err := l.checkJSON(b, req.ProtoReflect().Descriptor())
		if err == nil || protojson.Unmarshal(b, req) != nil {
			return
		}
		within := len(req.Events) <= 3
		for _, ev := range req.Events {
			within = within && len(ev.EntitiesImpacted) <= maxEntities && len(ev.ErrorCode) <= maxErrorCodes && len(ev.Metadata) <= maxMetadata
		}
		if within {
			t.Fatalf("refused %q (%v), which decodes within the limits", b, err)
		}
	})
}

// BenchmarkShapeProto: the protobuf shape check of a gRPC call of 100
// events as the agents send them, per call.
func BenchmarkShapeProto(b *testing.B) {
	l := shapeLimits{maxEvents: 1000}
	md := (&faultlinev1.SubmitEventsRequest{}).ProtoReflect().Descriptor()
	req := &faultlinev1.SubmitEventsRequest{}
	for range 100 {
		req.Events = append(req.Events, validEvent())
	}
	wire, _ := proto.Marshal(req)
	b.SetBytes(int64(len(wire)))
	b.ReportAllocs()
	for b.Loop() {
		if err := l.checkProto(wire, md, ""); err != nil {
			b.Fatal(err)
		}
	}
}
