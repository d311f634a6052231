package gateway

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/faultline/faultline/internal/warnlimit"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// panicOnce is a producer whose first call panics (a bug of its own).
type panicOnce struct {
	fakeProducer
	calls atomic.Int32
}

func (p *panicOnce) Produce(ctx context.Context, evs []*datamodels.HealthEvent) error {
	if p.calls.Add(1) == 1 {
		var m map[string]int
		m["boom"]++ // a nil map write: a runtime panic
	}
	return p.fakeProducer.Produce(ctx, evs)
}

// grpcDoor serves a gateway's gRPC door, its service producing to prod
// and logging nothing, its own log to log, for the token
// test-token-of-alpha-0001 (cluster alpha), until the test ends; it
// returns a client connection to it.
func grpcDoor(t *testing.T, log *slog.Logger, prod eventProducer) *grpc.ClientConn {
	t.Helper()
	tokens, err := ParseTokens(strings.NewReader("test-token-of-alpha-0001,alpha,agent\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	m := newMetrics(prometheus.NewRegistry())
	s := &Server{
		cfg: cfg, log: log, auth: &Authenticator{Tokens: tokens}, metrics: m,
		flight:    newInflight(cfg.MaxInflightBytes, cfg.MaxInflightBytesPerConn, cfg.MaxReadBytesPerCaller, cfg.MaxDecodedBytes),
		busyWarns: warnlimit.New(warnWindow, warnKeys), connWarns: warnlimit.New(warnWindow, warnKeys),
		codec: Codec{limits: shapeLimits{maxEvents: cfg.MaxBatch}},
		svc: &service{
			validator: Validator{MaxBatch: cfg.MaxBatch, MaxFutureSkew: cfg.MaxFutureSkew},
			producer:  prod, limiter: newLimiter(1000, 1000),
			metrics: m, now: func() time.Time { return testNow }, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
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
	return conn
}

// TestGRPCPanicFailsOneCall: a gRPC call whose handler panics is answered
// Internal and logged with its stack; the gateway goes on (the panic ended
// the process — in `faultline dev`, every role with it).
func TestGRPCPanicFailsOneCall(t *testing.T) {
	prod := &panicOnce{}
	var logged bytes.Buffer
	conn := grpcDoor(t, slog.New(slog.NewTextHandler(&logged, nil)), prod)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &faultlinev1.SubmitEventsRequest{Events: []*datamodels.HealthEvent{validEvent()}}
	cl := faultlinev1.NewEventsClient(conn)
	tokenCtx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer test-token-of-alpha-0001")
	if _, err := cl.SubmitEvents(tokenCtx, req); status.Code(err) != codes.Internal {
		t.Fatalf("the call that panicked: %v, want Internal", err)
	}
	if _, err := cl.SubmitEvents(tokenCtx, req); err != nil || prod.produced != 1 {
		t.Fatalf("the next call: %v, %d events produced; want it accepted", err, prod.produced)
	}
	if l := logged.String(); !strings.Contains(l, "call panicked") || !strings.Contains(l, "recover_test.go") {
		t.Fatalf("the panic is not logged with its stack:\n%s", l)
	}
}
