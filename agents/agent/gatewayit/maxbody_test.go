package gatewayit

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/agents/agent"
	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/gateway/gatewaytest"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/schemas/events"
)

// TestSpoolDrainsThroughSmallMaxBody: a real gateway whose
// gateway.max_body_bytes (64 KiB) is below the agent's 2 MiB a call gets a
// backlog of large events (8 KiB messages). Every call was refused as too
// large, at every try, and the spool never drained; now the agent halves
// its calls until they fit and every event reaches Kafka in order. An
// event larger alone than the limit (valid: 40 metadata values of 2000
// bytes) is dropped so that the events behind it arrive.
func TestSpoolDrainsThroughSmallMaxBody(t *testing.T) {
	k := testenv.SharedSecureKafka(t) // its plaintext listener; shared with the other tests
	for _, tc := range []struct {
		name     string
		maxBody  int
		events   int
		oversize int // this event is larger alone than maxBody (-1: none)
	}{
		{"a backlog of 8 KiB events, max_body_bytes 64 KiB", 64 << 10, 120, -1},
		{"an event larger alone than max_body_bytes", 64 << 10, 40, 17},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw := gatewaytest.Start(t, k.Addr(), func(c *gateway.Config) { c.MaxBodyBytes = tc.maxBody }, gateway.Options{})
			cfg := agentConfig(t, gw, "node-maxbody")
			node := cfg.NodeName
			// The whole backlog is in the check's first answer: one
			// spool append, then calls of 500 events at most.
			qc := &queueCheck{}
			var want []string
			for i := range tc.events {
				m := fmt.Sprintf("maxbody test event %03d %s", i, strings.Repeat("x", 8000))
				qc.add(m)
				if i == tc.oversize {
					md := map[string]string{}
					for j := range 40 {
						md[fmt.Sprint("detail", j)] = strings.Repeat("d", 2000)
					}
					qc.q[len(qc.q)-1].Metadata = md
					continue
				}
				want = append(want, m[:len("maxbody test event 000")])
			}
			a, err := agent.New(cfg, slog.Default(), agent.Options{Checks: []agent.Scheduled{{Check: qc, Interval: time.Hour, Timeout: time.Second}}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- a.Run(ctx) }()
			defer func() { cancel(); <-done }()

			cl := k.Client(t, kgo.ConsumeTopics(events.TopicEvents), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			var got []string // first appearances (at-least-once)
			seen := map[string]bool{}
			deadline := time.Now().Add(30 * time.Second)
			for len(got) < len(want) && time.Now().Before(deadline) {
				fctx, fcancel := context.WithTimeout(context.Background(), time.Second)
				cl.PollFetches(fctx).EachRecord(func(r *kgo.Record) {
					ev, err := events.Unmarshal(r.Value)
					if err != nil || ev.GetNodeName() != node {
						return
					}
					if m := ev.GetMessage()[:len("maxbody test event 000")]; !seen[m] {
						seen[m] = true
						got = append(got, m)
					}
				})
				fcancel()
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Fatalf("Kafka has %d of %d events (in order: %v); %d bytes still spooled", len(got), len(want),
					strings.Join(got, "\n") == strings.Join(want[:min(len(got), len(want))], "\n"), a.Spool().Pending())
			}
			waitFor(t, 10*time.Second, func() bool { return a.Spool().Pending() == 0 }, "the spool drained")
		})
	}
}
