package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
)

// restTestServer is a gateway's REST handler over a fake producer, with or
// without the POST /v1/events fast path.
type restTestServer struct {
	h    http.Handler
	reg  *prometheus.Registry
	prod *fakeProducer
}

func newRESTTestServer(t *testing.T, fast bool) *restTestServer {
	t.Helper()
	tokens, err := ParseTokens(strings.NewReader(
		"test-token-of-alpha-0001,alpha,agent\ntest-token-of-node-00001,alpha,agent,gpu-node-1\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.MaxBatch = 3
	cfg.MaxBodyBytes = 2048
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	prod := &fakeProducer{}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := &Server{
		cfg: cfg, log: log, auth: &Authenticator{Tokens: tokens}, metrics: m, reg: reg,
		flight:           newInflight(cfg.MaxInflightBytes, cfg.MaxInflightBytesPerConn, cfg.MaxReadBytesPerCaller, cfg.MaxDecodedBytes),
		codec:            Codec{limits: shapeLimits{maxEvents: cfg.MaxBatch}},
		noSubmitFastPath: !fast,
		svc: &service{
			validator: Validator{MaxBatch: cfg.MaxBatch, MaxFutureSkew: cfg.MaxFutureSkew},
			producer:  prod,
			// 13 events of burst, then none: the clock does not move.
			limiter: newLimiter(0.001, 13),
			metrics: m, now: func() time.Time { return testNow }, log: log,
		},
	}
	h, err := s.httpHandler(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return &restTestServer{h: h, reg: reg, prod: prod}
}

const (
	fastToken = "Bearer test-token-of-alpha-0001"
	fastEvent = `{"agent":"faultline-agent","componentClass":"NIC","checkName":"InfiniBandStateCheck","isFatal":true,` +
		`"nodeName":"gpu-node-1","message":"Port mlx5_3 port 1 state DOWN","recommendedAction":"REPLACE_VM",` +
		`"entitiesImpacted":[{"entityType":"NIC","entityValue":"mlx5_3"}]}`
)

var uuidPattern = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// TestSubmitFastPathMatchesGRPCGateway sends the same requests, in the
// same order, to a REST handler with the POST /v1/events fast path and to
// one that routes every request through grpc-gateway: every answer (status,
// headers, body), the metrics and what was produced must be the same.
func TestSubmitFastPathMatchesGRPCGateway(t *testing.T) {
	fast, slow := newRESTTestServer(t, true), newRESTTestServer(t, false)
	type req struct {
		name, method, target, body string
		header                     map[string]string
		produceErr                 error
		wantCode                   int
	}
	json := map[string]string{"Authorization": fastToken, "Content-Type": "application/json"}
	with := func(kv ...string) map[string]string {
		h := map[string]string{}
		for k, v := range json {
			h[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "" {
				delete(h, kv[i])
			} else {
				h[kv[i]] = kv[i+1]
			}
		}
		return h
	}
	one := `{"events":[` + fastEvent + `]}`
	withID := `{"events":[` + strings.Replace(fastEvent, `{"agent"`, `{"id":"client-id-1","agent"`, 1) + `]}`
	tests := []req{
		{name: "one event", body: one, header: json, wantCode: 200},
		{name: "one event with a client id", body: withID, header: json, wantCode: 200},
		{name: "query string", target: "/v1/events?x=1", body: one, header: json, wantCode: 200},
		{name: "charset", body: one, header: with("Content-Type", "application/json; charset=utf-8"), wantCode: 200},
		{name: "TE trailers", body: one, header: with("TE", "trailers"), wantCode: 200},
		{name: "Accept xml", body: one, header: with("Accept", "application/xml"), wantCode: 200},
		{name: "grpc metadata header", body: one, header: with("Grpc-Metadata-Foo", "bar"), wantCode: 200},
		{name: "empty body", body: "", header: json, wantCode: 400},
		{name: "blank body", body: " \n", header: json, wantCode: 400},
		{name: "no events", body: `{}`, header: json, wantCode: 400},
		{name: "truncated", body: `{"events":[`, header: json, wantCode: 400},
		{name: "not json", body: `nope`, header: json, wantCode: 400},
		{name: "unknown field", body: `{"events":[{"bogus":1}]}`, header: json, wantCode: 400},
		{name: "wrong type", body: `{"events":[{"isFatal":"yes"}]}`, header: json, wantCode: 400},
		{name: "bad enum", body: `{"events":[{"recommendedAction":"EXPLODE"}]}`, header: json, wantCode: 400},
		{name: "too many events", body: `{"events":[{},{},{},{}]}`, header: json, wantCode: 400},
		{name: "invalid event", body: `{"events":[{"agent":"a"}]}`, header: json, wantCode: 400},
		{name: "body too large", body: `{"events":[` + strings.Repeat(" ", 4096) + `]}`, header: json, wantCode: 413},
		{name: "no credential", body: one, header: with("Authorization", ""), wantCode: 401},
		{name: "bad token", body: one, header: with("Authorization", "Bearer wrong-token-000000000"), wantCode: 401},
		{name: "basic auth", body: one, header: with("Authorization", "Basic dXNlcjpwYXNz"), wantCode: 401},
		{name: "text/plain", body: one, header: with("Content-Type", "text/plain"), wantCode: 415},
		{name: "no content type", body: one, header: with("Content-Type", ""), wantCode: 415},
		{name: "node-bound token, other node", body: strings.Replace(one, "gpu-node-1", "gpu-node-2", 1),
			header: with("Authorization", "Bearer test-token-of-node-00001"), wantCode: 403},
		{name: "node-bound token, its node", body: one, header: with("Authorization", "Bearer test-token-of-node-00001"), wantCode: 200},
		{name: "kafka overloaded", body: one, header: json, produceErr: ErrOverloaded, wantCode: 429},
		{name: "kafka down", body: one, header: json, produceErr: errors.New("broker down"), wantCode: 503},
		// Requests grpc-gateway's annotation may refuse or give a deadline
		// take its path on both servers; they must answer the same.
		{name: "grpc-timeout", body: one, header: with("Grpc-Timeout", "10S"), wantCode: 200},
		{name: "bad grpc-timeout", body: one, header: with("Grpc-Timeout", "soon"), wantCode: 400},
		// grpc-gateway's default header matcher forwards no *-Bin header
		// today, so it does not refuse this one; another matcher might.
		{name: "binary header", body: one, header: with("Grpc-Metadata-Foo-Bin", "!!!"), wantCode: 200},
		{name: "method override", body: one, header: with("X-HTTP-Method-Override", "GET"), wantCode: 200},
		{name: "escaped path", target: "/v1/%65vents", body: one, header: json, wantCode: 200},
		{name: "trailing slash", target: "/v1/events/", body: one, header: json, wantCode: 404},
		{name: "GET", method: http.MethodGet, body: "", header: json, wantCode: 501},
		{name: "PUT", method: http.MethodPut, body: one, header: json, wantCode: 501},
		// 13 events of burst, 13 taken above (Kafka's refusals count):
		// the caller is over its rate.
		{name: "rate limited", body: one, header: json, wantCode: 429},
	}
	for _, tt := range tests {
		if tt.method == "" {
			tt.method = http.MethodPost
		}
		if tt.target == "" {
			tt.target = "/v1/events"
		}
		var got [2]*httptest.ResponseRecorder
		for i, s := range []*restTestServer{fast, slow} {
			s.prod.err = tt.produceErr
			r := httptest.NewRequest(tt.method, tt.target, strings.NewReader(tt.body))
			for k, v := range tt.header {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			s.h.ServeHTTP(w, r)
			got[i] = w
		}
		f, s := got[0], got[1]
		if f.Code != tt.wantCode {
			t.Errorf("%s: fast path answered %d, want %d: %s", tt.name, f.Code, tt.wantCode, f.Body)
		}
		if f.Code != s.Code {
			t.Errorf("%s: fast path answered %d, grpc-gateway %d", tt.name, f.Code, s.Code)
		}
		if fb, sb := uuidPattern.ReplaceAllString(f.Body.String(), "<uuid>"), uuidPattern.ReplaceAllString(s.Body.String(), "<uuid>"); fb != sb {
			t.Errorf("%s: bodies differ:\nfast path:    %s\ngrpc-gateway: %s", tt.name, fb, sb)
		}
		if fh, sh := headerText(f.Header()), headerText(s.Header()); fh != sh {
			t.Errorf("%s: headers differ:\nfast path:    %s\ngrpc-gateway: %s", tt.name, fh, sh)
		}
	}
	if fast.prod.produced != slow.prod.produced || fast.prod.produced != 12 {
		t.Errorf("produced %d events with the fast path, %d without, want 12", fast.prod.produced, slow.prod.produced)
	}
	for _, name := range []string{"faultline_gateway_requests_total", "faultline_gateway_events_accepted_total", "faultline_gateway_events_rejected_total"} {
		if fm, sm := metricText(t, fast.reg, name), metricText(t, slow.reg, name); fm != sm {
			t.Errorf("%s differs:\nfast path:\n%s\ngrpc-gateway:\n%s", name, fm, sm)
		}
	}
	if m := metricText(t, fast.reg, "faultline_gateway_requests_total"); !strings.Contains(m, `method="POST /v1/events"`) {
		t.Errorf("requests_total has no POST /v1/events series:\n%s", m)
	}
}

func headerText(h http.Header) string {
	var b strings.Builder
	_ = h.Write(&b)
	return b.String()
}

func metricText(t *testing.T, reg *prometheus.Registry, name string) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if mf.GetName() == name {
			if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
				t.Fatal(err)
			}
		}
	}
	return b.String()
}

func TestIsSubmitFastPath(t *testing.T) {
	tests := []struct {
		name, method, target string
		header               map[string]string
		want                 bool
	}{
		{"POST /v1/events", http.MethodPost, "/v1/events", nil, true},
		{"with a query", http.MethodPost, "/v1/events?a=b", nil, true},
		{"ordinary headers", http.MethodPost, "/v1/events", map[string]string{"Authorization": "Bearer x", "TE": "trailers", "Grpc-Metadata-A": "b"}, true},
		{"GET", http.MethodGet, "/v1/events", nil, false},
		{"other path", http.MethodPost, "/v1/healthevents", nil, false},
		{"trailing slash", http.MethodPost, "/v1/events/", nil, false},
		{"escaped path", http.MethodPost, "/v1/%65vents", nil, false},
		{"grpc-timeout", http.MethodPost, "/v1/events", map[string]string{"Grpc-Timeout": "1S"}, false},
		{"binary header", http.MethodPost, "/v1/events", map[string]string{"Grpc-Metadata-A-Bin": "AA=="}, false},
		{"binary header, lower case", http.MethodPost, "/v1/events", map[string]string{"x-trace-bin": "AA=="}, false},
		{"method override", http.MethodPost, "/v1/events", map[string]string{"X-HTTP-Method-Override": "GET"}, false},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(tt.method, tt.target, nil)
		for k, v := range tt.header {
			r.Header[k] = []string{v} // as sent, not canonicalised
		}
		if got := isSubmitFastPath(r); got != tt.want {
			t.Errorf("%s: isSubmitFastPath = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestUnauthenticatedConnectionClosed: a 401 closes its connection, the
// request with a body or without (the fast path, grpc-gateway's routes, the
// fleet page's reads): over keep-alive a refusal started idle_timeout (5m)
// again, and a client with no credential held its connections, up to
// max_conns_per_address, as long as it liked. An answered request keeps
// its connection.
func TestUnauthenticatedConnectionClosed(t *testing.T) {
	for _, fast := range []bool{true, false} {
		srv := httptest.NewServer(newRESTTestServer(t, fast).h)
		for _, tc := range []struct {
			name, request string
			wantCode      int
			wantClosed    bool
		}{
			{"history read, bogus token", "GET /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer bogus-token-00000000000\r\n\r\n", 401, true},
			{"history read, no credential", "GET /v1/events HTTP/1.1\r\nHost: x\r\n\r\n", 401, true},
			{"fleet read, bogus token", "GET /v1/fleet/summary HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer bogus-token-00000000000\r\n\r\n", 401, true},
			{"submission, bogus token", "POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer bogus-token-00000000000\r\n" +
				"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", 401, true},
			{"health", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 200, false},
		} {
			name := fmt.Sprintf("%s (fast path %v)", tc.name, fast)
			c, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(c, tc.request); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.wantCode {
				t.Errorf("%s: %d, want %d", name, resp.StatusCode, tc.wantCode)
			}
			_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			_, err = br.ReadByte()
			closed := errors.Is(err, io.EOF)
			if closed != tc.wantClosed || resp.Close != tc.wantClosed {
				t.Errorf("%s: Connection: close %v, connection closed %v (%v), want %v", name, resp.Close, closed, err, tc.wantClosed)
			}
			c.Close()
		}
		srv.Close()
	}
}
