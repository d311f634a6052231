package janitor

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// listener is a host a node's annotation points at: it records the
// requests and the credentials it was sent.
type listener struct {
	*httptest.Server
	mu    sync.Mutex
	got   []string
	auths []string
}

func newListener(t *testing.T) *listener {
	l := &listener{}
	l.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		l.got = append(l.got, r.Method+" "+r.URL.Path)
		if a := r.Header.Get("Authorization"); a != "" {
			l.auths = append(l.auths, a)
		}
		l.mu.Unlock()
		if strings.TrimSuffix(r.URL.Path, "/") == "/redfish/v1" { // a BMC, to be logged in to
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"@odata.id":"/redfish/v1/","Systems":{"@odata.id":"/redfish/v1/Systems"}}`))
			return
		}
		http.Error(w, "no", http.StatusServiceUnavailable)
	}))
	t.Cleanup(l.Close)
	return l
}

func (l *listener) seen() (requests, credentials []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got...), append([]string(nil), l.auths...)
}

// TestNodeAnnotationsGetNoBMCCredentials: a node's annotations are the
// node's own (its kubelet may edit them). With the default configuration
// a node that points faultline.io/bmc-address at a host of its choosing,
// and faultline.io/bmc-secret at another Secret of the janitor's
// namespace, is refused, and that host is sent nothing: before, the
// janitor logged in there with the fleet's BMC credentials.
func TestNodeAnnotationsGetNoBMCCredentials(t *testing.T) {
	rf, err := NewRedfish(DefaultConfig().Redfish, testLog)
	if err != nil {
		t.Fatal(err)
	}
	kube := fake.NewClientset(bmcSecret("faultline", "bmc-credentials", "admin", "s3cret"),
		bmcSecret("faultline", "other-cluster-bmc", "root", "calvin"))
	for _, tc := range []struct {
		name   string
		secret string
		reason string
	}{
		{"its own host", "", "BMCAddressNotAllowed"},
		{"its own host and another Secret", "other-cluster-bmc", "BMCAddressNotAllowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := newListener(t)
			n := bmcNode("gpu-evil", host.URL, "")
			if tc.secret != "" {
				n.Annotations[AnnotationBMCSecret] = tc.secret
			}
			err := rf.Reboot(context.Background(), Target{Node: n, Kube: kube}, Graceful)
			reqs, creds := host.seen()
			if reasonOf(err) != tc.reason || len(reqs) > 0 {
				t.Fatalf("reboot: %v (reason %s, want %s); the node's host was sent %q with credentials %q", err, reasonOf(err), tc.reason, reqs, creds)
			}
		})
	}
}

// TestAllowlists: BMC and agent addresses from a node's annotations are
// followed only into the configured networks — every address a host name
// resolves to, and every connection's — and faultline.io/bmc-secret only
// to a configured Secret; a refusal says which key to set, and nothing is
// read or sent.
func TestAllowlists(t *testing.T) {
	ctx := context.Background()
	kube := fake.NewClientset(bmcSecret("faultline", "bmc-credentials", "admin", "s3cret"),
		bmcSecret("faultline", "bmc-rack-7", "admin", "s3cret"), bmcSecret("faultline", "other-cluster-bmc", "root", "calvin"))
	lookup := func(answers map[string][]string) lookupFunc {
		return func(_ context.Context, host string) ([]netip.Addr, error) {
			var out []netip.Addr
			for _, a := range answers[host] {
				out = append(out, netip.MustParseAddr(a))
			}
			return out, nil
		}
	}
	port := func(l *listener) string { return l.URL[strings.LastIndex(l.URL, ":"):] }

	t.Run("redfish", func(t *testing.T) {
		for _, tc := range []struct {
			name     string
			networks []string
			secrets  []string
			addr     func(l *listener) string // the annotation
			secret   string
			dns      map[string][]string
			reason   string // "" reached the BMC (the listener's 503 then)
			want     string
		}{
			{name: "no allowlist", addr: func(l *listener) string { return l.URL },
				reason: ReasonBMCAddressNotAllowed, want: "janitor.redfish.allowed_networks is empty"},
			{name: "outside", networks: []string{"10.20.0.0/16"}, addr: func(l *listener) string { return l.URL },
				reason: ReasonBMCAddressNotAllowed, want: "127.0.0.1 is not in janitor.redfish.allowed_networks"},
			{name: "inside", networks: []string{"10.20.0.0/16", "127.0.0.0/8"}, addr: func(l *listener) string { return l.URL }},
			{name: "a bare address", networks: []string{"127.0.0.1"}, addr: func(l *listener) string { return l.URL + "/redfish/v1/Systems/1" }},
			// A name is checked by every address it resolves to.
			{name: "a name, one address outside", networks: []string{"127.0.0.0/8"}, addr: func(l *listener) string { return "http://bmc-7.example" + port(l) },
				dns: map[string][]string{"bmc-7.example": {"127.0.0.1", "192.0.2.9"}}, reason: ReasonBMCAddressNotAllowed,
				want: "bmc-7.example resolves to 192.0.2.9, which is not in janitor.redfish.allowed_networks"},
			{name: "a name that does not resolve", networks: []string{"127.0.0.0/8"}, addr: func(l *listener) string { return "http://bmc-8.example" + port(l) },
				reason: ReasonBMCAddressNotAllowed, want: "bmc-8.example resolves to no address"},
			// Checked when the annotation was read, another address when
			// connecting (a name that resolves otherwise now): the
			// connection is refused too.
			{name: "a name resolving elsewhere at the connection", networks: []string{"10.0.0.0/8"}, addr: func(l *listener) string { return "http://localhost" + port(l) },
				dns: map[string][]string{"localhost": {"10.0.0.5"}}, reason: ReasonBMCAddressNotAllowed, want: "not in janitor.redfish.allowed_networks"},
			{name: "another Secret, none allowed", networks: []string{"127.0.0.0/8"}, addr: func(l *listener) string { return l.URL }, secret: "other-cluster-bmc",
				reason: ReasonBMCSecretNotAllowed, want: `names Secret "other-cluster-bmc", which janitor.redfish.allowed_secrets does not list`},
			{name: "another Secret, not listed", networks: []string{"127.0.0.0/8"}, secrets: []string{"bmc-rack-*"}, addr: func(l *listener) string { return l.URL },
				secret: "other-cluster-bmc", reason: ReasonBMCSecretNotAllowed, want: "does not list"},
			{name: "a Secret by prefix", networks: []string{"127.0.0.0/8"}, secrets: []string{"bmc-rack-*"}, addr: func(l *listener) string { return l.URL }, secret: "bmc-rack-7"},
			{name: "the default Secret named", networks: []string{"127.0.0.0/8"}, addr: func(l *listener) string { return l.URL }, secret: "bmc-credentials"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				cfg := DefaultConfig().Redfish
				cfg.AllowedNetworks, cfg.AllowedSecrets, cfg.Timeout = tc.networks, tc.secrets, 5*time.Second
				rf, err := NewRedfish(cfg, testLog)
				if err != nil {
					t.Fatal(err)
				}
				rf.lookup = lookup(tc.dns)
				host := newListener(t)
				n := bmcNode("gpu-1", tc.addr(host), "")
				if tc.secret != "" {
					n.Annotations[AnnotationBMCSecret] = tc.secret
				}
				err = rf.Reboot(ctx, Target{Node: n, Kube: kube}, Graceful)
				reqs, creds := host.seen()
				switch {
				case tc.reason != "" && (reasonOf(err) != tc.reason || !strings.Contains(err.Error(), tc.want) || len(reqs) > 0):
					t.Fatalf("%v (reason %s), want %s %q and nothing sent; sent %q with %q", err, reasonOf(err), tc.reason, tc.want, reqs, creds)
				case tc.reason == "" && (len(reqs) == 0 || strings.Contains(reasonOf(err), "NotAllowed")):
					t.Fatalf("%v: the allowed BMC was not asked (%q)", err, reqs)
				}
			})
		}
	})

	t.Run("local", func(t *testing.T) {
		key, _ := writeKeyPair(t, t.TempDir(), "janitor")
		for _, tc := range []struct {
			name       string
			networks   []string
			annotation bool // else the InternalIP
			reason     string
			want       string
		}{
			{name: "annotation, no allowlist", annotation: true, reason: ReasonAgentAddressNotAllowed, want: "janitor.local.allowed_networks is empty"},
			{name: "annotation, outside", networks: []string{"10.0.0.0/8"}, annotation: true, reason: ReasonAgentAddressNotAllowed, want: "127.0.0.1 is not in janitor.local.allowed_networks"},
			{name: "annotation, inside", networks: []string{"127.0.0.0/8"}, annotation: true},
			{name: "InternalIP, no allowlist", networks: nil},
			{name: "InternalIP, outside", networks: []string{"10.0.0.0/8"}, reason: ReasonAgentAddressNotAllowed, want: "InternalIP refused: 127.0.0.1 is not in"},
			{name: "InternalIP, inside", networks: []string{"127.0.0.0/8"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				host := newListener(t)
				cfg := DefaultConfig().Local
				cfg.AllowedNetworks, cfg.SigningKeyFile, cfg.Timeout = tc.networks, key, 5*time.Second
				_, p, _ := strings.Cut(strings.TrimPrefix(host.URL, "http://"), ":")
				var err error
				if cfg.Port, err = strconv.Atoi(p); err != nil {
					t.Fatal(err)
				}
				l, err := NewLocal(cfg)
				if err != nil {
					t.Fatal(err)
				}
				n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Annotations: map[string]string{}}}
				n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}
				if tc.annotation {
					n.Annotations[AnnotationAgent] = strings.TrimPrefix(host.URL, "http://")
					n.Status.Addresses = nil
				}
				err = l.Reboot(ctx, Target{Node: n}, Graceful)
				reqs, _ := host.seen()
				switch {
				case tc.reason != "" && (reasonOf(err) != tc.reason || !strings.Contains(err.Error(), tc.want) || len(reqs) > 0):
					t.Fatalf("%v (reason %s), want %s %q and nothing sent; sent %q", err, reasonOf(err), tc.reason, tc.want, reqs)
				case tc.reason == "" && len(reqs) == 0:
					t.Fatalf("%v: the allowed agent was not asked", err)
				}
			})
		}
	})
}
