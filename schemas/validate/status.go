package validate

import (
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of the refusals a client
// can act on (FieldError.Code).
const ErrorDomain = "faultline.io"

// Refusals a client can act on: the ErrorInfo reasons, and their metadata
// keys.
const (
	// ReasonFutureTimestamp: events[InfoIndex].generatedTimestamp is more
	// than InfoMaxFutureSkew (a Go duration) ahead of the gateway's clock.
	// The agent resends such an event without it (the gateway then stamps
	// its receive time), its own time kept in its metadata.
	ReasonFutureTimestamp = "GENERATED_TIMESTAMP_IN_FUTURE"
	// ReasonBatchLimit: the call holds more events than InfoMaxBatch (the
	// gateway's gateway.max_batch). The agent sends at most that many a
	// call from then on.
	ReasonBatchLimit = "BATCH_LIMIT_EXCEEDED"

	InfoIndex         = "index"           // the refused event's place in the call
	InfoMaxFutureSkew = "max_future_skew" // of ReasonFutureTimestamp
	InfoMaxBatch      = "max_batch"       // of ReasonBatchLimit
)

// StatusError is err (a ValidateBatch error) as a gRPC status of code c,
// its message err's text; a FieldError with a Code carries it, and its
// Info, in a google.rpc.ErrorInfo detail (domain ErrorDomain), which
// Refusal reads back.
func StatusError(c codes.Code, err error) error {
	st := status.New(c, err.Error())
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Code == "" {
		return st.Err()
	}
	withInfo, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: fe.Code, Domain: ErrorDomain, Metadata: fe.Info})
	if derr != nil {
		return st.Err()
	}
	return withInfo.Err()
}

// Refusal is the ErrorInfo of err (a gRPC status) in ErrorDomain: its
// reason (a FieldError.Code) and metadata; "" if none.
func Refusal(err error) (reason string, info map[string]string) {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return "", nil
	}
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == ErrorDomain {
			return ei.GetReason(), ei.GetMetadata()
		}
	}
	return "", nil
}
