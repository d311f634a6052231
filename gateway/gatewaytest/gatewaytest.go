// Package gatewaytest runs a real gateway for tests of the components that
// send to it (agents, preflight, loadtest): real gRPC and REST listeners on
// 127.0.0.1, producing to a Kafka broker the test supplies.
package gatewaytest

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/internal/kafka"
)

// Clusters are the clusters that have tokens: Token(cluster) returns the
// agent token of each, OperatorToken(cluster) its operator token.
var Clusters = []string{"alpha", "beta"}

// Server is a gateway started for a test.
type Server struct {
	tb      testing.TB
	cfg     gateway.Config
	kcfg    kafka.Config
	opts    gateway.Options
	srv     *gateway.Server
	cancel  context.CancelFunc
	done    chan error
	running bool
}

// Start starts a gateway producing to the given brokers, with an agent and
// an operator token per entry of Clusters. modify, if not nil, adjusts the
// config first. The gateway stops when the test ends.
func Start(tb testing.TB, brokers string, modify func(*gateway.Config), opts gateway.Options) *Server {
	tb.Helper()
	dir := tb.TempDir()
	tokens := filepath.Join(dir, "tokens")
	var lines string
	for _, c := range Clusters {
		lines += tokenFor(c) + "," + c + ",agent\n" + operatorTokenFor(c) + "," + c + ",operator\n"
	}
	if err := os.WriteFile(tokens, []byte(lines), 0o600); err != nil {
		tb.Fatal(err)
	}
	cfg := gateway.DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr, cfg.TokensFile = "127.0.0.1:0", "127.0.0.1:0", tokens
	if modify != nil {
		modify(&cfg)
	}
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers = brokers
	s := &Server{tb: tb, cfg: cfg, kcfg: kcfg, opts: opts}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	kcfg.ReplicationFactor = 1
	if err := kafka.CreatePipelineTopics(ctx, kcfg, slog.Default()); err != nil {
		tb.Fatalf("gatewaytest: %v", err)
	}
	s.StartAgain()
	tb.Cleanup(s.Stop)
	return s
}

// tokenFor is the test agent token of a cluster.
func tokenFor(cluster string) string { return "test-token-of-cluster-" + cluster }

// operatorTokenFor is the test operator token of a cluster.
func operatorTokenFor(cluster string) string { return "test-operator-token-of-cluster-" + cluster }

// Token returns the agent token of a cluster in Clusters: its events are
// stamped with submitter role AGENT (overrides in them are not honoured).
func (s *Server) Token(cluster string) string { return tokenFor(cluster) }

// OperatorToken returns the operator token of a cluster in Clusters: its
// events are stamped with submitter role OPERATOR.
func (s *Server) OperatorToken(cluster string) string { return operatorTokenFor(cluster) }

// Config is the gateway's configuration, as run.
func (s *Server) Config() gateway.Config { return s.cfg }

// GRPCAddr is the gateway's gRPC address.
func (s *Server) GRPCAddr() string { return s.cfg.GRPCAddr }

// HTTPAddr is the gateway's REST address.
func (s *Server) HTTPAddr() string { return s.cfg.HTTPAddr }

// URL is the REST base URL.
func (s *Server) URL() string { return "http://" + s.HTTPAddr() }

// Stop stops the gateway gracefully (it flushes to Kafka first).
func (s *Server) Stop() {
	if !s.running {
		return
	}
	s.cancel()
	if err := <-s.done; err != nil {
		s.tb.Errorf("gatewaytest: gateway exited: %v", err)
	}
	s.running = false
}

// StartAgain starts the gateway after Stop, on the same addresses.
func (s *Server) StartAgain() {
	s.tb.Helper()
	srv, err := gateway.New(s.cfg, s.kcfg, testLogger(), prometheus.NewRegistry(), s.opts)
	if err != nil {
		s.tb.Fatalf("gatewaytest: %v", err)
	}
	var lerr error
	for range 50 { // a just-closed port can take a moment to free
		if lerr = srv.Listen(); lerr == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if lerr != nil {
		s.tb.Fatalf("gatewaytest: %v", lerr)
	}
	// Keep the bound ports so a restart listens where clients point.
	s.cfg.GRPCAddr, s.cfg.HTTPAddr = srv.GRPCAddr(), srv.HTTPAddr()
	ctx, cancel := context.WithCancel(context.Background())
	s.srv, s.cancel, s.done, s.running = srv, cancel, make(chan error, 1), true
	go func() { s.done <- srv.Run(ctx) }()
	if err := waitHTTP(s.URL()+"/healthz", 10*time.Second); err != nil {
		s.tb.Fatalf("gatewaytest: %v", err)
	}
}

func waitHTTP(url string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		resp, err := httpClient.Get(url)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("gateway not serving %s: %w", url, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

func testLogger() *slog.Logger {
	if os.Getenv("FAULTLINE_TEST_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.Default()
}
