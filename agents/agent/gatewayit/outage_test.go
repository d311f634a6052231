package gatewayit

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/agents/agent"
	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/gateway/gatewaytest"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// queueCheck returns what the test queued since the last call.
type queueCheck struct {
	mu sync.Mutex
	q  []*datamodels.HealthEvent
}

func (c *queueCheck) Name() string { return "queue" }
func (c *queueCheck) Check(context.Context) ([]*datamodels.HealthEvent, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.q
	c.q = nil
	return out, nil
}
func (c *queueCheck) add(msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.q = append(c.q, &datamodels.HealthEvent{Agent: "nic-health-monitor", ComponentClass: "NIC",
		CheckName: "InfiniBandStateCheck", IsFatal: true, Message: msg,
		RecommendedAction: datamodels.RecommendedAction_REPLACE_VM,
		EntitiesImpacted:  []*datamodels.Entity{{EntityType: events.EntityNIC, EntityValue: "mlx5_0"}}})
}

// agentConfig is an agent's config for the gateway gw (plaintext, the
// alpha cluster's token, short backoff), named prefix-<now>, spooling in
// a temporary directory.
func agentConfig(t *testing.T, gw *gatewaytest.Server, prefix string) agent.Config {
	t.Helper()
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte(gw.Token("alpha")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.NodeName, cfg.MetricsAddr = fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()), ""
	cfg.Gateway.Addr, cfg.Gateway.TokenFile, cfg.Gateway.MaxBackoff = gw.GRPCAddr(), tok, 300*time.Millisecond
	cfg.Gateway.Timeout = 3 * time.Second
	cfg.Gateway.Insecure = true // gatewaytest serves plaintext
	cfg.Spool.Dir = filepath.Join(dir, "spool")
	return cfg
}

// TestSpoolSurvivesGatewayOutage: the agent sends to a real gateway backed
// by real Kafka; the gateway stops, the agent keeps producing events into
// its spool, the gateway comes back, and every event reaches Kafka exactly
// in the order it was produced.
func TestSpoolSurvivesGatewayOutage(t *testing.T) {
	k := testenv.SharedSecureKafka(t) // its plaintext listener; shared with the TLS test
	gw := gatewaytest.Start(t, k.Addr(), nil, gateway.Options{})

	cfg := agentConfig(t, gw, "node-outage")
	node := cfg.NodeName
	qc := &queueCheck{}
	a, err := agent.New(cfg, slog.Default(), agent.Options{Checks: []agent.Scheduled{{Check: qc, Interval: 50 * time.Millisecond, Timeout: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()

	var want []string
	emit := func(from, to int) {
		for i := from; i < to; i++ {
			m := fmt.Sprintf("outage test event %03d", i)
			want = append(want, m)
			qc.add(m)
		}
	}
	emit(0, 10)
	// The first events reached Kafka before the gateway stops (an empty
	// spool alone would not say so: it is empty before the check first
	// runs).
	first := k.Client(t, kgo.ConsumeTopics(events.TopicEvents), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	inKafka := map[string]bool{} // distinct messages: a call whose answer was lost is sent again
	waitFor(t, 30*time.Second, func() bool {
		fctx, fcancel := context.WithTimeout(context.Background(), time.Second)
		defer fcancel()
		first.PollFetches(fctx).EachRecord(func(r *kgo.Record) {
			if ev, err := events.Unmarshal(r.Value); err == nil && ev.GetNodeName() == node {
				inKafka[ev.GetMessage()] = true
			}
		})
		return len(inKafka) >= 10 && a.Spool().Pending() == 0
	}, "the first 10 events in Kafka")

	gw.Stop()
	emit(10, 60)
	waitFor(t, 10*time.Second, func() bool { return a.Spool().Pending() > 0 }, "events spooled during the outage")
	time.Sleep(time.Second) // a few failed attempts
	if a.Spool().Pending() == 0 {
		t.Fatal("spool drained while the gateway was down")
	}
	gw.StartAgain()
	emit(60, 70)
	waitFor(t, 60*time.Second, func() bool { return a.Spool().Pending() == 0 }, "spool drained after the outage")

	// Every event is in Kafka, in order, under this node's key.
	cl := k.Client(t, kgo.ConsumeTopics(events.TopicEvents), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got []string
	ids := map[string]map[string]bool{} // message -> stored ids
	deadline := time.Now().Add(60 * time.Second)
	for len(ids) < len(want) && time.Now().Before(deadline) {
		fctx, fcancel := context.WithTimeout(context.Background(), 5*time.Second)
		fs := cl.PollFetches(fctx)
		fcancel()
		fs.EachRecord(func(r *kgo.Record) {
			ev, err := events.Unmarshal(r.Value)
			if err != nil || ev.GetNodeName() != node {
				return
			}
			if string(r.Key) != "alpha/"+node {
				t.Errorf("record key %q", r.Key)
			}
			got = append(got, ev.GetMessage())
			if ids[ev.GetMessage()] == nil {
				ids[ev.GetMessage()] = map[string]bool{}
			}
			ids[ev.GetMessage()][ev.GetId()] = true
		})
	}
	// At-least-once: a batch whose answer was lost may come twice; order
	// of first appearances must be the production order and nothing lost.
	var firsts []string
	seen := map[string]bool{}
	for _, m := range got {
		if !seen[m] {
			seen[m] = true
			firsts = append(firsts, m)
		}
	}
	if strings.Join(firsts, "\n") != strings.Join(want, "\n") {
		t.Fatalf("Kafka has %d events (%d distinct), want %d in order\nfirst got: %v", len(got), len(firsts), len(want), firsts[:min(5, len(firsts))])
	}
	if len(got) != len(want) {
		t.Logf("%d duplicates (at-least-once resend)", len(got)-len(want))
	}
	// A resent event keeps its id (the agent's key, events.StoredID at
	// the gateway): downstream it is one event.
	for m, set := range ids {
		if len(set) != 1 {
			t.Errorf("%q stored under %d ids, want 1: %v", m, len(set), set)
		}
	}
}

func waitFor(t *testing.T, d time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
