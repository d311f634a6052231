package janitor

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
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
	t.Parallel()
	cfg := DefaultConfig().Redfish
	cfg.AllowHTTP = true // the listener is http: refused by its address, not its scheme
	rf, err := NewRedfish(cfg, testLog)
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
	t.Parallel()
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
				cfg.AllowHTTP = true // the listener is http
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

// recordingBMC is a Redfish service with systems "1" and "2" (UUIDs
// ...0001, ...0002) that records every request and the resets it got.
type recordingBMC struct {
	mu     sync.Mutex
	got    []string
	resets []string
}

func (b *recordingBMC) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	b.got = append(b.got, r.Method+" "+r.URL.Path)
	b.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch p := strings.TrimSuffix(r.URL.Path, "/"); {
	case p == "/redfish/v1":
		_, _ = w.Write([]byte(`{"@odata.id":"/redfish/v1/","Id":"RootService","Systems":{"@odata.id":"/redfish/v1/Systems"}}`))
	case p == "/redfish/v1/Systems":
		_, _ = w.Write([]byte(`{"@odata.id":"/redfish/v1/Systems","Members":[{"@odata.id":"/redfish/v1/Systems/1"},{"@odata.id":"/redfish/v1/Systems/2"}],"Members@odata.count":2}`))
	case r.Method == http.MethodPost && strings.HasSuffix(p, "/Actions/ComputerSystem.Reset"):
		b.mu.Lock()
		b.resets = append(b.resets, strings.TrimSuffix(p, "/Actions/ComputerSystem.Reset"))
		b.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	case p == "/redfish/v1/Systems/1" || p == "/redfish/v1/Systems/2":
		_, _ = fmt.Fprintf(w, `{"@odata.id":%q,"Id":%q,"UUID":"00000000-0000-4000-8000-00000000000%s","PowerState":"On",
			"Actions":{"#ComputerSystem.Reset":{"target":%q}}}`, p, p[len(p)-1:], p[len(p)-1:], p+"/Actions/ComputerSystem.Reset")
	default:
		http.NotFound(w, r)
	}
}

func (b *recordingBMC) seen() (requests, resets []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.got...), append([]string(nil), b.resets...)
}

// TestBMCFromRestrictedLabels: a node's BMC is read from the
// node-restriction.kubernetes.io/faultline-bmc-* labels, which no kubelet
// may set or change under the NodeRestriction admission plugin, before its
// own annotations: a node that points faultline.io/bmc-address at another
// node's BMC (inside allowed_networks, the same credential) resets its
// own system, not that one; with redfish.labels_only the annotation is
// refused outright (BMCAnnotationNotAllowed), and the node's own system
// UUID does not pick among a BMC's systems. The allowlists still bound
// the labels. Before, the labels were not read: the annotation was
// followed and the other node's machine was reset.
func TestBMCFromRestrictedLabels(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kube := fake.NewClientset(bmcSecret("faultline", "bmc-credentials", "admin", "s3cret"),
		bmcSecret("faultline", "bmc-a", "admin", "s3cret"), bmcSecret("faultline", "other", "root", "calvin"))
	start := func(t *testing.T) (*recordingBMC, string) {
		b := &recordingBMC{}
		srv := httptest.NewTLSServer(b)
		t.Cleanup(srv.Close)
		return b, srv.URL
	}
	for _, tc := range []struct {
		name       string
		labelsOnly bool
		networks   []string
		secrets    []string
		labels     func(own string) map[string]string // own: the node's BMC's host:port
		annotation bool                               // faultline.io/bmc-address: the other BMC's system 2
		uuid       string                             // the node's reported system UUID
		reason     string                             // "": reset sent
		want       string                             // in the error
		ownResets  []string
		otherSent  bool // the other BMC was asked anything
	}{
		{name: "labels win over the annotation", annotation: true,
			labels: func(own string) map[string]string {
				h, p, _ := strings.Cut(own, ":")
				return map[string]string{LabelBMCHost: h, LabelBMCPort: p, LabelBMCSystem: "1"}
			},
			ownResets: []string{"/redfish/v1/Systems/1"}},
		{name: "labels only, labelled", labelsOnly: true,
			labels: func(own string) map[string]string {
				h, p, _ := strings.Cut(own, ":")
				return map[string]string{LabelBMCHost: h, LabelBMCPort: p, LabelBMCSystem: "2", LabelBMCSecret: "bmc-a"}
			},
			secrets: []string{"bmc-*"}, ownResets: []string{"/redfish/v1/Systems/2"}},
		{name: "labels only, the annotation alone", labelsOnly: true, annotation: true, reason: ReasonBMCAnnotationNotAllowed,
			want: "janitor.redfish.labels_only is set and the annotation is the node's own"},
		{name: "labels only, neither", labelsOnly: true, reason: ReasonNoBMC, want: "has no node-restriction.kubernetes.io/faultline-bmc-host label"},
		// Compatibility: without labels_only an unlabelled node is still
		// served by its annotation.
		{name: "no labels, annotation followed", annotation: true, otherSent: true},
		{name: "port label without the host", annotation: true, labels: func(string) map[string]string { return map[string]string{LabelBMCPort: "443"} },
			reason: ReasonNoBMC, want: "has the label node-restriction.kubernetes.io/faultline-bmc-port but not node-restriction.kubernetes.io/faultline-bmc-host"},
		{name: "not a port", labels: func(own string) map[string]string {
			h, _, _ := strings.Cut(own, ":")
			return map[string]string{LabelBMCHost: h, LabelBMCPort: "https"}
		}, reason: ReasonNoBMC, want: `faultline-bmc-port "https" is not a port`},
		{name: "label host outside the networks", networks: []string{"10.0.0.0/8"}, labels: func(own string) map[string]string {
			h, p, _ := strings.Cut(own, ":")
			return map[string]string{LabelBMCHost: h, LabelBMCPort: p}
		}, reason: ReasonBMCAddressNotAllowed, want: `label node-restriction.kubernetes.io/faultline-bmc-host "127.0.0.1" refused`},
		{name: "label Secret not allowed", labels: func(own string) map[string]string {
			h, p, _ := strings.Cut(own, ":")
			return map[string]string{LabelBMCHost: h, LabelBMCPort: p, LabelBMCSecret: "other"}
		}, reason: ReasonBMCSecretNotAllowed, want: `node-restriction.kubernetes.io/faultline-bmc-secret names Secret "other"`},
		// Two systems, none named: the node's reported UUID picks one
		// unless labels_only (the node reports it itself).
		{name: "system by the node's UUID", uuid: "00000000-0000-4000-8000-000000000002", labels: func(own string) map[string]string {
			h, p, _ := strings.Cut(own, ":")
			return map[string]string{LabelBMCHost: h, LabelBMCPort: p}
		}, ownResets: []string{"/redfish/v1/Systems/2"}},
		{name: "labels only, system not by the node's UUID", labelsOnly: true, uuid: "00000000-0000-4000-8000-000000000002", labels: func(own string) map[string]string {
			h, p, _ := strings.Cut(own, ":")
			return map[string]string{LabelBMCHost: h, LabelBMCPort: p}
		}, reason: ReasonSystemNotFound, want: "name node gpu-1's in the label node-restriction.kubernetes.io/faultline-bmc-system"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			own, ownURL := start(t)
			other, otherURL := start(t)
			cfg := DefaultConfig().Redfish
			cfg.InsecureSkipVerify, cfg.Timeout, cfg.LabelsOnly, cfg.AllowedSecrets = true, 5*time.Second, tc.labelsOnly, tc.secrets
			cfg.AllowedNetworks = []string{"127.0.0.0/8"}
			if tc.networks != nil {
				cfg.AllowedNetworks = tc.networks
			}
			rf, err := NewRedfish(cfg, testLog)
			if err != nil {
				t.Fatal(err)
			}
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Labels: map[string]string{}, Annotations: map[string]string{}}}
			n.Status.NodeInfo.SystemUUID = tc.uuid
			if tc.labels != nil {
				n.Labels = tc.labels(strings.TrimPrefix(ownURL, "https://"))
			}
			if tc.annotation {
				n.Annotations[AnnotationBMC] = otherURL + "/redfish/v1/Systems/2"
			}
			err = rf.Reboot(ctx, Target{Node: n, Kube: kube}, Graceful)
			_, resets := own.seen()
			otherReqs, _ := other.seen()
			switch {
			case tc.reason != "" && (reasonOf(err) != tc.reason || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("%v (reason %s), want %s %q", err, reasonOf(err), tc.reason, tc.want)
			case tc.reason == "" && err != nil:
				t.Fatalf("%v, want the reset sent", err)
			case !slices.Equal(resets, tc.ownResets):
				t.Fatalf("the node's BMC got resets %q, want %q", resets, tc.ownResets)
			case tc.otherSent != (len(otherReqs) > 0):
				t.Fatalf("the other node's BMC was sent %q, want anything sent %v", otherReqs, tc.otherSent)
			}
		})
	}
}

// TestBMCAnnotationHTTPNeedsAllowHTTP: faultline.io/bmc-address is the
// node's own, and an http:// one would have the BMC's credentials (often
// the fleet's default_secret) sent in cleartext to whoever receives on
// that address. It is refused unless janitor.redfish.allow_http is set,
// before anything is read or sent; https is unaffected.
func TestBMCAnnotationHTTPNeedsAllowHTTP(t *testing.T) {
	t.Parallel()
	kube := fake.NewClientset(bmcSecret("faultline", "bmc-credentials", "admin", "s3cret"))
	for _, tc := range []struct {
		name      string
		tls       bool
		allowHTTP bool
		reason    string // "": the BMC was reset
	}{
		{name: "http refused by default", reason: ReasonBMCHTTPNotAllowed},
		{name: "http with allow_http", allowHTTP: true},
		{name: "https", tls: true},
		{name: "https with allow_http", tls: true, allowHTTP: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := &recordingBMC{}
			srv := httptest.NewUnstartedServer(b)
			if tc.tls {
				srv.StartTLS()
			} else {
				srv.Start()
			}
			t.Cleanup(srv.Close)
			cfg := DefaultConfig().Redfish
			cfg.InsecureSkipVerify, cfg.Timeout, cfg.AllowedNetworks, cfg.AllowHTTP = true, 5*time.Second, []string{"127.0.0.0/8"}, tc.allowHTTP
			rf, err := NewRedfish(cfg, testLog)
			if err != nil {
				t.Fatal(err)
			}
			n := bmcNode("gpu-1", srv.URL+"/redfish/v1/Systems/1", "")
			err = rf.Reboot(context.Background(), Target{Node: n, Kube: kube}, Graceful)
			reqs, resets := b.seen()
			if tc.reason != "" {
				if reasonOf(err) != tc.reason || !strings.Contains(err.Error(), "janitor.redfish.allow_http") || len(reqs) > 0 {
					t.Fatalf("%v (reason %s), want %s naming janitor.redfish.allow_http and nothing sent; sent %q", err, reasonOf(err), tc.reason, reqs)
				}
				return
			}
			if err != nil || !slices.Equal(resets, []string{"/redfish/v1/Systems/1"}) {
				t.Fatalf("%v: resets %q, want /redfish/v1/Systems/1 (requests %q)", err, resets, reqs)
			}
		})
	}
}

// TestBMCRedirectToHTTPRefused: an https BMC redirecting to http would
// have its credentials sent on in cleartext (net/http keeps the
// Authorization header for the same host): the redirect is refused
// unless janitor.redfish.allow_http.
func TestBMCRedirectToHTTPRefused(t *testing.T) {
	kube := fake.NewClientset(bmcSecret("faultline", "bmc-credentials", "admin", "s3cret"))
	plain := &recordingBMC{}
	httpSrv := httptest.NewServer(plain)
	t.Cleanup(httpSrv.Close)
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, httpSrv.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	t.Cleanup(tlsSrv.Close)
	cfg := DefaultConfig().Redfish
	cfg.InsecureSkipVerify, cfg.Timeout, cfg.AllowedNetworks = true, 5*time.Second, []string{"127.0.0.0/8"}
	rf, err := NewRedfish(cfg, testLog)
	if err != nil {
		t.Fatal(err)
	}
	err = rf.Reboot(context.Background(), Target{Node: bmcNode("gpu-1", tlsSrv.URL+"/redfish/v1/Systems/1", ""), Kube: kube}, Graceful)
	if reqs, _ := plain.seen(); err == nil || len(reqs) > 0 {
		t.Fatalf("redirected to http: err %v, http requests %q; want an error and none", err, reqs)
	}
}
