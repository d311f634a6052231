package protoshape

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// TestMalformedRefusedBeforeDecoding: wire data that does not parse is
// refused by the check, whatever was counted before it: 2 million empty
// events and a cut tag passed (the limit was compared only at the end of a
// message), and the decoders allocated every event (755 MB) before
// failing; an unknown group whose end does not match passed too, and
// vtprotobuf's decoder (which skips it) decoded the 2 million events after
// it.
func TestMalformedRefusedBeforeDecoding(t *testing.T) {
	empties := func(field protowire.Number) []byte {
		var b []byte
		for range 2_000_000 {
			b = protowire.AppendTag(b, field, protowire.BytesType)
			b = protowire.AppendVarint(b, 0)
		}
		return b
	}
	badGroup := protowire.AppendTag(protowire.AppendTag(nil, 50, protowire.StartGroupType), 51, protowire.EndGroupType)
	cutTag := []byte{0x80}
	l := Limits{MaxEvents: 1000}
	for _, tc := range []struct {
		name string
		msg  proto.Message
		b    []byte
	}{
		{"gateway request, a cut tag after the events", &faultlinev1.SubmitEventsRequest{}, append(empties(1), cutTag...)},
		{"relay request, a cut tag after the events", &datamodels.HealthEvents{}, append(empties(2), cutTag...)},
		{"gateway request, a broken group before the events", &faultlinev1.SubmitEventsRequest{}, append(bytes.Clone(badGroup), empties(1)...)},
		{"an event, a cut length inside it", &faultlinev1.SubmitEventsRequest{}, protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte{0x22, 0x05, 'a'})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := l.Check(tc.b, tc.msg.ProtoReflect().Descriptor(), "")
			if _, ok := errors.AsType[*Malformed](err); !ok {
				t.Fatalf("Check = %v, want a *Malformed", err)
			}
			sv := &Shaped{Msg: tc.msg}
			decoded := false
			if err := l.Decode(tc.b, sv, func([]byte, proto.Message) error { decoded = true; return nil }); err != nil {
				t.Fatal(err)
			}
			if decoded || sv.DecodeErr == nil || sv.Err != nil {
				t.Fatalf("Decode: decoded %v, DecodeErr %v, Err %v; want DecodeErr and no decoding", decoded, sv.DecodeErr, sv.Err)
			}
		})
	}
	// Well-formed wire data with an unknown field passes.
	ok := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), nil)
	ok = protowire.AppendVarint(protowire.AppendTag(ok, 99, protowire.VarintType), 7)
	if err := l.Check(ok, (&faultlinev1.SubmitEventsRequest{}).ProtoReflect().Descriptor(), ""); err != nil {
		t.Fatalf("a well-formed request: %v", err)
	}
}
