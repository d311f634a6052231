package relay

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/faultline/faultline/internal/protoshape"
	"github.com/faultline/faultline/schemas/gen/datamodels"
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

func (codec) Name() string { return "proto" }

func (codec) Marshal(v any) ([]byte, error) { return protoshape.Marshal(v) }

func (c codec) Unmarshal(data []byte, v any) error {
	return c.limits.Decode(data, v, proto.Unmarshal)
}

// shapeChecked returns a copy of a generated service description whose
// handlers read each request within the read budget (readBudget, waiting
// for it up to readWait, else refused Unavailable), decode it through the
// codec's shape check and refuse one over the limits InvalidArgument,
// naming the field, and one that does not decode InvalidArgument too
// (grpc-go answered it Internal).
func (s *Server) shapeChecked(sd *grpc.ServiceDesc) *grpc.ServiceDesc {
	return protoshape.ServiceDesc(sd, func(ctx context.Context, _ string, sv *protoshape.Shaped, dec func(any) error) error {
		// Its size is not known until it is read: each read takes room
		// for the largest.
		wctx, cancel := context.WithTimeout(ctx, readWait)
		err := s.reads.Acquire(wctx, MaxMessageBytes)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err()).Err()
			}
			return s.busy("messages being read")
		}
		err = dec(sv)
		// The message decoded waits for the spool, which takes one call
		// at a time: it keeps its share of the budget, its size decoded,
		// until the call ends (callTimeout at most), and gives back the
		// rest now. A call within a stream's window holds none (a
		// monitor's small call: bounded by maxCalls × streamWindow):
		// holding a few KiB left less than a read's room, and small calls
		// queued behind one stalled read were refused.
		held := int64(MaxMessageBytes)
		if err == nil && sv.DecodeErr == nil && sv.Err == nil {
			held = min(held, decodedBytes(sv.Msg))
		} else {
			held = 0
		}
		if held <= streamWindow {
			held = 0
		}
		s.reads.Release(MaxMessageBytes - held)
		if held > 0 {
			context.AfterFunc(ctx, func() { s.reads.Release(held) })
		}
		if err != nil {
			return err
		}
		if sv.DecodeErr != nil {
			return s.refuse(resultInvalid, 0, codes.InvalidArgument, "the message does not decode: "+sv.DecodeErr.Error())
		}
		if sv.Err == nil {
			return nil
		}
		// A call over the batch limit counts its events as invalid; one
		// refused for a list inside an event counts none (its events were
		// never counted).
		n := 0
		if e := (*protoshape.Error)(nil); errors.As(sv.Err, &e) && e.Field == "events" {
			n = e.Count
		}
		return s.refuse(resultInvalid, n, codes.InvalidArgument, sv.Err.Error())
	})
}

// decodedBytes is about what msg holds decoded: its size on the wire and
// the structs its elements take (a batch of empty entities or metadata
// entries took 9 to 11 times its size on the wire).
func decodedBytes(msg proto.Message) int64 {
	n := int64(proto.Size(msg))
	req, ok := msg.(*datamodels.HealthEvents)
	if !ok {
		return MaxMessageBytes
	}
	for _, ev := range req.GetEvents() {
		n += 512 + 128*int64(len(ev.GetEntitiesImpacted())+len(ev.GetMetadata())) +
			32*int64(len(ev.GetErrorCode())+len(ev.GetCauseIds()))
	}
	return n
}
