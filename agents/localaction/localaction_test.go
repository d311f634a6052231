package localaction

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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
	cfg.TokenFile = filepath.Join(dir, "token")
	if err := os.WriteFile(cfg.TokenFile, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
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
	s, err := New(cfg, testLog, p)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	call := func(path, token string, req Request) (int, Answer) {
		t.Helper()
		b, _ := json.Marshal(req)
		hr, _ := http.NewRequest(http.MethodPost, srv.URL+path, bytes.NewReader(b))
		hr.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var a Answer
		_ = json.NewDecoder(resp.Body).Decode(&a)
		return resp.StatusCode, a
	}
	calls := func() string { b, _ := os.ReadFile(log); return string(b) }

	if code, _ := call("/v1/local/reboot", "wrong", Request{ID: "r1"}); code != http.StatusUnauthorized {
		t.Fatalf("wrong token: %d", code)
	}
	if code, a := call("/v1/local/reboot", "tok", Request{ID: "r1"}); code != 200 || !a.OK || a.Repeated {
		t.Fatalf("reboot: %d %+v", code, a)
	}
	if code, a := call("/v1/local/reboot", "tok", Request{ID: "r1"}); code != 200 || !a.OK || !a.Repeated {
		t.Fatalf("repeated reboot: %d %+v", code, a)
	}
	if got := strings.Count(calls(), "systemctl reboot"); got != 1 {
		t.Fatalf("reboot command ran %d times:\n%s", got, calls())
	}
	// The record survives the agent (and the node) restarting.
	s2, err := New(cfg, testLog, p)
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = s2.Handler()
	if _, a := call("/v1/local/reboot", "tok", Request{ID: "r1"}); !a.Repeated || strings.Count(calls(), "systemctl reboot") != 1 {
		t.Fatalf("after a restart: %+v\n%s", a, calls())
	}

	// GPU reset: waits for the pods, resets each GPU once.
	p.busy.Store(2)
	g := "GPU-00000000-0000-0000-0000-00000000000a"
	if _, a := call("/v1/local/gpu-reset", "tok", Request{ID: "g1", GPUs: []string{g}}); !a.OK {
		t.Fatalf("gpu reset: %+v", a)
	}
	if p.busy.Load() >= 0 || !strings.Contains(calls(), "nvidia-smi -r -i "+g) {
		t.Fatalf("reset before the pods were gone, or not at all:\n%s", calls())
	}
	// Every GPU: listed by the GPU list command.
	if _, a := call("/v1/local/gpu-reset", "tok", Request{ID: "g2"}); !a.OK || !strings.Contains(calls(), "-i GPU-00000000-0000-0000-0000-000000000002") {
		t.Fatalf("all GPUs: %+v\n%s", a, calls())
	}
	// Failures.
	if _, a := call("/v1/local/gpu-reset", "tok", Request{ID: "g3", GPUs: []string{"GPU-00000000-dead-0000-0000-000000000000"}}); a.OK || a.Reason != "CommandFailed" {
		t.Fatalf("failing reset: %+v", a)
	}
	p.busy.Store(1 << 20)
	s2.cfg.PodsGoneTimeout = 1500 * time.Millisecond
	if _, a := call("/v1/local/gpu-reset", "tok", Request{ID: "g4", GPUs: []string{g}}); a.OK || a.Reason != "GPUInUse" || !strings.Contains(a.Message, "ml/train-0") {
		t.Fatalf("GPU in use: %+v", a)
	}
	// Bad requests say what is wrong and run nothing.
	before := calls()
	for _, tc := range []struct{ path, body, want string }{
		{"/v1/local/gpu-reset", `{"id":"g6","gpu":["` + g + `"]}`, `body: json: unknown field "gpu"`}, // not every GPU
		{"/v1/local/gpu-reset", `{"gpus":["` + g + `"]}`, "id: required"},
		{"/v1/local/gpu-reset", `{"id":"g7","gpus":"` + g + `"}`, "body: json: cannot unmarshal string"},
		{"/v1/local/gpu-reset", `{"id":"g5","gpus":["0"]}`, `gpus: "0" is not a GPU UUID`},
		{"/v1/local/gpu-reset", `{"id":"` + strings.Repeat("x", maxID+1) + `"}`, "id: 257 bytes, at most 256"},
		{"/v1/local/reboot", `{"id":"r9","gpus":["` + g + `"]}`, "gpus: a reboot takes none"},
		{"/v1/local/reboot", `{"id":"r\u0000\u001b[31m"}`, `id: "r\x00\x1b[31m" has a character outside ^[A-Za-z0-9._:/-]+$`},
	} {
		hr, _ := http.NewRequest(http.MethodPost, srv.URL+tc.path, strings.NewReader(tc.body))
		hr.Header.Set("Authorization", "Bearer tok")
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		var a Answer
		_ = json.NewDecoder(resp.Body).Decode(&a)
		resp.Body.Close()
		if resp.StatusCode != 400 || a.Reason != "InvalidRequest" || !strings.Contains(a.Message, tc.want) {
			t.Errorf("%s %s: %d %+v, want 400 InvalidRequest %q", tc.path, tc.body, resp.StatusCode, a, tc.want)
		}
	}
	if calls() != before {
		t.Fatalf("a bad request ran a command:\n%s", strings.TrimPrefix(calls(), before))
	}
	// A GPU list that is not one UUID a line resets nothing.
	s2.cfg.GPUListCommand = []string{"/bin/echo", "No devices were found"}
	if _, a := call("/v1/local/gpu-reset", "tok", Request{ID: "g8"}); a.Reason != "CommandFailed" || !strings.Contains(a.Message, `line 1 "No devices were found" is not a GPU UUID`) {
		t.Fatalf("bad GPU list: %+v", a)
	}
	if calls() != before {
		t.Fatalf("a bad GPU list ran a reset:\n%s", strings.TrimPrefix(calls(), before))
	}
}

func TestValidateNamesTheBadKey(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("tok"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		set  func(*Config)
		want string
	}{
		{"ok", func(*Config) {}, ""},
		{"no token", func(c *Config) { c.TokenFile = "" }, "local_actions.token_file: required"},
		{"token missing", func(c *Config) { c.TokenFile = tok + ".gone" }, "local_actions.token_file: "},
		{"empty list command", func(c *Config) { c.GPUListCommand = nil }, "local_actions.gpu_list_command: want the program and its arguments, got []"},
		{"empty program", func(c *Config) { c.RebootCommand = []string{""} }, `local_actions.reboot_command: want the program and its arguments, got [""]`},
		{"no {uuid}", func(c *Config) { c.GPUResetCommand = []string{"nvidia-smi", "-r"} }, "local_actions.gpu_reset_command: must name {uuid}"},
		{"no state file", func(c *Config) { c.StateFile = "" }, "local_actions.state_file: must not be empty"},
		{"pods gone", func(c *Config) { c.PodsGoneTimeout = 0 }, "local_actions.pods_gone_timeout: must be positive, got 0s"},
		{"command timeout", func(c *Config) { c.CommandTimeout = -5 * time.Second }, "local_actions.command_timeout: must be positive, got -5s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Listen, c.TokenFile = "127.0.0.1:0", tok
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
	s, err := New(cfg, testLog, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range maxRecorded + 10 {
		if err := s.record(&Answer{ID: fmt.Sprintf("uid-%03d/signal", i), OK: true}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Microsecond) // distinct times
	}
	s2, err := New(cfg, testLog, nil)
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
			cfg.StateFile, cfg.TokenFile = filepath.Join(dir, "state.json"), filepath.Join(dir, "token")
			cfg.RebootCommand = []string{standIn(t, dir, "systemctl", log), "reboot"}
			if err := os.WriteFile(cfg.TokenFile, []byte("tok"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(cfg.StateFile, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := New(cfg, testLog, nil)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if b, err := os.ReadFile(cfg.StateFile + ".corrupt"); err != nil || string(b) != content {
				t.Fatalf("the unreadable file not kept aside: %q, %v", b, err)
			}
			srv := httptest.NewServer(s.Handler())
			defer srv.Close()
			client := &http.Client{Timeout: 5 * time.Second}
			for try := range 2 {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/local/reboot", strings.NewReader(`{"id":"uid-2/signal"}`))
				req.Header.Set("Authorization", "Bearer tok")
				resp, err := client.Do(req)
				if err != nil {
					t.Fatalf("request %d: %v", try, err)
				}
				resp.Body.Close()
			}
			if b, _ := os.ReadFile(log); strings.Count(string(b), "systemctl reboot") != 1 {
				t.Fatalf("reboot ran: %q, want once", b)
			}
			s2, err := New(cfg, testLog, nil)
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
	script := "#!/bin/sh\necho \"start $*\" >> " + log + "\nsleep 1\necho \"end $*\" >> " + log + "\n"
	if err := os.WriteFile(slow, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.TokenFile = filepath.Join(dir, "token")
	if err := os.WriteFile(cfg.TokenFile, []byte("tok"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.RebootCommand = []string{slow, "reboot"}
	cfg.GPUResetCommand = []string{slow, "reset", "{uuid}"}
	cfg.StateFile = filepath.Join(dir, "local-actions.json")
	start := func() *httptest.Server {
		s, err := New(cfg, testLog, nil)
		if err != nil {
			t.Fatal(err)
		}
		s.AnswerWait = 100 * time.Millisecond
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(srv.Close)
		return srv
	}
	srv := start()
	const gpuA, gpuB = "GPU-00000000-0000-0000-0000-00000000000a", "GPU-00000000-0000-0000-0000-00000000000b"
	call := func(srv *httptest.Server, id, gpu string) (int, Answer) {
		t.Helper()
		path, req := "/v1/local/reboot", Request{ID: id}
		if gpu != "" {
			path, req.GPUs = "/v1/local/gpu-reset", []string{gpu}
		}
		b, _ := json.Marshal(req)
		hr, _ := http.NewRequest(http.MethodPost, srv.URL+path, bytes.NewReader(b))
		hr.Header.Set("Authorization", "Bearer tok")
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var a Answer
		if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, a
	}
	calls := func() []string { b, _ := os.ReadFile(log); return strings.Split(strings.TrimSpace(string(b)), "\n") }
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
		{"r1", "", http.StatusOK, false, false},        // recorded, its command started at once
		{"g1", gpuA, http.StatusAccepted, true, true},  // asked again
	} {
		began := time.Now()
		code, a := call(srv, step.id, step.gpu)
		if code != step.code || a.InProgress != step.inProgress || a.Repeated != step.repeated || time.Since(began) > 900*time.Millisecond {
			t.Fatalf("%s: %d %+v after %v", step.id, code, a, time.Since(began))
		}
	}
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
	if len(calls()) != 6 || at("start reboot") > at("end reset "+gpuA) || at("start reset "+gpuB) < at("end reset "+gpuA) {
		t.Fatalf("want each command once, the reboot during reset A, reset B after it:\n%s", strings.Join(calls(), "\n"))
	}

	// The agent stops (restarts) while g3 resets.
	if _, a := call(srv, "g3", gpuA); !a.InProgress {
		t.Fatalf("g3: %+v", a)
	}
	srv2 := start()
	if _, a := call(srv2, "g3", gpuA); a.OK || a.InProgress || a.Reason != "Interrupted" || !a.Repeated {
		t.Fatalf("g3 after a restart: %+v", a)
	}
	time.Sleep(1200 * time.Millisecond) // the first agent's command ends
	if n := strings.Count(strings.Join(calls(), "\n"), "start reset"); n != 3 {
		t.Fatalf("resets ran %d times, want 3 (g1, g2, g3 once):\n%s", n, strings.Join(calls(), "\n"))
	}
}
