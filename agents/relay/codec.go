package relay

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/faultline/faultline/internal/protoshape"
)

// codec is gRPC's standard protobuf codec with the gateway's shape check
// (internal/protoshape) before a request is decoded: decoding allocates a
// struct per element however small it is on the wire, so a 4 MiB message
// of empty events allocated ~835 MB, and the agent's memory limit is
// 128 MiB. A request with more elements in a list than the validator
// accepts is refused undecoded.
type codec struct {
	limits protoshape.Limits
}

// shaped is what the relay's handler decodes a request into: the codec
// checks the encoded shape of msg first and reports a violation in err,
// without decoding, instead of failing (gRPC would answer a codec failure
// Internal; the handler answers InvalidArgument, as the gateway does).
type shaped struct {
	msg proto.Message
	err error
}

func (codec) Name() string { return "proto" }

func (codec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("codec: %T is not a protobuf message", v)
	}
	return proto.Marshal(m)
}

func (c codec) Unmarshal(data []byte, v any) error {
	if sv, ok := v.(*shaped); ok {
		if err := c.limits.Check(data, sv.msg.ProtoReflect().Descriptor(), ""); err != nil {
			sv.err = err
			return nil
		}
		v = sv.msg
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("codec: %T is not a protobuf message", v)
	}
	return proto.Unmarshal(data, m)
}

// shapeChecked returns a copy of a generated service description whose
// handlers decode each request through the codec's shape check and refuse
// one over the limits InvalidArgument, naming the field.
func (s *Server) shapeChecked(sd *grpc.ServiceDesc) *grpc.ServiceDesc {
	out := *sd
	out.Methods = make([]grpc.MethodDesc, len(sd.Methods))
	for i, m := range sd.Methods {
		h := m.Handler
		out.Methods[i] = grpc.MethodDesc{MethodName: m.MethodName, Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			return h(srv, ctx, func(v any) error {
				msg, ok := v.(proto.Message)
				if !ok {
					return dec(v)
				}
				sv := &shaped{msg: msg}
				if err := dec(sv); err != nil {
					return err
				}
				if sv.err == nil {
					return nil
				}
				// A call over the batch limit counts its events as invalid; one
				// refused for a list inside an event counts none (its events
				// were never counted).
				n := 0
				if e := (*protoshape.Error)(nil); errors.As(sv.err, &e) && e.Field == "events" {
					n = e.Count
				}
				return s.refuse(resultInvalid, n, codes.InvalidArgument, sv.err.Error())
			}, ic)
		}}
	}
	return &out
}
