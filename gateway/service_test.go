package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
	"github.com/faultline/faultline/schemas/nvsentinel"
)

// fakeProducer records what would go to Kafka (a unit-test stand-in; the
// real broker is exercised in integration_test.go).
type fakeProducer struct {
	produced int
	err      error
}

func (f *fakeProducer) Produce(_ context.Context, evs []*datamodels.HealthEvent) error {
	if f.err != nil {
		return f.err
	}
	f.produced += len(evs)
	return nil
}

func testService(p eventProducer, rate float64, burst int) *service {
	return &service{
		validator: Validator{MaxBatch: 10, MaxFutureSkew: time.Minute},
		producer:  p, limiter: newLimiter(rate, burst),
		metrics: newMetrics(prometheus.NewRegistry()), now: func() time.Time { return testNow },
		log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

func submit(s *service, c Caller, n int) error {
	evs := make([]*datamodels.HealthEvent, n)
	for i := range evs {
		evs[i] = validEvent()
	}
	_, err := s.SubmitEvents(withCaller(context.Background(), c), &faultlinev1.SubmitEventsRequest{Events: evs})
	return err
}

func TestRateLimitPerCaller(t *testing.T) {
	p := &fakeProducer{}
	s := testService(p, 1, 10) // 10 events of burst, then 1/s (the clock does not move)
	a1 := Caller{Cluster: "alpha", Name: "token:alpha#1"}
	a2 := Caller{Cluster: "alpha", Name: "token:alpha#2"}
	if err := submit(s, a1, 10); err != nil {
		t.Fatal(err)
	}
	if err := submit(s, a1, 1); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("over the limit: %v", err)
	}
	if err := submit(s, a2, 10); err != nil {
		t.Fatalf("another caller of the same cluster has its own bucket: %v", err)
	}
	if p.produced != 20 {
		t.Fatalf("produced %d, want 20 (the refused batch must not be produced)", p.produced)
	}
}

func TestProduceErrorsMapToStatus(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want codes.Code
	}{
		{ErrOverloaded, codes.ResourceExhausted},
		{ErrUnavailable, codes.Unavailable},
		{errors.New("anything else"), codes.Unavailable},
	} {
		s := testService(&fakeProducer{err: tt.err}, 0, 0)
		if err := submit(s, Caller{Cluster: "alpha", Name: "x"}, 1); status.Code(err) != tt.want {
			t.Errorf("%v: got %v, want %v", tt.err, err, tt.want)
		}
	}
	s := testService(&fakeProducer{}, 0, 0)
	if _, err := s.SubmitEvents(context.Background(), &faultlinev1.SubmitEventsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no caller: %v", err)
	}
}

// TestClientIDIsAnIdempotencyKey: an event the client gave an id is stored
// under an id derived from it and the caller's cluster, so a retry is the
// same event downstream and no cluster can collide with another's; events
// without one get fresh ids.
func TestClientIDIsAnIdempotencyKey(t *testing.T) {
	s := testService(&fakeProducer{}, 0, 0)
	send := func(cluster, id string) (string, error) {
		ev := validEvent()
		ev.Id = id
		resp, err := s.SubmitEvents(withCaller(context.Background(), Caller{Cluster: cluster, Name: "token:" + cluster}),
			&faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{ev}})
		if err != nil {
			return "", err
		}
		return resp.GetIds()[0], nil
	}
	const key = "0195f0e2-7c1a-7d3e-9c4b-2a1f00000001"
	first, err := send("alpha", key)
	if err != nil {
		t.Fatal(err)
	}
	retry, _ := send("alpha", key)
	other, _ := send("beta", key)
	fresh1, _ := send("alpha", "")
	fresh2, _ := send("alpha", "")
	switch {
	case first != retry:
		t.Errorf("a retry with the same id got %s, then %s", first, retry)
	case first == key:
		t.Errorf("the stored id is the client's (%s): another cluster could collide with it", first)
	case other == first:
		t.Errorf("two clusters' events with the same client id share stored id %s", first)
	case fresh1 == fresh2 || fresh1 == "":
		t.Errorf("events without an id got %q and %q", fresh1, fresh2)
	}
	if _, err := send("alpha", strings.Repeat("x", 129)); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "id") {
		t.Errorf("a 129-byte id: %v, want InvalidArgument naming id", err)
	}
}

// TestNVSentinelResendIsOneEvent: NVSentinel's monitors set no event id and
// resend a call unchanged when they lose its answer — in direct mode with
// the call's idempotency-key header, on a socket without one. Each event
// of the resend gets the stored id of the first sending; different calls,
// and different events, get different ids.
func TestNVSentinelResendIsOneEvent(t *testing.T) {
	caller := Caller{Cluster: "alpha", Name: "token:alpha"}
	later := validEvent()
	later.GeneratedTimestamp = timestamppb.New(testNow.Add(-time.Second))
	untimed := validEvent()
	untimed.GeneratedTimestamp = nil
	withKey := func(k string) context.Context {
		return metadata.NewIncomingContext(withCaller(context.Background(), caller), metadata.Pairs(idempotencyKeyHeader, k))
	}
	plain := withCaller(context.Background(), caller)
	for _, tc := range []struct {
		name        string
		ctx1, ctx2  context.Context
		first, then []*datamodels.HealthEvent
		wantSame    []bool // per event: the resend has the first's id
	}{
		{"direct mode: the call resent with its key", withKey("k1"), withKey("k1"),
			[]*datamodels.HealthEvent{validEvent(), later}, []*datamodels.HealthEvent{validEvent(), later}, []bool{true, true}},
		{"direct mode: another call", withKey("k1"), withKey("k2"),
			[]*datamodels.HealthEvent{validEvent()}, []*datamodels.HealthEvent{validEvent()}, []bool{false}},
		{"direct mode: an event without generatedTimestamp resent", withKey("k1"), withKey("k1"),
			[]*datamodels.HealthEvent{untimed}, []*datamodels.HealthEvent{untimed}, []bool{true}},
		{"socket: the call resent", plain, plain,
			[]*datamodels.HealthEvent{validEvent(), later}, []*datamodels.HealthEvent{validEvent(), later}, []bool{true, true}},
		{"socket: a later occurrence", plain, plain,
			[]*datamodels.HealthEvent{validEvent()}, []*datamodels.HealthEvent{later}, []bool{false}},
		{"socket: without generatedTimestamp", plain, plain,
			[]*datamodels.HealthEvent{untimed}, []*datamodels.HealthEvent{untimed}, []bool{false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &capture{}
			s := testService(c, 0, 0)
			clone := func(evs []*datamodels.HealthEvent) []*datamodels.HealthEvent {
				out := make([]*datamodels.HealthEvent, len(evs))
				for i, ev := range evs {
					out[i] = proto.Clone(ev).(*datamodels.HealthEvent)
				}
				return out
			}
			if _, err := s.HealthEventOccurredV1(tc.ctx1, &datamodels.HealthEvents{Version: 1, Events: clone(tc.first)}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.HealthEventOccurredV1(tc.ctx2, &datamodels.HealthEvents{Version: 1, Events: clone(tc.then)}); err != nil {
				t.Fatal(err)
			}
			n := len(tc.first)
			if len(c.evs) != 2*n {
				t.Fatalf("produced %d events", len(c.evs))
			}
			for i, want := range tc.wantSame {
				a, b := c.evs[i].GetId(), c.evs[n+i].GetId()
				if a == "" || b == "" || (a == b) != want {
					t.Errorf("event %d: ids %q and %q, same %v, want %v", i, a, b, a == b, want)
				}
			}
			if n > 1 && c.evs[0].GetId() == c.evs[1].GetId() {
				t.Errorf("two events of one call share id %s", c.evs[0].GetId())
			}
		})
	}
}

// TestNVSentinelNormalised: NVSentinel's syslog monitor's Xid, sent in
// direct mode, is produced in faultline's vocabulary (nvsentinel.Normalize:
// "31" → "XID-31", GPU_UUID → GPU), with the same id when resent; an event
// sent through faultline's own API is left as it is.
func TestNVSentinelNormalised(t *testing.T) {
	c := &capture{}
	s := testService(c, 0, 0)
	ctx := withCaller(context.Background(), Caller{Cluster: "alpha", Name: "token:alpha"})
	nv := func() *datamodels.HealthEvent {
		ev := validEvent()
		ev.Agent, ev.CheckName, ev.ErrorCode = "syslog-health-monitor", "SysLogsXIDError", []string{"31"}
		ev.EntitiesImpacted = []*datamodels.Entity{{EntityType: "PCI", EntityValue: "0000:17:00"}, {EntityType: "GPU_UUID", EntityValue: "GPU-3f2a"}}
		return ev
	}
	for range 2 {
		if _, err := s.HealthEventOccurredV1(ctx, &datamodels.HealthEvents{Version: 1, Events: []*datamodels.HealthEvent{nv()}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.SubmitEvents(ctx, &faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{nv()}}); err != nil {
		t.Fatal(err)
	}
	for i, ev := range c.evs[:2] {
		if fmt.Sprint(ev.GetErrorCode()) != "[XID-31]" || events.EntityKey(ev) != "PCI=0000:17:00,GPU=GPU-3f2a" || ev.GetMetadata()[nvsentinel.MetaErrorCode] != "31" {
			t.Fatalf("event %d: errorCode %v, entities %s, metadata %v: not normalised", i, ev.GetErrorCode(), events.EntityKey(ev), ev.GetMetadata())
		}
	}
	if c.evs[0].GetId() != c.evs[1].GetId() {
		t.Errorf("resend: ids %s and %s", c.evs[0].GetId(), c.evs[1].GetId())
	}
	if got := c.evs[2]; fmt.Sprint(got.GetErrorCode()) != "[31]" {
		t.Errorf("SubmitEvents: errorCode %v, want it as sent", got.GetErrorCode())
	}
}

// capture records the events the service would produce.
type capture struct{ evs []*datamodels.HealthEvent }

func (c *capture) Produce(_ context.Context, evs []*datamodels.HealthEvent) error {
	c.evs = append(c.evs, evs...)
	return nil
}

// TestSubmitterAndNodeBinding: every accepted event carries the caller's
// credential as its submitter (an agent's overrides are stamped as an
// agent's, whatever the client claimed), and a node-bound credential
// cannot report for another node.
func TestSubmitterAndNodeBinding(t *testing.T) {
	c := &capture{}
	s := testService(c, 0, 0)
	agent := Caller{Cluster: "alpha", Name: "token:alpha#1", Role: RoleAgent}
	bound := Caller{Cluster: "alpha", Name: "token:alpha#2", Role: RoleAgent, Node: "gpu-node-42"}
	operator := Caller{Cluster: "alpha", Name: "token:alpha#3", Role: RoleOperator}
	send := func(c Caller, node string) error {
		ev := validEvent()
		ev.NodeName = node
		ev.QuarantineOverrides = &datamodels.BehaviourOverrides{Force: true}
		ev.Submitter = &datamodels.Submitter{Name: "me", Role: RoleOperator} // forged
		_, err := s.SubmitEvents(withCaller(context.Background(), c), &faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{validEvent(), ev}})
		return err
	}
	if err := send(agent, "gpu-node-7"); err != nil {
		t.Fatal(err)
	}
	if err := send(operator, "gpu-node-7"); err != nil {
		t.Fatal(err)
	}
	if err := send(bound, "gpu-node-42"); err != nil {
		t.Fatal(err)
	}
	err := send(bound, "gpu-node-7")
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `events[1].nodeName: "gpu-node-7" is not "gpu-node-42"`) {
		t.Fatalf("a node-bound credential reporting for another node: %v", err)
	}
	if len(c.evs) != 6 {
		t.Fatalf("%d events produced, want 6 (the refused batch produces none)", len(c.evs))
	}
	for i, want := range []Caller{agent, agent, operator, operator, bound, bound} {
		got := c.evs[i].GetSubmitter()
		if got.GetName() != want.Name || got.GetRole() != want.Role || got.GetNode() != want.Node {
			t.Errorf("event %d: submitter %v, want %+v", i, got, want)
		}
	}
	if !c.evs[1].GetQuarantineOverrides().GetForce() || c.evs[1].GetSubmitter().GetRole() != RoleAgent {
		t.Errorf("an agent's override is kept for the audit and stamped as an agent's: %v", c.evs[1])
	}
}

// fakeHistory answers reads, failing with err or blocking until release.
type fakeHistory struct {
	err     error
	block   chan struct{}
	entered chan struct{}
	lastReq *faultlinev1.ListEventsRequest
}

func (f *fakeHistory) ListEvents(ctx context.Context, _ string, req *faultlinev1.ListEventsRequest) (*faultlinev1.ListEventsResponse, error) {
	f.lastReq = req
	if f.block != nil {
		f.entered <- struct{}{}
		<-f.block
	}
	return &faultlinev1.ListEventsResponse{}, f.err
}

func (f *fakeHistory) ListActions(context.Context, string, *faultlinev1.ListActionsRequest) (*faultlinev1.ListActionsResponse, error) {
	return &faultlinev1.ListActionsResponse{}, f.err
}

// TestHistoryReads: reads are rate-limited per caller and bounded in
// number; a node-bound credential reads its own node only; a failing store
// answers a generic message (details go to the log).
func TestHistoryReads(t *testing.T) {
	h := &fakeHistory{}
	s := testService(&fakeProducer{}, 0, 0)
	s.history, s.readLimiter, s.reads = h, newLimiter(1, 3), semaphore.NewWeighted(1)
	read := func(c Caller, node string) error {
		_, err := s.ListEvents(withCaller(context.Background(), c), &faultlinev1.ListEventsRequest{Node: node})
		return err
	}
	a1 := Caller{Cluster: "alpha", Name: "token:alpha#1", Role: RoleAgent}
	for i := range 3 {
		if err := read(a1, ""); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
	}
	if err := read(a1, ""); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "read rate") {
		t.Fatalf("4th read in the same instant: %v", err)
	}
	bound := Caller{Cluster: "alpha", Name: "token:alpha#2", Role: RoleAgent, Node: "gpu-node-42"}
	if err := read(bound, ""); err != nil || h.lastReq.GetNode() != "gpu-node-42" {
		t.Fatalf("a node-bound read without a node reads its node: %v, node %q", err, h.lastReq.GetNode())
	}
	if err := read(bound, "gpu-node-7"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a node-bound read of another node: %v", err)
	}

	// One read in progress fills the bound of 1: the next is refused.
	h.block, h.entered = make(chan struct{}), make(chan struct{})
	done := make(chan error)
	a3 := Caller{Cluster: "alpha", Name: "token:alpha#3"}
	go func() { done <- read(a3, "") }()
	<-h.entered
	if err := read(Caller{Cluster: "alpha", Name: "token:alpha#4"}, ""); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "too many history reads") {
		t.Fatalf("read beyond max_concurrent_reads: %v", err)
	}
	close(h.block)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	h.block = nil

	h.err = errors.New("clickhouse ping clickhouse://default@10.1.2.3:9000/faultline: code: 516, message: default: Authentication failed")
	err := read(Caller{Cluster: "alpha", Name: "token:alpha#5"}, "")
	if status.Code(err) != codes.Unavailable || strings.Contains(err.Error(), "10.1.2.3") || strings.Contains(err.Error(), "default") {
		t.Fatalf("a store failure must answer a generic Unavailable: %v", err)
	}
}
