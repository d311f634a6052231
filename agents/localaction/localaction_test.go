package localaction

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/faultline/faultline/agents/podres"
	"github.com/faultline/faultline/agents/podres/podrestest"
)

var testLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// standIn writes an executable that appends its arguments to log (and
// fails when its first argument is "fail"): the stand-in for systemctl
// and nvidia-smi.
func standIn(t *testing.T, dir, name, log string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	script := "#!/bin/sh\necho \"" + name + " $*\" >> " + log + "\ncase \"$*\" in *GPU-00000000-dead-*) echo 'Unable to reset GPU' >&2; exit 3;; esac\n" +
		"[ \"$1\" = \"--query-gpu=uuid\" ] && printf 'GPU-00000000-0000-0000-0000-000000000001\\nGPU-00000000-0000-0000-0000-000000000002\\n'\nexit 0\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// testNode is the node the tests' agents serve.
const testNode = "node-a"

// janitorKey is a janitor's signing key, its public key written where
// an agent's verify_key_file names it.
type janitorKey struct {
	priv    ed25519.PrivateKey
	pubFile string
}

// newJanitorKey makes a key pair and writes the public key as PEM to
// dir/name.pub.
func newJanitorKey(t *testing.T, dir, name string) janitorKey {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	k := janitorKey{priv: priv, pubFile: filepath.Join(dir, name+".pub")}
	if err := os.WriteFile(k.pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return k
}

// post signs body for path and posts it; auth, when not "", replaces the
// signature.
func (k janitorKey) post(t *testing.T, url, path, body, auth string) (int, Answer) {
	t.Helper()
	hr, _ := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	if auth == "" {
		auth = Sign(k.priv, http.MethodPost, path, []byte(body))
	}
	hr.Header.Set("Authorization", auth)
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a Answer
	_ = json.NewDecoder(resp.Body).Decode(&a)
	return resp.StatusCode, a
}

// call sends req as the janitor would: for testNode, issued now, the
// action of the path, signed.
func (k janitorKey) call(t *testing.T, url string, req Request) (int, Answer) {
	t.Helper()
	path := "/v1/local/reboot"
	if req.Action == "" {
		req.Action = ActionReboot
		if req.GPUs != nil {
			req.Action = ActionGPUReset
		}
	}
	if req.Action == ActionGPUReset {
		path = "/v1/local/gpu-reset"
	}
	if req.Node == "" {
		req.Node = testNode
	}
	if req.Issued.IsZero() {
		req.Issued = time.Now()
	}
	b, _ := json.Marshal(req)
	return k.post(t, url, path, string(b), "")
}

type pods struct{ busy atomic.Int32 }

func (p *pods) PodsOf(context.Context, []string) ([]string, error) {
	if p.busy.Add(-1) >= 0 {
		return []string{"ml/train-0"}, nil
	}
	return nil, nil
}

func TestServer(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "calls.log")
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	k := newJanitorKey(t, dir, "janitor")
	cfg.VerifyKeyFile = k.pubFile
	cfg.RebootCommand = []string{standIn(t, dir, "systemctl", log), "reboot"}
	smi := standIn(t, dir, "nvidia-smi", log)
	cfg.GPUResetCommand = []string{smi, "-r", "-i", "{uuid}"}
	cfg.GPUListCommand = []string{smi, "--query-gpu=uuid", "--format=csv,noheader"}
	cfg.StateFile = filepath.Join(dir, "state", "local-actions.json")
	cfg.PodsGoneTimeout = 10 * time.Second
	if err := cfg.Validate("local_actions."); err != nil {
		t.Fatal(err)
	}
	p := &pods{}
	s, err := New(cfg, testNode, testLog, p)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	call := func(req Request) (int, Answer) { t.Helper(); return k.call(t, srv.URL, req) }
	calls := func() string { b, _ := os.ReadFile(log); return string(b) }

	if code, a := call(Request{ID: "r1"}); code != 200 || !a.OK || a.Repeated {
		t.Fatalf("reboot: %d %+v", code, a)
	}
	if code, a := call(Request{ID: "r1"}); code != 200 || !a.OK || !a.Repeated {
		t.Fatalf("repeated reboot: %d %+v", code, a)
	}
	if got := strings.Count(calls(), "systemctl reboot"); got != 1 {
		t.Fatalf("reboot command ran %d times:\n%s", got, calls())
	}
	// The record survives the agent (and the node) restarting.
	s2, err := New(cfg, testNode, testLog, p)
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = s2.Handler()
	if _, a := call(Request{ID: "r1"}); !a.Repeated || strings.Count(calls(), "systemctl reboot") != 1 {
		t.Fatalf("after a restart: %+v\n%s", a, calls())
	}

	// GPU reset: waits for the pods, resets each GPU once.
	p.busy.Store(2)
	g := "GPU-00000000-0000-0000-0000-00000000000a"
	if _, a := call(Request{ID: "g1", GPUs: []string{g}}); !a.OK {
		t.Fatalf("gpu reset: %+v", a)
	}
	if p.busy.Load() >= 0 || !strings.Contains(calls(), "nvidia-smi -r -i "+g) {
		t.Fatalf("reset before the pods were gone, or not at all:\n%s", calls())
	}
	// Every GPU: listed by the GPU list command.
	if _, a := call(Request{ID: "g2", Action: ActionGPUReset}); !a.OK || !strings.Contains(calls(), "-i GPU-00000000-0000-0000-0000-000000000002") {
		t.Fatalf("all GPUs: %+v\n%s", a, calls())
	}
	// Failures.
	if _, a := call(Request{ID: "g3", GPUs: []string{"GPU-00000000-dead-0000-0000-000000000000"}}); a.OK || a.Reason != "CommandFailed" {
		t.Fatalf("failing reset: %+v", a)
	}
	p.busy.Store(1 << 20)
	s2.cfg.PodsGoneTimeout = 1500 * time.Millisecond
	if _, a := call(Request{ID: "g4", GPUs: []string{g}}); a.OK || a.Reason != "GPUInUse" || !strings.Contains(a.Message, "ml/train-0") {
		t.Fatalf("GPU in use: %+v", a)
	}
	// Bad requests say what is wrong and run nothing.
	before := calls()
	now := time.Now().UTC().Format(time.RFC3339Nano)
	reset := `"node":"node-a","action":"gpu-reset","issued":"` + now + `"`
	reboot := `"node":"node-a","action":"reboot","issued":"` + now + `"`
	for _, tc := range []struct{ path, body, want string }{
		{"/v1/local/gpu-reset", `{"id":"g6",` + reset + `,"gpu":["` + g + `"]}`, `body: json: unknown field "gpu"`}, // not every GPU
		{"/v1/local/gpu-reset", `{` + reset + `,"gpus":["` + g + `"]}`, "id: required"},
		{"/v1/local/gpu-reset", `{"id":"g7",` + reset + `,"gpus":"` + g + `"}`, "body: json: cannot unmarshal string"},
		{"/v1/local/gpu-reset", `{"id":"g5",` + reset + `,"gpus":["0"]}`, `gpus: "0" is not a GPU UUID`},
		{"/v1/local/gpu-reset", `{"id":"g5b",` + reset + `,"gpus":["GPU-` + strings.Repeat("-", 36) + `"]}`, `is not a GPU UUID`}, // the UUID's shape, not its characters
		{"/v1/local/gpu-reset", `{"id":"` + strings.Repeat("x", maxID+1) + `",` + reset + `}`, "id: 257 bytes, at most 256"},
		{"/v1/local/reboot", `{"id":"r9",` + reboot + `,"gpus":["` + g + `"]}`, "gpus: a reboot takes none"},
		{"/v1/local/reboot", `{"id":"r\u0000\u001b[31m",` + reboot + `}`, `id: "r\x00\x1b[31m" has a character outside ^[A-Za-z0-9._:/-]+$`},
		{"/v1/local/reboot", `{"id":"r10",` + reset + `}`, `action: "gpu-reset" sent to the reboot endpoint`},
		{"/v1/local/reboot", `{"id":"r11","action":"reboot","issued":"` + now + `"}`, `node: required`},
		{"/v1/local/reboot", `{"id":"r12","node":"node-a","action":"reboot"}`, `issued: required`},
	} {
		code, a := k.post(t, srv.URL, tc.path, tc.body, "")
		if code != 400 || a.Reason != "InvalidRequest" || !strings.Contains(a.Message, tc.want) {
			t.Errorf("%s %s: %d %+v, want 400 InvalidRequest %q", tc.path, tc.body, code, a, tc.want)
		}
	}
	if calls() != before {
		t.Fatalf("a bad request ran a command:\n%s", strings.TrimPrefix(calls(), before))
	}
	// A GPU list that is not one UUID a line resets nothing.
	s2.cfg.GPUListCommand = []string{"/bin/echo", "No devices were found"}
	if _, a := call(Request{ID: "g8", Action: ActionGPUReset}); a.Reason != "CommandFailed" || !strings.Contains(a.Message, `line 1 "No devices were found" is not a GPU UUID`) {
		t.Fatalf("bad GPU list: %+v", a)
	}
	if calls() != before {
		t.Fatalf("a bad GPU list ran a reset:\n%s", strings.TrimPrefix(calls(), before))
	}
}

func TestValidateNamesTheBadKey(t *testing.T) {
	dir := t.TempDir()
	pub := newJanitorKey(t, dir, "janitor").pubFile
	priv := filepath.Join(dir, "janitor.key")
	der, err := x509.MarshalPKCS8PrivateKey(newJanitorKey(t, dir, "other").priv)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(priv, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("tok"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		set  func(*Config)
		want string
	}{
		{"ok", func(*Config) {}, ""},
		{"no verify key", func(c *Config) { c.VerifyKeyFile = "" }, "local_actions.verify_key_file: required when local_actions.listen is set"},
		{"verify key missing", func(c *Config) { c.VerifyKeyFile = pub + ".gone" }, "local_actions.verify_key_file: open "},
		{"verify key not PEM", func(c *Config) { c.VerifyKeyFile = garbage }, "local_actions.verify_key_file: " + garbage + ": no PEM PUBLIC KEY block"},
		{"the private key", func(c *Config) { c.VerifyKeyFile = priv }, "a PEM PRIVATE KEY block, want PUBLIC KEY (openssl pkey -pubout); never give agents the private key"},
		// The shared bearer token is gone, and saying so beats "unknown key".
		{"token file", func(c *Config) { c.TokenFile = garbage }, "local_actions.token_file: removed (the same token on every node let any node's root reboot every other); set local_actions.verify_key_file"},
		{"token file, endpoint off", func(c *Config) { c.Listen, c.TokenFile = "", garbage }, "local_actions.token_file: removed"},
		{"clock skew", func(c *Config) { c.MaxClockSkew = 0 }, "local_actions.max_clock_skew: must be positive, got 0s"},
		{"empty list command", func(c *Config) { c.GPUListCommand = nil }, "local_actions.gpu_list_command: want the program and its arguments, got []"},
		{"empty program", func(c *Config) { c.RebootCommand = []string{""} }, `local_actions.reboot_command: want the program and its arguments, got [""]`},
		{"no {uuid}", func(c *Config) { c.GPUResetCommand = []string{"nvidia-smi", "-r"} }, "local_actions.gpu_reset_command: must name {uuid}"},
		{"no state file", func(c *Config) { c.StateFile = "" }, "local_actions.state_file: must not be empty"},
		{"pods gone", func(c *Config) { c.PodsGoneTimeout = 0 }, "local_actions.pods_gone_timeout: must be positive, got 0s"},
		{"command timeout", func(c *Config) { c.CommandTimeout = -5 * time.Second }, "local_actions.command_timeout: must be positive, got -5s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Listen, c.VerifyKeyFile = "127.0.0.1:0", pub
			tc.set(&c)
			err := c.Validate("local_actions.")
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// TestStateKeepsTheNewest: the state file keeps the newest maxRecorded
// answers, so it no longer grows with every reboot a node ever had; a
// kept id is still answered as a repeat after a restart.
func TestStateKeepsTheNewest(t *testing.T) {
	cfg := DefaultConfig()
	cfg.StateFile = filepath.Join(t.TempDir(), "local-actions.json")
	s, err := New(cfg, testNode, testLog, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range maxRecorded + 10 {
		if err := s.record(&Answer{ID: fmt.Sprintf("uid-%03d/signal", i), OK: true}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Microsecond) // distinct times
	}
	s2, err := New(cfg, testNode, testLog, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(s2.state) != maxRecorded {
		t.Fatalf("%d answers kept, want %d", len(s2.state), maxRecorded)
	}
	for i, want := range map[int]bool{0: false, 9: false, 10: true, maxRecorded + 9: true} {
		a, ok := s2.state[fmt.Sprintf("uid-%03d/signal", i)]
		if ok != want || (ok && a.At.IsZero()) {
			t.Fatalf("answer %d kept %v (at %v), want kept %v", i, ok, a.At, want)
		}
	}
}

// TestUnreadableStateStartsAfresh: a state file left empty (a power cut
// while it was first written), cut short or "null" is moved aside and the
// endpoint starts with no recorded actions, then records and answers
// (before: the agent refused to start — every check down — or, on
// "null", the first request panicked holding the lock and every later one
// hung).
func TestUnreadableStateStartsAfresh(t *testing.T) {
	for name, content := range map[string]string{"empty": "", "cut short": `{"uid-1/signal":{"id":"uid-1/sig`, "null": "null"} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			log := filepath.Join(dir, "calls.log")
			cfg := DefaultConfig()
			k := newJanitorKey(t, dir, "janitor")
			cfg.StateFile, cfg.VerifyKeyFile = filepath.Join(dir, "state.json"), k.pubFile
			cfg.RebootCommand = []string{standIn(t, dir, "systemctl", log), "reboot"}
			if err := os.WriteFile(cfg.StateFile, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := New(cfg, testNode, testLog, nil)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if b, err := os.ReadFile(cfg.StateFile + ".corrupt"); err != nil || string(b) != content {
				t.Fatalf("the unreadable file not kept aside: %q, %v", b, err)
			}
			srv := httptest.NewServer(s.Handler())
			defer srv.Close()
			for range 2 {
				k.call(t, srv.URL, Request{ID: "uid-2/signal"})
			}
			if b, _ := os.ReadFile(log); strings.Count(string(b), "systemctl reboot") != 1 {
				t.Fatalf("reboot ran: %q, want once", b)
			}
			s2, err := New(cfg, testNode, testLog, nil)
			if err != nil || len(s2.state) != 1 {
				t.Fatalf("restarted: %v, %d answers recorded, want the reboot's", err, len(s2.state))
			}
		})
	}
}

// TestSlowActionsAnsweredInProgress: an action longer than the answer wait
// is answered in_progress (202) and asked for again with the same id; a
// second reset waits for the first (each command once, never
// overlapping); a reboot asked for during a reset runs at once (it resets
// every GPU; a stuck reset must not hold it back); a reset in progress
// when the agent stops is answered Interrupted after the restart and not
// run again.
func TestSlowActionsAnsweredInProgress(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "calls.log")
	slow := filepath.Join(dir, "slow")
	// A command runs until the test creates the release file: the steps
	// below happen while the commands run however slow the machine (a
	// fixed "sleep 1" ended under load before they were done).
	release := filepath.Join(dir, "release")
	script := "#!/bin/sh\necho \"start $*\" >> " + log + "\nwhile [ ! -e " + release + " ]; do sleep 0.02; done\necho \"end $*\" >> " + log + "\n"
	if err := os.WriteFile(slow, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	letGo := func() {
		if err := os.WriteFile(release, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = os.WriteFile(release, nil, 0o644) }) // no command left waiting
	cfg := DefaultConfig()
	cfg.CommandTimeout = 30 * time.Second // a test gone wrong does not wait 2m
	k := newJanitorKey(t, dir, "janitor")
	cfg.VerifyKeyFile = k.pubFile
	cfg.RebootCommand = []string{slow, "reboot"}
	cfg.GPUResetCommand = []string{slow, "reset", "{uuid}"}
	cfg.StateFile = filepath.Join(dir, "local-actions.json")
	start := func() (*Server, *httptest.Server) {
		s, err := New(cfg, testNode, testLog, nil)
		if err != nil {
			t.Fatal(err)
		}
		s.AnswerWait = 100 * time.Millisecond
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(srv.Close)
		return s, srv
	}
	s1, srv := start()
	const gpuA, gpuB = "GPU-00000000-0000-0000-0000-00000000000a", "GPU-00000000-0000-0000-0000-00000000000b"
	call := func(srv *httptest.Server, id, gpu string) (int, Answer) {
		t.Helper()
		req := Request{ID: id}
		if gpu != "" {
			req.GPUs = []string{gpu}
		}
		return k.call(t, srv.URL, req)
	}
	calls := func() []string { b, _ := os.ReadFile(log); return strings.Split(strings.TrimSpace(string(b)), "\n") }
	waitLogged := func(line string, n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); strings.Count(strings.Join(calls(), "\n")+"\n", line+"\n") < n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%q not logged %d times within 10s:\n%s", line, n, strings.Join(calls(), "\n"))
			}
		}
	}
	waitDone := func(id, gpu string) Answer {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			if _, a := call(srv, id, gpu); !a.InProgress {
				return a
			}
		}
		t.Fatalf("%s still in progress:\n%s", id, calls())
		return Answer{}
	}

	for _, step := range []struct {
		id, gpu    string
		code       int
		inProgress bool
		repeated   bool
	}{
		{"g1", gpuA, http.StatusAccepted, true, false}, // running
		{"g2", gpuB, http.StatusAccepted, true, false}, // waits for g1
		{"r1", "", http.StatusOK, false, false},        // recorded, its command started at once (reset A still runs)
		{"g1", gpuA, http.StatusAccepted, true, true},  // asked again
	} {
		if code, a := call(srv, step.id, step.gpu); code != step.code || a.InProgress != step.inProgress || a.Repeated != step.repeated {
			t.Fatalf("%s: %d %+v", step.id, code, a)
		}
	}
	letGo()
	if a := waitDone("g1", gpuA); !a.OK || !a.Repeated {
		t.Fatalf("g1: %+v", a)
	}
	if a := waitDone("g2", gpuB); !a.OK || !a.Repeated {
		t.Fatalf("g2: %+v", a)
	}
	at := func(line string) int {
		t.Helper()
		i := slices.Index(calls(), line)
		if i < 0 {
			t.Fatalf("%q never ran:\n%s", line, strings.Join(calls(), "\n"))
		}
		return i
	}
	waitLogged("end reboot", 1)
	if len(calls()) != 6 || at("start reboot") > at("end reset "+gpuA) || at("start reset "+gpuB) < at("end reset "+gpuA) {
		t.Fatalf("want each command once, the reboot during reset A, reset B after it:\n%s", strings.Join(calls(), "\n"))
	}
	waitIdle(t, s1)

	// The agent stops (restarts) while g3 resets.
	if err := os.Remove(release); err != nil {
		t.Fatal(err)
	}
	if _, a := call(srv, "g3", gpuA); !a.InProgress {
		t.Fatalf("g3: %+v", a)
	}
	_, srv2 := start()
	if _, a := call(srv2, "g3", gpuA); a.OK || a.InProgress || a.Reason != "Interrupted" || !a.Repeated {
		t.Fatalf("g3 after a restart: %+v", a)
	}
	letGo() // the first agent's command ends
	waitLogged("end reset "+gpuA, 2)
	waitIdle(t, s1)
	if n := strings.Count(strings.Join(calls(), "\n"), "start reset"); n != 3 {
		t.Fatalf("resets ran %d times, want 3 (g1, g2, g3 once):\n%s", n, strings.Join(calls(), "\n"))
	}
}

// waitIdle waits until no action of s runs (each one's answer recorded).
func waitIdle(t *testing.T, s *Server) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		n := len(s.running)
		s.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d actions still running after 10s", n)
		}
	}
}

// TestOnlyTheJanitorForThisNode: the endpoint serves only a request the
// janitor signed for this node, issued within max_clock_skew. Before, it
// took a bearer token that was the same on every node, so root on one node
// (a container escape) could reboot or reset every node of the fleet:
// each refused row here was served. Nothing refused runs a command.
func TestOnlyTheJanitorForThisNode(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "calls.log")
	janitor, other := newJanitorKey(t, dir, "janitor"), newJanitorKey(t, dir, "node-b")
	next := newJanitorKey(t, dir, "next") // rotation: both public keys listed
	rotated := filepath.Join(dir, "rotated.pub")
	a, _ := os.ReadFile(janitor.pubFile)
	b, _ := os.ReadFile(next.pubFile)
	if err := os.WriteFile(rotated, append(a, b...), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Listen, cfg.VerifyKeyFile, cfg.StateFile = "127.0.0.1:0", rotated, filepath.Join(dir, "state.json")
	cfg.RebootCommand = []string{standIn(t, dir, "systemctl", log), "reboot"}
	cfg.GPUResetCommand = []string{standIn(t, dir, "nvidia-smi", log), "-r", "-i", "{uuid}"}
	if err := cfg.Validate("local_actions."); err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, testNode, testLog, nil)
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	s.now = func() time.Time { return clock }
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	calls := func() string { b, _ := os.ReadFile(log); return string(b) }
	const g = "GPU-00000000-0000-0000-0000-00000000000a"
	body := func(id, node, action string, issued time.Time, gpus ...string) string {
		b, _ := json.Marshal(Request{ID: id, Node: node, Action: action, Issued: issued, GPUs: gpus})
		return string(b)
	}
	resetBody := body("g-signed", testNode, ActionGPUReset, clock, g)
	for _, tc := range []struct {
		name, path, body, auth string
		key                    janitorKey
		code                   int
		reason, want           string
	}{
		{"the token every node held", "/v1/local/reboot", body("r1", testNode, ActionReboot, clock), "Bearer agent-token", janitor, 401, "Unauthorized", "not a signed request"},
		{"nothing", "/v1/local/reboot", body("r2", testNode, ActionReboot, clock), " ", janitor, 401, "Unauthorized", "not a signed request"},
		{"not a signature", "/v1/local/reboot", body("r3", testNode, ActionReboot, clock), AuthScheme + " c2lnbmF0dXJl", janitor, 401, "Unauthorized", "not a base64 Ed25519 signature"},
		{"a node's own key", "/v1/local/reboot", body("r4", testNode, ActionReboot, clock), "", other, 401, "Unauthorized", "made by no key of local_actions.verify_key_file"},
		{"signed for another node", "/v1/local/reboot", body("r5", "node-b", ActionReboot, clock), "", janitor, 403, "WrongNode", `the request is for node "node-b", this agent is node "node-a"`},
		{"issued 6m ago", "/v1/local/reboot", body("r6", testNode, ActionReboot, clock.Add(-6*time.Minute)), "", janitor, 403, "Expired", "issued: 2026-03-01T09:54:00Z, further than max_clock_skew 5m0s"},
		{"issued 6m ahead", "/v1/local/reboot", body("r7", testNode, ActionReboot, clock.Add(6*time.Minute)), "", janitor, 403, "Expired", "further than max_clock_skew"},
		{"a reset's signature on the reboot path", "/v1/local/reboot", resetBody, Sign(janitor.priv, http.MethodPost, "/v1/local/gpu-reset", []byte(resetBody)), janitor, 401, "Unauthorized", "or over another method, path or body"},
		{"a body changed after signing (every GPU)", "/v1/local/gpu-reset", body("g-signed", testNode, ActionGPUReset, clock), Sign(janitor.priv, http.MethodPost, "/v1/local/gpu-reset", []byte(resetBody)), janitor, 401, "Unauthorized", "or over another method, path or body"},
		{"signed for this node, 4m skew", "/v1/local/reboot", body("r8", testNode, ActionReboot, clock.Add(-4*time.Minute)), "", janitor, 200, "", "reboot started"},
		{"the rotated-in key", "/v1/local/gpu-reset", body("g9", testNode, ActionGPUReset, clock.Add(4*time.Minute), g), "", next, 200, "", "reset " + g},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := calls()
			code, a := tc.key.post(t, srv.URL, tc.path, tc.body, tc.auth)
			if code != tc.code || a.Reason != tc.reason || !strings.Contains(a.Message, tc.want) {
				t.Fatalf("%d %+v, want %d %s %q", code, a, tc.code, tc.reason, tc.want)
			}
			if ran := strings.TrimPrefix(calls(), before); (ran != "") != (tc.code == 200) {
				t.Fatalf("answered %d and ran %q", code, ran)
			}
		})
	}
}

// podsHook is a PodLister that calls f (a GPU reset asks it after the
// request's in-progress record is written, before the reset).
type podsHook func()

func (f podsHook) PodsOf(context.Context, []string) ([]string, error) { f(); return nil, nil }

// TestFailedStateWriteRunsOnRetry: a request whose in-progress record
// cannot be written (a full or read-only disk) is answered
// StateNotRecorded and leaves nothing behind: asked again once the file
// can be written, its action runs, once, and a restart reads it done.
// Before, the id stayed in memory in progress with nothing running: every
// retry was answered 202 in_progress (the janitor waited for a reboot
// that never came) and the next write saved it, Interrupted after a
// restart. An action whose answer cannot be written is still answered
// from memory, never in progress for ever.
func TestFailedStateWriteRunsOnRetry(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "calls.log")
	cfg := DefaultConfig()
	k := newJanitorKey(t, dir, "janitor")
	cfg.VerifyKeyFile = k.pubFile
	cfg.RebootCommand = []string{standIn(t, dir, "systemctl", log), "reboot"}
	cfg.GPUResetCommand = []string{standIn(t, dir, "nvidia-smi", log), "-r", "-i", "{uuid}"}
	cfg.StateFile = filepath.Join(dir, "state", "local-actions.json")
	// A directory where the state file goes fails its write (rename over
	// a directory) as root too, which file modes would not; mend puts the
	// file back as it was (saved under mu: a reset's action breaks it).
	var (
		mu    sync.Mutex
		saved []byte
	)
	breakState := func() {
		mu.Lock()
		defer mu.Unlock()
		saved, _ = os.ReadFile(cfg.StateFile)
		if err := os.RemoveAll(cfg.StateFile); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(cfg.StateFile, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mend := func() {
		mu.Lock()
		defer mu.Unlock()
		if err := os.Remove(cfg.StateFile); err != nil {
			t.Fatal(err)
		}
		if saved != nil {
			if err := os.WriteFile(cfg.StateFile, saved, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	var breakOnReset atomic.Bool
	s, err := New(cfg, testNode, testLog, podsHook(func() {
		// Once: pod-resources is asked again before each GPU's reset.
		if breakOnReset.CompareAndSwap(true, false) {
			breakState()
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	calls := func(cmd string) int { b, _ := os.ReadFile(log); return strings.Count(string(b), cmd) }

	breakState()
	for i := range 2 {
		if code, a := k.call(t, srv.URL, Request{ID: "r1"}); code != 200 || a.OK || a.InProgress || a.Repeated || a.Reason != "StateNotRecorded" {
			t.Fatalf("reboot %d, the state file unwritable: %d %+v, want StateNotRecorded", i+1, code, a)
		}
	}
	mend()
	if code, a := k.call(t, srv.URL, Request{ID: "r1"}); code != 200 || !a.OK || a.Repeated {
		t.Fatalf("reboot asked again, the state file writable: %d %+v", code, a)
	}
	if n := calls("systemctl reboot"); n != 1 {
		t.Fatalf("reboot ran %d times, want once", n)
	}

	// The reset's answer cannot be written: answered from memory; the file
	// still says in progress, Interrupted after a restart (not run again).
	const g = "GPU-00000000-0000-0000-0000-00000000000a"
	breakOnReset.Store(true)
	if _, a := k.call(t, srv.URL, Request{ID: "g1", GPUs: []string{g}}); !a.OK || a.Repeated {
		t.Fatalf("reset, its answer unwritable: %+v", a)
	}
	breakOnReset.Store(false)
	if _, a := k.call(t, srv.URL, Request{ID: "g1", GPUs: []string{g}}); !a.OK || !a.Repeated {
		t.Fatalf("reset asked again: %+v", a)
	}
	mend()

	s2, err := New(cfg, testNode, testLog, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a := s2.state["r1"]; !a.OK {
		t.Fatalf("r1 after a restart: %+v, want the reboot's OK", a)
	}
	if a := s2.state["g1"]; a.Reason != "Interrupted" {
		t.Fatalf("g1 after a restart: %+v, want Interrupted", a)
	}
	if n := calls("nvidia-smi -r -i " + g); n != 1 {
		t.Fatalf("reset ran %d times, want once", n)
	}
}

// TestSlowClientsBounded: the endpoint (any pod can reach it) bounds what
// a client that never finishes its request holds: the whole request must
// arrive within the read timeout (before, only the headers had to: a
// client that sent a Content-Length and stalled held its connection, its
// buffers and a goroutine for ever, and thousands of them the agent's
// memory), headers and body are capped, and past maxConns a connection
// waits for one to end; a signed request still gets through once one has.
func TestSlowClientsBounded(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig()
	k := newJanitorKey(t, dir, "janitor")
	cfg.VerifyKeyFile, cfg.StateFile = k.pubFile, filepath.Join(dir, "state.json")
	cfg.RebootCommand = []string{standIn(t, dir, "systemctl", filepath.Join(dir, "calls.log")), "reboot"}
	s, err := New(cfg, testNode, testLog, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.readTimeout, s.maxConns = 500*time.Millisecond, 2
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.serveOn(ctx, ln) }()
	defer func() {
		cancel()
		<-served
	}()
	addr := ln.Addr().String()
	// stall sends the start of a request and returns its connection.
	stall := func(head string) net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, head); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// answer reads what the server sends until it closes the connection
	// (a reset too: it closed with bytes unread), failing when that takes
	// past within.
	answer := func(t *testing.T, c net.Conn, within time.Duration) string {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(within))
		b, err := io.ReadAll(c)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("connection still open after %v (%v); read %q", within, err, b)
		}
		return string(b)
	}
	const stalledBody = "POST /v1/local/reboot HTTP/1.1\r\nHost: agent\r\nContent-Length: 60000\r\n\r\n{\"id\":"
	for _, tc := range []struct{ name, head, want string }{
		{"a body that stalls", stalledBody, "HTTP/1.1 400"},
		{"a body over maxBody", "POST /v1/local/reboot HTTP/1.1\r\nHost: agent\r\nConnection: close\r\nContent-Length: 70000\r\n\r\n" + strings.Repeat("x", 70000), "HTTP/1.1 400"},
		{"headers over maxHeaderBytes", "POST /v1/local/reboot HTTP/1.1\r\nHost: agent\r\nX-Pad: " + strings.Repeat("x", 32<<10) + "\r\n\r\n", "HTTP/1.1 431"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := answer(t, stall(tc.head), 5*time.Second); !strings.HasPrefix(got, tc.want) {
				t.Fatalf("answered %.80q, want %s", got, tc.want)
			}
		})
	}

	// maxConns stalled clients: the janitor's request waits for one to
	// time out, then is served.
	began := time.Now()
	for range s.maxConns {
		stall(stalledBody)
	}
	b, _ := json.Marshal(Request{ID: "r1", Node: testNode, Action: ActionReboot, Issued: time.Now()})
	if code, a := k.post(t, "http://"+addr, "/v1/local/reboot", string(b), ""); code != 200 || !a.OK {
		t.Fatalf("the janitor's request: %d %+v", code, a)
	}
	if took := time.Since(began); took < s.readTimeout/2 {
		t.Fatalf("served after %v, with %d connections stalled: no connection limit", took, s.maxConns)
	}
}

// TestStateFileNotReadable: a state file that exists but cannot be read
// (EACCES, EIO; here a directory, or a path through a file, which fail as
// root too) stops New with an error naming it, and is left as it is: its
// answers may be intact. Before, the agent started with none recorded and
// its next write renamed over the file, so a repeated reboot or reset id
// ran again. (A file read but not parsed is moved aside and the agent
// starts afresh: TestUnreadableStateStartsAfresh.)
func TestStateFileNotReadable(t *testing.T) {
	for _, tc := range []struct {
		name string
		make func(t *testing.T, dir string) string // the state file's path
		want string
	}{
		{"a directory", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "local-actions.json")
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
			return p
		}, "is a directory"},
		{"under a file", func(t *testing.T, dir string) string {
			if err := os.WriteFile(filepath.Join(dir, "state"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(dir, "state", "local-actions.json")
		}, "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := DefaultConfig()
			cfg.StateFile = tc.make(t, dir)
			s, err := New(cfg, testNode, testLog, nil)
			if err == nil || !strings.Contains(err.Error(), "local_actions.state_file") || !strings.Contains(err.Error(), cfg.StateFile) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v (server %v), want an error naming %s: %s", err, s != nil, cfg.StateFile, tc.want)
			}
			if _, err := os.Stat(cfg.StateFile + ".corrupt"); err == nil {
				t.Fatal("moved aside")
			}
		})
	}
}

// TestNvidiaSMIWarningExit: nvidia-smi's warning exit (14, infoROM
// corrupted: topology.SMIWarningExit) after listing the GPUs, or after a
// reset, is no failure: both GPUs are reset. It failed the GPUReset
// ("list GPUs: exit status 14") and remediate escalated the node. Exit 14
// of a command that is not nvidia-smi, or a warning with no GPU listed,
// still fails.
func TestNvidiaSMIWarningExit(t *testing.T) {
	const gpuA, gpuB = "GPU-00000000-0000-0000-0000-000000000001", "GPU-00000000-0000-0000-0000-000000000002"
	for _, tc := range []struct {
		name, program, list string
		gpus                []string
		want                string // "" OK, else the Reason and a part of the message
	}{
		{"list and resets warn", "nvidia-smi", gpuA + `\nWARNING: infoROM is corrupted at gpu 0000:18:00.0\n` + gpuB + `\n`, nil, ""},
		{"named GPU's reset warns", "nvidia-smi", "", []string{gpuB}, ""},
		{"warning, nothing listed", "nvidia-smi", `WARNING: infoROM is corrupted at gpu 0000:18:00.0\n`, nil, "CommandFailed: listed none (exit status 14)"},
		{"not nvidia-smi", "gpu-tool", gpuA + `\n` + gpuB + `\n`, nil, "CommandFailed: list GPUs: exit status 14"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			log := filepath.Join(dir, "calls.log")
			prog := filepath.Join(dir, tc.program)
			script := "#!/bin/sh\necho \"$*\" >> " + log + "\n[ \"$1\" = \"--query-gpu=uuid\" ] && printf '" + tc.list + "'\n" +
				"echo 'WARNING: infoROM is corrupted at gpu 0000:18:00.0' >&2\nexit 14\n"
			if err := os.WriteFile(prog, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			cfg := DefaultConfig()
			cfg.GPUResetCommand = []string{prog, "-r", "-i", "{uuid}"}
			cfg.GPUListCommand = []string{prog, "--query-gpu=uuid", "--format=csv,noheader"}
			cfg.StateFile = filepath.Join(dir, "state.json")
			s, err := New(cfg, testNode, testLog, &pods{})
			if err != nil {
				t.Fatal(err)
			}
			a := s.gpuReset(context.Background(), Request{ID: "w1", Action: ActionGPUReset, GPUs: tc.gpus})
			calls, _ := os.ReadFile(log)
			if tc.want != "" {
				reason, msg, _ := strings.Cut(tc.want, ": ")
				if a.OK || a.Reason != reason || !strings.Contains(a.Message, msg) || strings.Contains(string(calls), "-r -i") {
					t.Fatalf("%+v, want %s; calls:\n%s", a, tc.want, calls)
				}
				return
			}
			want := tc.gpus
			if want == nil {
				want = []string{gpuA, gpuB}
			}
			if !a.OK || a.Message != "reset "+strings.Join(want, ",") {
				t.Fatalf("%+v, want OK reset of %v; calls:\n%s", a, want, calls)
			}
			for _, g := range want {
				if !strings.Contains(string(calls), "-r -i "+g) {
					t.Fatalf("%s not reset; calls:\n%s", g, calls)
				}
			}
		})
	}
}

// podsOf answers PodsOf from a function of the GPUs asked about.
type podsOf func(gpus []string) ([]string, error)

func (f podsOf) PodsOf(_ context.Context, gpus []string) ([]string, error) { return f(gpus) }

// TestGPUResetChecksPodsBeforeEachGPU: pod-resources is asked right
// before each GPU's reset, not once before all: a pod that takes the
// second GPU while the first is reset stops its reset (GPUInUse). And a
// pod-resources that cannot be read refuses the reset, never resets
// blind.
func TestGPUResetChecksPodsBeforeEachGPU(t *testing.T) {
	const gpuA, gpuB = "GPU-00000000-0000-0000-0000-00000000000a", "GPU-00000000-0000-0000-0000-00000000000b"
	dir := t.TempDir()
	log := filepath.Join(dir, "calls.log")
	smi := standIn(t, dir, "nvidia-smi", log)
	cfg := DefaultConfig()
	cfg.GPUResetCommand = []string{smi, "-r", "-i", "{uuid}"}
	cfg.StateFile = filepath.Join(dir, "state.json")
	cfg.PodsGoneTimeout = 1200 * time.Millisecond
	calls := func() string { b, _ := os.ReadFile(log); return string(b) }
	for _, tc := range []struct {
		name  string
		pods  func(resets string, gpus []string) ([]string, error)
		want  string // the message's part
		reset []string
	}{
		{"pod takes the second GPU during the first's reset", func(resets string, gpus []string) ([]string, error) {
			if strings.Contains(resets, gpuA) && slices.Contains(gpus, gpuB) {
				return []string{"ml/train-9"}, nil
			}
			return nil, nil
		}, gpuB + ": pods still hold the GPUs after 1.2s: ml/train-9 (after 1 done: " + gpuA + ")", []string{gpuA}},
		{"pod-resources unreadable", func(string, []string) ([]string, error) {
			return nil, errors.New("kubelet pod resources: connection refused")
		}, "pod-resources unreadable for 1.2s, so which pods hold the GPUs is not known: kubelet pod resources: connection refused", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(log)
			s, err := New(cfg, testNode, testLog, podsOf(func(gpus []string) ([]string, error) { return tc.pods(calls(), gpus) }))
			if err != nil {
				t.Fatal(err)
			}
			a := s.gpuReset(context.Background(), Request{ID: "p1", Action: ActionGPUReset, GPUs: []string{gpuA, gpuB}})
			if a.OK || a.Reason != "GPUInUse" || !strings.Contains(a.Message, tc.want) {
				t.Fatalf("%+v, want GPUInUse %q", a, tc.want)
			}
			for _, g := range []string{gpuA, gpuB} {
				if got, want := strings.Contains(calls(), "-i "+g), slices.Contains(tc.reset, g); got != want {
					t.Fatalf("%s reset %v, want %v; calls:\n%s", g, got, want, calls())
				}
			}
		})
	}
}

// TestKeepAliveClientsDoNotHoldTheSlots: a connection is closed after its
// answer. Before, a refused request (401 for an unsigned body) left its
// connection open for the next, idle up to idleTimeout: maxConns clients
// each asking again within it held every slot, and the janitor's signed
// reboot waited until it timed out (the node never remediated).
func TestKeepAliveClientsDoNotHoldTheSlots(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig()
	k := newJanitorKey(t, dir, "janitor")
	cfg.VerifyKeyFile, cfg.StateFile = k.pubFile, filepath.Join(dir, "state.json")
	cfg.RebootCommand = []string{standIn(t, dir, "systemctl", filepath.Join(dir, "calls.log")), "reboot"}
	s, err := New(cfg, testNode, testLog, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.readTimeout, s.maxConns = 500*time.Millisecond, 2
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.serveOn(ctx, ln) }()
	url := "http://" + ln.Addr().String()

	// maxConns keep-alive clients, each asking unsigned again and again.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var refused atomic.Int32
	for range s.maxConns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}, Timeout: 5 * time.Second}
			defer c.CloseIdleConnections()
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				resp, err := c.Post(url+"/v1/local/reboot", "application/json", strings.NewReader("{}"))
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusUnauthorized {
					refused.Add(1)
				}
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
		cancel()
		<-served
	}()
	for deadline := time.Now().Add(5 * time.Second); refused.Load() < int32(2*s.maxConns); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the clients were refused %d times in 5s", refused.Load())
		}
	}

	path := "/v1/local/reboot"
	body, _ := json.Marshal(Request{ID: "r1", Node: testNode, Action: ActionReboot, Issued: time.Now()})
	hr, _ := http.NewRequest(http.MethodPost, url+path, strings.NewReader(string(body)))
	hr.Header.Set("Authorization", Sign(k.priv, http.MethodPost, path, body))
	janitor := &http.Client{Transport: &http.Transport{}, Timeout: s.readTimeout + 3*time.Second}
	resp, err := janitor.Do(hr)
	if err != nil {
		t.Fatalf("the janitor's request, with %d keep-alive clients asking: %v", s.maxConns, err)
	}
	defer resp.Body.Close()
	var a Answer
	_ = json.NewDecoder(resp.Body).Decode(&a)
	if resp.StatusCode != 200 || !a.OK {
		t.Fatalf("the janitor's request: %d %+v", resp.StatusCode, a)
	}
}

// TestCommandTimeoutEndsTheReset: a reset command whose child outlives it
// holding its output (a wrapper, sh or nsenter, around an nvidia-smi -r
// hung on a wedged GPU) is answered CommandFailed once command_timeout
// has passed, and the next reset runs. Before, only the direct child was
// killed and the output waited for as long as the grandchild held it: no
// answer, and every later reset on the node in progress behind the lock.
func TestCommandTimeoutEndsTheReset(t *testing.T) {
	const gpuA, gpuB = "GPU-00000000-0000-0000-0000-00000000000a", "GPU-00000000-0000-0000-0000-00000000000b"
	dir := t.TempDir()
	log := filepath.Join(dir, "calls.log")
	reset := filepath.Join(dir, "reset")
	// The hang: a child that keeps stdout and stderr for 30s, the script
	// waiting for it; GPU b's reset is done at once.
	script := "#!/bin/sh\necho \"reset $1\" >> " + log + "\n[ \"$1\" = " + gpuB + " ] && exit 0\nsleep 30 &\nwait\n"
	if err := os.WriteFile(reset, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		list []string // the GPU list command; nil: the GPU named
	}{
		{"reset hangs", nil},
		{"list hangs", []string{"/bin/sh", "-c", "sleep 30 & wait"}},
		// Outside the process group, not killed: its output is left.
		{"list's child leaves the group", []string{"/bin/sh", "-c", "setsid sleep 10 & wait"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.GPUResetCommand = []string{reset, "{uuid}"}
			cfg.StateFile = filepath.Join(t.TempDir(), "state.json")
			cfg.CommandTimeout = time.Second
			s, err := New(cfg, testNode, testLog, &pods{})
			if err != nil {
				t.Fatal(err)
			}
			gpus := []string{gpuA}
			if tc.list != nil {
				s.cfg.GPUListCommand, gpus = tc.list, nil
			}
			answered := make(chan Answer, 1)
			began := time.Now()
			go func() {
				answered <- s.gpuReset(context.Background(), Request{ID: "h1", Action: ActionGPUReset, GPUs: gpus})
			}()
			within := cfg.CommandTimeout + commandWaitDelay + 3*time.Second
			select {
			case a := <-answered:
				if a.OK || a.Reason != "CommandFailed" || !strings.Contains(a.Message, "did not exit within command_timeout 1s") {
					t.Fatalf("%+v, want CommandFailed: did not exit within command_timeout", a)
				}
				t.Logf("answered after %v: %s", time.Since(began), a.Message)
			case <-time.After(within):
				t.Fatalf("no answer %v after the reset began (command_timeout %v)", within, cfg.CommandTimeout)
			}
			// The lock is free: the next reset runs.
			next := make(chan Answer, 1)
			go func() {
				next <- s.gpuReset(context.Background(), Request{ID: "h2", Action: ActionGPUReset, GPUs: []string{gpuB}})
			}()
			select {
			case a := <-next:
				if !a.OK {
					t.Fatalf("next reset: %+v", a)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the next reset did not run: the reset lock is still held")
			}
		})
	}
}

// allocations answers PodsOf from a pod-resources listing, as the agent's
// PodLister does.
type allocations podres.Allocations

func (a allocations) PodsOf(_ context.Context, gpus []string) ([]string, error) {
	pods, _ := podres.Allocations(a).Pods(gpus)
	return pods, nil
}

// TestGPUUUIDCase: a GPUReset may name a GPU with upper-case hex (its
// selector accepts either); the device plugin and NVML write lower case.
// The reset is refused while a pod holds the GPU, whatever the case.
// Before, the upper-case UUID found no pod, and the GPU was reset under
// the pod.
func TestGPUUUIDCase(t *testing.T) {
	const lower, upper = "GPU-abcdef01-2345-6789-abcd-ef0123456789", "GPU-ABCDEF01-2345-6789-ABCD-EF0123456789"
	dir := t.TempDir()
	log := filepath.Join(dir, "calls.log")
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	k := newJanitorKey(t, dir, "janitor")
	cfg.VerifyKeyFile = k.pubFile
	smi := standIn(t, dir, "nvidia-smi", log)
	cfg.GPUResetCommand = []string{smi, "-r", "-i", "{uuid}"}
	cfg.GPUListCommand = []string{"/bin/echo", upper}
	cfg.StateFile = filepath.Join(dir, "state.json")
	cfg.PodsGoneTimeout = 100 * time.Millisecond
	held := podres.FromList(&podresv1.ListPodResourcesResponse{PodResources: []*podresv1.PodResources{
		podrestest.Pod("ml", "train-0", "nvidia.com/gpu", lower)}}, time.Now())
	s, err := New(cfg, testNode, testLog, allocations(held))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	for _, tc := range []struct {
		name string
		gpus []string
	}{
		{"named in upper case", []string{upper}},
		{"listed in upper case", []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := Request{ID: "c-" + strings.ReplaceAll(tc.name, " ", "-"), Action: ActionGPUReset, GPUs: tc.gpus}
			var a Answer
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				if _, a = k.call(t, srv.URL, req); !a.InProgress || time.Now().After(deadline) {
					break
				}
			}
			if a.OK || a.Reason != "GPUInUse" || !strings.Contains(a.Message, "ml/train-0") {
				t.Fatalf("%+v, want GPUInUse naming ml/train-0", a)
			}
			if b, _ := os.ReadFile(log); len(b) > 0 {
				t.Fatalf("reset a GPU a pod holds:\n%s", b)
			}
		})
	}
}
