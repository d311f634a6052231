package agent

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/nvsentinel"
)

// TestRelayConfig: nvsentinel_socket and nvsentinel_socket_group, from
// TOML or flags; with the socket on, the agent may run no check of its own.
func TestRelayConfig(t *testing.T) {
	env := func(string) string { return "gpu-node-42" }
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.toml")
	if err := os.WriteFile(path, []byte("checks = []\nnvsentinel_socket = \"/var/run/nvsentinel/nvsentinel.sock\"\nnvsentinel_socket_group = \"nvsentinel\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig("t", []string{"--config", path}, env)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Checks) != 0 || cfg.NVSentinelSocket != "/var/run/nvsentinel/nvsentinel.sock" || cfg.NVSentinelSocketGroup != "nvsentinel" {
		t.Fatalf("config %+v", cfg)
	}
	cfg, err = LoadConfig("t", []string{"--checks=", "--nvsentinel-socket", "/run/s.sock", "--nvsentinel-socket-group", "1000"}, env)
	if err != nil || len(cfg.Checks) != 0 || cfg.NVSentinelSocket != "/run/s.sock" || cfg.NVSentinelSocketGroup != "1000" {
		t.Fatalf("flags: %+v %v", cfg, err)
	}
	if cfg, err := LoadConfig("t", nil, env); err != nil || cfg.NVSentinelSocket != "" {
		t.Fatalf("off by default: %q %v", cfg.NVSentinelSocket, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--checks="}, "invalid configuration: checks: no check enabled, and nvsentinel_socket is off: the agent would have nothing to report"},
		{[]string{"--nvsentinel-socket-group", "g"}, "invalid configuration: nvsentinel_socket_group: set, but nvsentinel_socket is off"},
		// A spool that cannot hold the relay's largest call: such a call
		// was refused as Unavailable ("resend later") at every resend.
		{[]string{"--nvsentinel-socket", "/run/s.sock", "--spool.max-bytes", "1048576"},
			"invalid configuration: spool.max_bytes: 1048576 is below 5242880 (5 MiB), the least that holds the largest call nvsentinel_socket takes from an NVSentinel monitor"},
	} {
		if _, err := LoadConfig("t", tc.args, env); err == nil || err.Error() != tc.want {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestAgentRelayOnly: an agent with no check of its own serves the relay
// socket; a monitor's event lands in its spool, and /healthz is ok.
func TestAgentRelayOnly(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.NodeName, cfg.Checks, cfg.MetricsAddr, cfg.PodResourcesSocket = "gpu-node-42", nil, "", ""
	cfg.Gateway.Addr, cfg.Gateway.Insecure = "127.0.0.1:1", true // nothing listens: events stay spooled
	cfg.Spool.Dir = filepath.Join(dir, "spool")
	cfg.NVSentinelSocket = filepath.Join(dir, "nvsentinel.sock")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg, quiet(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	mon, err := nvsentinel.Dial(cfg.NVSentinelSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close()
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	// The socket exists from New; calls are answered once Run serves it.
	var sendErr error
	for sctx.Err() == nil {
		if sendErr = mon.Send(sctx, nvsentinel.Event{Agent: "gpu-health-monitor", ComponentClass: "GPU", CheckName: "GpuXidError",
			IsFatal: true, NodeName: "gpu-node-42", Message: "relayed"}); sendErr == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if sendErr != nil {
		t.Fatal(sendErr)
	}
	evs, _, err := a.Spool().Peek(10)
	if err != nil || len(evs) != 1 || evs[0].GetMessage() != "relayed" {
		t.Fatalf("spool %v %v", evs, err)
	}
	rec := httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("healthz %d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), `faultline_agent_relay_events_total{result="accepted"} 1`) {
		t.Fatal("relay metric not on the agent's /metrics")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	assertRefusing(t, cfg.NVSentinelSocket)
}

// TestAgentRelayRemovedOnFailedStart: when Run fails before serving (its
// metrics address is taken), the relay's socket stops answering (the file
// stays: see relay.New).
func TestAgentRelayRemovedOnFailedStart(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.NodeName, cfg.Checks, cfg.PodResourcesSocket = "gpu-node-42", nil, ""
	cfg.MetricsAddr = taken.Addr().String()
	cfg.Gateway.Addr, cfg.Gateway.Insecure = "127.0.0.1:1", true
	cfg.Spool.Dir = filepath.Join(dir, "spool")
	cfg.NVSentinelSocket = filepath.Join(dir, "nvsentinel.sock")
	a, err := New(cfg, quiet(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cfg.NVSentinelSocket); err != nil {
		t.Fatalf("no socket after New: %v", err)
	}
	if err := a.Run(context.Background()); err == nil || !strings.HasPrefix(err.Error(), "metrics_addr: ") {
		t.Fatalf("Run: %v", err)
	}
	assertRefusing(t, cfg.NVSentinelSocket)
}

// assertRefusing: the relay's socket stays when the agent stops, refusing
// connections (the preflight checks wait for a restarting agent, and take
// only a missing socket for a node without one).
func assertRefusing(t *testing.T, path string) {
	t.Helper()
	if st, err := os.Stat(path); err != nil || st.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket gone after the agent stopped: %v", err)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		t.Fatal("socket still answers after the agent stopped")
	}
}

// TestRelayedOverlapStoredOnly: NVSentinel's syslog monitor and the kmsg
// check report the same kernel lines, each at its own time (the monitor
// at its journal poll), so the rules would count every Xid twice; with
// kmsg enabled, the monitor's events of kmsg's checkNames are spooled
// STORE_ONLY (stored, never counted or acted on), and its other events,
// or all of them without kmsg, keep their strategy.
func TestRelayedOverlapStoredOnly(t *testing.T) {
	unset, storeOnly := datamodels.ProcessingStrategy_UNSPECIFIED, datamodels.ProcessingStrategy_STORE_ONLY
	for _, tc := range []struct {
		name     string
		checks   []string
		xid, gpu datamodels.ProcessingStrategy
	}{
		{"relay only", nil, unset, unset},
		{"relay and kmsg", []string{"kmsg"}, storeOnly, unset},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := DefaultConfig()
			cfg.NodeName, cfg.Checks, cfg.MetricsAddr, cfg.PodResourcesSocket = "gpu-node-42", tc.checks, "", ""
			cfg.Gateway.Addr, cfg.Gateway.Insecure = "127.0.0.1:1", true // nothing listens: events stay spooled
			cfg.Spool.Dir = filepath.Join(dir, "spool")
			cfg.NVSentinelSocket = filepath.Join(dir, "nvsentinel.sock")
			cfg.Kmsg.Source, cfg.Kmsg.File, cfg.Kmsg.StateDir = "file", filepath.Join(dir, "kern.log"), filepath.Join(dir, "kmsg")
			cfg.NIC.MetadataPath = filepath.Join(dir, "none.json")
			cfg.Fabric.NvidiaSMI = filepath.Join(dir, "no-nvidia-smi")
			if err := os.WriteFile(cfg.Kmsg.File, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			a, err := New(cfg, quiet(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- a.Run(ctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Error(err)
				}
			}()
			mon, err := nvsentinel.Dial(cfg.NVSentinelSocket)
			if err != nil {
				t.Fatal(err)
			}
			defer mon.Close()
			at := time.Now().Add(-time.Minute)
			xid := nvsentinel.Event{Agent: "syslog-health-monitor", ComponentClass: "GPU", CheckName: "SysLogsXIDError",
				IsFatal: true, NodeName: "gpu-node-42", Message: "xid", ErrorCode: []string{"48"}, GeneratedTimestamp: at}
			gpu := nvsentinel.Event{Agent: "gpu-health-monitor", ComponentClass: "GPU", CheckName: "GpuDbeError",
				IsFatal: true, NodeName: "gpu-node-42", Message: "gpu", GeneratedTimestamp: at}
			sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
			defer scancel()
			var sendErr error
			for sctx.Err() == nil {
				if sendErr = mon.Send(sctx, xid, gpu); sendErr == nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if sendErr != nil {
				t.Fatal(sendErr)
			}
			evs, _, err := a.Spool().Peek(10)
			var got []*datamodels.HealthEvent
			for _, ev := range evs {
				if ev.GetAgent() != "faultline-agent" {
					got = append(got, ev)
				}
			}
			if err != nil || len(got) != 2 {
				t.Fatalf("spool %v %v", evs, err)
			}
			if got[0].GetProcessingStrategy() != tc.xid || got[1].GetProcessingStrategy() != tc.gpu {
				t.Fatalf("relayed %s: %v, %s: %v; want %v, %v", got[0].GetCheckName(), got[0].GetProcessingStrategy(),
					got[1].GetCheckName(), got[1].GetProcessingStrategy(), tc.xid, tc.gpu)
			}
		})
	}
}

// TestRunFailsBeforeStartingAnything: local_actions' state file cannot be
// read (here a directory): Run refuses naming the key, and does so before
// the sender or the metrics server start — before, it returned with them
// running and closed the spool under the sender.
func TestRunFailsBeforeStartingAnything(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.NodeName, cfg.Checks, cfg.PodResourcesSocket = "gpu-node-42", nil, ""
	cfg.MetricsAddr = "127.0.0.1:0"
	cfg.Gateway.Addr, cfg.Gateway.Insecure = "127.0.0.1:1", true
	cfg.Spool.Dir = filepath.Join(dir, "spool")
	cfg.NVSentinelSocket = ""
	cfg.LocalActions.Listen = "127.0.0.1:0"
	cfg.LocalActions.StateFile = dir // a directory: not readable as a file
	a, err := New(cfg, quiet(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	logged := false
	a.log = slog.New(slog.NewTextHandler(writerFunc(func(p []byte) {
		if strings.Contains(string(p), "serving /metrics") {
			logged = true
		}
	}), nil))
	if err := a.Run(context.Background()); err == nil || !strings.HasPrefix(err.Error(), "local_actions.state_file: ") {
		t.Fatalf("Run: %v", err)
	}
	if logged {
		t.Fatal("the metrics server started before local actions failed")
	}
}

type writerFunc func([]byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }
