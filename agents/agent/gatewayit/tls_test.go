package gatewayit

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/agents/agent"
	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/schemas/events"
)

// The tests of this package share one broker (testenv.SharedSecureKafka).
func TestMain(m *testing.M) { testenv.Main(m) }

// TestAgentToGatewayToKafkaAllTLS: with its default settings (TLS on) plus
// a CA bundle, the agent reaches a real gateway serving TLS, which
// produces to a real Kafka broker over TLS with SCRAM-SHA-256: an event
// crosses both hops encrypted and lands under its cluster/node key.
func TestAgentToGatewayToKafkaAllTLS(t *testing.T) {
	k := testenv.SharedSecureKafka(t)
	sec := k.Security()
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	kc := kafka.DefaultConfig()
	kc.Brokers, kc.ReplicationFactor = sec.SASLSSLAddr, 1
	kc.TLS = kafka.TLSConfig{Enabled: true, CAFile: sec.CA.File}
	kc.SASL = kafka.SASLConfig{Mechanism: kafka.MechanismScramSHA256, Username: sec.User, PasswordFile: sec.PasswordFile}
	if err := kafka.CreatePipelineTopics(ctx, kc, log); err != nil {
		t.Fatal(err)
	}

	const token = "tls-test-token-0123456789"
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(token+",gamma\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cert := sec.CA.Issue(t, "faultline-gateway", "127.0.0.1")
	gcfg := gateway.DefaultConfig()
	gcfg.GRPCAddr, gcfg.HTTPAddr, gcfg.TokensFile = "127.0.0.1:0", "127.0.0.1:0", tokens
	gcfg.TLSCert, gcfg.TLSKey = cert.CertFile, cert.KeyFile
	gw, err := gateway.New(gcfg, kc, log, prometheus.NewRegistry(), gateway.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Listen(); err != nil {
		t.Fatal(err)
	}
	gctx, gcancel := context.WithCancel(context.Background())
	gdone := make(chan error, 1)
	go func() { gdone <- gw.Run(gctx) }()
	defer func() {
		gcancel()
		if err := <-gdone; err != nil {
			t.Errorf("gateway: %v", err)
		}
	}()

	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := agent.DefaultConfig() // TLS on: no Insecure here
	node := fmt.Sprintf("node-tls-%d", time.Now().UnixNano())
	cfg.NodeName, cfg.MetricsAddr = node, ""
	cfg.Gateway.Addr, cfg.Gateway.TokenFile, cfg.Gateway.CAFile = gw.GRPCAddr(), tok, sec.CA.File
	cfg.Gateway.MaxBackoff = 300 * time.Millisecond
	cfg.Spool.Dir = filepath.Join(dir, "spool")
	qc := &queueCheck{}
	a, err := agent.New(cfg, log, agent.Options{Checks: []agent.Scheduled{{Check: qc, Interval: 50 * time.Millisecond, Timeout: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(context.Background())
	adone := make(chan error, 1)
	go func() { adone <- a.Run(actx) }()
	defer func() { acancel(); <-adone }()
	qc.add("sent over TLS twice")
	waitFor(t, 60*time.Second, func() bool { return a.Spool().Pending() == 0 }, "the agent's event accepted")

	cl, err := kafka.NewClient(kc, log, kgo.ConsumeTopics(events.TopicEvents), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("the event of %s is not in %s", node, events.TopicEvents)
		}
		found := false
		fs.EachRecord(func(r *kgo.Record) {
			if ev, err := events.Unmarshal(r.Value); err == nil && ev.GetNodeName() == node {
				if string(r.Key) != "gamma/"+node || ev.GetMessage() != "sent over TLS twice" {
					t.Errorf("record %q: %v", r.Key, ev)
				}
				found = true
			}
		})
		if found {
			return
		}
	}
}
