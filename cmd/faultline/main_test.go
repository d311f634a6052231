package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/faultline/faultline/internal/chserver"
)

func TestConfigErrorsNameTheKey(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("[gateway]\nmax_batch = 10\nmax_bach = 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("0123456789abcdef0123,alpha\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"no command", nil, "a command is required"},
		{"unknown TOML key", []string{"gateway", "--config", bad}, "unknown keys: gateway.max_bach"},
		{"bad flag value", []string{"gateway", "--tokens-file", tokens, "--max-batch", "0"}, "gateway.max_batch: must be at least 1"},
		{"no credentials", []string{"gateway"}, "gateway.tokens_file: required"},
		{"unknown role", []string{"process", "--role", "store,cook"}, `role: unknown role "cook"`},
		{"bad kafka", []string{"process", "--kafka.brokers", " , "}, "kafka.brokers: at least one broker"},
		{"bad dev port", []string{"dev", "--kafka-port", "70000"}, "dev.kafka_port: 70000 is not a port"},
		{"bad cluster name", []string{"migrate", "--cluster", "two words"}, `clickhouse.cluster: "two words" is not a cluster name`},
		{"zookeeper path shared by tables", []string{"migrate", "--cluster", "fleet", "--clickhouse.zookeeper-path", "/clickhouse/{shard}"}, "clickhouse.zookeeper_path: \"/clickhouse/{shard}\" must be an absolute path containing {table}"},
		{"bad address in list", []string{"migrate", "--clickhouse.addr", "ch-0:9000,ch-1"}, `clickhouse.addr: "ch-1" is not host:port`},
		{"bad min insync", []string{"process", "--kafka.replication-factor", "3", "--kafka.min-insync-replicas", "4"}, "kafka.min_insync_replicas: 4 is more than kafka.replication_factor 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(context.Background(), tt.args, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestDev runs `faultline dev` (what `make run` starts) on free ports and
// uses it as a person would: wait for /readyz, submit a fatal event with the
// written token, see the dry-run decision in the live output, and read the
// event back from the history.
func TestDev(t *testing.T) {
	if _, _, err := chserver.FindBinary(); err != nil {
		if os.Getenv("CI") != "" || os.Getenv("FAULTLINE_REQUIRE_SERVERS") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"dev", "--dir", dir, "--kafka-port", "0", "--clickhouse-port", "0",
			"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--fleet-nodes", "0", "--log-level", "warn"}, pw, io.Discard)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("dev exited: %v", err)
		}
	})

	var (
		mu    sync.Mutex
		lines []string
		rest  = make(chan string, 1)
	)
	restRE := regexp.MustCompile(`REST\s+(http://\S+)`)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			mu.Lock()
			lines = append(lines, sc.Text())
			mu.Unlock()
			if m := restRE.FindStringSubmatch(sc.Text()); m != nil {
				rest <- m[1]
			}
		}
	}()
	var base string
	select {
	case base = <-rest:
	case <-time.After(2 * time.Minute):
		t.Fatal("dev did not print its REST address")
	}
	waitFor(t, 2*time.Minute, func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	token, err := os.ReadFile(filepath.Join(dir, "dev-token"))
	if err != nil {
		t.Fatal(err)
	}
	auth := "Bearer " + strings.TrimSpace(string(token))
	body := `{"events":[{"agent":"faultline-agent","componentClass":"GPU","checkName":"SysLogsXIDError","isFatal":true,
	  "message":"Xid 79: GPU has fallen off the bus","recommendedAction":"REPLACE_VM","errorCode":["XID-79"],
	  "entitiesImpacted":[{"entityType":"GPU","entityValue":"GPU-dev-1"}],"nodeName":"dev-node-1"}]}`
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/events", strings.NewReader(body))
	req.Header.Set("Authorization", auth)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"ids"`) {
		t.Fatalf("POST: %d %s", resp.StatusCode, b)
	}

	waitFor(t, time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, l := range lines {
			if strings.Contains(l, "quarantine/dry_run") && strings.Contains(l, "dev-node-1") {
				return true
			}
		}
		return false
	})
	waitFor(t, time.Minute, func() bool {
		req, _ := http.NewRequest(http.MethodGet, base+"/v1/events?node=dev-node-1", nil)
		req.Header.Set("Authorization", auth)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && strings.Contains(string(b), "GPU-dev-1")
	})
}

func waitFor(t *testing.T, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", d)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
