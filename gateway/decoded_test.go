package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/faultline/faultline/internal/warnlimit"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// denseEvents are n events with as many one-byte elements as the shape
// check lets an event have (64 entities, 64 metadata entries, 64 causeIds,
// 32 error codes): a few wire bytes each, tens decoded.
func denseEvents(n int, causes bool) []*datamodels.HealthEvent {
	evs := make([]*datamodels.HealthEvent, n)
	for i := range evs {
		ev := validEvent()
		ev.EntitiesImpacted, ev.ErrorCode, ev.Metadata = nil, nil, map[string]string{}
		for j := range 64 {
			ev.EntitiesImpacted = append(ev.EntitiesImpacted, &datamodels.Entity{EntityType: "GPU", EntityValue: "x"})
			ev.Metadata[fmt.Sprintf("k%02d", j)] = "v"
			if causes {
				ev.CauseIds = append(ev.CauseIds, "")
			}
		}
		for range 32 {
			ev.ErrorCode = append(ev.ErrorCode, "x")
		}
		evs[i] = ev
	}
	return evs
}

// decodeAllocs is the bytes UnmarshalVT allocates decoding b.
func decodeAllocs(t *testing.T, b []byte) (int64, *faultlinev1.SubmitEventsRequest) {
	var before, after runtime.MemStats
	req := &faultlinev1.SubmitEventsRequest{}
	runtime.GC()
	runtime.ReadMemStats(&before)
	err := req.UnmarshalVT(b)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	return int64(after.TotalAlloc - before.TotalAlloc), req
}

// TestDecodedCostCoversDecoding: what a submission's reservation holds
// once decoded (decodedCost) is at least what decoding its message
// allocated, for the densest events the shape check lets through (14 times
// their wire size: the wire size the reservation held let 24 slow calls
// hold 460 MB), and within twice it for the usual events; computing it
// allocates nothing.
func TestDecodedCostCoversDecoding(t *testing.T) {
	usual := make([]*datamodels.HealthEvent, 1000)
	for i := range usual {
		usual[i] = validEvent()
	}
	for _, tc := range []struct {
		name    string
		evs     []*datamodels.HealthEvent
		atMost2 bool
	}{
		{"dense", denseEvents(1000, true), false},
		{"dense, no causeIds", denseEvents(1000, false), false},
		{"usual", usual, true},
	} {
		b, err := (&faultlinev1.SubmitEventsRequest{Events: tc.evs}).MarshalVT()
		if err != nil {
			t.Fatal(err)
		}
		allocs, req := decodeAllocs(t, b)
		cost := decodedCost(req.GetEvents())
		t.Logf("%s: %d wire bytes, %d allocated decoding (×%.1f), decodedCost %d (×%.2f of the allocation)",
			tc.name, len(b), allocs, float64(allocs)/float64(len(b)), cost, float64(cost)/float64(allocs))
		if cost < allocs {
			t.Errorf("%s: decodedCost %d, less than the %d bytes decoding allocated", tc.name, cost, allocs)
		}
		if ceiling := decodedCeiling(len(tc.evs), len(b)); cost > ceiling {
			t.Errorf("%s: decodedCost %d, over the ceiling %d gateway.max_decoded_bytes is checked against", tc.name, cost, ceiling)
		}
		if tc.atMost2 && cost > 2*allocs {
			t.Errorf("%s: decodedCost %d, more than twice the %d bytes decoding allocated", tc.name, cost, allocs)
		}
		if n := testing.AllocsPerRun(10, func() { decodedCost(req.GetEvents()) }); n != 0 {
			t.Errorf("%s: decodedCost allocates %v times", tc.name, n)
		}
	}
}

// TestDecodedCostOverBudgetRefusedBusy: a submission whose wire size fits
// the in-flight budget and whose decoded events do not fit theirs
// (gateway.max_decoded_bytes) is refused like one that does not fit
// (RESOURCE_EXHAUSTED; 429 with Retry-After), through both doors, and
// nothing stays held; the usual events are accepted.
func TestDecodedCostOverBudgetRefusedBusy(t *testing.T) {
	tokens, err := ParseTokens(strings.NewReader("test-token-of-alpha-0001,alpha,agent\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.MaxBodyBytes = 1 << 20
	cfg.MaxInflightBytes, cfg.MaxInflightBytesPerConn, cfg.MaxReadBytesPerCaller = 1<<20, 1<<20, 1<<20
	cfg.MaxDecodedBytes = 1 << 20 // below Validate's floor, for a small dense request
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := &Server{
		cfg: cfg, log: log, auth: &Authenticator{Tokens: tokens}, metrics: m, reg: reg,
		flight:    newInflight(cfg.MaxInflightBytes, cfg.MaxInflightBytesPerConn, cfg.MaxReadBytesPerCaller, cfg.MaxDecodedBytes),
		busyWarns: warnlimit.New(warnWindow, warnKeys), connWarns: warnlimit.New(warnWindow, warnKeys),
		codec: Codec{limits: shapeLimits{maxEvents: cfg.MaxBatch}},
		svc: &service{
			validator: Validator{MaxBatch: cfg.MaxBatch, MaxFutureSkew: cfg.MaxFutureSkew},
			producer:  &fakeProducer{}, limiter: newLimiter(1e6, 1e6),
			metrics: m, now: func() time.Time { return testNow }, log: log,
		},
	}
	g := s.newGRPCServer(doorGRPC, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h, err := s.httpHandler(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)

	dense := &faultlinev1.SubmitEventsRequest{Events: denseEvents(100, false)}
	usual := &faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{validEvent()}}
	if wire, cost := int64(dense.SizeVT()), decodedCost(dense.Events); wire > cfg.MaxInflightBytes/4 || cost <= cfg.MaxDecodedBytes {
		t.Fatalf("the dense request: %d wire bytes, %d decoded; want its wire size to fit and its decoded cost not", wire, cost)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer test-token-of-alpha-0001")
	client := faultlinev1.NewEventsClient(conn)
	post := func(req *faultlinev1.SubmitEventsRequest) (*http.Response, string) {
		body, err := protojson.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		hr, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/events", bytes.NewReader(body))
		hr.Header.Set("Authorization", "Bearer test-token-of-alpha-0001")
		hr.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return resp, string(b)
	}

	if _, err := client.SubmitEvents(ctx, dense); status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "max_decoded_bytes") {
		t.Errorf("gRPC, decoded over the budget: %v, want RESOURCE_EXHAUSTED naming gateway.max_decoded_bytes", err)
	}
	if _, err := client.SubmitEvents(ctx, usual); err != nil {
		t.Errorf("gRPC, the usual event: %v", err)
	}
	for _, fast := range []bool{true, false} {
		s.noSubmitFastPath = !fast
		if h, err = s.httpHandler(context.Background()); err != nil {
			t.Fatal(err)
		}
		ts.Config.Handler = h
		if resp, body := post(dense); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
			t.Errorf("REST (fast path %v), decoded over the budget: %d Retry-After %q %s, want 429 with Retry-After 1",
				fast, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		if resp, body := post(usual); resp.StatusCode != http.StatusOK {
			t.Errorf("REST (fast path %v), the usual event: %d %s", fast, resp.StatusCode, body)
		}
	}
	if got := testutil.ToFloat64(m.rejects.WithLabelValues("busy")); got != 3 {
		t.Errorf("busy refusals counted: %v, want 3", got)
	}
	if n, d := s.flight.inUse(), s.flight.decodedInUse(); n != 0 || d != 0 {
		t.Errorf("%d request bytes and %d of decoded events still held once every call was answered", n, d)
	}
}

// DecodedCost is decodedCost, for the package's external tests.
var DecodedCost = decodedCost
