package gateway

import (
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/faultline/faultline/internal/protoshape"
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

func (Codec) Name() string { return "proto" }

func (Codec) Marshal(v any) ([]byte, error) {
	if m, ok := v.(vtMessage); ok {
		return m.MarshalVT()
	}
	return protoshape.Marshal(v)
}

// Unmarshal decodes into a message, or into a *protoshape.Shaped
// (the gateway's gRPC handlers) after its shape check.
func (c Codec) Unmarshal(data []byte, v any) error {
	return c.limits.shape().Decode(data, v, func(b []byte, m proto.Message) error {
		if m, ok := m.(vtMessage); ok {
			return m.UnmarshalVT(b)
		}
		return proto.Unmarshal(b, m)
	})
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
