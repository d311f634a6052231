package validate

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestStatusErrorRefusal: the refusals a client acts on carry their reason
// and details in an ErrorInfo, read back by Refusal, with the message
// unchanged; the others carry none.
func TestStatusErrorRefusal(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	good := func() *datamodels.HealthEvent {
		return &datamodels.HealthEvent{Agent: "a", ComponentClass: "GPU", CheckName: "c", NodeName: "n1", Message: "m"}
	}
	future, bad := good(), good()
	future.GeneratedTimestamp = timestamppb.New(now.Add(10 * time.Minute))
	bad.NodeName = "N 1"
	v := Validator{MaxBatch: 3, MaxFutureSkew: 5 * time.Minute}
	for _, tc := range []struct {
		name   string
		evs    []*datamodels.HealthEvent
		reason string
		info   map[string]string
	}{
		{"future", []*datamodels.HealthEvent{good(), future}, ReasonFutureTimestamp, map[string]string{InfoIndex: "1", InfoMaxFutureSkew: "5m0s"}},
		{"batch limit", []*datamodels.HealthEvent{good(), good(), good(), good()}, ReasonBatchLimit, map[string]string{InfoMaxBatch: "3"}},
		{"other", []*datamodels.HealthEvent{bad}, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			verr := v.ValidateBatch(tc.evs, now)
			if verr == nil {
				t.Fatal("accepted")
			}
			err := StatusError(codes.InvalidArgument, verr)
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() != verr.Error() {
				t.Errorf("status %v %q, want InvalidArgument %q", st.Code(), st.Message(), verr.Error())
			}
			reason, info := Refusal(err)
			if reason != tc.reason || len(info) != len(tc.info) {
				t.Fatalf("Refusal = %q %v, want %q %v", reason, info, tc.reason, tc.info)
			}
			for k, v := range tc.info {
				if info[k] != v {
					t.Errorf("info[%s] = %q, want %q", k, info[k], v)
				}
			}
		})
	}
}
