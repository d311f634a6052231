package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

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
// the batches.
func TestSenderBatchFitsTheGateway(t *testing.T) {
	for _, tc := range []struct {
		name      string
		batchSize int
		events    int
		msgBytes  int
		maxRecv   int // the gateway's gateway.max_body_bytes (gRPC's MaxRecvMsgSize); 0: 4 MiB
		oversize  int // this event is larger alone than maxRecv (-1: none)
		busy      int // calls first refused as over the gateway's in-flight budget
	}{
		{"500 large events", 500, 600, 8 << 10, 0, -1, 0},
		{"a large batch_size of small events", 10000, 12000, 500, 0, -1, 0},
		{"gateway.max_body_bytes 64 KiB", 500, 600, 8 << 10, 64 << 10, -1, 0},
		{"gateway.max_body_bytes 1024", 500, 300, 200, 1024, -1, 0},
		{"an event larger alone than gateway.max_body_bytes", 500, 100, 2 << 10, 16 << 10, 37, 0},
		{"the gateway busy: batches kept whole", 100, 300, 500, 0, -1, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &fakeGateway{t: t, addr: "127.0.0.1:0", token: "s3cret", busy: tc.busy}
			if tc.maxRecv > 0 {
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
				t.Fatalf("%d of %d events received, %d bytes still spooled; send errors: %v", len(g.received()), tc.events,
					sp.Pending(), val(m.sendErrors.WithLabelValues("ResourceExhausted")))
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
				for i, n := range sizes[:tc.busy+1] {
					if n != tc.batchSize {
						t.Errorf("call %d (after %d busy refusals) carried %d events, want %d: %v", i, min(i, tc.busy), n, tc.batchSize, sizes)
					}
				}
			}
		})
	}
}
