// Package localaction is the faultline agent's local action endpoint: the
// janitor (processors/janitor, provider "local") asks the agent on a node
// to reboot the node or reset some of its GPUs, and the agent carries it
// out with configurable commands (default `systemctl reboot`, through
// systemd/logind, and `nvidia-smi -r -i <uuid>`), confirming back.
//
// A GPU is reset only once no pod holds it (the kubelet's pod-resources
// API, asked right before each GPU's reset; the drain evicted them): a
// pod-resources that cannot be read refuses the reset. Every request carries an id; the agent
// records it in its state file before it acts (a reboot's record survives
// the reboot) and answers a repeated id with the first answer, so a
// janitor that asks again never reboots or resets twice. GPU resets run
// one at a time; a reboot runs at once, even during a reset (it resets
// every GPU, and a reset stuck in its command must not hold it back). A
// request is answered within seconds, in_progress while its action is
// queued or running, so a reset that takes minutes is polled for, not
// waited on.
//
// Only the janitor can ask: every request is signed with its Ed25519 key
// (sign.go) over the method, the path and the body, and the body names
// the node, the request id, the action and when it was issued. The agent
// holds only the public key; it refuses a request that is unsigned,
// signed by another key, for another node than its own, or issued
// outside max_clock_skew of its clock. Root on one node therefore cannot
// reboot or reset another.
package localaction

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/netutil"

	"github.com/faultline/faultline/agents/topology"
	"github.com/faultline/faultline/internal/groupcmd"
	"github.com/faultline/faultline/schemas/events"
)

// Config is the agent's [local_actions] section.
type Config struct {
	// Listen is the endpoint's address ("[$(HOST_IP)]:9477"); "" (default)
	// turns the endpoint off.
	Listen string `toml:"listen"`
	// VerifyKeyFile holds the janitor's Ed25519 public key (PEM PUBLIC
	// KEY blocks, several while a key is rotated; required when Listen is
	// set). It is read at start and again for every request, so a new key
	// mounted in its place is used without a restart.
	VerifyKeyFile string `toml:"verify_key_file"`
	// MaxClockSkew: a request issued more than this before or after the
	// agent's clock is refused (Expired). Default 5m.
	MaxClockSkew time.Duration `toml:"max_clock_skew"`
	// TokenFile was the bearer token every node shared; removed (any
	// node's root could act on every other node with it). Set: an error
	// naming verify_key_file.
	TokenFile string `toml:"token_file" chart:"-"`
	// RebootCommand is run for a reboot. Default ["systemctl", "reboot"].
	RebootCommand []string `toml:"reboot_command"`
	// GPUResetCommand is run once per GPU, "{uuid}" replaced by its UUID.
	// Default ["nvidia-smi", "-r", "-i", "{uuid}"].
	GPUResetCommand []string `toml:"gpu_reset_command"`
	// GPUListCommand lists the node's GPU UUIDs, one per line, for a reset
	// of every GPU. Default ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"].
	GPUListCommand []string `toml:"gpu_list_command"`
	// StateFile records the requests handled. Default
	// "/var/lib/faultline/local-actions.json".
	StateFile string `toml:"state_file"`
	// PodsGoneTimeout is how long a GPU reset waits for the GPU's pods to
	// be gone. Default 2m.
	PodsGoneTimeout time.Duration `toml:"pods_gone_timeout"`
	// CommandTimeout bounds one command. Default 2m.
	CommandTimeout time.Duration `toml:"command_timeout"`
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		RebootCommand: []string{"systemctl", "reboot"}, GPUResetCommand: []string{"nvidia-smi", "-r", "-i", "{uuid}"},
		GPUListCommand: []string{"nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"},
		StateFile:      "/var/lib/faultline/local-actions.json", PodsGoneTimeout: 2 * time.Minute, CommandTimeout: 2 * time.Minute,
		MaxClockSkew: 5 * time.Minute,
	}
}

// RegisterFlags adds the flags under prefix ("local-actions.").
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.Listen, prefix+"listen", c.Listen, "address of the local action endpoint the janitor calls (\"\": off)")
	fs.StringVar(&c.VerifyKeyFile, prefix+"verify-key-file", c.VerifyKeyFile, "PEM file of the janitor's Ed25519 public key(s); only requests it signed for this node are served")
	fs.DurationVar(&c.MaxClockSkew, prefix+"max-clock-skew", c.MaxClockSkew, "refuse a request issued further than this from the agent's clock")
	fs.StringVar(&c.StateFile, prefix+"state-file", c.StateFile, "file recording the requests handled")
	fs.DurationVar(&c.PodsGoneTimeout, prefix+"pods-gone-timeout", c.PodsGoneTimeout, "wait for a GPU's pods to be gone before its reset")
	fs.DurationVar(&c.CommandTimeout, prefix+"command-timeout", c.CommandTimeout, "time bound of one command")
}

// Validate names the first bad key.
func (c Config) Validate(prefix string) error {
	if c.TokenFile != "" {
		return fmt.Errorf("%stoken_file: removed (the same token on every node let any node's root reboot every other); "+
			"set %sverify_key_file to the janitor's Ed25519 public key instead (agents/README.md, \"Local actions\")", prefix, prefix)
	}
	if c.Listen == "" {
		return nil
	}
	if c.VerifyKeyFile == "" {
		return fmt.Errorf("%sverify_key_file: required when %slisten is set (the janitor's Ed25519 public key, PEM)", prefix, prefix)
	}
	for _, cmd := range []struct {
		key  string
		argv []string
	}{{"reboot_command", c.RebootCommand}, {"gpu_reset_command", c.GPUResetCommand}, {"gpu_list_command", c.GPUListCommand}} {
		if len(cmd.argv) == 0 || strings.TrimSpace(cmd.argv[0]) == "" {
			return fmt.Errorf("%s%s: want the program and its arguments, got %q", prefix, cmd.key, cmd.argv)
		}
	}
	switch {
	case !slices.ContainsFunc(c.GPUResetCommand, func(a string) bool { return strings.Contains(a, "{uuid}") }):
		return fmt.Errorf("%sgpu_reset_command: must name {uuid}, got %q", prefix, c.GPUResetCommand)
	case c.StateFile == "":
		return fmt.Errorf("%sstate_file: must not be empty", prefix)
	case c.PodsGoneTimeout <= 0:
		return fmt.Errorf("%spods_gone_timeout: must be positive, got %v", prefix, c.PodsGoneTimeout)
	case c.CommandTimeout <= 0:
		return fmt.Errorf("%scommand_timeout: must be positive, got %v", prefix, c.CommandTimeout)
	case c.MaxClockSkew <= 0:
		return fmt.Errorf("%smax_clock_skew: must be positive, got %v", prefix, c.MaxClockSkew)
	}
	if _, err := LoadVerifyKeys(c.VerifyKeyFile); err != nil {
		return fmt.Errorf("%sverify_key_file: %w", prefix, err)
	}
	return nil
}

// Actions, a Request's Action and the last element of its path.
const (
	ActionReboot   = "reboot"
	ActionGPUReset = "gpu-reset"
)

// Request is what the janitor sends, signed (Sign) over the method, the
// path and these exact bytes.
type Request struct {
	// ID identifies the request; a repeated id gets the first answer.
	ID string `json:"id"`
	// Node is the node the request is for; any other agent refuses it.
	Node string `json:"node"`
	// Action is ActionReboot or ActionGPUReset, the path's.
	Action string `json:"action"`
	// Issued is when the janitor signed it; refused outside
	// max_clock_skew of the agent's clock.
	Issued time.Time `json:"issued"`
	// GPUs to reset (UUIDs); empty: every GPU of the node.
	GPUs []string `json:"gpus,omitempty"`
}

// Answer is the endpoint's reply.
type Answer struct {
	ID string `json:"id"`
	// OK: done (a reboot: the command was started).
	OK bool `json:"ok"`
	// Reason is a CamelCase reason when not OK (GPUInUse, CommandFailed,
	// InvalidRequest, StateNotRecorded, InProgress, Interrupted).
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Repeated: the id was handled before; this is the first answer.
	Repeated bool `json:"repeated,omitempty"`
	// InProgress: the action is queued or running (Reason "InProgress");
	// ask again with the same id for its answer.
	InProgress bool `json:"in_progress,omitempty"`
	// At is when the answer was recorded.
	At time.Time `json:"at,omitzero"`
}

// maxRecorded is how many answers the state file keeps, the newest: a
// node's reboots and resets of years (the janitor repeats a request only
// while its resource exists).
const maxRecorded = 256

// answerWait is how long a request waits for its action before it is
// answered in_progress: well inside the janitor's request timeout.
const answerWait = 5 * time.Second

// What one client of the endpoint (any pod can reach HOST_IP:9477) can
// hold: a request must arrive whole, body included, within readTimeout
// (the janitor's are under 1 KiB), its headers within maxHeaderBytes and
// its body within maxBody; every connection is closed after its one
// answer (no keep-alive: the janitor's requests are minutes apart, and a
// client that kept its connection open by asking again, even refused,
// within idleTimeout held its slot for ever: maxConns of them and the
// janitor's reboot never got in); past maxConns open connections a new
// one waits in the listen queue until one ends. A client holds a
// connection for one request, readTimeout to arrive and its answer at
// most. 32 connections of 64 KiB bodies and 16 KiB headers are a few MiB
// of the agent's 128 MiB.
const (
	readTimeout    = 10 * time.Second
	idleTimeout    = 30 * time.Second
	maxConns       = 32
	maxHeaderBytes = 16 << 10
)

// PodLister tells which pods hold GPUs (podres.Allocations.Pods).
type PodLister interface {
	PodsOf(ctx context.Context, gpus []string) ([]string, error)
}

// Server serves POST /v1/local/reboot and /v1/local/gpu-reset.
type Server struct {
	// AnswerWait is how long a request waits for its action before it is
	// answered in_progress (default answerWait).
	AnswerWait time.Duration

	cfg  Config
	node string
	log  *slog.Logger
	pods PodLister
	now  func() time.Time

	// readTimeout and maxConns are the constants' (shorter in tests).
	readTimeout time.Duration
	maxConns    int

	// resetting is held while a GPU reset runs: one at a time.
	resetting sync.Mutex

	mu      sync.Mutex
	state   map[string]Answer
	running map[string]chan struct{} // closed when the id's action ends
}

// New returns the server of node (the agent's node_name: a request for
// any other node is refused); pods may be nil only where pod-resources is
// turned off on purpose (pod_resources_socket ""): the drain's word is
// then taken that no pod holds a GPU, logged here as a warning. A
// PodLister that cannot read pod-resources refuses every GPU reset
// (GPUInUse).
func New(cfg Config, node string, log *slog.Logger, pods PodLister) (*Server, error) {
	if node == "" {
		return nil, errors.New("local actions: the node name is required (a request names the node it is for)")
	}
	if pods == nil {
		log.Warn("local actions: pod-resources is off (pod_resources_socket empty): a GPU is reset without checking that no pod holds it")
	}
	s := &Server{cfg: cfg, node: node, log: log, pods: pods, now: time.Now, AnswerWait: answerWait,
		readTimeout: readTimeout, maxConns: maxConns, state: map[string]Answer{}, running: map[string]chan struct{}{}}
	b, err := os.ReadFile(cfg.StateFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// The first start.
	case err != nil:
		// There but not read (EACCES, EIO, a directory): the answers it
		// records may be intact. Starting without them would run a
		// repeated reboot or reset id again, and the next write would
		// rename over them; the agent stops instead, naming the file.
		return nil, fmt.Errorf("local_actions.state_file: %w (the requests already handled cannot be read; "+
			"fix the file or its directory, or remove it to start with none recorded)", err)
	default:
		if err := json.Unmarshal(b, &s.state); err != nil || s.state == nil {
			// Empty or cut short (a power cut while it was first written) or
			// damaged: kept aside and started afresh — the agent refused to
			// start, its every check down, until someone deleted it. What
			// is lost is which request ids were answered (the agent cannot
			// read them from a file that does not parse: refusing to start
			// would only wait for someone to remove it): a GPU reset asked
			// again under one of them runs again.
			aside := cfg.StateFile + ".corrupt"
			log.Error("local actions: state file does not parse; moved aside, starting with no recorded actions",
				"state_file", cfg.StateFile, "moved_to", aside, "err", cmp.Or(err, errors.New("null")))
			if err := os.Rename(cfg.StateFile, aside); err != nil {
				return nil, fmt.Errorf("local_actions.state_file %s: does not parse, and moving it aside: %w", cfg.StateFile, err)
			}
			s.state = map[string]Answer{}
		}
	}
	// An action in progress when the agent stopped did not finish (a
	// reboot is recorded done before its command runs): it is not run
	// again, its caller learns it was interrupted.
	for id, a := range s.state {
		if a.InProgress {
			s.state[id] = Answer{ID: id, Reason: "Interrupted", At: a.At,
				Message: "the agent stopped before the action finished (recorded in progress at " + a.At.Format(time.RFC3339) + "); not run again"}
		}
	}
	return s, nil
}

// put records a under the lock.
func (s *Server) put(a *Answer) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.record(a)
}

// record writes the state file with a (rename, so a crash leaves the old
// one), keeping the newest maxRecorded answers, and only once it is
// written keeps them in memory: a failed write (a full or read-only disk)
// leaves the state as it was, so an id whose in-progress record failed is
// not taken for running and runs when asked again. s.mu is held.
func (s *Server) record(a *Answer) error {
	a.At = time.Now().UTC()
	next := maps.Clone(s.state)
	next[a.ID] = *a
	if over := len(next) - maxRecorded; over > 0 {
		ids := slices.SortedFunc(maps.Keys(next), func(x, y string) int { return next[x].At.Compare(next[y].At) })
		for _, id := range ids[:over] {
			delete(next, id)
		}
	}
	b, _ := json.Marshal(next)
	if err := os.MkdirAll(filepath.Dir(s.cfg.StateFile), 0o755); err != nil {
		return fmt.Errorf("local_actions.state_file %s: %w", s.cfg.StateFile, err)
	}
	// Synced before the rename and the directory after it: a reboot runs
	// right after this write, and a power cut must not leave it empty.
	if err := topology.AtomicWrite(s.cfg.StateFile, b); err != nil {
		return err
	}
	s.state = next
	return nil
}

// Handler is the endpoint's HTTP handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/local/reboot", func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, ActionReboot, s.reboot) })
	mux.HandleFunc("POST /v1/local/gpu-reset", func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, ActionGPUReset, s.gpuReset) })
	return mux
}

// maxID bounds a request id (the janitor's are a UID and a step), idRE
// says its characters (no control characters into the logs and the state
// file).
const maxID = 256

var idRE = regexp.MustCompile(`^[A-Za-z0-9._:/-]+$`)

// maxBody bounds a request's body.
const maxBody = 1 << 16

// decode parses a signed request's body, saying what is wrong with a bad
// one; action is the path's.
func decode(body []byte, action string) (Request, error) {
	var req Request
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields() // a misspelt "gpus" must not mean every GPU
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf("body: %v; want JSON {\"id\": ..., \"node\": ..., \"action\": ..., \"issued\": ..., \"gpus\": [...]}", err)
	}
	gpus := action == ActionGPUReset
	switch {
	case req.Action != action:
		return req, fmt.Errorf("action: %q sent to the %s endpoint", req.Action, action)
	case req.Node == "":
		return req, errors.New("node: required")
	case req.Issued.IsZero():
		return req, errors.New("issued: required")
	case req.ID == "":
		return req, errors.New("id: required")
	case len(req.ID) > maxID:
		return req, fmt.Errorf("id: %d bytes, at most %d", len(req.ID), maxID)
	case !idRE.MatchString(req.ID):
		return req, fmt.Errorf("id: %q has a character outside %s", req.ID, idRE)
	case !gpus && len(req.GPUs) > 0:
		return req, errors.New("gpus: a reboot takes none")
	}
	for i, g := range req.GPUs {
		if !events.IsGPUUUID(g) {
			return req, fmt.Errorf("gpus: %q is not a GPU UUID", g)
		}
		// As NVML and the device plugin write it: pod-resources is asked
		// about, and the reset command given, the GPU's own UUID.
		req.GPUs[i] = events.CanonicalGPUUUID(g)
	}
	return req, nil
}

// authorize reads the body and checks its signature, its node and its
// time; a refusal is written and nil returned.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, action string) *Request {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, Answer{Reason: "InvalidRequest", Message: "body: " + err.Error()})
		return nil
	}
	keys, err := LoadVerifyKeys(s.cfg.VerifyKeyFile)
	if err != nil {
		s.log.Error("local actions: verify key unreadable; refusing every request", "verify_key_file", s.cfg.VerifyKeyFile, "err", err)
		writeJSON(w, http.StatusUnauthorized, Answer{Reason: "Unauthorized", Message: "the agent cannot read local_actions.verify_key_file"})
		return nil
	}
	if err := verify(keys, r.Header.Get("Authorization"), r.Method, r.URL.Path, body); err != nil {
		writeJSON(w, http.StatusUnauthorized, Answer{Reason: "Unauthorized", Message: err.Error()})
		return nil
	}
	req, err := decode(body, action)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, Answer{ID: req.ID, Reason: "InvalidRequest", Message: err.Error()})
		return nil
	}
	if req.Node != s.node {
		s.log.Warn("local actions: refused a request signed for another node", "id", req.ID, "for", req.Node, "node", s.node)
		writeJSON(w, http.StatusForbidden, Answer{ID: req.ID, Reason: "WrongNode",
			Message: fmt.Sprintf("node: the request is for node %q, this agent is node %q", req.Node, s.node)})
		return nil
	}
	if now := s.now(); req.Issued.Before(now.Add(-s.cfg.MaxClockSkew)) || req.Issued.After(now.Add(s.cfg.MaxClockSkew)) {
		writeJSON(w, http.StatusForbidden, Answer{ID: req.ID, Reason: "Expired",
			Message: fmt.Sprintf("issued: %s, further than max_clock_skew %v from the agent's clock (%s)",
				req.Issued.UTC().Format(time.RFC3339), s.cfg.MaxClockSkew, now.UTC().Format(time.RFC3339))})
		return nil
	}
	return &req
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request, action string, do func(context.Context, Request) Answer) {
	rp := s.authorize(w, r, action)
	if rp == nil {
		return
	}
	req := *rp
	a, known, done, err := s.begin(r.Context(), req, do)
	if err != nil {
		writeJSON(w, http.StatusOK, Answer{ID: req.ID, Reason: "StateNotRecorded", Message: err.Error()})
		return
	}
	if done != nil { // running
		t := time.NewTimer(s.AnswerWait)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
		case <-r.Context().Done():
			return
		}
		s.mu.Lock()
		a = s.state[req.ID]
		s.mu.Unlock()
	}
	a.Repeated = known
	writeJSON(w, http.StatusOK, a)
}

// begin returns the answer recorded for req's id (known) and, while its
// action runs, the channel closed when it ends; an unknown id is recorded
// in progress and its action started. The lock is released by a defer: a
// panic on the way cannot leave it held, every later request waiting.
func (s *Server) begin(ctx context.Context, req Request, do func(context.Context, Request) Answer) (a Answer, known bool, done chan struct{}, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a, known = s.state[req.ID]; known {
		return a, true, s.running[req.ID], nil
	}
	a = Answer{ID: req.ID, InProgress: true, Reason: "InProgress", Message: "accepted"}
	if err := s.record(&a); err != nil {
		return a, false, nil, err
	}
	done = make(chan struct{})
	s.running[req.ID] = done
	// The action outlives the request (the caller asks again), bounded by
	// the command and pods-gone timeouts.
	go s.act(context.WithoutCancel(ctx), req, do, done)
	return a, false, done, nil
}

// act runs an action and records its answer.
func (s *Server) act(ctx context.Context, req Request, do func(context.Context, Request) Answer, done chan struct{}) {
	a := do(ctx, req)
	s.mu.Lock()
	if err := s.record(&a); err != nil {
		// The action ran: its answer is kept in memory for the next ask
		// (else it is in progress for ever); the file still says in
		// progress, read as Interrupted after a restart, not run again.
		s.log.Warn("local action: answer not recorded", "id", req.ID, "err", err)
		s.state[req.ID] = a
	}
	delete(s.running, req.ID)
	s.mu.Unlock()
	close(done)
}

func writeJSON(w http.ResponseWriter, code int, a Answer) {
	if a.InProgress {
		code = http.StatusAccepted
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(a)
}

// commandWaitDelay is how long a command's output is waited for after
// command_timeout killed its process group.
const commandWaitDelay = 3 * time.Second

// command returns argv to run in its own process group: at ctx's end the
// whole group is killed (a wrapper's child too: sh -c, nsenter), and the
// output is no longer waited for after commandWaitDelay (a child that
// left the group, or one in D state that SIGKILL does not end, holding
// the output open). Before, only the direct child was killed and Wait
// waited for the pipe for as long as a grandchild (nvidia-smi -r on a
// wedged GPU) held it: the answer never came, and the reset lock was
// held, every later reset on the node in progress until the agent
// restarted.
func command(ctx context.Context, argv []string) *exec.Cmd {
	return groupcmd.Command(ctx, commandWaitDelay, argv[0], argv[1:]...)
}

// timedOut names a command that command_timeout ended.
func (s *Server) timedOut(ctx context.Context, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	return fmt.Errorf("did not exit within command_timeout %v (its process group killed): %w", s.cfg.CommandTimeout, err)
}

func (s *Server) run(ctx context.Context, argv []string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CommandTimeout)
	defer cancel()
	out, err := command(ctx, argv).CombinedOutput()
	err = s.timedOut(ctx, err)
	if smiWarning(argv, err) {
		s.log.Warn("local action: nvidia-smi exited with its warning (infoROM corrupted); taken as done", "command", argv,
			"err", err, "output", strings.TrimSpace(string(out)))
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// smiWarning reports whether err is nvidia-smi's warning exit
// (topology.SMIWarningExit: 14, infoROM corrupted), which it gives after
// doing its work, from a command that runs nvidia-smi (an argument whose
// base name is nvidia-smi: the program, or a wrapper's argument such as
// chroot's). Any other command's exit 14 is its failure.
func smiWarning(argv []string, err error) bool {
	return topology.SMIWarning(err) && slices.ContainsFunc(argv, func(a string) bool { return filepath.Base(a) == "nvidia-smi" })
}

// reboot records the reboot done, then starts the reboot command (the
// record must be on disk before the node goes down).
func (s *Server) reboot(ctx context.Context, req Request) Answer {
	a := Answer{ID: req.ID, OK: true, Message: "reboot started: " + strings.Join(s.cfg.RebootCommand, " ")}
	if err := s.put(&a); err != nil {
		return Answer{ID: req.ID, Reason: "StateNotRecorded", Message: err.Error()}
	}
	s.log.Warn("local action: rebooting the node", "id", req.ID, "command", s.cfg.RebootCommand)
	if err := s.run(ctx, s.cfg.RebootCommand); err != nil {
		return Answer{ID: req.ID, Reason: "CommandFailed", Message: err.Error()}
	}
	return a
}

// gpuReset waits for any reset before it and until no pod holds the GPUs,
// then resets each, once no pod holds it (asked again right before it).
func (s *Server) gpuReset(ctx context.Context, req Request) Answer {
	s.resetting.Lock()
	defer s.resetting.Unlock()
	gpus := req.GPUs
	if len(gpus) == 0 {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.CommandTimeout)
		out, err := command(cctx, s.cfg.GPUListCommand).Output()
		err = s.timedOut(cctx, err)
		cancel()
		// nvidia-smi's warning exit comes after the full list: the list
		// stands when it names GPUs (checked below), its warning line left.
		warned := smiWarning(s.cfg.GPUListCommand, err)
		if err != nil && !warned {
			return Answer{ID: req.ID, Reason: "CommandFailed", Message: "list GPUs: " + err.Error()}
		}
		for i, l := range strings.Split(string(out), "\n") {
			if l = strings.TrimSpace(l); l == "" || warned && strings.HasPrefix(l, "WARNING:") {
				continue
			}
			if !events.IsGPUUUID(l) {
				return Answer{ID: req.ID, Reason: "CommandFailed", Message: fmt.Sprintf("list GPUs: line %d %q is not a GPU UUID", i+1, l)}
			}
			gpus = append(gpus, events.CanonicalGPUUUID(l))
		}
		if len(gpus) == 0 {
			msg := "list GPUs: " + strings.Join(s.cfg.GPUListCommand, " ") + " listed none"
			if warned {
				msg += " (" + err.Error() + ")"
			}
			return Answer{ID: req.ID, Reason: "CommandFailed", Message: msg}
		}
		if warned {
			s.log.Warn("local action: nvidia-smi listed the GPUs with its warning exit (infoROM corrupted)", "id", req.ID, "gpus", len(gpus), "err", err)
		}
	}
	deadline := time.Now().Add(s.cfg.PodsGoneTimeout)
	if msg := s.podsGone(ctx, gpus, deadline); msg != "" {
		return Answer{ID: req.ID, Reason: "GPUInUse", Message: msg}
	}
	var done []string
	for _, g := range gpus {
		// Again right before each GPU's reset: a pod may have taken it
		// while the ones before were reset.
		if msg := s.podsGone(ctx, []string{g}, deadline); msg != "" {
			return Answer{ID: req.ID, Reason: "GPUInUse", Message: fmt.Sprintf("%s: %s (after %d done: %s)", g, msg, len(done), strings.Join(done, ","))}
		}
		argv := make([]string, len(s.cfg.GPUResetCommand))
		for i, a := range s.cfg.GPUResetCommand {
			argv[i] = strings.ReplaceAll(a, "{uuid}", g)
		}
		if err := s.run(ctx, argv); err != nil {
			return Answer{ID: req.ID, Reason: "CommandFailed", Message: fmt.Sprintf("reset %s (after %d done): %v", g, len(done), err)}
		}
		done = append(done, g)
	}
	return Answer{ID: req.ID, OK: true, Message: "reset " + strings.Join(done, ",")}
}

// podsGone waits until the kubelet's pod-resources API says no pod holds
// the GPUs, until deadline; it returns "" then, else why not: the pods
// holding them, or that pod-resources could not be read (the GPUs are
// never reset blind). Without a PodLister (pod_resources_socket "", the
// chart's agent.podResources=false: logged at start) it does not ask.
func (s *Server) podsGone(ctx context.Context, gpus []string, deadline time.Time) string {
	if s.pods == nil {
		return ""
	}
	for {
		pods, err := s.pods.PodsOf(ctx, gpus)
		if err == nil && len(pods) == 0 {
			return ""
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if err != nil {
				return fmt.Sprintf("pod-resources unreadable for %v, so which pods hold the GPUs is not known: %v", s.cfg.PodsGoneTimeout, err)
			}
			return fmt.Sprintf("pods still hold the GPUs after %v: %s", s.cfg.PodsGoneTimeout, strings.Join(pods, ", "))
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// Serve listens on cfg.Listen until ctx ends.
func (s *Server) Serve(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("local_actions.listen: %w", err)
	}
	return s.serveOn(ctx, ln)
}

// serveOn serves ln, at most s.maxConns connections at a time, until ctx
// ends.
func (s *Server) serveOn(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: min(5*time.Second, s.readTimeout),
		ReadTimeout:       s.readTimeout,
		// From the end of the headers: the body, the answer wait and a
		// state write, so an answer is never cut short.
		WriteTimeout:   s.readTimeout + s.AnswerWait + 5*time.Second,
		IdleTimeout:    idleTimeout,
		MaxHeaderBytes: maxHeaderBytes,
		ErrorLog:       slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	srv.SetKeepAlivesEnabled(false) // one request a connection: see maxConns
	go func() {
		<-ctx.Done()
		sctx, c := context.WithTimeout(context.Background(), 2*time.Second)
		defer c()
		_ = srv.Shutdown(sctx)
	}()
	s.log.Info("serving local actions", "addr", ln.Addr().String(), "max_conns", s.maxConns)
	if err := srv.Serve(netutil.LimitListener(ln, s.maxConns)); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
