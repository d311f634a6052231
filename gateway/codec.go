package gateway

import (
	"fmt"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// vtMessage is a message with vtprotobuf's generated fast paths (every
// message of schemas/gen has them).
type vtMessage interface {
	MarshalVT() ([]byte, error)
	UnmarshalVT([]byte) error
}

// Codec is the gateway's gRPC protobuf codec, and clients may use it too
// (the zero value): vtprotobuf's generated marshal and unmarshal (no
// reflection) for faultline's messages, the standard codec for anything
// else. The generated unmarshal does not check UTF-8; the Validator does,
// for every string it accepts, and stamp drops unknown fields, so what is
// produced to Kafka always decodes with the standard decoder
// (FuzzCodecMatchesProto). The gateway's own codec also checks the shape of
// every request before decoding it (see shapeLimits), and refuses a map
// entry whose key or value has the wrong wire type, which the generated
// decoder would read differently from the standard one (internal/protoshape).
type Codec struct {
	limits shapeLimits
}

// shaped is what the gateway's gRPC handlers decode a request into: the
// codec checks the encoded shape of msg first and reports a violation in
// err, without decoding, instead of failing (gRPC would answer a codec
// failure as Internal; the handler answers InvalidArgument).
type shaped struct {
	msg proto.Message
	err error
}

func (Codec) Name() string { return "proto" }

func (Codec) Marshal(v any) ([]byte, error) {
	if m, ok := v.(vtMessage); ok {
		return m.MarshalVT()
	}
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("codec: %T is not a protobuf message", v)
	}
	return proto.Marshal(m)
}

func (c Codec) Unmarshal(data []byte, v any) error {
	if sv, ok := v.(*shaped); ok {
		if err := c.limits.checkProto(data, sv.msg.ProtoReflect().Descriptor(), ""); err != nil {
			sv.err = err
			return nil
		}
		v = sv.msg
	}
	if m, ok := v.(vtMessage); ok {
		return m.UnmarshalVT(data)
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("codec: %T is not a protobuf message", v)
	}
	return proto.Unmarshal(data, m)
}

// serverCodec is the gateway's codec as the gRPC server uses it
// (encoding.CodecV2): a received message, which arrives in pieces, is
// copied into one pooled buffer, shape-checked, decoded (vtprotobuf copies
// every string it keeps) and the buffer goes back to the pool, instead of
// a new 4 MiB buffer per message for the garbage collector.
type serverCodec struct{ c Codec }

func (s serverCodec) Name() string { return s.c.Name() }

func (s serverCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := s.c.Marshal(v)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (s serverCodec) Unmarshal(data mem.BufferSlice, v any) error {
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return s.c.Unmarshal(buf.ReadOnlyData(), v)
}
