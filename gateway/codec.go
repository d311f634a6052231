package gateway

import (
	"fmt"

	"google.golang.org/protobuf/proto"
)

// vtMessage is a message with vtprotobuf's generated fast paths (every
// message of schemas/gen has them).
type vtMessage interface {
	MarshalVT() ([]byte, error)
	UnmarshalVT([]byte) error
}

// Codec is the gateway's gRPC protobuf codec, and clients may use it too:
// vtprotobuf's generated marshal and unmarshal (no reflection) for
// faultline's messages, the standard codec for anything else. The generated
// unmarshal does not check UTF-8; the Validator does, for every string it
// accepts, and stamp drops unknown fields, so what is produced to Kafka
// always decodes with the standard decoder (FuzzCodecMatchesProto).
type Codec struct{}

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

func (Codec) Unmarshal(data []byte, v any) error {
	if m, ok := v.(vtMessage); ok {
		return m.UnmarshalVT(data)
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("codec: %T is not a protobuf message", v)
	}
	return proto.Unmarshal(data, m)
}
