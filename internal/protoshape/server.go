package protoshape

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Shaped is what a gRPC server's handler decodes a request into when its
// codec checks the request's shape first (Limits.Decode): Err is the
// violation, and Msg is then left undecoded — the handler answers it
// InvalidArgument, naming the field, where gRPC answers a codec's failure
// Internal (and a client retries it for ever).
// DecodeErr is why a message of the right shape did not decode (a
// message cut short, a field of the wrong wire type), for the handler to
// answer InvalidArgument too: grpc-go sends a codec's failure as Internal
// itself, before the handler answers.
type Shaped struct {
	Msg       proto.Message
	Err       error
	DecodeErr error
}

// Decode is a server codec's Unmarshal: into a *Shaped it checks data
// against l first and records a violation in Err (or, for data that is
// not protobuf, in DecodeErr) without decoding, then decodes, recording a
// failure in DecodeErr; otherwise decode decodes data into the message.
func (l Limits) Decode(data []byte, v any, decode func([]byte, proto.Message) error) error {
	if sv, ok := v.(*Shaped); ok {
		if err := l.Check(data, sv.Msg.ProtoReflect().Descriptor(), ""); err != nil {
			if _, ok := errors.AsType[*Malformed](err); ok {
				sv.DecodeErr = err
			} else {
				sv.Err = err
			}
			return nil
		}
		sv.DecodeErr = decode(data, sv.Msg)
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("codec: %T is not a protobuf message", v)
	}
	return decode(data, m)
}

// Marshal is a codec's Marshal of a protobuf message.
func Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("codec: %T is not a protobuf message", v)
	}
	return proto.Marshal(m)
}

// ServiceDesc returns a copy of a generated service description whose
// unary handlers read each request through read: it gets the call's full
// method name, a *Shaped around the request and the generated decoder
// (which, with a server codec decoding by Limits.Decode, checks the shape
// and fills sv.Err instead of failing), and returns nil to go on with the
// call or the call's error.
func ServiceDesc(sd *grpc.ServiceDesc, read func(ctx context.Context, method string, sv *Shaped, dec func(any) error) error) *grpc.ServiceDesc {
	out := *sd
	out.Methods = make([]grpc.MethodDesc, len(sd.Methods))
	for i, m := range sd.Methods {
		h, method := m.Handler, "/"+sd.ServiceName+"/"+m.MethodName
		out.Methods[i] = grpc.MethodDesc{MethodName: m.MethodName, Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			return h(srv, ctx, func(v any) error {
				msg, ok := v.(proto.Message)
				if !ok {
					return dec(v)
				}
				return read(ctx, method, &Shaped{Msg: msg}, dec)
			}, ic)
		}}
	}
	return &out
}
