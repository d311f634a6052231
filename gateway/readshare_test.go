package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/peer"

	"github.com/faultline/faultline/internal/warnlimit"
)

// readShareCases: two reads whose messages never come hold a credential's
// read share from held; a third read from third is served or refused.
// A credential not bound to a node (the preflight token of a cluster, the
// chart's agent token) is shared by many pods and nodes: one holder's
// held reads refuse the holders at its address only. A node-bound
// credential has one share wherever its calls come from.
var readShareCases = []struct {
	name        string
	caller      Caller
	held, third string
	served      bool
}{
	{"shared credential, another address", shared, "10.0.0.1", "10.0.0.2", true},
	{"shared credential, the same address", shared, "10.0.0.1", "10.0.0.1", false},
	{"shared credential, another IPv6 /64", shared, "2001:db8:0:1::1", "2001:db8:0:2::1", true},
	{"shared credential, the same IPv6 /64", shared, "2001:db8:0:1::1", "2001:db8:0:1::2", false},
	{"node-bound credential, another address", bound, "10.0.0.1", "10.0.0.2", false},
}

var (
	shared = Caller{Cluster: "alpha", Name: "token:alpha#shared", Role: RoleAgent}
	bound  = Caller{Cluster: "alpha", Name: "token:alpha#bound", Role: RoleAgent, Node: "gpu-node-1"}
)

func readShareServer() *Server {
	cfg := DefaultConfig()
	return &Server{cfg: cfg, log: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics(prometheus.NewRegistry()),
		busyWarns: warnlimit.New(warnWindow, warnKeys),
		flight:    newInflight(cfg.MaxInflightBytes, cfg.MaxInflightBytesPerConn, cfg.MaxReadBytesPerCaller, cfg.MaxDecodedBytes)}
}

// TestGRPCReadShareByAddress: gRPC calls whose headers came and whose
// message never does (growForRead claims max_body_bytes each: two fill
// the 8 MiB share).
func TestGRPCReadShareByAddress(t *testing.T) {
	for _, tt := range readShareCases {
		t.Run(tt.name, func(t *testing.T) {
			s := readShareServer()
			port := 40000
			call := func(ip string) (*reservation, error) {
				port++
				ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: port}})
				ctx = withCaller(ctx, tt.caller)
				res := mustReserve(t, s.flight, ctx, 64<<10)
				return res, s.growForRead(ctx, res)
			}
			for range 2 {
				res, err := call(tt.held)
				if err != nil {
					t.Fatalf("a held read: %v", err)
				}
				defer res.release()
			}
			res, err := call(tt.third)
			defer res.release()
			if tt.served && err != nil {
				t.Fatalf("a read from %s while two reads from %s hold the share: %v, want it served", tt.third, tt.held, err)
			}
			if !tt.served && !errors.Is(err, errCallerBusy) {
				t.Fatalf("a read from %s while two reads from %s hold the share: %v, want errCallerBusy", tt.third, tt.held, err)
			}
		})
	}
}

// TestRESTReadShareByAddress: REST bodies that declare 4 MiB and never
// arrive (two fill the 8 MiB share).
func TestRESTReadShareByAddress(t *testing.T) {
	for _, tt := range readShareCases {
		t.Run(tt.name, func(t *testing.T) {
			s := readShareServer()
			h := s.readBody(func(w http.ResponseWriter, _ *http.Request, _ map[string]string) { w.WriteHeader(http.StatusOK) })
			port := 40000
			post := func(ip string, body io.Reader, n int64) *httptest.ResponseRecorder {
				port++
				r := httptest.NewRequest(http.MethodPost, "/v1/events", body)
				r.ContentLength = n
				r.Header.Set("Content-Type", "application/json")
				r.RemoteAddr = net.JoinHostPort(ip, strconv.Itoa(port))
				r = r.WithContext(withCaller(r.Context(), tt.caller))
				w := httptest.NewRecorder()
				h(w, r, nil)
				return w
			}
			var wg sync.WaitGroup
			defer wg.Wait() // after the bodies are closed
			for range 2 {
				pr, pw := io.Pipe() // a body that never arrives
				defer pw.Close()
				wg.Add(1)
				go func() { defer wg.Done(); post(tt.held, pr, 4<<20) }()
			}
			waitShareFull(t, s.flight)
			w := post(tt.third, bytes.NewReader([]byte("{}")), 2)
			if got, want := w.Code == http.StatusOK, tt.served; got != want {
				t.Fatalf("a POST from %s while two bodies from %s hold the share: %d %s, want served=%v", tt.third, tt.held, w.Code, w.Body, want)
			}
			if !tt.served && w.Code != http.StatusTooManyRequests {
				t.Fatalf("a POST from %s refused with %d, want 429", tt.third, w.Code)
			}
		})
	}
}

// waitShareFull waits until a read share has no byte free.
func waitShareFull(t *testing.T, f *inflight) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		f.mu.Lock()
		full := false
		for _, sh := range f.reads {
			if !sh.sem.TryAcquire(1) {
				full = true
			} else {
				sh.sem.Release(1)
			}
		}
		f.mu.Unlock()
		if full {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the held reads did not take their share")
}
