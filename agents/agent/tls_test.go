package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/internal/tlsclient"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

func (g *fakeGateway) seen() []fakeCall {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]fakeCall(nil), g.calls...)
}

// startFakeTLS starts the fake gateway with TLS from a certificate of ca
// for 127.0.0.1; clientCAs, if set, makes it require a client certificate
// they sign.
func startFakeTLS(t *testing.T, ca *testenv.CA, token string, clientCAs *x509.CertPool) *fakeGateway {
	t.Helper()
	g := &fakeGateway{t: t, addr: "127.0.0.1:0", token: token, opts: fakeTLS(t, ca, clientCAs)}
	g.start()
	t.Cleanup(g.stop)
	return g
}

// fakeTLS are the fake gateway's TLS options: a certificate of ca for
// 127.0.0.1, and a client certificate required when clientCAs is set.
func fakeTLS(t *testing.T, ca *testenv.CA, clientCAs *x509.CertPool) []grpc.ServerOption {
	server := ca.Issue(t, "gateway", "127.0.0.1")
	tc := &tls.Config{Certificates: []tls.Certificate{server.Cert}, MinVersion: tls.VersionTLS12}
	if clientCAs != nil {
		tc.ClientCAs, tc.ClientAuth = clientCAs, tls.RequireAndVerifyClientCert
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tc))}
}

// logBuffer is a slog sink the tests read.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startSender runs a sender of cfg (its Addr and TokenFile set by the
// caller) over a fresh spool, returning the spool, metrics and log.
func startSender(t *testing.T, cfg GatewayConfig) (*Spool, *Metrics, *logBuffer) {
	t.Helper()
	m := NewMetrics()
	logs := &logBuffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	sp, err := OpenSpool(filepath.Join(t.TempDir(), "spool"), 1<<20, log, m)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxBackoff = 200 * time.Millisecond
	s, err := NewSender(cfg, sp, log, m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := contextWithCancel()
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; s.Close(); sp.Close() })
	return sp, m, logs
}

func tokenFile(t *testing.T, tok string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDefaultsAreSafe: with no flags and no file, the agent's metrics
// listen on loopback only (they used to listen on every interface).
func TestDefaultsAreSafe(t *testing.T) {
	loaded, err := LoadConfig("t", nil, func(string) string { return "node-1" })
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]Config{"DefaultConfig": DefaultConfig(), "LoadConfig": loaded} {
		host, _, err := net.SplitHostPort(cfg.MetricsAddr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			t.Errorf("%s: metrics_addr %q is not a loopback address", name, cfg.MetricsAddr)
		}
	}
}

// TestDefaultSenderNeverSendsTheTokenInClear: with the default gateway
// settings, a plaintext gateway never receives a call — so never the
// bearer token — and the event stays spooled.
func TestDefaultSenderNeverSendsTheTokenInClear(t *testing.T) {
	g := startFake(t)
	cfg := DefaultConfig().Gateway
	cfg.Addr, cfg.TokenFile = g.addr, tokenFile(t, g.token)
	sp, _, _ := startSender(t, cfg)
	sp.Append([]*datamodels.HealthEvent{ev("secret-bearing call", true)})
	time.Sleep(1500 * time.Millisecond)
	if calls := g.seen(); len(calls) != 0 {
		t.Fatalf("a plaintext gateway received %d calls (authorization %q) from a default agent", len(calls), calls[0].auth)
	}
	if sp.Pending() == 0 {
		t.Fatal("the event left the spool")
	}
}

// TestDefaultSenderUsesTLS: the default settings plus a CA bundle reach a
// TLS gateway; the token travels inside TLS 1.2 or later.
func TestDefaultSenderUsesTLS(t *testing.T) {
	ca := testenv.NewCA(t, "", "agent-test")
	g := startFakeTLS(t, ca, "s3cret", nil)
	cfg := DefaultConfig().Gateway
	cfg.Addr, cfg.TokenFile, cfg.CAFile = g.addr, tokenFile(t, g.token), ca.File
	sp, _, _ := startSender(t, cfg)
	sp.Append([]*datamodels.HealthEvent{ev("over tls", true)})
	waitFor(t, 10*time.Second, func() bool { return sp.Pending() == 0 }, "the event sent over TLS")
	calls := g.seen()
	if len(calls) == 0 || calls[0].tls == nil || calls[0].tls.Version < tls.VersionTLS12 || calls[0].auth != "Bearer s3cret" {
		t.Fatalf("calls %+v", calls)
	}
	if got := g.received(); len(got) != 1 || got[0] != "over tls" {
		t.Fatalf("received %v", got)
	}
}

// TestDefaultSenderVerifiesTheGateway: a gateway whose certificate the
// agent's CA bundle does not sign gets no call.
func TestDefaultSenderVerifiesTheGateway(t *testing.T) {
	g := startFakeTLS(t, testenv.NewCA(t, "", "impostor"), "s3cret", nil)
	cfg := DefaultConfig().Gateway
	cfg.Addr, cfg.TokenFile, cfg.CAFile = g.addr, tokenFile(t, g.token), testenv.NewCA(t, "", "the-real-one").File
	sp, m, _ := startSender(t, cfg)
	sp.Append([]*datamodels.HealthEvent{ev("x", true)})
	waitFor(t, 10*time.Second, func() bool { return val(m.sendErrors.WithLabelValues("Unavailable")) > 0 }, "a failed send")
	if len(g.seen()) != 0 || sp.Pending() == 0 {
		t.Fatal("sent to a gateway with an untrusted certificate")
	}
}

// TestSenderFollowsTheGatewayCA: the CA bundle replaced in place (the
// chart's cert-manager CA renewed, the Secret updated under the agent) is
// trusted from the next connection on: a gateway restarted with a
// certificate of the new CA gets the spooled events without an agent
// restart. Before, the agent refused it until it restarted.
// faultline_tls_ca_expiry_timestamp_seconds{key="gateway.ca_file"} follows
// the bundle: the old CA's expiry, then the new one's. The gateway's CA
// taken out of the file again (distrusted), the open connection is closed
// within tlsclient.ReverifyEvery and the next events stay spooled; before,
// they went on over the connection the agent had.
func TestSenderFollowsTheGatewayCA(t *testing.T) {
	oldCA := testenv.NewCA(t, "", "old")
	time.Sleep(time.Second) // a later expiry
	newCA := testenv.NewCA(t, "", "new")
	caExpiry := func(ca *testenv.CA) float64 { return float64(ca.Cert.NotAfter.Unix()) }
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	testenv.Rotate(t, caFile, oldCA.File)
	g := startFakeTLS(t, oldCA, "s3cret", nil)
	cfg := DefaultConfig().Gateway
	cfg.Addr, cfg.TokenFile, cfg.CAFile = g.addr, tokenFile(t, g.token), caFile
	sp, m, _ := startSender(t, cfg)
	sp.Append([]*datamodels.HealthEvent{ev("before", true)})
	waitFor(t, 10*time.Second, func() bool { return sp.Pending() == 0 }, "the event sent under the old CA")
	if got, want := val(m.gatewayCAExpiry), caExpiry(oldCA); got != want {
		t.Fatalf("CA expiry gauge %v, want the old CA's %v", got, want)
	}

	g.stop() // the gateway restarts with a certificate of the new CA
	g.opts = fakeTLS(t, newCA, nil)
	g.start()
	sp.Append([]*datamodels.HealthEvent{ev("after", true)})
	waitFor(t, 10*time.Second, func() bool { return val(m.sendErrors.WithLabelValues("Unavailable")) > 0 }, "a send refused under the old CA")
	if sp.Pending() == 0 {
		t.Fatal("sent to a gateway the old CA does not sign")
	}
	testenv.Rotate(t, caFile, newCA.File)
	waitFor(t, 20*time.Second, func() bool { return sp.Pending() == 0 }, "the event sent once the new CA is installed")
	if got := g.received(); len(got) != 2 || got[1] != "after" {
		t.Fatalf("the gateway received %v, want [before after]", got)
	}
	if got, want := val(m.gatewayCAExpiry), caExpiry(newCA); got != want || got == caExpiry(oldCA) {
		t.Fatalf("CA expiry gauge %v after the rotation, want the new CA's %v", got, want)
	}

	refused := val(m.sendErrors.WithLabelValues("Unavailable"))
	testenv.Rotate(t, caFile, oldCA.File)
	time.Sleep(tlsclient.ReverifyEvery + time.Second) // the connection verified again, and closed
	sp.Append([]*datamodels.HealthEvent{ev("distrusted", true)})
	waitFor(t, 10*time.Second, func() bool { return val(m.sendErrors.WithLabelValues("Unavailable")) > refused }, "a send refused once the gateway's CA left the file")
	if got := g.received(); len(got) != 2 || sp.Pending() == 0 {
		t.Fatalf("the gateway received %v (pending %d): sent over the connection the file no longer verifies", got, sp.Pending())
	}
}

// TestInsecureIsExplicitAndLoud: plaintext works only when asked for, and
// then the agent says so in its log and in a metric.
func TestInsecureIsExplicitAndLoud(t *testing.T) {
	g := startFake(t)
	cfg := DefaultConfig().Gateway
	cfg.Addr, cfg.TokenFile, cfg.Insecure = g.addr, tokenFile(t, g.token), true
	sp, m, logs := startSender(t, cfg)
	sp.Append([]*datamodels.HealthEvent{ev("in clear", true)})
	waitFor(t, 10*time.Second, func() bool { return sp.Pending() == 0 }, "the event sent in clear")
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "IN CLEAR") {
		t.Errorf("no warning about plaintext in the log:\n%s", logs)
	}
	if v := val(m.gatewayInsecure); v != 1 {
		t.Errorf("faultline_agent_gateway_insecure = %v, want 1", v)
	}
	// And with TLS the gauge says 0.
	ca := testenv.NewCA(t, "", "agent-test")
	tg := startFakeTLS(t, ca, "s3cret", nil)
	cfg = DefaultConfig().Gateway
	cfg.Addr, cfg.TokenFile, cfg.CAFile = tg.addr, tokenFile(t, "s3cret"), ca.File
	_, m2, logs2 := startSender(t, cfg)
	if v := val(m2.gatewayInsecure); v != 0 || strings.Contains(logs2.String(), "IN CLEAR") {
		t.Errorf("TLS sender: gauge %v, log %s", v, logs2)
	}
}

// TestClientCertificate: with a client certificate and no token file the
// agent authenticates by mutual TLS (its certificate's CN is the node, for
// a gateway that binds the credential to it) and sends no authorization
// header. faultline_agent_gateway_client_certificate_expiry_timestamp_seconds
// says when the certificate expires, the renewed one's once its files are
// replaced (the old one's while only the certificate is: a half-written
// rotation).
func TestClientCertificate(t *testing.T) {
	ca := testenv.NewCA(t, "", "agent-test")
	g := startFakeTLS(t, ca, "", ca.Pool())
	client := ca.Issue(t, "node-7")
	cfg := DefaultConfig().Gateway
	cfg.Addr, cfg.TokenFile, cfg.CAFile, cfg.CertFile, cfg.KeyFile = g.addr, "", ca.File, client.CertFile, client.KeyFile
	sp, m, _ := startSender(t, cfg)
	sp.Append([]*datamodels.HealthEvent{ev("by certificate", true)})
	waitFor(t, 10*time.Second, func() bool { return sp.Pending() == 0 }, "the event sent with a client certificate")
	c := g.seen()[0]
	if c.auth != "" || c.tls == nil || len(c.tls.PeerCertificates) == 0 || c.tls.PeerCertificates[0].Subject.CommonName != "node-7" {
		t.Fatalf("call %+v", c)
	}
	expiry := func(kp testenv.KeyPair) float64 { return float64(kp.Cert.Leaf.NotAfter.Unix()) }
	if got, want := val(m.gatewayCertExpiry), expiry(client); got != want {
		t.Fatalf("expiry gauge %v, want the certificate's %v", got, want)
	}
	time.Sleep(time.Second) // a later expiry
	renewed := ca.Issue(t, "node-7")
	testenv.Rotate(t, client.CertFile, renewed.CertFile)
	if got := val(m.gatewayCertExpiry); got != expiry(client) {
		t.Fatalf("expiry gauge %v with the new certificate beside the old key, want the old pair's %v", got, expiry(client))
	}
	testenv.Rotate(t, client.KeyFile, renewed.KeyFile)
	if got := val(m.gatewayCertExpiry); got != expiry(renewed) || got == expiry(client) {
		t.Fatalf("expiry gauge %v after the rotation, want the renewed certificate's %v", got, expiry(renewed))
	}
}

// TestGatewayTLSConfigErrors: contradicting or unreadable TLS settings stop
// the agent at start, naming the key.
func TestGatewayTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testenv.NewCA(t, dir, "agent-test")
	kp := ca.Issue(t, "node-1")
	path := filepath.Join(dir, "agent.toml")
	env := func(string) string { return "node-1" }
	for _, tc := range []struct {
		toml string
		args []string
		want string // "" = valid
	}{
		{"[gateway]\ntls = true\n", nil, "gateway.tls: no longer a key: TLS is on by default; for plaintext set gateway.insecure = true"},
		{"", []string{"--gateway.insecure", "--gateway.ca-file", ca.File}, "gateway.ca_file: set, but gateway.insecure is true (no TLS)"},
		{"[gateway]\ninsecure = true\nserver_name = \"gw\"\n", nil, "gateway.server_name: set, but gateway.insecure is true"},
		{"", []string{"--gateway.cert-file", kp.CertFile}, "gateway.key_file: required with gateway.cert_file"},
		{"", []string{"--gateway.key-file", kp.KeyFile}, "gateway.cert_file: required with gateway.key_file"},
		{"", []string{"--gateway.cert-file", kp.KeyFile, "--gateway.key-file", kp.KeyFile}, "gateway.cert_file, gateway.key_file:"},
		{"", []string{"--gateway.ca-file", filepath.Join(dir, "absent.pem")}, "gateway.ca_file: open"},
		{"", []string{"--gateway.ca-file", path}, "gateway.ca_file: no PEM certificates in"},
		{"", []string{"--gateway.token-file="}, "gateway.token_file: must be set (or gateway.cert_file"},
		{"", []string{"--gateway.token-file=", "--gateway.cert-file", kp.CertFile, "--gateway.key-file", kp.KeyFile, "--gateway.ca-file", ca.File, "--gateway.server-name", "gw.example"}, ""},
		{"[gateway]\ninsecure = true\n", nil, ""},
		{"", []string{"--gateway.insecure"}, ""},
	} {
		if err := os.WriteFile(path, []byte(tc.toml), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadConfig("t", append([]string{"--config", path}, tc.args...), env)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%q %v: %v", tc.toml, tc.args, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q %v: got %v (config %+v), want an error containing %q", tc.toml, tc.args, err, cfg.Gateway, tc.want)
		}
	}
}

// TestHelpShowsTheSafeDefaults: --help tells how to turn TLS off and
// where the metrics listen.
func TestHelpShowsTheSafeDefaults(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var out bytes.Buffer
	fs.SetOutput(&out)
	c := DefaultConfig()
	c.RegisterFlags(fs)
	fs.PrintDefaults()
	for _, want := range []string{"-gateway.insecure", "WITHOUT TLS", `-metrics-addr string`, `(default "127.0.0.1:2112")`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

func contextWithCancel() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}
