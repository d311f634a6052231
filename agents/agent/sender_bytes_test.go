package agent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestSenderBatchFitsTheGateway: a backlog of large events (an 8 KiB
// message and 2 KiB of details each: 500 of them are 5 MB) reaches a
// gateway that takes messages up to gRPC's (and the gateway's default)
// 4 MiB. Batches were cut by count only: the first was refused as too
// large at every try, and nothing after it was ever sent. A gateway whose
// gateway.max_body_bytes is below the agent's 2 MiB a call (it may be as
// low as 1024) refused every call of such a backlog the same way; an event
// larger alone than that limit can never be sent (dropped, counted); and
// the gateway's other ResourceExhausted (in-flight, rate) must not shrink
// the batches. A proxy in front of the gateway (ingress-nginx, whose
// proxy-body-size defaults to 1m; envoy's buffer limits) refuses a body over
// its limit in its own words, and must shrink the calls the same way; its
// rate limit must not.
func TestSenderBatchFitsTheGateway(t *testing.T) {
	for _, tc := range []struct {
		name      string
		batchSize int
		events    int
		msgBytes  int
		maxRecv   int                         // the gateway's gateway.max_body_bytes (gRPC's MaxRecvMsgSize), or the proxy's limit; 0: 4 MiB
		oversize  int                         // this event is larger alone than maxRecv (-1: none)
		busy      int                         // calls first refused as over the gateway's in-flight budget, or by the proxy's rate limit
		proxy     func(w http.ResponseWriter) // a proxy's answer to a body over maxRecv (to a busy call if busy); nil: none
	}{
		{"500 large events", 500, 600, 8 << 10, 0, -1, 0, nil},
		{"a large batch_size of small events", 10000, 12000, 500, 0, -1, 0, nil},
		{"gateway.max_body_bytes 64 KiB", 500, 600, 8 << 10, 64 << 10, -1, 0, nil},
		{"gateway.max_body_bytes 1024", 500, 300, 200, 1024, -1, 0, nil},
		{"an event larger alone than gateway.max_body_bytes", 500, 100, 2 << 10, 16 << 10, 37, 0, nil},
		{"the gateway busy: batches kept whole", 100, 300, 500, 0, -1, 3, nil},
		{"nginx in front: HTTP 413", 500, 600, 8 << 10, 64 << 10, -1, 0, nginx413},
		{"nginx in front: an event larger alone than client_max_body_size", 500, 100, 2 << 10, 16 << 10, 37, 0, nginx413},
		{"envoy in front: Payload Too Large", 500, 600, 8 << 10, 64 << 10, -1, 0, envoy413},
		{"envoy in front rate-limiting: batches kept whole", 100, 300, 500, 0, -1, 3, envoyRateLimited},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &fakeGateway{t: t, addr: "127.0.0.1:0", token: "s3cret", busy: tc.busy}
			switch {
			case tc.proxy != nil:
				g.busy, g.front = 0, proxy(tc.maxRecv, tc.busy, tc.proxy)
			case tc.maxRecv > 0:
				g.opts = []grpc.ServerOption{grpc.MaxRecvMsgSize(tc.maxRecv)} // as the gateway sets it
			}
			g.start() // else gRPC's default limit: 4 MiB a message
			t.Cleanup(g.stop)
			dir := t.TempDir()
			tok := filepath.Join(dir, "token")
			if err := os.WriteFile(tok, []byte(g.token), 0o600); err != nil {
				t.Fatal(err)
			}
			m := NewMetrics()
			sp, err := OpenSpool(filepath.Join(dir, "spool"), 64<<20, quiet(), m)
			if err != nil {
				t.Fatal(err)
			}
			defer sp.Close()
			var want []string
			for i := range tc.events {
				e := ev(fmt.Sprintf("%05d %s", i, strings.Repeat("x", tc.msgBytes)), true)
				e.Metadata = map[string]string{"details": strings.Repeat("d", tc.msgBytes/4)}
				if i == tc.oversize {
					for k := range tc.maxRecv / 2048 {
						e.Metadata[fmt.Sprint("detail", k)] = strings.Repeat("d", 2048)
					}
				} else {
					want = append(want, e.Message)
				}
				if err := sp.AppendAll([]*datamodels.HealthEvent{e}); err != nil {
					t.Fatal(err)
				}
			}
			cfg := DefaultConfig().Gateway
			cfg.Addr, cfg.TokenFile, cfg.Insecure = g.addr, tok, true
			cfg.BatchSize, cfg.MaxBackoff = tc.batchSize, 200*time.Millisecond
			s, err := NewSender(cfg, sp, quiet(), m)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { s.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			deadline := time.Now().Add(10 * time.Second)
			for sp.Pending() > 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if sp.Pending() > 0 {
				t.Fatalf("%d of %d events received, %d bytes still spooled; send errors: ResourceExhausted %v, Unknown %v", len(g.received()), tc.events,
					sp.Pending(), val(m.sendErrors.WithLabelValues("ResourceExhausted")), val(m.sendErrors.WithLabelValues("Unknown")))
			}
			if got := g.received(); strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("received %d events, want %d in order", len(got), len(want))
			}
			if got, want := val(m.rejected), float64(tc.events-len(want)); got != want {
				t.Errorf("faultline_agent_rejected_events_total = %v, want %v", got, want)
			}
			if tc.busy > 0 {
				g.mu.Lock()
				sizes := g.sizes
				g.mu.Unlock()
				calls := sizes[:tc.busy+1] // the refused calls and the next
				if tc.proxy != nil {
					calls = sizes[:1] // the proxy's refusals never reached the gateway: the next
				}
				for _, n := range calls {
					if n != tc.batchSize {
						t.Errorf("after %d busy refusals, calls carried %v events, want %d each", tc.busy, sizes, tc.batchSize)
						break
					}
				}
			}
		})
	}
}

// proxy is a proxy in front of the gateway: it answers a call whose body
// is over limit bytes (limit 0: none) and the first busy calls with refuse,
// and hands the others to the gateway.
func proxy(limit, busy int, refuse func(http.ResponseWriter)) func(http.Handler) http.Handler {
	var mu sync.Mutex
	return func(gw http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			refused := busy > 0
			busy--
			mu.Unlock()
			b, err := io.ReadAll(r.Body)
			if err != nil {
				return
			}
			if refused || limit > 0 && len(b) > limit {
				refuse(w)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
			gw.ServeHTTP(w, r)
		})
	}
}

// nginx413 is nginx's answer to a request body over client_max_body_size
// (ingress-nginx's proxy-body-size, 1m by default): HTTP 413 and its HTML
// page, which grpc-go reads as code Unknown, "unexpected HTTP status code
// received from server: 413 (Request Entity Too Large); …".
func nginx413(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/html")
	w.WriteHeader(http.StatusRequestEntityTooLarge)
	io.WriteString(w, "<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n<center><h1>413 Request Entity Too Large</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")
}

// envoy413 is envoy's local reply to a gRPC call whose body is over its
// buffer limit (the buffer filter's max_request_bytes, a listener's
// per_connection_buffer_limit_bytes): trailers-only, grpc-status 2
// (Unknown, envoy's mapping of HTTP 413), grpc-message "Payload Too Large".
func envoy413(w http.ResponseWriter) { grpcAnswer(w, codes.Unknown, "Payload Too Large") }

// envoyRateLimited is envoy's local_ratelimit filter's answer to a gRPC
// call with rate_limited_as_resource_exhausted set.
func envoyRateLimited(w http.ResponseWriter) {
	grpcAnswer(w, codes.ResourceExhausted, "local_rate_limited")
}

func grpcAnswer(w http.ResponseWriter, c codes.Code, msg string) {
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set("Grpc-Status", fmt.Sprint(int(c)))
	w.Header().Set("Grpc-Message", msg)
	w.WriteHeader(http.StatusOK)
}
