package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/validate"
)

// refusingGateway starts a fake gateway validating as the real one does
// (v), its clock at now plus clock, and a sender with batchSize events a
// call draining a spool of evs; it returns once the spool is empty.
func refusingGateway(t *testing.T, v validate.Validator, clock time.Duration, plain bool, batchSize int, evs []*datamodels.HealthEvent) (*fakeGateway, *Metrics) {
	t.Helper()
	g := &fakeGateway{t: t, addr: "127.0.0.1:0", token: "s3cret", v: &v, clock: clock, plain: plain}
	g.start()
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
	t.Cleanup(func() { sp.Close() })
	if err := sp.AppendAll(evs); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig().Gateway
	cfg.Addr, cfg.TokenFile, cfg.Insecure = g.addr, tok, true
	cfg.BatchSize, cfg.MaxBackoff = batchSize, 200*time.Millisecond
	s, err := NewSender(cfg, sp, quiet(), m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; s.Close() })
	waitFor(t, 10*time.Second, func() bool { return sp.Pending() == 0 }, "the spool to drain")
	return g, m
}

// TestSenderClockAhead: the node's clock is 10 minutes ahead of the
// gateway's, whose gateway.max_future_skew is 5 minutes (a node booted
// with a wrong RTC before chrony corrected it). Every event was refused as
// invalid, and, one at a time, dropped from the spool: the boot's fatal
// events lost. Each must be delivered, in order, without its
// generatedTimestamp (the gateway stamps its own), the node's kept in its
// metadata; an event without one, or with one the gateway takes, as it
// was. Also from a gateway that gives no ErrorInfo detail (plain).
func TestSenderClockAhead(t *testing.T) {
	for _, plain := range []bool{false, true} {
		t.Run(fmt.Sprintf("plain=%v", plain), func(t *testing.T) {
			now := time.Now().UTC()
			var evs []*datamodels.HealthEvent
			want := map[string]string{} // message: the metadata's node time ("": none)
			for i := range 20 {
				e := ev(fmt.Sprintf("xid %02d", i), true)
				e.ComponentClass = "GPU"
				switch i {
				case 5: // no generatedTimestamp: the gateway stamps it anyway
				case 9: // an hour old: the gateway takes it
					e.GeneratedTimestamp = timestamppb.New(now.Add(-time.Hour))
				default:
					e.GeneratedTimestamp = timestamppb.New(now.Add(time.Duration(i) * time.Millisecond))
					want[e.Message] = e.GeneratedTimestamp.AsTime().Format(time.RFC3339Nano)
				}
				evs = append(evs, e)
			}
			g, m := refusingGateway(t, validate.Validator{MaxBatch: 1000, MaxFutureSkew: 5 * time.Minute}, -10*time.Minute, plain, 7, evs)
			if got := val(m.rejected); got != 0 {
				t.Errorf("faultline_agent_rejected_events_total = %v, want 0", got)
			}
			if got := val(m.clockAhead); got != float64(len(want)) {
				t.Errorf("faultline_agent_clock_ahead_events_total = %v, want %d", got, len(want))
			}
			g.mu.Lock()
			defer g.mu.Unlock()
			if len(g.evs) != len(evs) {
				t.Fatalf("gateway received %d events, want %d", len(g.evs), len(evs))
			}
			for i, e := range g.evs {
				if e.GetMessage() != evs[i].GetMessage() {
					t.Errorf("event %d is %q, want %q (in order)", i, e.GetMessage(), evs[i].GetMessage())
				}
				at, moved := want[e.GetMessage()]
				switch {
				case e.GetMetadata()[events.MetaAgentGeneratedAt] != at:
					t.Errorf("%s: metadata %s = %q, want %q", e.GetMessage(), events.MetaAgentGeneratedAt, e.GetMetadata()[events.MetaAgentGeneratedAt], at)
				case moved && e.GetGeneratedTimestamp() != nil:
					t.Errorf("%s: generatedTimestamp %v sent, want none (the gateway's receive time)", e.GetMessage(), e.GetGeneratedTimestamp().AsTime())
				case !moved && i == 9 && !e.GetGeneratedTimestamp().AsTime().Equal(now.Add(-time.Hour)):
					t.Errorf("%s: generatedTimestamp %v, want the event's own", e.GetMessage(), e.GetGeneratedTimestamp().AsTime())
				}
			}
		})
	}
}

// TestSenderGatewayMaxBatch: the gateway's gateway.max_batch (3) is below
// the agent's gateway.batch_size (7). Every full batch was refused, one
// event sent alone, and the full batch tried again: about two calls an
// event, forever. The calls must be capped at the gateway's limit (from
// its ErrorInfo detail, or a plain gateway's words for it).
func TestSenderGatewayMaxBatch(t *testing.T) {
	for _, plain := range []bool{false, true} {
		t.Run(fmt.Sprintf("plain=%v", plain), func(t *testing.T) {
			var evs []*datamodels.HealthEvent
			for i := range 30 {
				e := ev(fmt.Sprintf("%02d", i), false)
				e.ComponentClass = "GPU"
				evs = append(evs, e)
			}
			g, m := refusingGateway(t, validate.Validator{MaxBatch: 3, MaxFutureSkew: 5 * time.Minute}, 0, plain, 7, evs)
			if got := strings.Join(g.received(), ","); got != strings.Join(msgs(evs), ",") {
				t.Errorf("received %s, want all 30 in order", got)
			}
			if got := val(m.rejected); got != 0 {
				t.Errorf("faultline_agent_rejected_events_total = %v, want 0", got)
			}
			g.mu.Lock()
			sizes := g.sizes
			g.mu.Unlock()
			if len(sizes) > 11 { // the refused batch of 7, then ten of 3
				t.Errorf("%d calls (%v events each) for 30 events, want 11", len(sizes), sizes)
			}
		})
	}
}

// TestSenderInvalidOneAtATimeUntilDropped: a batch refused as invalid
// for its last event (the 7th of 7). The sender sent its first event
// alone, then the whole batch again (refused again), and so on: about two
// calls for each event ahead of the invalid one, each carrying the whole
// batch. It must send one event a call until the invalid one is dropped,
// then whole batches again.
func TestSenderInvalidOneAtATimeUntilDropped(t *testing.T) {
	g := startFake(t)
	sp, _, m, _ := senderFor(t, g.addr, g.token) // batches of 7
	var evs []*datamodels.HealthEvent
	var want []string
	for i := range 30 {
		msg := fmt.Sprintf("%02d", i)
		if i == 6 {
			msg = "invalid"
		} else {
			want = append(want, msg)
		}
		evs = append(evs, ev(msg, false))
	}
	if err := sp.AppendAll(evs); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return sp.Pending() == 0 }, "the spool to drain")
	if got := strings.Join(g.received(), ","); got != strings.Join(want, ",") {
		t.Errorf("received %s, want %s", got, strings.Join(want, ","))
	}
	if got := val(m.rejected); got != 1 {
		t.Errorf("faultline_agent_rejected_events_total = %v, want 1", got)
	}
	g.mu.Lock()
	sizes := g.sizes
	g.mu.Unlock()
	// The refused batch of 7, its 7 events alone (the 7th dropped), then
	// 23 events in 4 calls.
	if len(sizes) > 12 {
		t.Errorf("%d calls (%v events each) for 30 events, want 12", len(sizes), sizes)
	}
}
