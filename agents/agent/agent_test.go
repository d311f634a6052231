package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/agents/check"
	"github.com/faultline/faultline/agents/podres/podrestest"
	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
	"github.com/faultline/faultline/schemas/validate"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func ev(msg string, fatal bool) *datamodels.HealthEvent {
	return &datamodels.HealthEvent{Agent: "test", CheckName: "T", Message: msg, IsFatal: fatal, NodeName: "n1"}
}

func msgs(evs []*datamodels.HealthEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.GetMessage()
	}
	return out
}

// TestSpoolOrderAndRestart: events come back in order across segments, a
// commit removes only what was sent, and a reopened spool resends the rest.
func TestSpoolOrderAndRestart(t *testing.T) {
	dir := t.TempDir()
	sp, err := OpenSpool(dir, 64<<10, quiet(), NewMetrics()) // 8 KiB segments
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 300 {
		m := fmt.Sprintf("event %03d %s", i, strings.Repeat("x", 40))
		want = append(want, m)
		if n, err := sp.Append([]*datamodels.HealthEvent{ev(m, true)}); err != nil || n != 1 {
			t.Fatalf("append %d: %d %v", i, n, err)
		}
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	if len(segs) < 2 {
		t.Fatalf("expected several segments, got %d", len(segs))
	}
	got, next, err := sp.Peek(100)
	if err != nil || len(got) != 100 {
		t.Fatalf("peek: %d %v", len(got), err)
	}
	if err := sp.Commit(next); err != nil {
		t.Fatal(err)
	}
	got2, _, _ := sp.Peek(10) // read but not committed: must come back
	if got2[0].GetMessage() != want[100] {
		t.Fatalf("after commit: %q", got2[0].GetMessage())
	}
	sp.Close()
	// A torn record at the end (crash mid-append) is cut off on open.
	segs, _ = filepath.Glob(filepath.Join(dir, "*.seg"))
	f, _ := os.OpenFile(segs[len(segs)-1], os.O_APPEND|os.O_WRONLY, 0)
	f.Write([]byte{0, 0, 1, 0, 1, 2})
	f.Close()
	sp, err = OpenSpool(dir, 64<<10, quiet(), NewMetrics())
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	rest, next, err := sp.Peek(1000)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(msgs(rest), "|") != strings.Join(want[100:], "|") {
		t.Fatalf("after reopen: %d events, first %q", len(rest), msgs(rest)[0])
	}
	if err := sp.Commit(next); err != nil {
		t.Fatal(err)
	}
	if sp.Pending() != 0 {
		t.Errorf("pending %d after committing everything", sp.Pending())
	}
	segs, _ = filepath.Glob(filepath.Join(dir, "*.seg"))
	if len(segs) != 1 {
		t.Errorf("%d segments left, want only the open one", len(segs))
	}
}

// TestSpoolFullPolicy: above 90% only fatal events are accepted, at 100%
// nothing; refusals are counted; draining re-opens the spool.
func TestSpoolFullPolicy(t *testing.T) {
	m := NewMetrics()
	sp, err := OpenSpool(t.TempDir(), 64<<10, quiet(), m)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	big := strings.Repeat("y", 1000)
	accepted := 0
	for range 100 {
		n, _ := sp.Append([]*datamodels.HealthEvent{ev(big, false)})
		accepted += n
	}
	if p := sp.Pending(); p > 64<<10*9/10 || p < 64<<10*8/10 {
		t.Errorf("non-fatal events filled %d bytes, want just under 90%%", p)
	}
	if n, _ := sp.Append([]*datamodels.HealthEvent{ev(big, true)}); n != 1 {
		t.Errorf("fatal event refused in the reserve")
	}
	for range 20 {
		sp.Append([]*datamodels.HealthEvent{ev(big, true)})
	}
	if p := sp.Pending(); p > 64<<10 {
		t.Errorf("spool over capacity: %d", p)
	}
	if v := val(m.spoolFull); v != 1 {
		t.Errorf("spool_full = %v", v)
	}
	if v := val(m.spoolDropped.WithLabelValues("reserved_for_fatal")); v < 1 {
		t.Errorf("reserved_for_fatal drops = %v", v)
	}
	if v := val(m.spoolDropped.WithLabelValues("full")); v < 1 {
		t.Errorf("full drops = %v", v)
	}
	evs, next, _ := sp.Peek(1000)
	sp.Commit(next)
	if val(m.spoolFull) != 0 || len(evs) == 0 {
		t.Errorf("drained spool still full")
	}
	if n, _ := sp.Append([]*datamodels.HealthEvent{ev("after", false)}); n != 1 {
		t.Errorf("drained spool refuses")
	}
}

// fakeGateway is a tiny faultlinev1.EventsServer that can go down and come
// back on the same address.
type fakeGateway struct {
	faultlinev1.UnimplementedEventsServer
	t     *testing.T
	addr  string
	token string
	srv   *grpc.Server
	mu    sync.Mutex
	got   []string
	auth  []string
	n     int
	// opts are the server's options (TLS credentials); calls records the
	// authorization header and TLS state of every call, before any check.
	opts  []grpc.ServerOption
	calls []fakeCall
	// busy is how many calls, first, are refused as the gateway refuses
	// one over its in-flight or rate budget; sizes records every call's
	// number of events.
	busy  int
	sizes []int
	// front, when set, is a proxy in front of the gateway (nginx, envoy):
	// the gRPC server is served through it, over HTTP/2 in clear.
	front func(http.Handler) http.Handler
	web   *http.Server
	// node, when set, is the node the token is bound to: another node's
	// events are refused as the gateway refuses them.
	node string
	// v, when set, validates every call as the gateway does, at the time
	// now plus clock, answering as the gateway (or, plain, a gateway that
	// gave no ErrorInfo detail) does; evs are the events received.
	v     *validate.Validator
	clock time.Duration
	plain bool
	evs   []*datamodels.HealthEvent
}

// fakeCall is what the fake gateway saw of one SubmitEvents call.
type fakeCall struct {
	auth string               // the authorization header, "" if none
	tls  *tls.ConnectionState // nil over plaintext
}

func startFake(t *testing.T) *fakeGateway {
	g := &fakeGateway{t: t, addr: "127.0.0.1:0", token: "s3cret"}
	g.start()
	t.Cleanup(g.stop)
	return g
}

func (g *fakeGateway) start() {
	var ln net.Listener
	var err error
	for range 50 {
		if ln, err = net.Listen("tcp", g.addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		g.t.Fatal(err)
	}
	g.addr = ln.Addr().String()
	g.srv = grpc.NewServer(g.opts...)
	faultlinev1.RegisterEventsServer(g.srv, g)
	if g.front == nil {
		go g.srv.Serve(ln)
		return
	}
	g.web = &http.Server{Handler: g.front(g.srv), Protocols: new(http.Protocols)}
	g.web.Protocols.SetUnencryptedHTTP2(true) // gRPC's prior knowledge, as a proxy's h2c listener
	go g.web.Serve(ln)
}

func (g *fakeGateway) stop() {
	if g.web != nil {
		g.web.Close()
	}
	g.srv.Stop()
}

func (g *fakeGateway) SubmitEvents(ctx context.Context, req *faultlinev1.SubmitEventsRequest) (*faultlinev1.SubmitEventsResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	call := fakeCall{}
	if a := md.Get("authorization"); len(a) > 0 {
		call.auth = a[0]
	}
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			call.tls = &ti.State
		}
	}
	g.mu.Lock()
	g.calls = append(g.calls, call)
	g.sizes = append(g.sizes, len(req.GetEvents()))
	if g.busy > 0 {
		g.busy--
		g.mu.Unlock()
		return nil, status.Error(codes.ResourceExhausted, "the gateway holds as many request bytes as it may (gateway.max_inflight_bytes); retry later")
	}
	g.mu.Unlock()
	if g.token == "" { // client certificates authenticate
		if call.tls == nil || len(call.tls.PeerCertificates) == 0 {
			return nil, status.Error(codes.Unauthenticated, "no client certificate")
		}
	} else if a := md.Get("authorization"); len(a) != 1 || a[0] != "Bearer "+g.token {
		return nil, status.Error(codes.Unauthenticated, "bad token")
	}
	resp := &faultlinev1.SubmitEventsResponse{}
	for i, e := range req.GetEvents() {
		if g.node != "" && e.GetNodeName() != g.node {
			return nil, status.Errorf(codes.PermissionDenied, "events[%d].nodeName: %q is not %q, the only node credential %s may report for",
				i, e.GetNodeName(), g.node, "agent-"+g.node)
		}
	}
	if g.v != nil {
		if err := g.v.ValidateBatch(req.GetEvents(), time.Now().Add(g.clock)); err != nil {
			if g.plain {
				return nil, status.Error(codes.InvalidArgument, err.Error())
			}
			return nil, validate.StatusError(codes.InvalidArgument, err)
		}
	}
	for _, e := range req.GetEvents() {
		if e.GetMessage() == "invalid" {
			return nil, status.Error(codes.InvalidArgument, "events[0].message: invalid")
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, e := range req.GetEvents() {
		g.got = append(g.got, e.GetMessage())
		g.evs = append(g.evs, e)
		g.n++
		resp.Ids = append(resp.Ids, fmt.Sprint(g.n))
	}
	return resp, nil
}

func (g *fakeGateway) received() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.got...)
}

func waitFor(t *testing.T, d time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func senderFor(t *testing.T, addr, token string) (*Spool, *Sender, *Metrics, context.CancelFunc) {
	return nodeSenderFor(t, addr, token, "")
}

// nodeSenderFor is senderFor for a sender that knows its node's name.
func nodeSenderFor(t *testing.T, addr, token, node string) (*Spool, *Sender, *Metrics, context.CancelFunc) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	os.WriteFile(tok, []byte(token+"\n"), 0o600)
	m := NewMetrics()
	sp, err := OpenSpool(filepath.Join(dir, "spool"), 1<<20, quiet(), m)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig().Gateway
	cfg.Addr, cfg.TokenFile, cfg.MaxBackoff, cfg.BatchSize = addr, tok, 200*time.Millisecond, 7
	cfg.Insecure = true // the fake gateway is plaintext
	s, err := NewSender(cfg, sp, quiet(), m)
	if err != nil {
		t.Fatal(err)
	}
	s.node = node
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; s.Close(); sp.Close() })
	return sp, s, m, cancel
}

// TestSenderOutage: while the gateway is down events stay spooled; when it
// comes back they arrive once each, in order, and the spool empties.
func TestSenderOutage(t *testing.T) {
	g := startFake(t)
	sp, _, m, _ := senderFor(t, g.addr, g.token)
	var want []string
	add := func(i int) {
		m := fmt.Sprintf("e%02d", i)
		want = append(want, m)
		sp.Append([]*datamodels.HealthEvent{ev(m, i%2 == 0)})
	}
	for i := range 5 {
		add(i)
	}
	// Received and acknowledged: a stop before the reply reached the
	// sender would have it send them again (at least once), not a fault.
	waitFor(t, 5*time.Second, func() bool { return len(g.received()) == 5 && sp.Pending() == 0 }, "first events")
	g.stop()
	for i := 5; i < 40; i++ {
		add(i)
	}
	time.Sleep(500 * time.Millisecond)
	if sp.Pending() == 0 {
		t.Fatal("nothing spooled while the gateway is down")
	}
	g.start()
	waitFor(t, 10*time.Second, func() bool { return sp.Pending() == 0 }, "spool to drain")
	if got := g.received(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("received %v\nwant %v", got, want)
	}
	if v := val(m.sent); v != 40 {
		t.Errorf("sent metric %v", v)
	}
}

// TestSenderInvalidAndAuth: a wrong token keeps events spooled; an invalid
// event is dropped alone while its batch mates are delivered.
func TestSenderInvalidAndAuth(t *testing.T) {
	g := startFake(t)
	sp, _, m, _ := senderFor(t, g.addr, "wrong")
	sp.Append([]*datamodels.HealthEvent{ev("a", true)})
	waitFor(t, 5*time.Second, func() bool { return val(m.sendErrors.WithLabelValues("Unauthenticated")) >= 1 },
		"an Unauthenticated error counted")
	if len(g.received()) != 0 || sp.Pending() == 0 {
		t.Fatal("sent with a wrong token")
	}

	g2 := startFake(t)
	sp2, _, m2, _ := senderFor(t, g2.addr, g2.token)
	sp2.Append([]*datamodels.HealthEvent{ev("a", true), ev("invalid", true), ev("b", false)})
	waitFor(t, 5*time.Second, func() bool { return sp2.Pending() == 0 }, "drain")
	if got := strings.Join(g2.received(), ","); got != "a,b" {
		t.Errorf("received %s", got)
	}
	if val(m2.rejected) != 1 {
		t.Error("rejected not counted")
	}
}

type fakeCheck struct {
	name string
	run  func(ctx context.Context) ([]*datamodels.HealthEvent, error)
}

func (f fakeCheck) Name() string { return f.name }
func (f fakeCheck) Check(ctx context.Context) ([]*datamodels.HealthEvent, error) {
	return f.run(ctx)
}

func testConfig(t *testing.T, gatewayAddr string) Config {
	cfg := DefaultConfig()
	cfg.NodeName = "node-7"
	cfg.MetricsAddr = ""
	cfg.MachineSysfs = t.TempDir() // no DMI, whatever this machine's
	cfg.Spool.Dir = filepath.Join(t.TempDir(), "spool")
	cfg.Gateway.Addr = gatewayAddr
	cfg.Gateway.Insecure = true // the fake gateway is plaintext
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte("s3cret"), 0o600)
	cfg.Gateway.TokenFile = tok
	cfg.Gateway.MaxBackoff = 200 * time.Millisecond
	return cfg
}

// TestRunnerIsolation: a panicking check and a check past its deadline fail
// alone (success metric 0), the good one keeps reporting; events get the
// node name, agent, timestamp and processing strategy.
func TestRunnerIsolation(t *testing.T) {
	g := startFake(t)
	cfg := testConfig(t, g.addr)
	cfg.ProcessingStrategy = "STORE_ONLY"
	good := fakeCheck{"good", func(context.Context) ([]*datamodels.HealthEvent, error) {
		return []*datamodels.HealthEvent{{CheckName: "Good", Message: "hello"}}, nil
	}}
	bad := fakeCheck{"bad", func(context.Context) ([]*datamodels.HealthEvent, error) { panic("boom") }}
	slow := fakeCheck{"slow", func(ctx context.Context) ([]*datamodels.HealthEvent, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}}
	sched := func(c fakeCheck) Scheduled {
		return Scheduled{Check: c, Interval: 50 * time.Millisecond, Timeout: 20 * time.Millisecond}
	}
	a, err := New(cfg, quiet(), Options{Checks: []Scheduled{sched(good), sched(bad), sched(slow)}})
	if err != nil {
		t.Fatal(err)
	}
	var got *datamodels.HealthEvent
	a.RunOnce(context.Background(), sched(good))
	evs, _, _ := a.Spool().Peek(1)
	got = evs[0]
	if got.GetNodeName() != "node-7" || got.GetAgent() != "faultline-agent/good" || got.GetGeneratedTimestamp() == nil ||
		got.GetProcessingStrategy() != datamodels.ProcessingStrategy_STORE_ONLY {
		t.Errorf("stamped event: %v", got)
	}
	// What a check read reaches the gateway in a form it takes: text
	// printable and within limits, no empty entity, no time from a clock
	// set back since.
	raw := fakeCheck{"raw", func(context.Context) ([]*datamodels.HealthEvent, error) {
		return []*datamodels.HealthEvent{{CheckName: "Raw", ComponentClass: "NIC", Message: "port\x15 down\xff",
			EntitiesImpacted:   []*datamodels.Entity{{EntityType: "NIC"}, {EntityType: "NIC", EntityValue: "mlx5_0"}},
			Metadata:           map[string]string{"sysfs": strings.Repeat("x", validate.MaxMetadataVal+1)},
			GeneratedTimestamp: timestamppb.New(time.Now().Add(24 * time.Hour))}}, nil
	}}
	a.RunOnce(context.Background(), sched(raw))
	evs, _, _ = a.Spool().Peek(2)
	if len(evs) != 2 {
		t.Fatalf("%d events spooled, want 2", len(evs))
	}
	if err := (validate.Validator{MaxBatch: 1, MaxFutureSkew: time.Minute}).Validate(evs[1], time.Now()); err != nil {
		t.Errorf("raw check's event would be refused (%v): %v", err, evs[1])
	}
	if len(evs[1].EntitiesImpacted) != 1 || evs[1].Message != "port  down?" {
		t.Errorf("raw check's event: %v", evs[1])
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- a.Run(ctx) }()
	m := a.Metrics()
	// The good check's events and the other two checks' first results come
	// from separate goroutines: wait for all of them, not just the events.
	waitFor(t, 5*time.Second, func() bool {
		return len(g.received()) >= 3 && val(m.checkRuns.WithLabelValues("bad", "panic")) >= 1 &&
			val(m.checkRuns.WithLabelValues("slow", "timeout")) >= 1
	}, "good events and the bad and slow checks' results")
	for name, want := range map[string]float64{"good": 1, "bad": 0, "slow": 0} {
		if v := val(m.checkSuccess.WithLabelValues(name)); v != want {
			t.Errorf("check_success{%s} = %v, want %v", name, v, want)
		}
	}
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("healthz %d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), `faultline_agent_check_success{check="bad"} 0`) {
		t.Errorf("metrics lack check_success")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// committingCheck records what the spool held when the runner committed.
type committingCheck struct {
	fakeCheck
	spool   func() *Spool
	commits []int64 // the spool's pending bytes at each Commit
}

func (c *committingCheck) Commit() error {
	c.commits = append(c.commits, c.spool().Pending())
	return nil
}

// TestStateCommittedAfterSpooling: a check's persisted state (kmsg's read
// position, the NIC's reported states) was saved inside Check, before the
// runner spooled its events — a crash or an OOM kill between the two, or a
// spool that refused them, lost them for good (a restart resumed past
// them). The runner commits a check's state once its events are in the
// spool (at once when there are none), and not when they could not be
// spooled, nor after a panic.
func TestStateCommittedAfterSpooling(t *testing.T) {
	cfg := testConfig(t, "127.0.0.1:1")
	var a *Agent
	evs := []*datamodels.HealthEvent{{CheckName: "Xid", ComponentClass: "GPU", Message: "Xid 79"}}
	c := &committingCheck{spool: func() *Spool { return a.Spool() }}
	c.fakeCheck = fakeCheck{"kmsg", func(context.Context) ([]*datamodels.HealthEvent, error) { return evs, nil }}
	sched := Scheduled{Check: c, Interval: time.Minute, Timeout: time.Second}
	a, err := New(cfg, quiet(), Options{Checks: []Scheduled{sched}})
	if err != nil {
		t.Fatal(err)
	}
	a.RunOnce(context.Background(), sched)
	if len(c.commits) != 1 || c.commits[0] == 0 {
		t.Fatalf("commits %v: want one, with the events already in the spool", c.commits)
	}
	evs = nil
	a.RunOnce(context.Background(), sched)
	if len(c.commits) != 2 {
		t.Fatalf("no events: commits %v, want a second", c.commits)
	}
	c.fakeCheck.run = func(context.Context) ([]*datamodels.HealthEvent, error) { panic("boom") }
	a.RunOnce(context.Background(), sched)
	if len(c.commits) != 2 {
		t.Fatalf("committed after a panic: %v", c.commits)
	}
	evs = []*datamodels.HealthEvent{{CheckName: "Xid", ComponentClass: "GPU", Message: "Xid 48"}}
	c.fakeCheck.run = func(context.Context) ([]*datamodels.HealthEvent, error) { return evs, nil }
	a.Spool().Close()
	a.RunOnce(context.Background(), sched)
	if len(c.commits) != 2 {
		t.Fatalf("committed although the events were not spooled: %v", c.commits)
	}
}

func TestHealthzStale(t *testing.T) {
	cfg := testConfig(t, "127.0.0.1:1")
	now := time.Unix(1000, 0)
	c := fakeCheck{"c", func(context.Context) ([]*datamodels.HealthEvent, error) { return nil, nil }}
	a, err := New(cfg, quiet(), Options{Checks: []Scheduled{{Check: c, Interval: time.Second, Timeout: time.Second}},
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer a.spool.Close()
	a.started = now
	a.RunOnce(context.Background(), a.checks[0])
	now = now.Add(5 * time.Second)
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "c") {
		t.Errorf("healthz %d %q, want 503 naming c", rec.Code, rec.Body)
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.toml")
	os.WriteFile(path, []byte(`
node_name = "from-toml"
processing_strategy = "STORE_ONLY"
[gateway]
addr = "gw:50051"
timeout = "3s"
[spool]
max_bytes = 1048576
[nic]
sysfs_root = "/host/sys"
state_polling_interval = "2s"
nic_exclusion_regex = "^eth.*"
`), 0o644)
	env := func(string) string { return "from-env" }
	cfg, err := LoadConfig("t", []string{"--config", path, "--gateway.addr", "flag:1", "--nic.state-polling-interval", "500ms"}, env)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeName != "from-toml" || cfg.Gateway.Addr != "flag:1" || cfg.Gateway.Timeout != 3*time.Second ||
		cfg.NIC.SysfsRoot != "/host/sys" || cfg.NIC.PollInterval != 500*time.Millisecond || cfg.Spool.MaxBytes != 1<<20 ||
		cfg.ProcessingStrategy != "STORE_ONLY" || cfg.NIC.ExclusionRegex != "^eth.*" {
		t.Errorf("config: %+v", cfg)
	}
	cfg, err = LoadConfig("t", nil, env)
	if err != nil || cfg.NodeName != "from-env" {
		t.Errorf("env node name: %v %v", cfg.NodeName, err)
	}
	for _, tc := range []struct {
		toml, args, want string
	}{
		{"[gateway]\nadrr = \"x\"\n", "", "unknown keys: gateway.adrr"},
		{"processing_strategy = \"MAYBE\"\n", "", "processing_strategy"},
		{"[nic]\nnic_exclusion_regex = \"([\"\n", "", "nic.nic_exclusion_regex"},
		{"", "--checks=nic,nope", `checks: unknown check "nope"`},
		{"[spool]\nmax_bytes = 5\n", "", "spool.max_bytes"},
		{"", "--node-name=", "node_name"},
	} {
		os.WriteFile(path, []byte(tc.toml), 0o644)
		args := []string{"--config", path}
		if tc.args != "" {
			args = append(args, tc.args)
		}
		_, err := LoadConfig("t", args, env)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("toml %q args %q: err %v, want it to name %q", tc.toml, tc.args, err, tc.want)
		}
	}
}

func TestNICCheckRefusesWithoutMetadata(t *testing.T) {
	cfg := testConfig(t, "127.0.0.1:1")
	cfg.NIC.SysfsRoot = t.TempDir()
	cfg.NIC.MetadataPath = filepath.Join(t.TempDir(), "missing.json")
	_, err := New(cfg, quiet(), Options{})
	if err == nil || !strings.Contains(err.Error(), "GPU metadata") {
		t.Fatalf("New: %v", err)
	}
	if !errors.Is(err, errors.Unwrap(err)) {
		t.Log(err)
	}
}

// val reads a gauge or counter.
func val(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Gauge != nil {
		return d.Gauge.GetValue()
	}
	return d.Counter.GetValue()
}

// TestGPUPodsAttached: an unhealthy event about a GPU carries the pods the
// kubelet says hold it (known-empty when none does); other events, healthy
// ones, and a kubelet naming devices by index carry nothing.
func TestGPUPodsAttached(t *testing.T) {
	const g0, g1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"
	k := podrestest.Start(t, podrestest.Pod("ml", "train-0", "nvidia.com/gpu", g0), podrestest.Pod("ml", "train-1", "nvidia.com/gpu", g0))
	cfg := testConfig(t, "127.0.0.1:1")
	cfg.PodResourcesSocket = k.Socket
	gpuEv := func(uuid string, healthy bool) *datamodels.HealthEvent {
		return &datamodels.HealthEvent{CheckName: "SysLogsXIDError", IsHealthy: healthy,
			EntitiesImpacted: []*datamodels.Entity{{EntityType: "PCI", EntityValue: "0000:17:00"}, {EntityType: "GPU", EntityValue: uuid}}}
	}
	var emit []*datamodels.HealthEvent
	c := fakeCheck{"gpu", func(context.Context) ([]*datamodels.HealthEvent, error) { return emit, nil }}
	s := Scheduled{Check: c, Interval: time.Second, Timeout: time.Second}
	a, err := New(cfg, quiet(), Options{Checks: []Scheduled{s}})
	if err != nil {
		t.Fatal(err)
	}
	full := gpuEv(g0, false) // one key short of the gateway's limit: no room for two
	full.Metadata = map[string]string{}
	for len(full.Metadata) < validate.MaxMetadata-1 {
		full.Metadata[fmt.Sprintf("k%d", len(full.Metadata))] = "v"
	}
	emit = []*datamodels.HealthEvent{gpuEv(g0, false), gpuEv(g1, false), gpuEv(g0, true), {CheckName: "InfiniBandStateCheck"}, full}
	a.RunOnce(context.Background(), s)
	k.Set(podrestest.Pod("ml", "train-0", "nvidia.com/gpu", "0"))
	time.Sleep(podresTTL + 100*time.Millisecond) // the next run lists again
	emit = []*datamodels.HealthEvent{gpuEv(g0, false)}
	a.RunOnce(context.Background(), s)
	evs, _, err := a.Spool().Peek(10)
	if err != nil || len(evs) != 6 {
		t.Fatalf("spooled %d events, err %v", len(evs), err)
	}
	for i, want := range []struct {
		pods  string
		known bool
	}{{"ml/train-0,ml/train-1", true}, {"", true}, {"", false}, {"", false}, {"", false}, {"", false}} {
		if n := len(evs[i].GetMetadata()); n > validate.MaxMetadata {
			t.Errorf("event %d: %d metadata keys, the gateway refuses more than %d", i, n, validate.MaxMetadata)
		}
		pods, known := evs[i].GetMetadata()[events.MetaGPUPods]
		if pods != want.pods || known != want.known {
			t.Errorf("event %d (%s): %s = %q (present %v), want %q (present %v)", i, evs[i].GetCheckName(), events.MetaGPUPods, pods, known, want.pods, want.known)
		}
		if at, err := time.Parse(time.RFC3339Nano, evs[i].GetMetadata()[events.MetaGPUPodsAt]); known && (err != nil || at.IsZero()) {
			t.Errorf("event %d: %s %q: %v", i, events.MetaGPUPodsAt, evs[i].GetMetadata()[events.MetaGPUPodsAt], err)
		}
	}
}

// TestPodResourcesMissingAtStart: a pod-resources socket missing when the
// agent starts (the kubelet restarting) is read again when needed. It
// turned pod-resources off for the agent's life: the local action
// endpoint got no PodLister and reset GPUs without asking which pods held
// them. Until the socket answers, the lister says it cannot tell (a GPU
// reset is refused, localaction's TestGPUResetChecksPodsBeforeEachGPU).
func TestPodResourcesMissingAtStart(t *testing.T) {
	const g0 = "GPU-00000000-0000-0000-0000-000000000000"
	k := podrestest.Start(t, podrestest.Pod("ml", "train-0", "nvidia.com/gpu", g0))
	aside := k.Socket + ".aside"
	if err := os.Rename(k.Socket, aside); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, "127.0.0.1:1")
	cfg.PodResourcesSocket, cfg.Checks = k.Socket, nil
	a, err := New(cfg, quiet(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.podres.Close()
	pods := a.gpuPods()
	if pods == nil {
		t.Fatal("no PodLister for the local actions: GPU resets would not check for pods")
	}
	if got, err := pods.PodsOf(context.Background(), []string{g0}); err == nil {
		t.Fatalf("socket missing: pods %v, no error", got)
	}
	// The kubelet is back.
	if err := os.Rename(aside, k.Socket); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got, err := pods.PodsOf(context.Background(), []string{g0})
		if err == nil {
			if len(got) != 1 || got[0] != "ml/train-0" {
				t.Fatalf("pods %v", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("socket back, still: %v", err)
		}
	}
}

// TestFlagsNameTheirKeys: every flag of the agent is its TOML key with "-"
// for "_"; the earlier spellings still set the same keys and are named as
// deprecated.
func TestFlagsNameTheirKeys(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	c := DefaultConfig()
	c.RegisterFlags(fs)
	if err := config.CheckFlags(fs, c); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cfg, err := loadConfig("t", []string{"--gateway", "old:1", "--token-file", "/tok", "--spool-dir", "/spool",
		"--kmsg-source", "file", "--sysfs", "/host/sys", "--fabric-poll-interval", "7s", "--gpu-boot-grace", "1m"},
		func(string) string { return "n" }, &out)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Gateway.Addr != "old:1" || cfg.Gateway.TokenFile != "/tok" || cfg.Spool.Dir != "/spool" || cfg.Kmsg.Source != "file" ||
		cfg.NIC.SysfsRoot != "/host/sys" || cfg.Fabric.PollInterval != 7*time.Second || cfg.GPU.BootGrace != time.Minute {
		t.Fatalf("%+v", cfg)
	}
	for _, want := range []string{"--gateway is deprecated; use --gateway.addr", "--sysfs is deprecated; use --nic.sysfs-root",
		"--kmsg-source is deprecated; use --kmsg.source", "--fabric-poll-interval is deprecated; use --fabric.poll-interval"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output %q lacks %q", out.String(), want)
		}
	}
}

// skewedClock is time.Now moved on by what Add adds.
type skewedClock struct{ d atomic.Int64 }

func (c *skewedClock) Now() time.Time      { return time.Now().Add(time.Duration(c.d.Load())) }
func (c *skewedClock) Add(d time.Duration) { c.d.Add(int64(d)) }

// TestTriggerRunsNow: a check on a 6h schedule runs at start, then again
// at once when asked through the local endpoint (POST
// /checks/<name>/run) a minute later or Trigger (SIGUSR1), and an unknown
// check is 404.
func TestTriggerRunsNow(t *testing.T) {
	cfg := testConfig(t, "127.0.0.1:1")
	var runs atomic.Int32
	c := fakeCheck{"conformance", func(context.Context) ([]*datamodels.HealthEvent, error) {
		runs.Add(1)
		return nil, nil
	}}
	var clock skewedClock
	a, err := New(cfg, quiet(), Options{Checks: []Scheduled{{Check: c, Interval: 6 * time.Hour, Timeout: time.Second}}, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- a.Run(ctx) }()
	waitFor(t, 5*time.Second, func() bool { return runs.Load() == 1 }, "the run at start")
	clock.Add(cfg.MinTriggerInterval)
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest("POST", "/checks/conformance/run", nil))
	if rec.Code != http.StatusAccepted {
		t.Fatalf("POST run: %d %s", rec.Code, rec.Body)
	}
	waitFor(t, 5*time.Second, func() bool { return runs.Load() == 2 }, "the requested run")
	if !a.Trigger("") {
		t.Fatal("Trigger(all) found no check")
	}
	waitFor(t, 5*time.Second, func() bool { return runs.Load() == 3 }, "the triggered run")
	rec = httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest("POST", "/checks/nope/run", nil))
	if rec.Code != http.StatusNotFound {
		t.Fatalf("unknown check: %d", rec.Code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := runs.Load(); n != 3 {
		t.Fatalf("%d runs, want 3", n)
	}
}

// TestTriggerRequestsLimited: POST /checks/<name>/run is on metrics_addr,
// which the chart serves on the node's address: anyone who reaches it
// could have the conformance check (ipmitool, an event sent) run back to
// back. Of 100 requests in a row one is taken and 99 refused 429 with
// Retry-After, naming min_trigger_interval; the check runs once for them.
// A request is taken again min_trigger_interval after the last run, a
// check on a shorter interval is limited to that interval, and SIGUSR1
// (Trigger) is not limited.
func TestTriggerRequestsLimited(t *testing.T) {
	cfg := testConfig(t, "127.0.0.1:1")
	var runs, fastRuns atomic.Int32
	c := fakeCheck{"conformance", func(context.Context) ([]*datamodels.HealthEvent, error) {
		runs.Add(1)
		return nil, nil
	}}
	fast := fakeCheck{"nic", func(context.Context) ([]*datamodels.HealthEvent, error) {
		fastRuns.Add(1)
		return nil, nil
	}}
	var clock skewedClock
	a, err := New(cfg, quiet(), Options{Now: clock.Now, Checks: []Scheduled{
		{Check: c, Interval: 6 * time.Hour, Timeout: time.Second},
		{Check: fast, Interval: 10 * time.Second, Timeout: time.Second},
	}})
	if err != nil {
		t.Fatal(err)
	}
	post := func(name string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		a.Handler().ServeHTTP(rec, httptest.NewRequest("POST", "/checks/"+name+"/run", nil))
		return rec
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, 5*time.Second, func() bool { return runs.Load() == 1 && fastRuns.Load() == 1 }, "the runs at start")

	if rec := post("conformance"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("a request right after the run at start: %d %s, want 429", rec.Code, rec.Body)
	}
	clock.Add(cfg.MinTriggerInterval)
	accepted := 0
	for i := range 100 {
		rec := post("conformance")
		switch rec.Code {
		case http.StatusAccepted:
			accepted++
		case http.StatusTooManyRequests:
			if ra := rec.Header().Get("Retry-After"); ra != "60" && ra != "59" {
				t.Errorf("request %d: Retry-After %q, want about 60", i, ra)
			}
			if !strings.Contains(rec.Body.String(), "min_trigger_interval") {
				t.Errorf("request %d: refusal %q does not name min_trigger_interval", i, rec.Body)
			}
		default:
			t.Fatalf("request %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	if accepted != 1 {
		t.Fatalf("%d of 100 requests in a row accepted, want 1", accepted)
	}
	waitFor(t, 5*time.Second, func() bool { return runs.Load() == 2 }, "the requested run")
	time.Sleep(100 * time.Millisecond)
	if n := runs.Load(); n != 2 {
		t.Fatalf("%d runs after 100 requests, want 2 (one at start, one requested)", n)
	}

	// The gap runs from the requested run's end too.
	clock.Add(cfg.MinTriggerInterval - time.Second)
	if rec := post("conformance"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("a request %v after the requested run: %d, want 429", cfg.MinTriggerInterval-time.Second, rec.Code)
	}
	clock.Add(time.Second)
	if rec := post("conformance"); rec.Code != http.StatusAccepted {
		t.Fatalf("a request %v after the last run: %d %s", cfg.MinTriggerInterval, rec.Code, rec.Body)
	}
	waitFor(t, 5*time.Second, func() bool { return runs.Load() == 3 }, "the run requested later")

	// A check on a 10s interval is limited to 10s, not min_trigger_interval.
	clock.Add(10 * time.Second)
	if rec := post("nic"); rec.Code != http.StatusAccepted {
		t.Fatalf("nic 10s after its run: %d %s", rec.Code, rec.Body)
	}
	if rec := post("nic"); rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), "10s") {
		t.Fatalf("nic again at once: %d %s, want 429 naming 10s", rec.Code, rec.Body)
	}

	// SIGUSR1 is the node's own: not limited.
	waitFor(t, 5*time.Second, func() bool { return fastRuns.Load() == 2 }, "nic's requested run")
	a.Trigger("conformance")
	waitFor(t, 5*time.Second, func() bool { return runs.Load() == 4 }, "the run SIGUSR1 asked for")
}

// TestConformanceCheckRegistered: `checks = ["conformance"]` builds the
// conformance check from its section; one run spools a NodeConformance
// event stamped with the node, carrying the fingerprint and every
// component (ipmitool is absent here: bmc_version is reported unreadable).
func TestConformanceCheckRegistered(t *testing.T) {
	cfg := testConfig(t, "127.0.0.1:1")
	cfg.Checks = []string{"conformance"}
	root := filepath.Join("..", "conformance", "testdata", "h100-a")
	cfg.Conformance.Sysfs, cfg.Conformance.Procfs = filepath.Join(root, "sys"), filepath.Join(root, "proc")
	cfg.Conformance.OSImageFile = filepath.Join(root, "os-image")
	cfg.Conformance.BMCCommand = []string{"faultline-no-such-ipmitool", "mc", "info"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg, quiet(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.spool.Close()
	a.RunOnce(context.Background(), a.checks[0])
	evs, _, _ := a.Spool().Peek(1)
	if len(evs) != 1 {
		t.Fatalf("%d events", len(evs))
	}
	ev := evs[0]
	md := ev.GetMetadata()
	if ev.GetCheckName() != "NodeConformance" || ev.GetNodeName() != "node-7" || len(md["fingerprint"]) != 64 ||
		md["component.gpu_driver"] != "550.54.14" || md["component.bmc_version"] != "absent: faultline-no-such-ipmitool not installed" {
		t.Fatalf("event %v", ev)
	}
	if a.checks[0].Interval != 6*time.Hour {
		t.Fatalf("interval %v", a.checks[0].Interval)
	}
	if _, ok := a.checks[0].Check.(check.Retrier); !ok {
		t.Fatal("the conformance check is no check.Retrier: a partial report would stand for its interval")
	}
}

// TestEventsCarryTheMachine: every event names the machine that raised it
// (its system UUID from sysfs's DMI class, as the kubelet reports it), so
// a Node object kept across a machine swap tells the earlier machine's
// late events apart; where the UUID cannot be read (a non-root agent, no
// DMI) events carry none.
func TestEventsCarryTheMachine(t *testing.T) {
	const uuid = "4C4C4544-0042-3510-8052-B4C04F4E3732"
	for _, tc := range []struct {
		name    string
		content string // product_uuid; "-" none
		want    string
	}{
		{"read", uuid + "\n", uuid},
		{"no DMI", "-", ""},
		{"not a UUID's length", strings.Repeat("0", 80), ""},
		{"not a UUID: control characters", "4C4C4544-0042\x1b[2J-3510", ""},
		{"not a UUID: words", "Not Settable", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sys := t.TempDir()
			if tc.content != "-" {
				dir := filepath.Join(sys, "class", "dmi", "id")
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "product_uuid"), []byte(tc.content), 0o400); err != nil {
					t.Fatal(err)
				}
			}
			cfg := testConfig(t, "127.0.0.1:1")
			cfg.MachineSysfs = sys
			c := fakeCheck{"x", func(context.Context) ([]*datamodels.HealthEvent, error) {
				return []*datamodels.HealthEvent{{CheckName: "SysLogsXIDError", IsFatal: true, Message: "Xid 79"}, {CheckName: "Healthy", IsHealthy: true}}, nil
			}}
			s := Scheduled{Check: c, Interval: time.Second, Timeout: time.Second}
			a, err := New(cfg, quiet(), Options{Checks: []Scheduled{s}})
			if err != nil {
				t.Fatal(err)
			}
			a.RunOnce(context.Background(), s)
			evs, _, err := a.Spool().Peek(10)
			if err != nil || len(evs) != 2 {
				t.Fatalf("spooled %d events, err %v", len(evs), err)
			}
			for _, ev := range evs {
				if got, ok := ev.GetMetadata()[events.MetaSystemUUID]; got != tc.want || ok != (tc.want != "") {
					t.Errorf("%s: %s = %q (present %v), want %q", ev.GetCheckName(), events.MetaSystemUUID, got, ok, tc.want)
				}
			}
		})
	}
}

// TestStateNotCommittedWhenSpoolRefuses: a spool past 90% refuses a
// healthy event for capacity without an error, and the runner committed
// the check's state all the same: the recovery was lost for good (the
// gateway got the fatal events before it, never the recovery, and the
// node stayed quarantined). The refused event is kept, the state not
// committed; once the spool drains, the next run spools it, then commits.
func TestStateNotCommittedWhenSpoolRefuses(t *testing.T) {
	cfg := testConfig(t, "127.0.0.1:1")
	cfg.Spool.MaxBytes = 16 << 10
	var a *Agent
	runs := 0
	c := &committingCheck{spool: func() *Spool { return a.Spool() }}
	c.fakeCheck = fakeCheck{"gpu", func(context.Context) ([]*datamodels.HealthEvent, error) {
		runs++
		if runs > 1 {
			return nil, nil // reported once: the check's state has moved past it
		}
		return []*datamodels.HealthEvent{{CheckName: "GpuHealth", ComponentClass: "GPU", IsHealthy: true, Message: "recovered"}}, nil
	}}
	sched := Scheduled{Check: c, Interval: time.Minute, Timeout: time.Second}
	a, err := New(cfg, quiet(), Options{Checks: []Scheduled{sched}})
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("y", 500)
	for range 40 {
		a.Spool().Append([]*datamodels.HealthEvent{ev(big, false)})
	}
	before := a.Spool().Pending()
	refused := func() float64 {
		return val(a.m.spoolDropped.WithLabelValues("full")) + val(a.m.spoolDropped.WithLabelValues("reserved_for_fatal"))
	}
	r0 := refused()
	a.RunOnce(context.Background(), sched)
	if a.Spool().Pending() != before {
		t.Fatal("the full spool took the healthy event")
	}
	if len(c.commits) != 0 {
		t.Fatalf("committed although the spool refused the event: %v", c.commits)
	}
	a.RunOnce(context.Background(), sched) // still full: the check runs on, no commit
	if len(c.commits) != 0 || runs != 2 {
		t.Fatalf("while full: commits %v, runs %d; want none and 2", c.commits, runs)
	}
	if got := refused() - r0; got != 1 {
		t.Errorf("the refused event counted %v times in spool_dropped_events_total, want once (not again per try)", got)
	}
	_, next, _ := a.Spool().Peek(1000)
	if err := a.Spool().Commit(next); err != nil {
		t.Fatal(err)
	}
	a.RunOnce(context.Background(), sched)
	evs, _, _ := a.Spool().Peek(10)
	if len(evs) != 1 || evs[0].GetMessage() != "recovered" {
		t.Fatalf("after draining the spool holds %v, want the recovery", msgs(evs))
	}
	if len(c.commits) == 0 || c.commits[0] == 0 {
		t.Fatalf("commits %v: want one, after the event was spooled", c.commits)
	}
}

// TestSpoolAppendPrefix: Append takes an unbroken prefix: a large event
// that does not fit refuses the smaller ones after it, which would
// otherwise reach the gateway without it.
func TestSpoolAppendPrefix(t *testing.T) {
	sp, err := OpenSpool(t.TempDir(), 16<<10, quiet(), NewMetrics())
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	for sp.Pending() < 16<<10*8/10 {
		sp.Append([]*datamodels.HealthEvent{ev(strings.Repeat("y", 500), false)})
	}
	n, err := sp.Append([]*datamodels.HealthEvent{ev(strings.Repeat("z", 4000), false), ev("small", false)})
	if err != nil || n != 0 {
		t.Fatalf("Append = %d, %v; want 0: nothing after the refused event", n, err)
	}
}

// TestNilEventDropped: a check returning a nil event panicked the whole
// agent (stamping runs outside the check's recovery), and it crash-looped.
// The nil event is dropped, the others spooled.
func TestNilEventDropped(t *testing.T) {
	cfg := testConfig(t, "127.0.0.1:1")
	c := fakeCheck{"buggy", func(context.Context) ([]*datamodels.HealthEvent, error) {
		return []*datamodels.HealthEvent{nil, {CheckName: "Buggy", Message: "real"}}, nil
	}}
	sched := Scheduled{Check: c, Interval: time.Minute, Timeout: time.Second}
	a, err := New(cfg, quiet(), Options{Checks: []Scheduled{sched}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Spool().Close()
	a.RunOnce(context.Background(), sched)
	evs, _, _ := a.Spool().Peek(10)
	if got := strings.Join(msgs(evs), ","); got != "real" {
		t.Fatalf("spooled %q, want real", got)
	}
}

// TestSpoolFullUntilBelow80: a full spool took a non-fatal event again the
// moment it fitted under 90%, while faultline_agent_spool_full still read
// 1. Once full, it refuses non-fatal events until the backlog is below 80%
// (fatal ones still while they fit), Append and AppendAll alike.
func TestSpoolFullUntilBelow80(t *testing.T) {
	m := NewMetrics()
	const max = 16 << 10
	sp, err := OpenSpool(t.TempDir(), max, quiet(), m)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	big := strings.Repeat("y", 500)
	for range 40 {
		sp.Append([]*datamodels.HealthEvent{ev(big, false)})
	}
	if val(m.spoolFull) != 1 {
		t.Fatal("spool not full")
	}
	// Send events until the backlog is 84%, between 80% and 90%.
	for sp.Pending() > max*84/100 {
		_, next, _ := sp.Peek(1)
		if err := sp.Commit(next); err != nil {
			t.Fatal(err)
		}
	}
	if p := sp.Pending(); p < max*8/10 {
		t.Fatalf("drained to %d, below 80%%", p)
	}
	if n, _ := sp.Append([]*datamodels.HealthEvent{ev("small", false)}); n != 0 {
		t.Errorf("a full spool above 80%% took a non-fatal event (spool_full %v)", val(m.spoolFull))
	}
	if err := sp.AppendAll([]*datamodels.HealthEvent{ev("small", false)}); !errors.Is(err, ErrSpoolFull) {
		t.Errorf("AppendAll on a full spool above 80%%: %v, want ErrSpoolFull", err)
	}
	if n, _ := sp.Append([]*datamodels.HealthEvent{ev("fatal", true)}); n != 1 {
		t.Error("a full spool refused a fatal event that fits")
	}
	if val(m.spoolFull) != 1 {
		t.Error("spool_full not 1 while refusing")
	}
	for sp.Pending() >= max*8/10 {
		_, next, _ := sp.Peek(1)
		if err := sp.Commit(next); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := sp.Append([]*datamodels.HealthEvent{ev("small", false)}); n != 1 || val(m.spoolFull) != 0 {
		t.Errorf("below 80%%: accepted %d, spool_full %v; want 1 and 0", n, val(m.spoolFull))
	}
}

// TestSenderDropsAnotherNodesEvents: an event spooled under the node's
// earlier name (the node renamed, the spool kept) was refused
// PermissionDenied at every try, and everything behind it waited for
// ever. The events of this node before and after it are delivered, it is
// dropped and counted; a credential bound to another node than this one
// keeps every event waiting.
func TestSenderDropsAnotherNodesEvents(t *testing.T) {
	g := startFake(t)
	g.node = "n1"
	sp, _, m, _ := nodeSenderFor(t, g.addr, g.token, "n1")
	old := func(msg string) *datamodels.HealthEvent {
		e := ev(msg, true)
		e.NodeName = "old-name"
		return e
	}
	sp.Append([]*datamodels.HealthEvent{ev("a", false), old("x"), old("y"), ev("b", true), old("z"), ev("c", false)})
	waitFor(t, 5*time.Second, func() bool { return sp.Pending() == 0 }, "drain")
	if got := strings.Join(g.received(), ","); got != "a,b,c" {
		t.Errorf("received %s, want a,b,c", got)
	}
	if v := val(m.rejected); v != 3 {
		t.Errorf("rejected %v, want 3", v)
	}

	g2 := startFake(t)
	g2.node = "n2" // the credential is another node's: the operator fixes it
	sp2, _, m2, _ := nodeSenderFor(t, g2.addr, g2.token, "n1")
	sp2.Append([]*datamodels.HealthEvent{ev("a", false), old("x")})
	waitFor(t, 5*time.Second, func() bool { return val(m2.sendErrors.WithLabelValues("PermissionDenied")) >= 2 },
		"PermissionDenied errors counted")
	if sp2.Pending() == 0 || val(m2.rejected) != 0 || len(g2.received()) != 0 {
		t.Error("events dropped for a credential bound to another node")
	}
}

// retryingCheck asks to run again after retry (0: on its interval).
type retryingCheck struct {
	fakeCheck
	retry func() time.Duration
}

func (c retryingCheck) RetryIn() time.Duration { return c.retry() }

// TestRetryBeforeInterval: a check on a 6h schedule that asks to run
// again sooner (check.Retrier: the conformance check after a collection
// with unreadable components) runs again then, and once it asks no more
// it waits its interval. It waited the interval: the partial report after
// a reboot stood for 6h.
func TestRetryBeforeInterval(t *testing.T) {
	cfg := testConfig(t, "127.0.0.1:1")
	var runs atomic.Int32
	c := retryingCheck{fakeCheck: fakeCheck{"conformance", func(context.Context) ([]*datamodels.HealthEvent, error) {
		runs.Add(1)
		return nil, nil
	}}, retry: func() time.Duration {
		if runs.Load() < 3 {
			return 20 * time.Millisecond
		}
		return 0
	}}
	a, err := New(cfg, quiet(), Options{Checks: []Scheduled{{Check: c, Interval: 6 * time.Hour, Timeout: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- a.Run(ctx) }()
	waitFor(t, 5*time.Second, func() bool { return runs.Load() == 3 }, "the run at start and two retries")
	time.Sleep(200 * time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := runs.Load(); n != 3 {
		t.Fatalf("%d runs, want 3 (then the 6h interval)", n)
	}
}
