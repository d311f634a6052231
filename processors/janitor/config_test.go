package janitor

import (
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/faultline/faultline/internal/syncbuf"
	"github.com/faultline/faultline/processors/clusters"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	key, keyPub := writeKeyPair(t, dir, "janitor")
	keyOpen, _ := writeKeyPair(t, dir, "open")
	if err := os.Chmod(keyOpen, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string // "" valid; else the key named
	}{
		{"defaults", func(*Config) {}, ""},
		{"workers", func(c *Config) { c.Workers = 0 }, "janitor.workers"},
		{"negative hung_after", func(c *Config) { c.HungAfter = -time.Second }, "janitor.hung_after"},
		{"negative limit", func(c *Config) { c.MaxConcurrentPerRack = -1 }, "janitor.max_concurrent_per_rack"},
		{"timeout", func(c *Config) { c.RebootTimeout = 0 }, "janitor.reboot_timeout"},
		{"provider", func(c *Config) { c.DefaultProvider = "gcp" }, "janitor.default_provider"},
		{"prefix", func(c *Config) { c.ProviderIDPrefixes = []string{"aws://"} }, "janitor.provider_id_prefixes[0]"},
		{"terminate action", func(c *Config) { c.Redfish.TerminateAction = "Nmi" }, "janitor.redfish.terminate_action"},
		{"ca file", func(c *Config) { c.Redfish.CAFile = "/nonexistent/ca.pem" }, "janitor.redfish.ca_file"},
		{"maintenance cluster", func(c *Config) { c.AWS.MaintenanceRegions = []string{"us-east-1"} }, "janitor.aws.maintenance_cluster"},
		// A name no cluster can be configured under: its events would be
		// decided as dry-run, never acted on.
		{"maintenance cluster name", func(c *Config) {
			c.AWS.MaintenanceRegions, c.AWS.MaintenanceCluster = []string{"us-east-1"}, "Prod_East"
		}, "janitor.aws.maintenance_cluster"},
		// A rack label no node can carry makes every node its own rack:
		// max_concurrent_per_rack would silently limit nothing.
		{"rack label empty", func(c *Config) { c.RackLabel = "" }, "janitor.rack_label"},
		{"rack label malformed", func(c *Config) { c.RackLabel = "faultline.io/rack " }, "janitor.rack_label"},
		{"rack label unused", func(c *Config) { c.RackLabel, c.MaxConcurrentPerRack = "", 0 }, ""},
		{"event namespace", func(c *Config) { c.EventNamespace = "Node_Events" }, "janitor.event_namespace"},
		{"event namespace unused", func(c *Config) { c.EventNamespace, c.NodeEvents = "", false }, ""},
		{"lease namespace", func(c *Config) { c.LeaseNamespace = "" }, "janitor.lease_namespace"},
		{"lease namespace unused", func(c *Config) { c.LeaseNamespace, c.LeaderElection = "", false }, ""},
		// It holds the maintenance monitor's state too.
		{"lease namespace for maintenance", func(c *Config) {
			c.LeaseNamespace, c.LeaderElection = "", false
			c.AWS.MaintenanceRegions, c.AWS.MaintenanceCluster = []string{"us-east-1"}, "c1"
		}, "janitor.lease_namespace"},
		// Renewed every 2/15 of it: shorter, one slow answer loses it.
		{"lease duration", func(c *Config) { c.LeaseDuration = time.Second }, "janitor.lease_duration"},
		{"local port", func(c *Config) { c.Local.Port = 0 }, "janitor.local.port"},
		// The bearer token every node held is gone: saying so beats
		// "unknown key".
		{"local token file", func(c *Config) { c.Local.TokenFile = "/etc/faultline/token" }, "janitor.local.token_file"},
		{"signing key missing", func(c *Config) { c.Local.SigningKeyFile = "/nonexistent/key" }, "janitor.local.signing_key_file"},
		{"signing key is the public one", func(c *Config) { c.Local.SigningKeyFile = keyPub }, "janitor.local.signing_key_file"},
		{"signing key open to all", func(c *Config) { c.Local.SigningKeyFile = keyOpen }, "janitor.local.signing_key_file"},
		{"signing key", func(c *Config) { c.Local.SigningKeyFile = key }, ""},
		{"local provider without a key", func(c *Config) { c.DefaultProvider = ProviderLocal }, "janitor.local.signing_key_file"},
		{"local prefix without a key", func(c *Config) { c.ProviderIDPrefixes = []string{"kwok://=local"} }, "janitor.local.signing_key_file"},
		{"local provider", func(c *Config) { c.DefaultProvider, c.Local.SigningKeyFile = ProviderLocal, key }, ""},
		{"bmc networks", func(c *Config) { c.Redfish.AllowedNetworks = []string{"10.20.0.0/16", "10.21.0.7", "fd00::/64"} }, ""},
		{"bmc network malformed", func(c *Config) { c.Redfish.AllowedNetworks = []string{"10.20.0.0/16", "10.20/16"} }, "janitor.redfish.allowed_networks[1]"},
		{"redfish provider without bmc networks", func(c *Config) { c.DefaultProvider = ProviderRedfish }, "janitor.redfish.allowed_networks"},
		{"redfish provider", func(c *Config) {
			c.DefaultProvider, c.Redfish.AllowedNetworks = ProviderRedfish, []string{"10.20.0.0/16"}
		}, ""},
		{"bmc secrets", func(c *Config) { c.Redfish.AllowedSecrets = []string{"bmc-east", "bmc-rack-*"} }, ""},
		{"bmc secret malformed", func(c *Config) { c.Redfish.AllowedSecrets = []string{"bmc-*-east"} }, "janitor.redfish.allowed_secrets[0]"},
		{"agent network malformed", func(c *Config) { c.Local.AllowedNetworks = []string{"nodes"} }, "janitor.local.allowed_networks[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mod(&c)
			err := c.Validate("janitor.")
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want+":")):
				t.Fatalf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}

// TestHungAfterNotBelowRebootTimeout: a hung_after a reboot times out
// before is said at start, not refused (a reboot_timeout lowered before
// the key existed); 0 (never) and the defaults say nothing.
func TestHungAfterNotBelowRebootTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		hung, timeout time.Duration
		warned        bool
	}{{15 * time.Minute, 30 * time.Minute, false}, {15 * time.Minute, 10 * time.Minute, true}, {0, 10 * time.Minute, false}} {
		var logs syncbuf.Buffer
		cfg := DefaultConfig()
		cfg.HungAfter, cfg.RebootTimeout = tc.hung, tc.timeout
		if _, err := New(cfg, clusters.Config{}, nil, Options{Log: slog.New(slog.NewTextHandler(&logs, nil))}); err != nil {
			t.Fatalf("hung_after %v, reboot_timeout %v: %v", tc.hung, tc.timeout, err)
		}
		if got := strings.Contains(logs.String(), "hung_after is not below reboot_timeout"); got != tc.warned {
			t.Errorf("hung_after %v, reboot_timeout %v: warned %v, want %v:\n%s", tc.hung, tc.timeout, got, tc.warned, logs.String())
		}
	}
}

// TestForceAfterNotBelowRebootTimeout: a force_after a reboot times out
// before (its forced reboot never sent: the reboot fails Timeout first)
// is said at start, not refused (a configuration that worked, its
// forced reboot never needed, keeps starting); 0 (never) and the
// defaults say nothing.
func TestForceAfterNotBelowRebootTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		force, timeout time.Duration
		warned         bool
	}{{10 * time.Minute, 30 * time.Minute, false}, {30 * time.Minute, 30 * time.Minute, true}, {40 * time.Minute, 30 * time.Minute, true}, {0, 10 * time.Minute, false}} {
		var logs syncbuf.Buffer
		cfg := DefaultConfig()
		cfg.ForceAfter, cfg.RebootTimeout, cfg.HungAfter = tc.force, tc.timeout, 0
		if _, err := New(cfg, clusters.Config{}, nil, Options{Log: slog.New(slog.NewTextHandler(&logs, nil))}); err != nil {
			t.Fatalf("force_after %v, reboot_timeout %v: %v", tc.force, tc.timeout, err)
		}
		if got := strings.Contains(logs.String(), "force_after is not below reboot_timeout"); got != tc.warned {
			t.Errorf("force_after %v, reboot_timeout %v: warned %v, want %v:\n%s", tc.force, tc.timeout, got, tc.warned, logs.String())
		}
	}
}

func TestProviderName(t *testing.T) {
	t.Parallel()
	c := DefaultConfig()
	c.ProviderIDPrefixes = []string{"aws://=aws", "aws:///eu=redfish"}
	c.DefaultProvider = "local"
	node := func(ann, lbl map[string]string, pid string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: ann, Labels: lbl}, Spec: corev1.NodeSpec{ProviderID: pid}}
	}
	for _, tc := range []struct {
		name       string
		labelsOnly bool
		n          *corev1.Node
		want, key  string // the provider, the node's own key that picked it
		wantErr    bool
	}{
		{"annotation wins", false, node(map[string]string{AnnotationProvider: "redfish"}, map[string]string{AnnotationProvider: "aws"}, "aws:///us/i-1"), "redfish", AnnotationProvider, false},
		{"label", false, node(nil, map[string]string{AnnotationProvider: "redfish"}, "aws:///us/i-1"), "redfish", AnnotationProvider, false},
		{"the node's own naming its pick anyway", false, node(map[string]string{AnnotationProvider: "aws"}, nil, "aws:///us/i-1"), "aws", "", false},
		{"the administrator's label wins", false, node(map[string]string{AnnotationProvider: "redfish"}, map[string]string{LabelProvider: "local"}, "aws:///us/i-1"), "local", "", false},
		{"labels_only: the node's own pick refused", true, node(map[string]string{AnnotationProvider: "redfish"}, nil, "aws:///us/i-1"), "", "", true},
		{"labels_only: the node's own naming its pick anyway", true, node(map[string]string{AnnotationProvider: "aws"}, nil, "aws:///us/i-1"), "aws", "", false},
		{"labels_only: the administrator's label", true, node(map[string]string{AnnotationProvider: "redfish"}, map[string]string{LabelProvider: "local"}, "aws:///us/i-1"), "local", "", false},
		{"prefix", false, node(nil, nil, "aws:///us-east-1a/i-1"), "aws", "", false},
		{"longest prefix", false, node(nil, nil, "aws:///eu-west-1a/i-1"), "redfish", "", false},
		{"default", false, node(nil, nil, "kwok://n"), "local", "", false},
	} {
		c.Redfish.LabelsOnly = tc.labelsOnly
		got, key, err := c.providerName(tc.n)
		if got != tc.want || key != tc.key || (err != nil) != tc.wantErr {
			t.Errorf("%s: %q (node's key %q, err %v), want %q (%q, err %v)", tc.name, got, key, err, tc.want, tc.key, tc.wantErr)
		}
	}
}

func TestLimiter(t *testing.T) {
	t.Parallel()
	l := newLimiter(3, 1, 2)
	if r := l.acquire("a", "c1", "r1", "redfish", false); r != "" {
		t.Fatal(r)
	}
	if r := l.acquire("a", "c1", "r1", "redfish", false); r != "" {
		t.Fatalf("re-acquire by the holder refused: %s", r)
	}
	if r := l.acquire("b", "c1", "r1", "redfish", false); r != "max_concurrent_per_rack" {
		t.Fatalf("second on rack r1: %q", r)
	}
	if r := l.acquire("b", "c1", "r2", "redfish", false); r != "" {
		t.Fatal(r)
	}
	if r := l.acquire("c", "c1", "r3", "redfish", false); r != "max_concurrent_per_provider" {
		t.Fatalf("third redfish: %q", r)
	}
	if r := l.acquire("c", "c1", "r3", "aws", false); r != "" {
		t.Fatal(r)
	}
	if r := l.acquire("d", "c1", "r4", "aws", false); r != "max_concurrent" {
		t.Fatalf("fourth in c1: %q", r)
	}
	if r := l.acquire("d", "c2", "r4", "aws", false); r != "" {
		t.Fatalf("another cluster is not limited by c1: %q", r)
	}
	if r := l.acquire("e", "c1", "r1", "redfish", true); r != "" || l.inProgress("c1") != 4 {
		t.Fatalf("forced acquire: %q, %d in progress", r, l.inProgress("c1"))
	}
	for _, k := range []string{"a", "b", "c", "e", "e"} {
		l.release(k)
	}
	if n := l.inProgress("c1"); n != 0 {
		t.Fatalf("%d in progress after release", n)
	}
}

func TestSetConditions(t *testing.T) {
	t.Parallel()
	u := &unstructured.Unstructured{Object: map[string]any{"status": map[string]any{"conditions": []any{
		map[string]any{"type": "SignalSent", "status": "Unknown", "reason": "Initializing", "lastTransitionTime": "2020-01-01T00:00:00Z"},
	}}}}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	out := setConditions(u, now, cond{"SignalSent", "True", "Succeeded", "sent"}, cond{"NodeReady", "Unknown", "Initializing", ""})
	if len(out) != 2 {
		t.Fatalf("%v", out)
	}
	c0 := out[0].(map[string]any)
	if c0["status"] != "True" || c0["lastTransitionTime"] != "2026-01-01T00:00:00Z" {
		t.Fatalf("changed condition: %v", c0)
	}
	u.Object["status"].(map[string]any)["conditions"] = out
	out = setConditions(u, now.Add(time.Hour), cond{"SignalSent", "True", "Succeeded", "again"})
	if c := out[0].(map[string]any); c["lastTransitionTime"] != "2026-01-01T00:00:00Z" || c["message"] != "again" {
		t.Fatalf("unchanged status moved lastTransitionTime: %v", c)
	}
}
