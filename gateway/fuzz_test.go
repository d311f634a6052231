package gateway

import (
	"cmp"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/protoshape"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// FuzzDecodeValidate runs the REST body decoder and the validator over
// arbitrary bodies: neither may panic, and whatever passes both must stamp,
// encode and decode back to the same event.
func FuzzDecodeValidate(f *testing.F) {
	for _, seed := range []string{
		`{"events":[{"agent":"a","componentClass":"GPU","checkName":"XID","nodeName":"n1","isFatal":true,"recommendedAction":"REPLACE_VM","entitiesImpacted":[{"entityType":"GPU","entityValue":"GPU-1"}],"metadata":{"k":"v"},"generatedTimestamp":"2026-11-22T10:00:00Z"}]}`,
		`{"events":[{"agent":"a","componentClass":"NIC","checkName":"c","nodeName":"n.example","recommendedAction":27,"customRecommendedAction":"X"}]}`,
		`{"events":[]}`, `{"events":[null]}`, `{}`, `[]`, `{"events":[{"generatedTimestamp":"9999-12-31T23:59:59Z"}]}`,
		`{"events":[{"recommendedAction":"FOO"}]}`, `{"events":[{"errorCode":[""],"entitiesImpacted":[{}]}]}`,
	} {
		f.Add([]byte(seed))
	}
	v := Validator{MaxBatch: 1000, MaxFutureSkew: 5 * time.Minute}
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, body []byte) {
		req := &faultlinev1.SubmitEventsRequest{}
		if err := Marshaler.Unmarshal(body, req); err != nil {
			return
		}
		if err := v.ValidateBatch(req.GetEvents(), now); err != nil {
			if err.Error() == "" {
				t.Fatal("empty validation message")
			}
			return
		}
		for _, ev := range req.GetEvents() {
			stamp(ev, Caller{Cluster: "alpha", Name: "token:alpha#1", Role: RoleAgent}, timestamppb.New(now))
			b, err := events.Marshal(ev)
			if err != nil {
				t.Fatalf("valid event does not encode: %v", err)
			}
			back, err := events.Unmarshal(b)
			if err != nil || !proto.Equal(back, ev) {
				t.Fatalf("round trip changed the event: %v", err)
			}
		}
	})
}

// FuzzCodecMatchesProto holds the gRPC door's decoding (the server's
// codec: its shape check, then vtprotobuf's decoder) to the standard
// decoder: where both accept they decode the same message, and whatever
// the door accepts is written as a record the standard decoder reads
// downstream.
func FuzzCodecMatchesProto(f *testing.F) {
	good, _ := proto.Marshal(&faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{validEvent(), validEvent()}})
	f.Add(good)
	bad := validEvent()
	bad.Message = "\xff"
	badB, _ := proto.Marshal(&faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{bad}})
	f.Add(badB)
	f.Add([]byte{0x0a, 0x02, 0x3a, 0x00})
	v := Validator{MaxBatch: 1000, MaxFutureSkew: 5 * time.Minute}
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, b []byte) {
		fast, std := &faultlinev1.SubmitEventsRequest{}, &faultlinev1.SubmitEventsRequest{}
		sv := &protoshape.Shaped{Msg: fast}
		errFast := Codec{limits: shapeLimits{maxEvents: v.MaxBatch}}.Unmarshal(b, sv)
		if errFast == nil {
			errFast = cmp.Or(sv.Err, sv.DecodeErr)
		}
		errStd := proto.Unmarshal(b, std)
		// The door may refuse what the standard decoder accepts (it is
		// stricter about wire types in known fields and map entries); where
		// both accept they must agree on every field the gateway keeps
		// (it drops unknown fields of events, see stamp).
		if errStd == nil && errFast == nil {
			fe, se := fast.GetEvents(), std.GetEvents()
			if len(fe) != len(se) {
				t.Fatalf("decoders disagree: %d events vs %d", len(fe), len(se))
			}
			for i := range fe {
				if fe[i] != nil && se[i] != nil {
					discardUnknown(fe[i])
					discardUnknown(se[i])
				}
				if !proto.Equal(fe[i], se[i]) {
					t.Fatalf("decoders disagree on event %d:\nfast %v\nstd  %v", i, fe[i], se[i])
				}
			}
		}
		// Whatever the door accepts (decoded, valid, stamped) must be
		// written as a record every consumer's standard decoder reads.
		if errFast != nil || v.ValidateBatch(fast.GetEvents(), now) != nil {
			return
		}
		for _, ev := range fast.GetEvents() {
			stamp(ev, Caller{Cluster: "alpha", Name: "token:alpha#1", Role: RoleAgent}, timestamppb.New(now))
			b, err := events.Marshal(ev)
			if err != nil {
				t.Fatalf("accepted event does not encode: %v", err)
			}
			if _, err := events.Unmarshal(b); err != nil {
				t.Fatalf("accepted event is not readable downstream: %v", err)
			}
		}
	})
}
