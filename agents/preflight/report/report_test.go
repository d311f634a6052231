package report

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
	"github.com/faultline/faultline/schemas/validate"
)

// TestReportCleansText: a check's event carrying what a tool printed (ANSI
// colours, a stray byte) is spooled in a form the gateway takes.
func TestReportCleansText(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Spool.Dir = t.TempDir()
	r, err := Open(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ev := &datamodels.HealthEvent{Agent: "faultline-preflight", ComponentClass: "GPU", CheckName: "PreflightDCGMDiag", NodeName: "gpu-1",
		Message:  "\x1b[31mFail\x1b[0m: GPU 0 \xff",
		Metadata: map[string]string{"output": "line 1\x00line 2"}}
	if err := r.Report([]*datamodels.HealthEvent{ev}); err != nil {
		t.Fatal(err)
	}
	evs, _, err := r.spool.Peek(1)
	if err != nil || len(evs) != 1 {
		t.Fatalf("spooled %d events: %v", len(evs), err)
	}
	if err := (validate.Validator{MaxBatch: 1, MaxFutureSkew: time.Minute}).Validate(evs[0], time.Now()); err != nil {
		t.Fatalf("spooled event would be refused: %v", err)
	}
	if got, want := evs[0].Message, " [31mFail [0m: GPU 0 ?"; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
}

// gateway is a fake gateway that takes every event.
type gateway struct {
	faultlinev1.UnimplementedEventsServer
	mu  sync.Mutex
	got []string // event ids
}

func (g *gateway) SubmitEvents(_ context.Context, req *faultlinev1.SubmitEventsRequest) (*faultlinev1.SubmitEventsResponse, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	resp := &faultlinev1.SubmitEventsResponse{}
	for _, ev := range req.GetEvents() {
		g.got = append(g.got, ev.GetId())
		resp.Ids = append(resp.Ids, ev.GetId())
	}
	return resp, nil
}

func startGateway(t *testing.T) (*gateway, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g, srv := &gateway{}, grpc.NewServer()
	faultlinev1.RegisterEventsServer(srv, g)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return g, ln.Addr().String()
}

// TestUnspooledEventsSentDirectly: a check's events the spool refuses (too
// large for it, or the node's disk failing) are sent to the gateway
// directly, each once; while the gateway is down too, Flush says they are
// lost (the run exits non-zero), never drops them silently.
func TestUnspooledEventsSentDirectly(t *testing.T) {
	for _, tt := range []struct {
		name      string
		events    int // of 2000-byte messages: 100 overflow the 64 KiB spool
		gatewayUp bool
		wantSent  int
		wantLost  int
	}{
		{name: "spooled", events: 3, gatewayUp: true, wantSent: 3},
		{name: "spool refuses, gateway up", events: 100, gatewayUp: true, wantSent: 100},
		{name: "spool refuses, gateway down", events: 100, wantLost: 100},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Spool.Dir, cfg.Spool.MaxBytes, cfg.Spool.DrainTimeout = t.TempDir(), 64<<10, time.Second
			cfg.Gateway.Addr, cfg.Gateway.Insecure, cfg.Gateway.TokenFile = "127.0.0.1:1", true, ""
			g := &gateway{}
			if tt.gatewayUp {
				g, cfg.Gateway.Addr = startGateway(t)
			}
			r, err := Open(cfg, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			var evs []*datamodels.HealthEvent
			for i := range tt.events {
				evs = append(evs, &datamodels.HealthEvent{Agent: "faultline-preflight", CheckName: "PreflightDCGMDiag", NodeName: "gpu-1",
					IsFatal: true, Message: fmt.Sprintf("%d %s", i, strings.Repeat("x", 2000))})
			}
			err = r.Report(evs)
			res := r.Flush(context.Background())
			g.mu.Lock()
			sent := len(g.got)
			slices.Sort(g.got)
			dup := len(slices.Compact(g.got)) != sent
			g.mu.Unlock()
			if sent != tt.wantSent || dup || res.Lost != tt.wantLost {
				t.Fatalf("gateway received %d of %d events (duplicates %v), %d lost, want %d lost (Report: %v)",
					sent, tt.events, dup, res.Lost, tt.wantLost, err)
			}
		})
	}
}
