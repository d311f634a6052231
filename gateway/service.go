package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"golang.org/x/sync/semaphore"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/warnlimit"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
	"github.com/faultline/faultline/schemas/nvsentinel"
	"github.com/faultline/faultline/schemas/validate"
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
	log       *slog.Logger

	// readLimiter is the per-caller token bucket of history reads
	// (requests, not events); reads bounds how many run at once.
	readLimiter *limiter
	reads       *semaphore.Weighted
	// readTimeout bounds one history read (0: none).
	readTimeout time.Duration
	// produceWarns names why the event log refused events (nil: not logged).
	produceWarns *warnlimit.Limit
}

// SubmitEvents is faultline's submission: it answers with the ids.
func (s *service) SubmitEvents(ctx context.Context, req *faultlinev1.SubmitEventsRequest) (*faultlinev1.SubmitEventsResponse, error) {
	if err := s.holdDecoded(ctx, req.GetEvents()); err != nil {
		return nil, err
	}
	ids, err := s.ingest(ctx, "SubmitEvents", req.GetEvents())
	if err != nil {
		return nil, err
	}
	return &faultlinev1.SubmitEventsResponse{Ids: ids}, nil
}

// HealthEventOccurredV1 is NVSentinel's submission. Its events get client
// ids where they have none (nvsentinelIDs), so a monitor's resend is one
// event downstream, and then faultline's vocabulary where they report what
// faultline's checks do (nvsentinel.Normalize: Xid "31" is "XID-31"), so
// the correlation rules count them.
func (s *service) HealthEventOccurredV1(ctx context.Context, req *datamodels.HealthEvents) (*emptypb.Empty, error) {
	if err := s.holdDecoded(ctx, req.GetEvents()); err != nil {
		return nil, err
	}
	nvsentinelIDs(ctx, req.GetEvents())
	for _, ev := range req.GetEvents() {
		nvsentinel.Normalize(ev) // after the id, derived from the event as sent
	}
	if _, err := s.ingest(ctx, "HealthEventOccurredV1", req.GetEvents()); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

// holdDecoded makes a submission's in-flight reservation (both doors put
// it in the context) hold, in the gateway's budget, what its decoded
// events cost (decodedCost), not only their wire size: decoded, a message
// can take 15 times its bytes, and calls held by a slow event log held 15
// times gateway.max_inflight_bytes. It grows without waiting; when the
// budget cannot take it the call is refused like one that does not fit
// (RESOURCE_EXHAUSTED, 429), and the client resends it later.
func (s *service) holdDecoded(ctx context.Context, evs []*datamodels.HealthEvent) error {
	res := reservationFrom(ctx)
	if res == nil {
		return nil
	}
	switch err := res.holdDecoded(decodedCost(evs)); {
	case err == nil:
		return nil
	case errors.Is(err, errReleased): // the call is over
		return status.Error(codes.Canceled, "the call ended")
	default:
		reason, msg := busyRefusal(err)
		s.metrics.rejected(reason, 1)
		return status.Error(codes.ResourceExhausted, msg)
	}
}

// idempotencyKeyHeader is the gRPC metadata key of NVSentinel's
// per-call idempotency key (healthpub.IdempotencyKeyHeader): its monitors
// publishing to a remote platform connector (HEALTH_PUBLISH_TARGET, "direct
// mode") generate one per call and send it on every retry of the call.
const idempotencyKeyHeader = "idempotency-key"

// nvsentinelIDs gives NVSentinel's events that carry no id the client id
// the gateway then stores them under (events.StoredID): a function of the
// call's idempotency-key header and the event's place in the call, or,
// without that header, of the event itself when it carries its
// generatedTimestamp (events.OccurrenceID). NVSentinel's monitors set no
// id and resend a call unchanged when its answer is lost (healthpub: in
// direct mode within a retry window on any transient failure, on the
// socket up to 5 attempts on Unavailable, DeadlineExceeded or a dropped
// connection), so without this each resend — a Kafka write that succeeded
// after the monitor's deadline, a gateway replica restarting before it
// answered — was another event, counted again toward the rules' thresholds.
func nvsentinelIDs(ctx context.Context, evs []*datamodels.HealthEvent) {
	key := ""
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(idempotencyKeyHeader); len(v) > 0 {
			key = v[0]
		}
	}
	for i, ev := range evs {
		switch {
		case ev == nil || ev.GetId() != "":
		case key != "":
			ev.Id = events.HashID("nvsentinel-idempotency-key/v1", key, strconv.Itoa(i))
		case ev.GetGeneratedTimestamp() != nil:
			ev.Id = events.OccurrenceID(ev)
		}
	}
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
		// A refusal the agent acts on (a generatedTimestamp ahead of this
		// clock, more events than gateway.max_batch) says so in a detail.
		return nil, validate.StatusError(codes.InvalidArgument, err)
	}
	if caller.Node != "" {
		for i, ev := range evs {
			if ev.GetNodeName() != caller.Node {
				s.metrics.rejected("wrong_node", len(evs))
				return nil, status.Errorf(codes.PermissionDenied, "events[%d].nodeName: %q is not %q, the only node credential %s may report for",
					i, ev.GetNodeName(), caller.Node, caller.Name)
			}
		}
	}
	if !s.limiter.allow(caller.Name, len(evs), now) {
		s.metrics.rejected("rate_limited", len(evs))
		return nil, status.Errorf(codes.ResourceExhausted, "caller %s (cluster %s) is over its rate limit; retry later", caller.Name, caller.Cluster)
	}
	ids := make([]string, len(evs))
	received := timestamppb.New(now)
	for i, ev := range evs {
		stamp(ev, caller, received)
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
		s.produceFailed(err)
		return nil, status.Error(codes.Unavailable, "events not accepted: the event log is unavailable; retry later")
	}
	s.metrics.acceptedEvents(caller.Cluster, method, len(evs))
	return ids, nil
}

// produceFailed logs why the event log did not take a call's events
// (each reason at most once per 10 s; warnlimit): the client is answered
// Unavailable, to retry, whatever the reason, and a reason that lasts (the
// topic's authorization, a missing topic, SASL) is the operator's to fix.
func (s *service) produceFailed(err error) {
	if s.produceWarns == nil {
		return
	}
	switch named, full := s.produceWarns.Allow(err.Error(), time.Now()); {
	case named:
		s.log.Warn("events not accepted: the event log refused them; the caller is told to retry", "err", err)
	case full:
		s.log.Warn(fmt.Sprintf("events not accepted: more than %d reasons within %s, the rest not logged until then (faultline_gateway_events_rejected_total{reason=\"kafka_unavailable\"} counts them)", warnKeys, warnWindow))
	}
}

// stamp sets the fields the gateway owns; client values are overwritten.
// The id is new (UUIDv7), or, when the client set one (any key up to 128
// bytes; the faultline agent sets a UUID when it spools the event),
// derived from it, the cluster and the event's node (events.StoredID): a
// client that resends an event after a timeout or a 503 with the same id
// has it stored, counted and acted on once, and the same id on two nodes'
// events is two events. The submitter is the caller's credential (its
// role decides whether the processors honour the event's overrides).
// Fields the gateway does not know are dropped, so every record it
// writes decodes with the standard decoder downstream.
func stamp(ev *datamodels.HealthEvent, caller Caller, received *timestamppb.Timestamp) {
	cluster := caller.Cluster
	discardUnknown(ev)
	ev.Submitter = caller.Submitter()
	if ev.Id == "" {
		ev.Id = events.NewID()
	} else {
		ev.Id = events.StoredID(cluster, ev.GetNodeName(), ev.Id)
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

// ListEvents serves the caller's cluster's history (a node-bound
// credential's node only).
func (s *service) ListEvents(ctx context.Context, req *faultlinev1.ListEventsRequest) (*faultlinev1.ListEventsResponse, error) {
	caller, done, err := s.reader(ctx, req.GetNode())
	if err != nil {
		return nil, err
	}
	defer done()
	if caller.Node != "" && req.GetNode() == "" {
		req.Node = caller.Node
	}
	ctx, cancel := s.readContext(ctx)
	defer cancel()
	resp, err := s.history.ListEvents(ctx, caller.Cluster, req)
	return resp, s.readErr(ctx, "list events", err)
}

// ListActions serves the caller's cluster's audit trail (a node-bound
// credential's node only).
func (s *service) ListActions(ctx context.Context, req *faultlinev1.ListActionsRequest) (*faultlinev1.ListActionsResponse, error) {
	caller, done, err := s.reader(ctx, req.GetNode())
	if err != nil {
		return nil, err
	}
	defer done()
	if caller.Node != "" && req.GetNode() == "" {
		req.Node = caller.Node
	}
	ctx, cancel := s.readContext(ctx)
	defer cancel()
	resp, err := s.history.ListActions(ctx, caller.Cluster, req)
	return resp, s.readErr(ctx, "list actions", err)
}

// reader admits a history read: an authenticated caller allowed to read
// node (a node-bound credential reads its own node only), within its
// per-caller read rate and the gateway's bound on concurrent reads. done
// releases the read's slot.
func (s *service) reader(ctx context.Context, node string) (Caller, func(), error) {
	caller, ok := CallerFrom(ctx)
	if !ok {
		return Caller{}, nil, status.Error(codes.Unauthenticated, ErrNoCredential.Error())
	}
	if s.history == nil {
		return Caller{}, nil, status.Error(codes.Unimplemented, "history is not configured on this gateway (no ClickHouse)")
	}
	if caller.Node != "" && node != "" && node != caller.Node {
		return Caller{}, nil, status.Errorf(codes.PermissionDenied, "node: credential %s may read the history of node %q only", caller.Name, caller.Node)
	}
	if !s.readLimiter.allow(caller.Name, 1, s.now()) {
		s.metrics.rejected("read_rate_limited", 1)
		return Caller{}, nil, status.Errorf(codes.ResourceExhausted, "caller %s is over its history read rate; retry later", caller.Name)
	}
	if s.reads != nil {
		if !s.reads.TryAcquire(1) {
			s.metrics.rejected("reads_busy", 1)
			return Caller{}, nil, status.Error(codes.ResourceExhausted, "too many history reads in progress; retry later")
		}
		return caller, func() { s.reads.Release(1) }, nil
	}
	return caller, func() {}, nil
}

func (s *service) readContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.readTimeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.readTimeout)
}

// readErr keeps status errors (e.g. InvalidArgument from a bad page token),
// answers the request's own deadline or cancellation as such, and maps
// anything else to a generic Unavailable: the details (a ClickHouse
// address, a user name) go to the log, never to the client.
func (s *service) readErr(ctx context.Context, what string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	if s.log != nil {
		s.log.Warn("history read failed", "read", what, "err", err)
	}
	return status.Error(codes.Unavailable, fmt.Sprintf("%s: history unavailable; retry later", what))
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
