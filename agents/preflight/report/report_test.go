package report

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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

// gateway is a fake gateway that takes every event but one whose metadata
// "refuse" is "invalid" (InvalidArgument, as a gateway older or newer than
// the check refuses a field), and answers a call with an event whose
// metadata "delay" is a duration that much later (a slow call); opts are
// its server options (the gateway's gateway.max_body_bytes as
// grpc.MaxRecvMsgSize).
type gateway struct {
	faultlinev1.UnimplementedEventsServer
	mu  sync.Mutex
	got []string // event ids
}

func (g *gateway) SubmitEvents(_ context.Context, req *faultlinev1.SubmitEventsRequest) (*faultlinev1.SubmitEventsResponse, error) {
	for _, ev := range req.GetEvents() {
		if d, err := time.ParseDuration(ev.GetMetadata()["delay"]); err == nil {
			time.Sleep(d)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	resp := &faultlinev1.SubmitEventsResponse{}
	for i, ev := range req.GetEvents() {
		if ev.GetMetadata()["refuse"] == "invalid" {
			return nil, status.Errorf(codes.InvalidArgument, "events[%d].metadata: refused", i)
		}
	}
	for _, ev := range req.GetEvents() {
		g.got = append(g.got, ev.GetId())
		resp.Ids = append(resp.Ids, ev.GetId())
	}
	return resp, nil
}

func startGateway(t *testing.T, opts ...grpc.ServerOption) (*gateway, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g, srv := &gateway{}, grpc.NewServer(opts...)
	faultlinev1.RegisterEventsServer(srv, g)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return g, ln.Addr().String()
}

// TestUnspooledEventsSentDirectly: a check's events the spool refuses (too
// large for it, or the node's disk failing) are sent to the gateway
// directly, each once; while the gateway is down too, Flush says they are
// lost (the run exits non-zero), never drops them silently. An event the
// gateway can never take (larger alone than its gateway.max_body_bytes,
// refused as invalid) is lost at once: it is neither retried until the
// drain timeout nor keeps the events after it from being sent.
func TestUnspooledEventsSentDirectly(t *testing.T) {
	for _, tt := range []struct {
		name      string
		events    int // of 2000-byte messages: 100 overflow the 64 KiB spool
		gatewayUp bool
		maxRecv   int    // the gateway's gateway.max_body_bytes; 0: 4 MiB
		refuse    string // event 37 is "large" (16 KiB of metadata) or "invalid"
		wantSent  int
		wantLost  int
	}{
		{name: "spooled", events: 3, gatewayUp: true, wantSent: 3},
		{name: "spool refuses, gateway up", events: 100, gatewayUp: true, wantSent: 100},
		{name: "spool refuses, gateway down", events: 100, wantLost: 100},
		{name: "spool refuses, an event larger alone than gateway.max_body_bytes", events: 100, gatewayUp: true, maxRecv: 8 << 10, refuse: "large", wantSent: 99, wantLost: 1},
		{name: "spool refuses, the gateway refuses an event as invalid", events: 100, gatewayUp: true, refuse: "invalid", wantSent: 99, wantLost: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Spool.Dir, cfg.Spool.MaxBytes, cfg.Spool.DrainTimeout = t.TempDir(), 64<<10, time.Second
			cfg.Gateway.Addr, cfg.Gateway.Insecure, cfg.Gateway.TokenFile = "127.0.0.1:1", true, ""
			if tt.refuse != "" {
				cfg.Spool.DrainTimeout = 20 * time.Second // what an event the gateway can never take must not wait for
			}
			g := &gateway{}
			if tt.gatewayUp {
				var opts []grpc.ServerOption
				if tt.maxRecv > 0 {
					opts = append(opts, grpc.MaxRecvMsgSize(tt.maxRecv)) // as the gateway sets it
				}
				g, cfg.Gateway.Addr = startGateway(t, opts...)
			}
			r, err := Open(cfg, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			var evs []*datamodels.HealthEvent
			for i := range tt.events {
				ev := &datamodels.HealthEvent{Agent: "faultline-preflight", CheckName: "PreflightDCGMDiag", NodeName: "gpu-1",
					IsFatal: true, Message: fmt.Sprintf("%d %s", i, strings.Repeat("x", 2000))}
				switch {
				case i == 37 && tt.refuse == "large":
					ev.Metadata = map[string]string{}
					for k := range 8 {
						ev.Metadata[fmt.Sprint("output", k)] = strings.Repeat("o", 2048)
					}
				case i == 37 && tt.refuse == "invalid":
					ev.Metadata = map[string]string{"refuse": "invalid"}
				}
				evs = append(evs, ev)
			}
			err = r.Report(evs)
			start := time.Now()
			res := r.Flush(context.Background())
			took := time.Since(start)
			g.mu.Lock()
			sent := len(g.got)
			slices.Sort(g.got)
			dup := len(slices.Compact(g.got)) != sent
			g.mu.Unlock()
			if sent != tt.wantSent || dup || res.Lost != tt.wantLost {
				t.Fatalf("gateway received %d of %d events (duplicates %v), %d lost, want %d lost, in %s (Report: %v)",
					sent, tt.events, dup, res.Lost, tt.wantLost, took.Round(time.Millisecond), err)
			}
			if tt.refuse != "" && took > cfg.Spool.DrainTimeout/2 {
				t.Errorf("Flush took %s (drain timeout %s): an event the gateway can never take was retried", took, cfg.Spool.DrainTimeout)
			}
		})
	}
}

// TestOlderRunDeliveredFirst: a run fails while the gateway is down (its
// fatal event stays spooled), the kubelet runs the check again, the
// gateway is back and the new run passes. The new run sends the old
// run's events first and its own only once the gateway took them: the
// older failure reaches the gateway, before the pass. Before, both spools
// were sent at once, and the old fatal, slower to be taken, landed after
// the pass: the quarantine cordoned a node that had passed, and a
// cordoned node gets no pod to run the check again.
func TestOlderRunDeliveredFirst(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Spool.Dir, cfg.Spool.DrainTimeout = t.TempDir(), 300*time.Millisecond
	cfg.Gateway.Addr, cfg.Gateway.Insecure, cfg.Gateway.TokenFile = "127.0.0.1:1", true, ""
	log := slog.New(slog.DiscardHandler)
	ev := func(healthy bool, meta map[string]string) *datamodels.HealthEvent {
		return &datamodels.HealthEvent{Agent: "preflight-dcgm-diag", ComponentClass: "GPU", CheckName: "dcgm-diag", NodeName: "gpu-1",
			IsFatal: !healthy, IsHealthy: healthy, Metadata: meta,
			EntitiesImpacted: []*datamodels.Entity{{EntityType: "GPU", EntityValue: "GPU-934a71d6-e50c-86a3-f752-3743a8c1bbb2"}}}
	}

	failed, err := Open(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	fatal := ev(false, map[string]string{"delay": "500ms"})
	if err := failed.Report([]*datamodels.HealthEvent{fatal}); err != nil {
		t.Fatal(err)
	}
	if res := failed.Flush(context.Background()); res.Pending == 0 {
		t.Fatalf("the gateway is down, yet the failing run's event left its spool: %+v", res)
	}
	if err := failed.Close(); err != nil {
		t.Fatal(err)
	}

	g, addr := startGateway(t)
	cfg.Gateway.Addr, cfg.Spool.DrainTimeout = addr, 20*time.Second
	passed, err := Open(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	defer passed.Close()
	healthy := ev(true, nil)
	if err := passed.Report([]*datamodels.HealthEvent{healthy}); err != nil {
		t.Fatal(err)
	}
	res := passed.Flush(context.Background())
	g.mu.Lock()
	got := slices.Clone(g.got)
	g.mu.Unlock()
	if res.Adopted != 1 || res.Pending != 0 || !slices.Equal(got, []string{fatal.Id, healthy.Id}) {
		t.Fatalf("the gateway received %q, want the old fatal %q, then the new healthy %q (%+v)", got, fatal.Id, healthy.Id, res)
	}
}

// TestSpoolNotOpenable: a run whose spool cannot be opened (a check
// running as the pod's non-root user under a root-owned spool root; here
// a root under a regular file, which fails as root too) still reports:
// Direct sends its events, Flush says none were lost.
func TestSpoolNotOpenable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	g, addr := startGateway(t)
	cfg := DefaultConfig()
	cfg.Spool.Dir, cfg.Spool.DrainTimeout = filepath.Join(file, "spool"), 20*time.Second
	cfg.Gateway.Addr, cfg.Gateway.Insecure, cfg.Gateway.TokenFile = addr, true, ""
	log := slog.New(slog.DiscardHandler)
	if _, err := Open(cfg, log); err == nil {
		t.Fatal("Open succeeded under a regular file")
	}
	r := Direct(cfg, log)
	ev := &datamodels.HealthEvent{Agent: "faultline-preflight", CheckName: "PreflightDCGMDiag", NodeName: "gpu-1", IsHealthy: true}
	if err := r.Report([]*datamodels.HealthEvent{ev}); err != nil {
		t.Fatal(err)
	}
	res := r.Flush(context.Background())
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if res.Lost != 0 || res.Pending != 0 || !slices.Equal(g.got, []string{ev.Id}) {
		t.Fatalf("the gateway received %q, want %q (%+v)", g.got, ev.Id, res)
	}
}

// TestSpoolSharedAcrossUIDs: the spool root is 1777 (every UID makes its
// runs' directories there, none removes another's), a live run's
// directory is its own (0750), and one a run leaves events in is opened
// to the runs of every UID (0777, files 0666) so that any can adopt it.
func TestSpoolSharedAcrossUIDs(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Spool.Dir, cfg.Spool.DrainTimeout = filepath.Join(t.TempDir(), "spool"), 100*time.Millisecond
	cfg.Gateway.Addr, cfg.Gateway.Insecure, cfg.Gateway.TokenFile = "127.0.0.1:1", true, ""
	r, err := Open(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	mode := func(p string) os.FileMode {
		t.Helper()
		info, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return info.Mode() & (os.ModePerm | os.ModeSticky)
	}
	if got := mode(cfg.Spool.Dir); got != os.ModeSticky|0o777 {
		t.Errorf("spool root mode %v, want 1777", got)
	}
	if got := mode(r.Dir()); got != 0o750 {
		t.Errorf("live run's directory mode %v, want 0750", got)
	}
	if err := r.Report([]*datamodels.HealthEvent{{Agent: "faultline-preflight", CheckName: "PreflightDCGMDiag", NodeName: "gpu-1", IsFatal: true}}); err != nil {
		t.Fatal(err)
	}
	r.Flush(context.Background()) // the gateway is down: the event stays
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if got := mode(r.Dir()); got != 0o777 {
		t.Errorf("left directory mode %v, want 0777", got)
	}
	ents, _ := os.ReadDir(r.Dir())
	if len(ents) == 0 {
		t.Fatal("the run left nothing spooled")
	}
	for _, e := range ents {
		if got := mode(filepath.Join(r.Dir(), e.Name())); got != 0o666 {
			t.Errorf("left file %s mode %v, want 0666", e.Name(), got)
		}
	}
}
