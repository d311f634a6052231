package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/syncbuf"
	"github.com/faultline/faultline/processors/quarantine"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestSecretsNeverShow plants a secret in every place faultline reads one
// from — the ClickHouse password (file, variable, and the
// FAULTLINE_CLICKHOUSE_PASSWORD default), a kubeconfig's own token and a
// cluster's token_file and token_env — and looks for each, as is and
// base64- or hex-encoded, in every output: --help of every command,
// configuration errors, the logs at debug level (the libraries' too), the
// errors of a failed connect, /metrics, and every record the processors
// produce (actions, dead letters, retries). The tokens are sent (the fake
// API server sees them), so the check is not passing for want of use.
func TestSecretsNeverShow(t *testing.T) {
	dir := t.TempDir()
	plant := func(what string) string {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		return "planted-" + what + "-" + hex.EncodeToString(b)
	}
	var (
		chFile, chEnv, chDefault = plant("ch-file"), plant("ch-env"), plant("ch-default")
		kubeconfigToken          = plant("kubeconfig")
		tokenFile, tokenEnv      = plant("token-file"), plant("token-env")
		secrets                  = []string{chFile, chEnv, chDefault, kubeconfigToken, tokenFile, tokenEnv}
	)
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Setenv("FAULTLINE_CLICKHOUSE_PASSWORD", chDefault)
	t.Setenv("FAULTLINE_TEST_CH_PASSWORD", chEnv)
	t.Setenv("FAULTLINE_TEST_KUBE_TOKEN", tokenEnv)
	chPwFile := write("ch-password", chFile+"\n")
	tokFile := write("kube-token", tokenFile+"\n")

	// A Kubernetes API that refuses everything: 401 for node n-401 and
	// the node watch, 400 for n-400 (a failure the quarantine records as
	// an action, with the server's message). It remembers the tokens sent.
	var (
		mu   sync.Mutex
		sent = map[string]bool{}
	)
	api := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sent[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")] = true
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		code, reason := http.StatusUnauthorized, "Unauthorized"
		if strings.HasSuffix(r.URL.Path, "/nodes/n-400") {
			code, reason = http.StatusBadRequest, "BadRequest"
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"refused by the test API","reason":%q,"code":%d}`, reason, code)
	}))
	api.StartTLS() // client-go sends no credentials in clear, nor does faultline
	t.Cleanup(api.Close)
	ca := base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: api.Certificate().Raw}))
	kubeconfig := write("kubeconfig", fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, certificate-authority-data: %s}}]
users: [{name: u, user: {token: %s}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, api.URL, ca, kubeconfigToken))

	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, kafka.PipelineTopics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	brokers := strings.Join(kc.ListenAddrs(), ",")
	conf := write("faultline.toml", fmt.Sprintf(`
role = "quarantine,drain,remediate"
log_level = "debug"
library_log_level = "debug"
[kafka]
brokers = %q
partitions = 2
[clickhouse]
password_file = %q
[quarantine]
cluster_wait = "300ms"
retry_wait = "300ms"
[[kube.clusters]]
name = "kubeconfig"
kubeconfig = %q
[[kube.clusters]]
name = "file"
kubeconfig = %q
token_file = %q
[[kube.clusters]]
name = "env"
kubeconfig = %q
token_env = "FAULTLINE_TEST_KUBE_TOKEN"
[[kube.clusters]]
name = "unauthorized"
kubeconfig = %q
token_file = %q
`, brokers, chPwFile, kubeconfig, kubeconfig, tokFile, kubeconfig, kubeconfig, tokFile))

	var outputs []struct{ name, text string }
	add := func(name, text string) { outputs = append(outputs, struct{ name, text string }{name, text}) }

	// --help of every command.
	for c := range commands {
		var out bytes.Buffer
		_ = run(context.Background(), []string{c, "--help", "--config", conf}, &out, &out)
		add(c+" --help", out.String())
	}
	// Configuration errors that name the secret's key.
	for _, args := range [][]string{
		{"process", "--config", conf, "--clickhouse.password-env", "FAULTLINE_TEST_UNSET_X"},
		{"process", "--config", conf, "--clickhouse.password-file", chPwFile, "--clickhouse.password-env", "FAULTLINE_TEST_CH_PASSWORD"},
		{"process", "--config", write("old.toml", "[clickhouse]\npassword = \""+chFile+"\"\n")},
	} {
		var out bytes.Buffer
		err := run(context.Background(), args, &out, &out)
		if err == nil {
			t.Fatalf("%v: no error", args)
		}
		add(fmt.Sprintf("%v", args), out.String()+err.Error())
	}
	// A connect that fails, with each ClickHouse password source.
	for _, args := range [][]string{
		{"migrate", "--clickhouse.addr", freeAddr(t), "--clickhouse.password-file", chPwFile, "--clickhouse.dial-timeout", "300ms", "--log-level", "debug"},
		{"query", "top_error_codes", "--clickhouse.addr", freeAddr(t), "--clickhouse.password-env", "FAULTLINE_TEST_CH_PASSWORD", "--clickhouse.dial-timeout", "300ms", "--log-level", "debug"},
		{"migrate", "--clickhouse.addr", freeAddr(t), "--clickhouse.dial-timeout", "300ms", "--log-level", "debug"},
	} {
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := run(ctx, args, &out, &out)
		cancel()
		if err == nil {
			t.Fatalf("%v: no error", args)
		}
		add(fmt.Sprintf("%v", args), out.String()+err.Error())
	}
	add("the config printed", fmt.Sprintf("%+v %#v", DefaultConfig(), DefaultConfig()))

	// The processors at work: logs, metrics, every record they produce.
	metricsAddr := freeAddr(t)
	logs := &syncbuf.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"process", "--config", conf, "--metrics-addr", metricsAddr}, io.Discard, logs)
	}()
	cl, err := kafka.NewClient(kafka.Config{Brokers: brokers}, quietLog(),
		kgo.ConsumeTopics(events.TopicActions, events.TopicDeadLetter, quarantine.RetryTopic("unauthorized")),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// n-400 of three clusters (one per token source) fails for good; n-401
	// of a fourth (the API's 401 backs its cluster off) is deferred.
	for _, cn := range [][2]string{{"kubeconfig", "n-400"}, {"file", "n-400"}, {"env", "n-400"}, {"unauthorized", "n-401"}} {
		{
			cluster, node := cn[0], cn[1]
			ev := &datamodels.HealthEvent{Id: events.NewID(), Cluster: cluster, NodeName: node, Agent: "faultline-agent",
				ComponentClass: "GPU", CheckName: "SysLogsXIDError", IsFatal: true, ErrorCode: []string{"XID-79"},
				RecommendedAction: datamodels.RecommendedAction_RESTART_VM, Message: "Xid 79"}
			v, _ := events.Marshal(ev)
			pctx, pcancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := cl.ProduceSync(pctx, &kgo.Record{Topic: events.TopicEvents, Key: events.Key(cluster, node), Value: v}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			pcancel()
		}
	}
	var records bytes.Buffer
	failed, retried := 0, 0
	deadline := time.Now().Add(60 * time.Second)
	for (failed < 3 || retried < 1) && time.Now().Before(deadline) {
		fctx, fcancel := context.WithTimeout(context.Background(), time.Second)
		cl.PollFetches(fctx).EachRecord(func(r *kgo.Record) {
			records.Write(r.Key)
			records.Write(r.Value)
			for _, h := range r.Headers {
				records.WriteString(h.Key + "=" + string(h.Value) + "\n")
			}
			switch r.Topic {
			case quarantine.RetryTopic("unauthorized"):
				retried++
			case events.TopicActions:
				if a, err := events.UnmarshalAction(r.Value); err == nil && a.GetOutcome() == events.OutcomeFailed {
					failed++
					records.WriteString(a.GetReason() + "\n")
				}
			}
		})
		fcancel()
	}
	if failed < 3 || retried < 1 {
		t.Fatalf("%d failed actions (want 3: n-400 of three clusters), %d records deferred (want 1: n-401); logs:\n%s", failed, retried, logs.String())
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("process: %v", err)
	}
	add("process logs", logs.String())
	add("/metrics", string(metrics))
	add("actions, dead letters and retries", records.String())
	if !strings.Contains(logs.String(), "refused by the test API") || !strings.Contains(string(metrics), "faultline_quarantine_api_errors_total") {
		t.Fatalf("the roles did not reach the API or export their metrics:\n%s", logs.String())
	}

	mu.Lock()
	for _, tok := range []string{kubeconfigToken, tokenFile, tokenEnv} {
		if !sent[tok] {
			t.Errorf("the API never saw token %s: the check would prove nothing (saw %v)", tok, sent)
		}
	}
	mu.Unlock()
	for _, o := range outputs {
		for _, s := range secrets {
			for _, form := range []string{s, base64.StdEncoding.EncodeToString([]byte(s)), hex.EncodeToString([]byte(s))} {
				if strings.Contains(o.text, form) {
					t.Errorf("%s shows the secret %s:\n%s", o.name, s, o.text)
				}
			}
		}
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
