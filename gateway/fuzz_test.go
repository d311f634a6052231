package gateway

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/events"
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
			stamp(ev, "alpha", timestamppb.New(now))
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
