package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/faultline/faultline/internal/connlimit"
	"github.com/faultline/faultline/internal/warnlimit"
)

// TestClientAddrIPv6Per64: the per-address connection cap counts an IPv6
// peer by its /64, which a host is given whole; counted per /128, one
// client had as many addresses as it liked, and took every connection
// slot with none of its credentials.
func TestClientAddrIPv6Per64(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("10.0.0.7"), Port: 4000}, "10.0.0.7"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:10.0.0.7"), Port: 4000}, "10.0.0.7"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2::1"), Port: 4000}, "2001:db8:1:2::/64"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:ffff:eeee:dddd:cccc"), Port: 4000}, "2001:db8:1:2::/64"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:3::1"), Port: 4000}, "2001:db8:1:3::/64"},
		{&net.UnixAddr{Name: "/run/faultline.sock", Net: "unix"}, ""},
	} {
		if got := connlimit.ClientAddr(tc.addr); got != tc.want {
			t.Errorf("connlimit.ClientAddr(%s) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}

// TestHTTP2BodyHeldForAHandlerIsBounded: over HTTP/2 (REST with TLS) the
// server takes a request's body ahead of its handler only up to its
// flow-control window, outside the in-flight budgets: 64 KiB now, where
// net/http's default, 1 MiB a connection, let one credential's
// connections hold a GiB while their handlers waited.
func TestHTTP2BodyHeldForAHandlerIsBounded(t *testing.T) {
	cfg := DefaultConfig()
	s := &Server{cfg: cfg, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		flight: newInflight(cfg.MaxInflightBytes, cfg.MaxInflightBytesPerConn, cfg.MaxReadBytesPerCaller, cfg.MaxDecodedBytes)}
	release := make(chan struct{})
	ts := httptest.NewUnstartedServer(nil)
	ts.Config = s.newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release // a handler waiting for its share, the body unread
		_, _ = io.Copy(io.Discard, r.Body)
	}), nil)
	ts.EnableHTTP2 = true
	ts.StartTLS()
	defer ts.Close()
	defer close(release)
	var sent atomic.Int64
	body := &countingReader{r: io.LimitReader(rand.Reader, 1<<20), n: &sent}
	go func() {
		req, _ := http.NewRequest(http.MethodPost, ts.URL+"/v1/events", body)
		if resp, err := ts.Client().Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	time.Sleep(time.Second)
	// What the client could write is what the server's windows took in
	// (the transport's own buffering: at most a frame more).
	if n := sent.Load(); n > 160<<10 {
		t.Fatalf("the server took %d KiB of a body its handler had not read, want at most its 64 KiB window", n>>10)
	}
}

type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestGRPCMalformedMessageIsInvalidArgument: a SubmitEvents message that
// does not decode is answered InvalidArgument, as REST answers it 400;
// grpc-go answered Internal, which a client retries for ever.
func TestGRPCMalformedMessageIsInvalidArgument(t *testing.T) {
	conn := grpcDoor(t, slog.New(slog.NewTextHandler(io.Discard, nil)), &fakeProducer{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer test-token-of-alpha-0001")
	var out bytes.Buffer
	err := conn.Invoke(ctx, "/faultline.v1.Events/SubmitEvents", []byte{0x0a, 0x05, 0x01}, &out, grpc.ForceCodecV2(rawBytes{}))
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "does not decode") {
		t.Fatalf("a truncated message: %v, want InvalidArgument saying it does not decode", err)
	}
}

// TestKafkaRefusalLogged: why the event log refused a call's events is
// logged (each reason once per 10 s), where the caller is only told to
// retry; it was logged nowhere, and a topic's authorization that failed
// looked like a passing outage.
func TestKafkaRefusalLogged(t *testing.T) {
	var logged bytes.Buffer
	s := testService(&fakeProducer{err: kerr.TopicAuthorizationFailed}, 1000, 1000)
	s.log, s.produceWarns = slog.New(slog.NewTextHandler(&logged, nil)), warnlimit.New(warnWindow, warnKeys)
	for range 3 {
		if err := submit(s, Caller{Cluster: "alpha", Name: "token:alpha#1"}, 1); status.Code(err) != codes.Unavailable {
			t.Fatalf("a refused produce: %v, want Unavailable", err)
		}
	}
	if l := logged.String(); strings.Count(l, "TOPIC_AUTHORIZATION_FAILED") != 1 {
		t.Fatalf("the reason logged %d times, want once:\n%s", strings.Count(l, "TOPIC_AUTHORIZATION_FAILED"), l)
	}
}

// rawBytes sends a []byte as the message, as it is (a gRPC codec).
type rawBytes struct{}

func (rawBytes) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}

func (rawBytes) Unmarshal(d mem.BufferSlice, v any) error {
	_, err := v.(*bytes.Buffer).Write(d.Materialize())
	return err
}

func (rawBytes) Name() string { return "proto" }
