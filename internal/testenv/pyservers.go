package testenv

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Versions of the Python servers install.sh puts in venvs; keep them in
// step with scripts/testenv/install.sh.
const (
	// SushyVersion is the sushy-tools release (OpenStack's Redfish
	// emulator, PyPI).
	SushyVersion = "2.2.0"
	// MotoVersion is the moto[server] release (AWS API emulator, PyPI).
	MotoVersion = "5.2.5"
)

// pyVenv returns the python of a component's venv ($CACHE/<name>/<version>/venv).
func pyVenv(name, version string) (string, bool) {
	p := filepath.Join(CacheDir(), name, version, "venv", "bin", "python")
	return p, isExecutable(p)
}

// SushySystem is one emulated machine of the fake driver.
type SushySystem struct {
	UUID       string
	Name       string
	PowerState string // On (default) or Off
}

// SushyOptions are StartSushy's.
type SushyOptions struct {
	// Systems are the emulated machines. Default one, "node-0", On.
	Systems []SushySystem
	// Username and Password, when set, protect every request with HTTP
	// basic auth (sushy's bcrypt htpasswd file).
	Username, Password string
	// TLS serves HTTPS with a certificate for 127.0.0.1 from this CA.
	TLS *CA
}

// Sushy is a Redfish BMC emulator (sushy-tools' sushy-emulator with its
// fake driver): /redfish/v1/Systems lists the systems; a
// ComputerSystem.Reset answers 204 and changes the system's PowerState —
// a restart turns it Off at once and On again 1-11 s later (the fake
// driver's "hardware actions are not immediate"), observed on the next
// read of the system. sushy-tools has no SessionService: clients use basic
// auth.
type Sushy struct {
	// URL is the service's base URL (http(s)://127.0.0.1:PORT).
	URL string
	// Systems as started.
	Systems []SushySystem

	tb     testing.TB
	proc   *process
	client *http.Client
	user   string
	pass   string
}

// StartSushy starts sushy-emulator on a free port and waits until it
// answers. It stops when the test ends. A missing venv skips the test
// (fails in CI) naming `install.sh sushy`.
func StartSushy(tb testing.TB, opts SushyOptions) *Sushy {
	tb.Helper()
	Server(tb, "a Redfish emulator (sushy-tools)", nil)
	py, ok := pyVenv("sushy", SushyVersion)
	if !ok {
		missing(tb, "sushy", "no sushy-tools venv python at "+py)
	}
	if len(opts.Systems) == 0 {
		opts.Systems = []SushySystem{{UUID: "0b8a6c5e-0000-4000-8000-000000000000", Name: "node-0"}}
	}
	dir := tb.TempDir()
	port := freePort(tb)
	var sys []map[string]any
	for _, s := range opts.Systems {
		ps := s.PowerState
		if ps == "" {
			ps = "On"
		}
		sys = append(sys, map[string]any{"uuid": s.UUID, "name": s.Name, "power_state": ps, "external_notifier": false, "nics": []any{}})
	}
	sysJSON, _ := json.Marshal(sys)
	var conf strings.Builder
	fmt.Fprintf(&conf, "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\nSUSHY_EMULATOR_LISTEN_PORT = %d\n", port)
	fmt.Fprintf(&conf, "SUSHY_EMULATOR_FAKE_DRIVER = True\nSUSHY_EMULATOR_STATE_DIR = %q\n", filepath.Join(dir, "state"))
	fmt.Fprintf(&conf, "import json\nSUSHY_EMULATOR_FAKE_SYSTEMS = json.loads(%q)\n", string(sysJSON))
	s := &Sushy{tb: tb, Systems: opts.Systems, user: opts.Username, pass: opts.Password}
	scheme := "http"
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	if opts.TLS != nil {
		kp := opts.TLS.Issue(tb, "sushy", "127.0.0.1", "localhost")
		fmt.Fprintf(&conf, "SUSHY_EMULATOR_SSL_CERT = %q\nSUSHY_EMULATOR_SSL_KEY = %q\n", kp.CertFile, kp.KeyFile)
		tr.TLSClientConfig = &tls.Config{RootCAs: opts.TLS.Pool(), MinVersion: tls.VersionTLS12}
		scheme = "https"
	}
	if opts.Username != "" {
		out, err := exec.Command(py, "-c", "import bcrypt,sys; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(rounds=4)).decode())", opts.Password).Output()
		if err != nil {
			tb.Fatalf("testenv: sushy htpasswd: %v", err)
		}
		auth := filepath.Join(dir, "htpasswd")
		writeFile(tb, auth, []byte(opts.Username+":"+strings.TrimSpace(string(out))+"\n"), 0o600)
		fmt.Fprintf(&conf, "SUSHY_EMULATOR_AUTH_FILE = %q\n", auth)
	}
	cfgPath := filepath.Join(dir, "sushy.conf")
	writeFile(tb, cfgPath, []byte(conf.String()), 0o644)
	s.URL = fmt.Sprintf("%s://127.0.0.1:%d", scheme, port)
	s.client = &http.Client{Transport: tr, Timeout: 5 * time.Second}
	g := newGroup(tb)
	s.proc = g.add(&process{name: "sushy", path: py, args: []string{"-m", "sushy_tools.emulator.main", "--config", cfgPath},
		dir: dir, logPath: filepath.Join(dir, "sushy.log")})
	began := time.Now()
	if err := s.proc.start(); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(func() { s.proc.stop(syscall.SIGTERM, 5*time.Second) })
	if err := waitReady(s.proc, 60*time.Second, func(ctx context.Context) error {
		_, err := s.get(ctx, "/redfish/v1/Systems")
		return err
	}); err != nil {
		tb.Fatalf("testenv: %v\n%s", err, s.proc.logTail(40))
	}
	tb.Logf("testenv: sushy-emulator %s ready at %s in %s", SushyVersion, s.URL, time.Since(began).Round(time.Millisecond))
	return s
}

func (s *Sushy) get(ctx context.Context, path string) (map[string]any, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+path, nil)
	if err != nil {
		return nil, err
	}
	if s.user != "" {
		req.SetBasicAuth(s.user, s.pass)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	return out, nil
}

// SystemPath is the Redfish path of a system (by UUID, as the fake
// driver names them).
func (s *Sushy) SystemPath(uuid string) string { return "/redfish/v1/Systems/" + uuid }

// PowerState reads a system's PowerState (a read also applies a pending
// change whose time has come: the fake driver's way).
func (s *Sushy) PowerState(ctx context.Context, uuid string) (string, error) {
	m, err := s.get(ctx, s.SystemPath(uuid))
	if err != nil {
		return "", err
	}
	ps, _ := m["PowerState"].(string)
	return ps, nil
}

// Reset sends a ComputerSystem.Reset of resetType ("ForceOff", "On" …) to
// a system, as its administrator would (the fake driver applies it 1 to
// 11 s later).
func (s *Sushy) Reset(ctx context.Context, uuid, resetType string) error {
	path := s.SystemPath(uuid) + "/Actions/ComputerSystem.Reset"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+path, strings.NewReader(`{"ResetType":"`+resetType+`"}`))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if s.user != "" {
		req.SetBasicAuth(s.user, s.pass)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s", path, resp.Status)
	}
	return nil
}

// Resets counts the reset requests the emulator accepted for a system,
// from its request log. A restart's Off can last milliseconds (the fake
// driver turns the system On again at a whole second), too short for a
// poll of PowerState to see; the request log always has it.
func (s *Sushy) Resets(uuid string) int {
	b, _ := os.ReadFile(s.proc.logPath)
	log := ansiColor.ReplaceAllString(string(b), "") // werkzeug colours its request log
	return strings.Count(log, `"POST `+s.SystemPath(uuid)+`/Actions/ComputerSystem.Reset HTTP/1.1" 204`)
}

var ansiColor = regexp.MustCompile(`\x1b\[[0-9;]*m`)

// Stop stops the emulator (a BMC that went away).
func (s *Sushy) Stop() { s.proc.stop(syscall.SIGTERM, 5*time.Second) }

// Moto is moto's AWS API emulator in server mode (`python -m moto.server`):
// one endpoint for every service, any SigV4-looking credentials. Its
// recorder is on: Requests returns every request it received.
type Moto struct {
	// URL is the endpoint (http://127.0.0.1:PORT).
	URL  string
	proc *process
}

// MotoRequest is one request moto received.
type MotoRequest struct {
	Method string `json:"method"`
	URL    string `json:"url"`
	// Body is the request body, decoded.
	Body string `json:"-"`
}

// Requests returns moto's recording: every request it received, in order.
func (m *Moto) Requests(ctx context.Context) ([]MotoRequest, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.URL+"/moto-api/recorder/download-recording", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("moto recording: %s", resp.Status)
	}
	var out []MotoRequest
	for _, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var r struct {
			MotoRequest
			Body    string `json:"body"`
			Encoded bool   `json:"body_encoded"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return nil, fmt.Errorf("moto recording: %w", err)
		}
		r.MotoRequest.Body = r.Body
		if r.Encoded {
			d, err := base64.StdEncoding.DecodeString(r.Body)
			if err != nil {
				return nil, fmt.Errorf("moto recording body: %w", err)
			}
			r.MotoRequest.Body = string(d)
		}
		out = append(out, r.MotoRequest)
	}
	return out, nil
}

// StartMoto starts moto_server on a free port and waits until it answers.
func StartMoto(tb testing.TB) *Moto {
	tb.Helper()
	Server(tb, "an AWS API emulator (moto)", nil)
	py, ok := pyVenv("moto", MotoVersion)
	if !ok {
		missing(tb, "moto", "no moto venv python at "+py)
	}
	dir := tb.TempDir()
	port := freePort(tb)
	m := &Moto{URL: fmt.Sprintf("http://127.0.0.1:%d", port)}
	g := newGroup(tb)
	m.proc = g.add(&process{name: "moto", path: py, args: []string{"-m", "moto.server", "-H", "127.0.0.1", "-p", fmt.Sprint(port)},
		dir: dir, logPath: filepath.Join(dir, "moto.log"), env: []string{"AWS_ACCESS_KEY_ID=testing", "AWS_SECRET_ACCESS_KEY=testing",
			"MOTO_ENABLE_RECORDING=True", "MOTO_RECORDER_FILEPATH=" + filepath.Join(dir, "recording.jsonl")}})
	began := time.Now()
	if err := m.proc.start(); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(func() { m.proc.stop(syscall.SIGTERM, 5*time.Second) })
	client := &http.Client{Timeout: 2 * time.Second}
	if err := waitReady(m.proc, 60*time.Second, httpOK(m.URL+"/moto-api/", client)); err != nil {
		tb.Fatalf("testenv: %v\n%s", err, m.proc.logTail(40))
	}
	tb.Logf("testenv: moto %s ready at %s in %s", MotoVersion, m.URL, time.Since(began).Round(time.Millisecond))
	return m
}
