package gatewayit

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/faultline/faultline/agents/agent"
	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/gateway/gatewaytest"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/nvsentinel"
)

// TestNVSentinelMonitorThroughRelay: a stand-in NVSentinel monitor (its
// events encoded from NVSentinel's field numbers, sent over the agent's
// unix socket with insecure credentials) reports while the gateway is
// down, then after it is back. The agent runs no check of its own. Every
// event reaches Kafka through the real gateway, in the order sent, under
// one stored id each, with the cluster of the agent's credential; an event
// for another node is refused with a status that says so, and reaches
// nothing.
func TestNVSentinelMonitorThroughRelay(t *testing.T) {
	k := testenv.SharedSecureKafka(t) // its plaintext listener
	gw := gatewaytest.Start(t, k.Addr(), nil, gateway.Options{})
	gw.Stop() // down from the start: the first events wait in the spool

	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte(gw.Token("alpha")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	node := fmt.Sprintf("relay-node-%d", time.Now().UnixNano())
	cfg := agent.DefaultConfig()
	cfg.NodeName, cfg.Checks, cfg.MetricsAddr, cfg.PodResourcesSocket = node, nil, "", ""
	cfg.Gateway.Addr, cfg.Gateway.TokenFile, cfg.Gateway.MaxBackoff = gw.GRPCAddr(), tok, 300*time.Millisecond
	cfg.Gateway.Timeout, cfg.Gateway.BatchSize = 3*time.Second, 7 // several batches
	cfg.Gateway.Insecure = true                                   // gatewaytest serves plaintext
	cfg.Spool.Dir = filepath.Join(dir, "spool")
	cfg.NVSentinelSocket = filepath.Join(dir, "nvsentinel.sock")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(cfg, slog.New(slog.DiscardHandler), agent.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()

	mon, err := nvsentinel.Dial(cfg.NVSentinelSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close()
	var want []string
	strategy := map[string]datamodels.ProcessingStrategy{}
	send := func(from, to int) {
		t.Helper()
		var batch []nvsentinel.Event
		for i := from; i < to; i++ {
			m := fmt.Sprintf("Xid 79 on GPU 0, report %03d", i)
			ev := nvsentinel.Event{Version: 1, Agent: "syslog-health-monitor", ComponentClass: "GPU", CheckName: "SysLogsXIDError",
				IsFatal: true, Message: m, RecommendedAction: nvsentinel.ActionReplaceVM, ErrorCode: []string{"79"},
				Entities: []nvsentinel.Entity{{Type: "GPU", Value: "0"}}, NodeName: node, GeneratedTimestamp: time.Now()}
			strategy[m] = datamodels.ProcessingStrategy_EXECUTE_REMEDIATION // UNSPECIFIED, as the gateway normalises it
			if i%4 == 3 {
				ev.ProcessingStrategy = nvsentinel.StrategyStoreAndAnalyse
				strategy[m] = datamodels.ProcessingStrategy_STORE_AND_ANALYSE
			}
			want = append(want, m)
			batch = append(batch, ev)
			if len(batch) == 3 || i == to-1 { // calls of 1 to 3 events
				sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
				err := mon.Send(sctx, batch...)
				scancel()
				if err != nil {
					t.Fatalf("monitor send: %v", err)
				}
				batch = nil
			}
		}
	}
	send(0, 20)
	// Another node's event: refused, with why.
	other := nvsentinel.Event{Agent: "syslog-health-monitor", ComponentClass: "GPU", CheckName: "SysLogsXIDError",
		IsFatal: true, Message: "for someone else", NodeName: "some-other-node"}
	err = mon.Send(ctx, other)
	if st, _ := status.FromError(err); st.Code() != codes.PermissionDenied ||
		st.Message() != fmt.Sprintf(`events[0].nodeName: "some-other-node" is not this node: the faultline agent on node %q relays events for its own node only`, node) {
		t.Fatalf("another node's event: %v", err)
	}
	time.Sleep(time.Second) // a few failed sends
	if a.Spool().Pending() == 0 {
		t.Fatal("the spool is empty while the gateway is down")
	}
	gw.StartAgain()
	send(20, 30)
	waitFor(t, 60*time.Second, func() bool { return a.Spool().Pending() == 0 }, "the relayed events delivered")

	cl := k.Client(t, kgo.ConsumeTopics(events.TopicEvents), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got []*datamodels.HealthEvent
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
		fctx, fcancel := context.WithTimeout(ctx, 5*time.Second)
		fs := cl.PollFetches(fctx)
		fcancel()
		fs.EachRecord(func(r *kgo.Record) {
			ev, err := events.Unmarshal(r.Value)
			if err != nil {
				return
			}
			if ev.GetMessage() == other.Message {
				t.Errorf("another node's event reached Kafka: %v", ev)
			}
			if ev.GetNodeName() != node {
				return
			}
			if string(r.Key) != "alpha/"+node {
				t.Errorf("record key %q", r.Key)
			}
			got = append(got, ev)
		})
		if distinct(got) == len(want) {
			break
		}
	}
	// Each event once: one stored id per event, first appearances in the
	// order sent (a batch whose answer was lost may be in Kafka twice,
	// under the same id, which the store keeps once).
	ids := map[string]string{} // message -> id
	var order []string
	for _, ev := range got {
		m := ev.GetMessage()
		if id, ok := ids[m]; ok {
			if id != ev.GetId() {
				t.Errorf("%q stored under two ids: %s and %s", m, id, ev.GetId())
			}
			continue
		}
		ids[m] = ev.GetId()
		order = append(order, m)
		if ev.GetCluster() != "alpha" || ev.GetSubmitter().GetRole() != datamodels.SubmitterRole_SUBMITTER_ROLE_AGENT {
			t.Errorf("%q: cluster %q submitter %v, want the agent credential's (alpha, agent)", m, ev.GetCluster(), ev.GetSubmitter())
		}
		// the relay gives the syslog monitor's "79" faultline's name (nvsentinel.Normalize)
		if ev.GetProcessingStrategy() != strategy[m] || ev.GetAgent() != "syslog-health-monitor" || ev.GetErrorCode()[0] != "XID-79" {
			t.Errorf("%q: %v", m, ev)
		}
	}
	if strings.Join(order, "\n") != strings.Join(want, "\n") {
		t.Fatalf("Kafka has %d records, %d distinct events; want the %d sent, in order\nfirst: %v", len(got), len(order), len(want), order[:min(3, len(order))])
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			t.Fatalf("two events share the stored id %s", id)
		}
		seen[id] = true
	}
	if d := len(got) - len(want); d > 0 {
		t.Logf("%d records resent (at-least-once), each under its event's id", d)
	}
}

func distinct(evs []*datamodels.HealthEvent) int {
	m := map[string]bool{}
	for _, ev := range evs {
		m[ev.GetMessage()] = true
	}
	return len(m)
}
