package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestSenderBatchFitsTheGateway: a backlog of large events (an 8 KiB
// message and 2 KiB of details each: 500 of them are 5 MB) reaches a
// gateway that takes messages up to gRPC's (and the gateway's default)
// 4 MiB. Batches were cut by count only: the first was refused as too
// large at every try, and nothing after it was ever sent.
func TestSenderBatchFitsTheGateway(t *testing.T) {
	for _, tc := range []struct {
		name      string
		batchSize int
		events    int
		msgBytes  int
	}{
		{"500 large events", 500, 600, 8 << 10},
		{"a large batch_size of small events", 10000, 12000, 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startFake(t) // gRPC's default limit: 4 MiB a message
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
				want = append(want, e.Message)
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
		})
	}
}
