package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/faultline/faultline/deploy/chart"
	"github.com/faultline/faultline/internal/syncbuf"
	"github.com/faultline/faultline/internal/testenv"
)

// TestChartWalkthrough is the README's "Install on a cluster" without the
// cluster: the chart renders its default values pointed at a real Kafka
// broker and a real ClickHouse server, and the gateway and the store role
// run in this process on exactly that config.toml and tokens Secret (the
// pod's mount paths and listen ports mapped to a temporary directory and
// free ports, nothing else changed). The README's event is posted with the
// agent token, and `faultline query events_per_day --config` shows it.
func TestChartWalkthrough(t *testing.T) {
	helm := testenv.Helm(t)
	kafka := testenv.StartKafka(t)
	ch := testenv.StartClickHouse(t)
	ctx, cancel := context.WithCancel(context.Background())
	objs, err := chart.Render(ctx, helm, t.TempDir(), "faultline", "faultline", []string{chart.ValueSets()["default"]},
		"--set", "kafka.brokers="+kafka.Addr(), "--set", "clickhouse.addr="+ch.Addr(),
		"--set", "kafka.replicationFactor=1", "--set", "kafka.minInsyncReplicas=1", "--set", "kafka.partitions=3")
	if err != nil {
		t.Fatal(err)
	}
	conf, err := chart.ConfigTOML(objs, "faultline-config")
	if err != nil {
		t.Fatal(err)
	}
	tokens, _, _ := unstructured.NestedString(chart.Find(objs, "Secret", "faultline-gateway-tokens").Object, "stringData", "tokens")
	agentToken, _, _ := unstructured.NestedString(chart.Find(objs, "Secret", "faultline-agent-token").Object, "stringData", "token")
	if tokens == "" || agentToken == "" || !strings.Contains(tokens, agentToken+",") {
		t.Fatalf("tokens Secret %q, agent token %q", tokens, agentToken)
	}

	// The pod's view: the projected Secret directory and the listen ports.
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "gateway"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "gateway", "tokens"), []byte(tokens), 0o440); err != nil {
		t.Fatal(err)
	}
	grpcAddr, httpAddr := freeAddr(t), freeAddr(t)
	for _, r := range [][2]string{
		{"/var/run/secrets/faultline", dir},
		{`grpc_addr = ":50051"`, fmt.Sprintf("grpc_addr = %q", grpcAddr)},
		{`http_addr = ":8080"`, fmt.Sprintf("http_addr = %q", httpAddr)},
		{`metrics_addr = ":9464"`, `metrics_addr = ""`},
	} {
		if !strings.Contains(conf, r[0]) {
			t.Fatalf("rendered config.toml has no %s:\n%s", r[0], conf)
		}
		conf = strings.ReplaceAll(conf, r[0], r[1])
	}
	path := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}

	// The gateway's and the store's Deployment args.
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	logs := &syncbuf.Buffer{}
	for _, args := range [][]string{
		{"gateway", "--config", path},
		{"process", "--config", path, "--role=store"},
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx, args, io.Discard, logs); err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("%s: %w", args[0], err)
			}
		}()
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	base := "http://" + httpAddr
	waitForOrFail(t, 2*time.Minute, errs, logs, func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	// The README's event.
	body := `{"events": [{"agent": "install-check",
  "componentClass": "GPU", "checkName": "InstallCheck", "isHealthy": true,
  "message": "hello from the install", "nodeName": "gpu-node-0"}]}`
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/events", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+agentToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"ids"`) {
		t.Fatalf("POST /v1/events: %d %s", resp.StatusCode, b)
	}
	var out bytes.Buffer
	waitForOrFail(t, 2*time.Minute, errs, logs, func() bool {
		out.Reset()
		if err := run(ctx, []string{"query", "events_per_day", "--config", path}, &out, io.Discard); err != nil {
			return false
		}
		return strings.Contains(out.String(), "gpu-node-0") && strings.Contains(out.String(), "gpu-east")
	})
	t.Logf("faultline query events_per_day --config (the chart's):\n%s", out.String())
}

// waitForOrFail polls ok until d, failing at once if a component exits.
func waitForOrFail(t *testing.T, d time.Duration, errs <-chan error, logs *syncbuf.Buffer, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		select {
		case err := <-errs:
			t.Fatalf("%v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s\n%s", d, logs.String())
		}
		time.Sleep(300 * time.Millisecond)
	}
}
