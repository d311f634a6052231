package gateway

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
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
