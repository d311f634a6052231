package webhook

import (
	"io"
	"strings"
	"testing"

	"github.com/faultline/faultline/agents/preflight/injection"
	"github.com/faultline/faultline/internal/config"
)

// TestConfigValidate: bad values are refused naming the key and quoting
// the value, the [check] section's included (as check.<key>); a NaN is
// refused, though it compares false with every bound.
func TestConfigValidate(t *testing.T) {
	load := func(args ...string) (Config, error) {
		cfg := DefaultConfig()
		_, err := config.Load("faultline-preflight webhook", append([]string{"--namespaces.include=training"}, args...),
			&cfg, cfg.RegisterFlags, cfg.Validate, io.Discard)
		return cfg, err
	}
	if cfg, err := load("--check.gateway.batch-size=250", "--kube.qps=5.5", "--kube.burst=7"); err != nil ||
		cfg.Check.Gateway.BatchSize != 250 || cfg.Kube.QPS != 5.5 || cfg.Kube.Burst != 7 {
		t.Fatalf("valid flags: %v (%+v)", err, cfg)
	}
	if _, err := load("--inject.relay-socket=/run/faultline-agent/agent.sock", "--inject.relay-socket-group=64500", "--inject.token-secret="); err != nil {
		t.Fatalf("relay socket: %v", err)
	}
	for _, tc := range []struct{ flag, want string }{
		{"--kube.qps=NaN", "kube.qps: must be a finite number above 0, got NaN"},
		{"--kube.qps=+Inf", "kube.qps: must be a finite number above 0, got +Inf"},
		{"--kube.qps=0", "kube.qps: must be a finite number above 0, got 0"},
		{"--kube.burst=-1", "kube.burst: must be at least 1, got -1"},
		{"--kube.burst=0", "kube.burst: must be at least 1, got 0"},
		{"--check.gateway.timeout=0s", "check.gateway.timeout: must be positive, got 0s"},
		{"--check.dcgm.diag-level=3", "check.timeout: 5m0s is shorter than dcgm.diag_level 3's run (~15m); raise timeout to at least 15m0s"},
		{"--check.gateway.batch-size=0", "check.gateway.batch_size: must be in 1..10000, got 0"},
		{"--check.gateway.batch-size=10001", "check.gateway.batch_size: must be in 1..10000, got 10001"},
		{"--check.gateway.max-backoff=10ms", "check.gateway.max_backoff: must be at least 100ms, got 10ms"},
		{"--check.nccl.loopback-threshold-gbps=NaN", "check.nccl.loopback_threshold_gbps: must be a finite number not below 0, got NaN"},
		{"--check.nccl.allreduce-threshold-gbps=-Inf", "check.nccl.allreduce_threshold_gbps: must be a finite number not below 0, got -Inf"},
		{"--check.nccl.allreduce-bytes=0", "check.nccl.allreduce_bytes: must be at least 4 (one float32 element), got 0"},
		{"--check.nccl.allreduce-bytes=-1", "check.nccl.allreduce_bytes: must be at least 4 (one float32 element), got -1"},
		{"--check.gang.marker-dir=run/preflight", `check.gang.marker_dir: "run/preflight" is not an absolute path`},
		{"--check.gang.marker-dir=/etc/preflight/", `check.gang.marker_dir: "/etc/preflight/" is where another of the checks' volumes is mounted`},
		{"--inject.relay-socket=/run/faultline-agent/agent.sock", `inject.token_secret: "faultline-preflight-token" is set with inject.relay_socket`},
		{"--inject.relay-socket=run/agent.sock", `inject.relay_socket: "run/agent.sock" is not a clean absolute path`},
		{"--inject.relay-socket=/agent.sock", `inject.relay_socket: "/agent.sock" is not a clean absolute path of a socket in a directory other than /`},
		{"--inject.relay-socket-group=64500", "inject.relay_socket_group: set, but inject.relay_socket is off"},
		{"--check.relay-socket=/run/x.sock", "check.relay_socket: set by the webhook from inject.relay_socket; leave it empty"},
		{"--check.gang.marker-dir=/run/faultline-agent", `check.gang.marker_dir: "/run/faultline-agent" is where another of the checks' volumes is mounted`},
	} {
		if _, err := load(tc.flag); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.flag, err, tc.want)
		}
	}
}

// TestCheckNamesAreContainerNames: a check's name makes its init container
// "preflight-<name>", which the API server validates as a DNS-1123 label
// after the webhook's patch; a name that cannot be one would make every
// mutated pod fail creation, so it is refused at start.
func TestCheckNamesAreContainerNames(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"gpu:burn", `checks[2].name: "gpu:burn"`},
		{"burn-", `checks[2].name: "burn-"`},
		{"brûler", `checks[2].name: "brûler"`},
		{strings.Repeat("x", 54), `checks[2].name: "` + strings.Repeat("x", 54) + `"`},
	} {
		cfg := DefaultConfig()
		cfg.Namespaces.Include = []string{"training"}
		cfg.Checks = append(cfg.Checks, injection.CheckSpec{Name: tc.name, Image: "example.com/burn:1", Command: []string{"burn"}})
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err %v, want %q", tc.name, err, tc.want)
		}
	}
	cfg := DefaultConfig()
	cfg.Namespaces.Include = []string{"training"}
	cfg.Checks = append(cfg.Checks, injection.CheckSpec{Name: strings.Repeat("x", 53), Image: "example.com/burn:1", Command: []string{"burn"}})
	if err := cfg.Validate(); err != nil {
		t.Errorf("a 53-character name (a 63-character container name): %v", err)
	}
}
