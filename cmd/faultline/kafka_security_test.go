package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/syncbuf"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/schemas/events"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// freeAddr returns a 127.0.0.1 address that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestGatewayAndProcessOverSASLSSL: `faultline gateway` and `faultline
// process` configured from TOML (plus flags) reach a real Kafka broker only
// through TLS and SCRAM-SHA-512 — the gateway reading the password from a
// file, the processor from an environment variable — and an event posted
// to the gateway comes out of the quarantine role as an action. Neither
// prints the password, even at debug level. A wrong password stops the
// gateway at start, at once, with an error saying what to check.
func TestGatewayAndProcessOverSASLSSL(t *testing.T) {
	k := testenv.SharedSecureKafka(t)
	sec := k.Security()
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	conf := write("faultline.toml", fmt.Sprintf(`
[kafka]
brokers = %q
partitions = 2
[kafka.tls]
enabled = true
ca_file = %q
[kafka.sasl]
mechanism = "SCRAM-SHA-512"
username = %q
`, sec.SASLSSLAddr, sec.CA.File, sec.User))
	const token = "sec-test-token-0123456789"
	tokens := write("tokens", token+",sec\n")
	t.Setenv("FAULTLINE_TEST_KAFKA_PASSWORD", sec.Password)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	start := func(name string, args ...string) *syncbuf.Buffer {
		logs := &syncbuf.Buffer{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx, args, io.Discard, logs); err != nil && ctx.Err() == nil {
				t.Errorf("%s exited: %v", name, err)
			}
		}()
		return logs
	}
	t.Cleanup(func() { cancel(); wg.Wait() })

	httpAddr := freeAddr(t)
	gwLogs := start("gateway", "gateway", "--config", conf, "--log-level", "debug",
		"--kafka.sasl.password-file", sec.PasswordFile,
		"--gateway.tokens-file", tokens, "--gateway.http-addr", httpAddr, "--gateway.grpc-addr", freeAddr(t))
	procLogs := start("process", "process", "--config", conf, "--log-level", "debug",
		"--kafka.sasl.password-env", "FAULTLINE_TEST_KAFKA_PASSWORD",
		"--role", "quarantine", "--metrics-addr", "")

	// The gateway answers once it has created the topics through SASL_SSL.
	base := "http://" + httpAddr
	body := `{"events":[{"agent":"faultline-agent","componentClass":"GPU","checkName":"SysLogsXIDError","isFatal":true,
	  "message":"Xid 79: GPU has fallen off the bus","recommendedAction":"REPLACE_VM","errorCode":["XID-79"],
	  "entitiesImpacted":[{"entityType":"GPU","entityValue":"GPU-sec-1"}],"nodeName":"sec-node-1"}]}`
	waitFor(t, 2*time.Minute, func() bool {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/events", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Logf("POST: %d %s", resp.StatusCode, b)
			return false
		}
		return true
	})

	// The quarantine role consumed it through SASL_SSL and recorded its
	// decision; read it back the same way.
	kc := kafka.DefaultConfig()
	kc.Brokers = sec.SASLSSLAddr
	kc.TLS = kafka.TLSConfig{Enabled: true, CAFile: sec.CA.File}
	kc.SASL = kafka.SASLConfig{Mechanism: kafka.MechanismScramSHA256, Username: sec.User, PasswordFile: sec.PasswordFile}
	cl, err := kafka.NewClient(kc, slog.New(slog.DiscardHandler), kgo.ConsumeTopics(events.TopicActions),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer pcancel()
	found := ""
	for found == "" {
		fs := cl.PollFetches(pctx)
		if pctx.Err() != nil {
			t.Fatalf("no action for sec-node-1 on %s\ngateway log:\n%s\nprocess log:\n%s", events.TopicActions, tail(gwLogs.String()), tail(procLogs.String()))
		}
		fs.EachRecord(func(r *kgo.Record) {
			if a, err := events.UnmarshalAction(r.Value); err == nil && a.GetNode() == "sec-node-1" {
				found = a.GetRole() + " " + a.GetKind() + "/" + a.GetOutcome()
			}
		})
	}
	t.Logf("action over SASL_SSL: %s", found)

	for name, logs := range map[string]*syncbuf.Buffer{"gateway": gwLogs, "process": procLogs} {
		l := logs.String()
		if !strings.Contains(l, "SCRAM-SHA-512") {
			t.Errorf("the %s debug log shows no SCRAM-SHA-512 login:\n%s", name, tail(l))
		}
		if strings.Contains(l, sec.Password) {
			t.Errorf("the %s log contains the Kafka password", name)
		}
	}

	// Wrong password: the gateway stops at start with a clear error.
	began := time.Now()
	err = run(context.Background(), []string{"gateway", "--config", conf, "--gateway.tokens-file", tokens,
		"--kafka.sasl.password-file", write("wrong", "not-the-password-5\n"),
		"--gateway.http-addr", freeAddr(t), "--gateway.grpc-addr", freeAddr(t)}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "kafka authentication failed: check kafka.sasl.username") ||
		strings.Contains(err.Error(), "not-the-password-5") {
		t.Fatalf("gateway with a wrong Kafka password: %v", err)
	}
	if took := time.Since(began); took > 15*time.Second {
		t.Errorf("the gateway took %s to give up on a wrong password", took)
	}
}

// tail returns the last 40 lines of s.
func tail(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

// TestKafkaSecurityConfigErrors: both Kafka-facing commands refuse bad TLS
// and SASL settings at start, naming the key.
func TestKafkaSecurityConfigErrors(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("0123456789abcdef0123,alpha\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"process", "--kafka.sasl.mechanism", "PLAIN", "--kafka.sasl.username", "u", "--kafka.sasl.password-env", "X"},
			"kafka.sasl.mechanism: PLAIN sends the password in clear; it requires kafka.tls.enabled = true"},
		{[]string{"gateway", "--gateway.tokens-file", tokens, "--kafka.sasl.mechanism", "SCRAM-SHA-256", "--kafka.sasl.username", "u"},
			"kafka.sasl.password_file or kafka.sasl.password_env: required by SCRAM-SHA-256"},
		{[]string{"gateway", "--gateway.tokens-file", tokens, "--kafka.sasl.mechanism", "KERBEROS"}, `kafka.sasl.mechanism: "KERBEROS" is not one of`},
		{[]string{"process", "--kafka.tls.ca-file", tokens}, "kafka.tls.ca_file: set, but kafka.tls.enabled is false"},
		{[]string{"process", "--kafka.tls.enabled", "--kafka.tls.ca-file", tokens}, "kafka.tls.ca_file: no PEM certificates in " + tokens},
	}
	for _, tt := range tests {
		err := run(context.Background(), tt.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: got %v, want an error containing %q", tt.args, err, tt.want)
		}
	}
}
