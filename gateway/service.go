package gateway

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// History serves the read side of the API (GET /v1/events, /v1/actions),
// always scoped to the caller's cluster.
type History interface {
	ListEvents(ctx context.Context, cluster string, req *faultlinev1.ListEventsRequest) (*faultlinev1.ListEventsResponse, error)
	ListActions(ctx context.Context, cluster string, req *faultlinev1.ListActionsRequest) (*faultlinev1.ListActionsResponse, error)
}

// eventProducer is what the service needs of Kafka.
type eventProducer interface {
	Produce(ctx context.Context, evs []*datamodels.HealthEvent) error
}

// service implements both gRPC services over one ingest path.
type service struct {
	faultlinev1.UnimplementedEventsServer
	datamodels.UnimplementedPlatformConnectorServer

	validator Validator
	producer  eventProducer
	limiter   *limiter
	history   History
	metrics   *metrics
	now       func() time.Time
}

// SubmitEvents is faultline's submission: it answers with the ids.
func (s *service) SubmitEvents(ctx context.Context, req *faultlinev1.SubmitEventsRequest) (*faultlinev1.SubmitEventsResponse, error) {
	ids, err := s.ingest(ctx, "SubmitEvents", req.GetEvents())
	if err != nil {
		return nil, err
	}
	return &faultlinev1.SubmitEventsResponse{Ids: ids}, nil
}

// HealthEventOccurredV1 is NVSentinel's submission.
func (s *service) HealthEventOccurredV1(ctx context.Context, req *datamodels.HealthEvents) (*emptypb.Empty, error) {
	if _, err := s.ingest(ctx, "HealthEventOccurredV1", req.GetEvents()); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

// ingest authenticates, validates, stamps and produces a batch; it is
// all-or-nothing up to the Kafka write.
func (s *service) ingest(ctx context.Context, method string, evs []*datamodels.HealthEvent) ([]string, error) {
	caller, ok := CallerFrom(ctx)
	if !ok {
		s.metrics.rejected("unauthenticated", len(evs))
		return nil, status.Error(codes.Unauthenticated, ErrNoCredential.Error())
	}
	now := s.now()
	if err := s.validator.ValidateBatch(evs, now); err != nil {
		s.metrics.rejected("invalid", len(evs))
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if !s.limiter.allow(caller.Name, len(evs), now) {
		s.metrics.rejected("rate_limited", len(evs))
		return nil, status.Errorf(codes.ResourceExhausted, "caller %s (cluster %s) is over its rate limit; retry later", caller.Name, caller.Cluster)
	}
	ids := make([]string, len(evs))
	received := timestamppb.New(now)
	for i, ev := range evs {
		stamp(ev, caller.Cluster, received)
		ids[i] = ev.GetId()
	}
	start := time.Now()
	err := s.producer.Produce(ctx, evs)
	s.metrics.produceLatency.Observe(time.Since(start).Seconds())
	switch {
	case errors.Is(err, ErrOverloaded):
		s.metrics.rejected("overloaded", len(evs))
		return nil, status.Error(codes.ResourceExhausted, "gateway is overloaded; retry later")
	case err != nil:
		s.metrics.rejected("kafka_unavailable", len(evs))
		return nil, status.Error(codes.Unavailable, "events not accepted: the event log is unavailable; retry later")
	}
	s.metrics.accepted.WithLabelValues(caller.Cluster, method).Add(float64(len(evs)))
	return ids, nil
}

// stamp sets the fields the gateway owns; client values are overwritten.
// The id is new (UUIDv7), or, when the client set one (any key up to 128
// bytes; the faultline agent sets a UUID when it spools the event),
// derived from it and the cluster (events.StoredID): a client that resends
// an event after a timeout or a 503 with the same id has it stored,
// counted and acted on once. Fields the gateway does not know are dropped, so every record it
// writes decodes with the standard decoder downstream.
func stamp(ev *datamodels.HealthEvent, cluster string, received *timestamppb.Timestamp) {
	discardUnknown(ev)
	if ev.Id == "" {
		ev.Id = events.NewID()
	} else {
		ev.Id = events.StoredID(cluster, ev.Id)
	}
	ev.Cluster = cluster
	ev.ReceivedTimestamp = received
	ev.DerivedBy = ""
	ev.CauseIds = nil
	if ev.GeneratedTimestamp == nil {
		ev.GeneratedTimestamp = received
	}
	if ev.ProcessingStrategy == datamodels.ProcessingStrategy_UNSPECIFIED {
		ev.ProcessingStrategy = datamodels.ProcessingStrategy_EXECUTE_REMEDIATION
	}
}

// ListEvents serves the caller's cluster's history.
func (s *service) ListEvents(ctx context.Context, req *faultlinev1.ListEventsRequest) (*faultlinev1.ListEventsResponse, error) {
	caller, err := s.reader(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := s.history.ListEvents(ctx, caller.Cluster, req)
	return resp, readErr(err)
}

// ListActions serves the caller's cluster's audit trail.
func (s *service) ListActions(ctx context.Context, req *faultlinev1.ListActionsRequest) (*faultlinev1.ListActionsResponse, error) {
	caller, err := s.reader(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := s.history.ListActions(ctx, caller.Cluster, req)
	return resp, readErr(err)
}

func (s *service) reader(ctx context.Context) (Caller, error) {
	caller, ok := CallerFrom(ctx)
	if !ok {
		return Caller{}, status.Error(codes.Unauthenticated, ErrNoCredential.Error())
	}
	if s.history == nil {
		return Caller{}, status.Error(codes.Unimplemented, "history is not configured on this gateway (no ClickHouse)")
	}
	return caller, nil
}

// readErr keeps status errors (e.g. InvalidArgument from a bad page token)
// and maps anything else to Unavailable.
func readErr(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Errorf(codes.Unavailable, "history unavailable: %v", err)
}

// discardUnknown drops unknown fields from the event and the messages in it.
func discardUnknown(ev *datamodels.HealthEvent) {
	for _, m := range []protoreflect.ProtoMessage{ev, ev.GeneratedTimestamp, ev.QuarantineOverrides, ev.DrainOverrides} {
		if r := m.ProtoReflect(); r.IsValid() && len(r.GetUnknown()) > 0 {
			r.SetUnknown(nil)
		}
	}
	for _, e := range ev.EntitiesImpacted {
		if r := e.ProtoReflect(); r.IsValid() && len(r.GetUnknown()) > 0 {
			r.SetUnknown(nil)
		}
	}
}
