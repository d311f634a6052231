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
	"github.com/faultline/faultline/internal/testenv"
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
	openTokens := filepath.Join(dir, "open-tokens")
	if err := os.WriteFile(openTokens, []byte("0123456789abcdef0123,alpha\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(openTokens, 0o644); err != nil {
		t.Fatal(err)
	}
	badRole := filepath.Join(dir, "bad-role")
	if err := os.WriteFile(badRole, []byte("0123456789abcdef0123,alpha,root\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	staleness := filepath.Join(dir, "staleness.toml")
	if err := os.WriteFile(staleness, []byte("[conformance]\nstaleness = \"-1h\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	caseKey := filepath.Join(dir, "case.toml")
	if err := os.WriteFile(caseKey, []byte("[quarantine.breaker]\nWindow = 600\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	negative := filepath.Join(dir, "negative.toml")
	if err := os.WriteFile(negative, []byte("[quarantine]\nrule_cost_limit = -1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"key in another case", []string{"process", "--config", caseKey}, "quarantine.breaker.Window: unknown key (keys are case-sensitive): write quarantine.breaker.window"},
		{"negative unsigned", []string{"process", "--config", negative}, "quarantine.rule_cost_limit = -1: must not be negative"},
		{"config twice", []string{"process", "--config", negative, "--config=" + caseKey}, "--config given twice: " + negative + " and " + caseKey},
		{"negative staleness at the score door", []string{"gateway", "--tokens-file", tokens, "--config", staleness}, "conformance.staleness: must be positive, got -1h0m0s"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"no command", nil, "a command is required"},
		{"unknown TOML key", []string{"gateway", "--config", bad}, "unknown keys: gateway.max_bach"},
		{"bad flag value", []string{"gateway", "--gateway.tokens-file", tokens, "--gateway.max-batch", "0"}, "gateway.max_batch: must be at least 1"},
		{"no credentials", []string{"gateway"}, "gateway.tokens_file: required"},
		{"tokens file open to all", []string{"gateway", "--tokens-file", openTokens}, "gateway.tokens_file: tokens file " + openTokens + " has mode 0644, open to every user on the machine: chmod 0600"},
		{"tokens file bad role", []string{"gateway", "--tokens-file", badRole}, `gateway.tokens_file: tokens file ` + badRole + `: line 1: role "root" is not agent or operator`},
		{"read timeout below header timeout", []string{"gateway", "--tokens-file", tokens, "--read-timeout", "1s"}, "gateway.read_timeout: must be at least gateway.read_header_timeout (10s), got 1s"},
		{"in-flight below a message", []string{"gateway", "--tokens-file", tokens, "--max-inflight-bytes-per-conn", "1024"}, "gateway.max_inflight_bytes_per_conn: must be at least gateway.max_body_bytes"},
		{"credential's share below a message", []string{"gateway", "--tokens-file", tokens, "--max-read-bytes-per-caller", "1024"}, "gateway.max_read_bytes_per_caller: must be at least gateway.max_body_bytes"},
		{"credential's share past the budget", []string{"gateway", "--tokens-file", tokens, "--max-read-bytes-per-caller", "67108864"}, "at most gateway.max_inflight_bytes (33554432), got 67108864"},
		{"linger past the produce timeout", []string{"gateway", "--tokens-file", tokens, "--producer-linger", "5s"}, "gateway.producer_linger: must be 0 or more and shorter than gateway.produce_timeout (5s), got 5s"},
		{"binding certificates without a CA", []string{"gateway", "--tokens-file", tokens, "--client-cert-binds-node"}, "gateway.client_cert_binds_node: needs gateway.client_ca"},
		{"unknown role", []string{"process", "--role", "store,cook"}, `role: unknown role "cook"`},
		{"bad kafka", []string{"process", "--kafka.brokers", " , "}, "kafka.brokers: at least one broker"},
		{"bad dev port", []string{"dev", "--dev.kafka-port", "70000"}, "dev.kafka_port: 70000 is not a port"},
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
// uses it as a person would: wait for /readyz, find the agent and operator
// tokens it wrote (mode 0600), submit a fatal event with each, see a
// check name that would forge an output line refused, see the dry-run
// decision in the live output (quoted), and read the event back from the
// history.
func TestDev(t *testing.T) {
	_, _, err := chserver.FindBinary()
	testenv.Server(t, "faultline dev (its local ClickHouse server)", err)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"dev", "--dev.dir", dir, "--dev.kafka-port", "0", "--dev.clickhouse-port", "0",
			"--gateway.http-addr", "127.0.0.1:0", "--gateway.grpc-addr", "127.0.0.1:0", "--dev.fleet-nodes", "0", "--log-level", "warn"}, pw, io.Discard)
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
	// An agent token and an operator token, each readable by its owner only.
	readToken := func(name string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Fatalf("%s has mode %#o, want 0600", name, st.Mode().Perm())
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	token, operator := readToken("dev-token"), readToken("operator-token")
	readToken("tokens")
	if token == operator || len(operator) < 16 {
		t.Fatalf("agent token %q, operator token %q", token, operator)
	}
	auth := "Bearer " + token
	post := func(auth, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/events", strings.NewReader(body))
		req.Header.Set("Authorization", auth)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	body := `{"events":[{"agent":"faultline-agent","componentClass":"GPU","checkName":"SysLogsXIDError","isFatal":true,
	  "message":"Xid 79: GPU has fallen off the bus","recommendedAction":"REPLACE_VM","errorCode":["XID-79"],
	  "entitiesImpacted":[{"entityType":"GPU","entityValue":"GPU-dev-1"}],"nodeName":"dev-node-1"}]}`
	if code, b := post(auth, body); code != http.StatusOK || !strings.Contains(b, `"ids"`) {
		t.Fatalf("POST: %d %s", code, b)
	}
	// The operator token is a credential of the same cluster.
	opBody := strings.Replace(body, `"nodeName":"dev-node-1"`, `"nodeName":"dev-node-2","quarantineOverrides":{"skip":true}`, 1)
	if code, b := post("Bearer "+operator, opBody); code != http.StatusOK {
		t.Fatalf("POST with the operator token: %d %s", code, b)
	}
	// A check name that would forge a line of this output is refused.
	forged := strings.Replace(body, `"checkName":"SysLogsXIDError"`, `"checkName":"X\n12:00:00  quarantine  \"quarantine/applied\" \"dev-node-9\""`, 1)
	if code, b := post(auth, forged); code != http.StatusBadRequest || !strings.Contains(b, "checkName: control character U+000A") {
		t.Fatalf("POST with a newline in checkName: %d %s", code, b)
	}

	waitFor(t, time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, l := range lines {
			// Decisions are printed with every string quoted.
			if strings.Contains(l, `"quarantine/dry_run"`) && strings.Contains(l, `"dev-node-1"`) {
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

// TestStrayArgumentRefused: the flag parser stops at the first word that
// is not a flag, so a stray word (`--x false`: a true/false flag takes no
// separate value) would drop every flag after it: each command but query
// (whose NAME is a word) refuses it before anything starts, naming it.
func TestStrayArgumentRefused(t *testing.T) {
	const want = `unexpected argument "false": flags after it would be ignored (write a true/false flag as --flag=false)`
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"process bool then value", []string{"process", "--role=quarantine", "--janitor.redfish.insecure-skip-verify", "false", "--kube.dry-run-clusters=prod"}, want},
		{"process word first", []string{"process", "stray", "--role=store"}, `unexpected argument "stray"`},
		{"process second broker", []string{"process", "--kafka.brokers", "k1:9092", "k2:9092", "--role=store"}, `unexpected argument "k2:9092"`},
		{"gateway", []string{"gateway", "--gateway.client-cert-binds-node", "false", "--gateway.max-batch=5"}, want},
		{"dev", []string{"dev", "--dev.kafka-port", "0", "stray", "--dev.fleet-nodes=0"}, `unexpected argument "stray"`},
		{"migrate status", []string{"migrate", "status"}, `unexpected argument "status"`},
		{"migrate bool then value", []string{"migrate", "--status", "false"}, want},
		{"query extra word", []string{"query", "top_error_codes", "--format", "json", "extra"}, "usage: faultline query NAME"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run(context.Background(), tc.args, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
