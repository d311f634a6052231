package checks

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/internal/config"
)

func load(t *testing.T, toml string, args ...string) (Config, error) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.NodeName = "n1"
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("secret-token-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Gateway.TokenFile = tok
	if toml != "" {
		p := filepath.Join(t.TempDir(), "c.toml")
		if err := os.WriteFile(p, []byte(toml), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"--config", p}, args...)
	}
	_, err := config.Load("check", args, &cfg, cfg.RegisterFlags, cfg.Validate, io.Discard)
	return cfg, err
}

// TestConfigTOMLAndFlags: TOML sections (the embedded report.Config's
// [gateway] and [spool] included), flags win, unknown keys and bad values
// are refused naming the key.
func TestConfigTOMLAndFlags(t *testing.T) {
	cfg, err := load(t, `
timeout = "15m"
[gateway]
addr = "gw.example:50051"
[spool]
drain_timeout = "5s"
[dcgm]
diag_level = 2
[nccl]
loopback_threshold_gbps = 42.5
instance_types = { "p5.48xlarge" = "aws-p5.48xlarge.xml" }
[gang]
timeout = "30s"
`, "--dcgm.diag-level=3", "--nccl.instance-types=x1=a.xml,x2=b.xml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Timeout != 15*time.Minute || cfg.Gateway.Addr != "gw.example:50051" || cfg.Spool.DrainTimeout != 5*time.Second ||
		cfg.DCGM.DiagLevel != 3 || cfg.NCCL.LoopbackThresholdGBps != 42.5 || cfg.Gang.Timeout != 30*time.Second ||
		!reflect.DeepEqual(cfg.NCCL.InstanceTypes, map[string]string{"x1": "a.xml", "x2": "b.xml"}) {
		t.Fatalf("config %+v", cfg)
	}
	for _, tc := range []struct{ toml, flag, want string }{
		{"[dcgm]\ndiag_levle = 2\n", "", "unknown keys: dcgm.diag_levle"},
		{"", "--dcgm.format=xml", `dcgm.format: "xml" is not table or json`},
		{"[nccl]\ninstance_types = { \"a\" = \"../etc/passwd\" }\n", "", "nccl.instance_types: a"},
		// An empty name made NCCL_TOPO_FILE the topology directory itself.
		{"[nccl]\ninstance_types = { \"p5.48xlarge\" = \"\" }\n", "", `nccl.instance_types: p5.48xlarge = ""`},
		{"[nccl]\ninstance_types = { \"a\" = \"..\" }\n", "", `nccl.instance_types: a = ".."`},
		{"processing_strategy = \"STORE_AND_ANALYSE\"\n", "", `processing_strategy: "STORE_AND_ANALYSE" is not EXECUTE_REMEDIATION or STORE_ONLY`},
		{"[dcgm]\nhostengine_addr = \"\"\n", "", "dcgm.hostengine_addr: required"},
		{"[gateway]\ninsecure = true\nca_file = \"/x\"\n", "", "gateway.ca_file: set, but gateway.insecure is true"},
		{"", "--nccl.instance-types=nokey", `"nokey" is not key=value`},
		{"", "--gang.poll-interval=0s", "gang.poll_interval: must be positive"},
		// NaN compares false with every bound: a NaN threshold would
		// pass every bandwidth.
		{"", "--nccl.loopback-threshold-gbps=NaN", "nccl.loopback_threshold_gbps: must be a finite number not below 0, got NaN"},
		{"[nccl]\nallreduce_threshold_gbps = nan\n", "", "nccl.allreduce_threshold_gbps: must be a finite number not below 0, got NaN"},
		{"", "--nccl.allreduce-threshold-gbps=+Inf", "nccl.allreduce_threshold_gbps: must be a finite number not below 0, got +Inf"},
		{"", "--nccl.loopback-threshold-gbps=-1", "nccl.loopback_threshold_gbps: must be a finite number not below 0, got -1"},
		{"", "--nccl.allreduce-bytes=0", "nccl.allreduce_bytes: must be at least 4 (one float32 element), got 0"},
		{"", "--nccl.allreduce-bytes=-1", "nccl.allreduce_bytes: must be at least 4 (one float32 element), got -1"},
		{"", "--gateway.batch-size=0", "gateway.batch_size: must be in 1..10000, got 0"},
		// A timeout shorter than the diagnostic's run timed out every run:
		// every GPU pod held in Init:Error on healthy nodes.
		{"", "--dcgm.diag-level=3", "timeout: 5m0s is shorter than dcgm.diag_level 3's run (~15m); raise timeout to at least 15m0s"},
		{"[dcgm]\ndiag_level = 4\n", "--timeout=20m", "timeout: 20m0s is shorter than dcgm.diag_level 4's run (~1h); raise timeout to at least 1h0m0s"},
		{"timeout = \"90s\"\n", "--dcgm.diag-level=2", "timeout: 1m30s is shorter than dcgm.diag_level 2's run (~2m); raise timeout to at least 2m0s"},
	} {
		var args []string
		if tc.flag != "" {
			args = append(args, tc.flag)
		}
		if _, err := load(t, tc.toml, args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q %q: err %v, want %q", tc.toml, tc.flag, err, tc.want)
		}
	}
}

// TestRenderFlags: the flags the webhook renders, parsed onto a default
// config, reproduce the config; defaults and the node/pod flags are not
// rendered; the token's content never appears.
func TestRenderFlags(t *testing.T) {
	want := DefaultConfig()
	want.DCGM.DiagLevel = 2
	want.DCGM.HostengineAddr = "dcgm.nvsentinel.svc:5555"
	want.NCCL.AllreduceThresholdGBps = 7.5
	want.NCCL.InstanceTypes = map[string]string{"p5.48xlarge": "aws-p5.48xlarge.xml"}
	want.Gateway.Insecure = true
	want.Gateway.BatchSize = 250
	want.Gang.Timeout = 10 * time.Minute
	want.NodeName = "must-not-render"
	flags := RenderFlags(want)
	for _, f := range flags {
		if strings.HasPrefix(f, "--node-name") || strings.HasPrefix(f, "--pod.") || strings.HasPrefix(f, "--timeout=") {
			t.Errorf("rendered %s", f)
		}
	}
	got := DefaultConfig()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	got.RegisterFlags(fs)
	if err := fs.Parse(flags); err != nil {
		t.Fatal(err)
	}
	got.NodeName = want.NodeName
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip:\n got %+v\nwant %+v\nflags %v", got, want, flags)
	}
	if len(RenderFlags(DefaultConfig())) != 0 {
		t.Errorf("defaults render as %v", RenderFlags(DefaultConfig()))
	}
}
