package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// KubeOptions selects what StartKube runs besides etcd and kube-apiserver.
type KubeOptions struct {
	// ControllerManager runs kube-controller-manager with the controllers in
	// Controllers, so PDB status (disruptionsAllowed) is kept current and
	// every namespace gets its default ServiceAccount. Default false.
	ControllerManager bool
	// Controllers is kube-controller-manager's --controllers list. Default
	// "disruption,serviceaccount".
	Controllers string
	// KWOK runs kwok with the fast node and pod stages: every Node becomes
	// Ready and keeps a heartbeat, pods bound to a node (spec.nodeName; there
	// is no scheduler) become Running, and deleted or evicted pods really go
	// away. Default false.
	KWOK bool
	// Scheduler runs kube-scheduler, so pods without spec.nodeName
	// (a Deployment's, a DaemonSet's) are bound to nodes; with KWOK they
	// then become Running on kwok's fake nodes. Default false.
	Scheduler bool
	// APIServerArgs are extra kube-apiserver flags, appended last so they win.
	APIServerArgs []string
}

// Kube is a Kubernetes control plane started by StartKube: etcd and
// kube-apiserver, optionally kube-controller-manager, kube-scheduler and kwok. The client
// credentials are an admin token in the system:masters group.
//
// Measured on a 2-core machine with v1.34.4 and etcd 3.6.4 while other
// builds kept it busy: etcd ready in 0.4-1.5 s, kube-apiserver in 4-10 s
// (6 s for a restart), a graceful apiserver Stop ~1.3 s; RSS apiserver
// ~255 MB, etcd ~40 MB, kube-controller-manager ~80 MB, kwok ~75 MB.
type Kube struct {
	tb         testing.TB
	host       string
	caPEM      []byte
	token      string
	kubeconfig string
	client     kubernetes.Interface

	etcd, apiserver, kcm, kwok, scheduler *process

	closeOnce sync.Once
}

// kubeAssets returns $FAULTLINE_KUBE_ASSETS, else the cache directory of
// KubeVersion.
func kubeAssets() string {
	if d := os.Getenv("FAULTLINE_KUBE_ASSETS"); d != "" {
		return d
	}
	return filepath.Join(CacheDir(), "kube", KubeVersion)
}

// kwokStages are the stage files install.sh copies next to kwok.
var kwokStages = []string{"node-initialize", "node-heartbeat", "pod-ready", "pod-complete", "pod-delete"}

// StartKube starts etcd and kube-apiserver on free 127.0.0.1 ports (plus
// kube-controller-manager and kwok when opts ask for them) and waits until
// the apiserver is ready and the default namespace exists. Everything is
// stopped when the test ends.
//
// The ServiceAccount admission plugin is disabled, so pods can be created
// in any namespace without a ServiceAccount; RBAC is on, the admin token
// bypasses it.
func StartKube(tb testing.TB, opts KubeOptions) *Kube {
	tb.Helper()
	Server(tb, "a Kubernetes control plane", nil) // -short
	assets := kubeAssets()
	need := []string{"etcd", "kube-apiserver"}
	if opts.ControllerManager {
		need = append(need, "kube-controller-manager")
	}
	if opts.Scheduler {
		need = append(need, "kube-scheduler")
	}
	if opts.KWOK {
		need = append(need, "kwok")
		for _, s := range kwokStages {
			if _, err := os.Stat(filepath.Join(assets, "stages", s+".yaml")); err != nil {
				missing(tb, "kube", "no kwok stage "+s+".yaml in "+filepath.Join(assets, "stages"))
			}
		}
	}
	for _, b := range need {
		if !isExecutable(filepath.Join(assets, b)) {
			missing(tb, "kube", "no "+b+" in "+assets)
		}
	}
	if opts.Controllers == "" {
		opts.Controllers = "disruption,serviceaccount"
	}

	dir := tb.TempDir()
	certDir := filepath.Join(dir, "certs")
	mkdirs(tb, certDir, filepath.Join(dir, "etcd"))
	began := time.Now()

	certPEM, keyPEM := selfSignedCert(tb)
	saPub, saKey := serviceAccountKeys(tb)
	writeFile(tb, filepath.Join(certDir, "serving.crt"), certPEM, 0o644)
	writeFile(tb, filepath.Join(certDir, "serving.key"), keyPEM, 0o600)
	writeFile(tb, filepath.Join(certDir, "sa.pub"), saPub, 0o644)
	writeFile(tb, filepath.Join(certDir, "sa.key"), saKey, 0o600)
	token := randomHex(tb, 16)
	writeFile(tb, filepath.Join(dir, "tokens.csv"), []byte(token+`,admin,admin-uid,"system:masters"`+"\n"), 0o600)

	ps := freePorts(tb, 3)
	etcdPort, peerPort, apiPort := ps[0], ps[1], ps[2]
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)

	k := &Kube{
		tb:         tb,
		host:       fmt.Sprintf("https://127.0.0.1:%d", apiPort),
		caPEM:      certPEM,
		token:      token,
		kubeconfig: filepath.Join(dir, "kubeconfig"),
	}
	writeFile(tb, k.kubeconfig, k.kubeconfigYAML(), 0o600)

	g := newGroup(tb)
	k.etcd = g.add(&process{
		name: "etcd",
		path: filepath.Join(assets, "etcd"),
		args: []string{
			"--name=testenv",
			"--data-dir=" + filepath.Join(dir, "etcd"),
			"--listen-client-urls=" + etcdURL,
			"--advertise-client-urls=" + etcdURL,
			"--listen-peer-urls=" + peerURL,
			"--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=testenv=" + peerURL,
			"--unsafe-no-fsync",
			"--log-level=warn",
		},
		dir:     dir,
		logPath: filepath.Join(dir, "etcd.log"),
	})
	k.apiserver = g.add(&process{
		name: "kube-apiserver",
		path: filepath.Join(assets, "kube-apiserver"),
		args: append([]string{
			"--etcd-servers=" + etcdURL,
			"--bind-address=127.0.0.1",
			"--advertise-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", apiPort),
			"--cert-dir=" + certDir,
			"--tls-cert-file=" + filepath.Join(certDir, "serving.crt"),
			"--tls-private-key-file=" + filepath.Join(certDir, "serving.key"),
			"--service-cluster-ip-range=10.96.0.0/16",
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + filepath.Join(certDir, "sa.pub"),
			"--service-account-signing-key-file=" + filepath.Join(certDir, "sa.key"),
			"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
			"--authorization-mode=RBAC",
			"--endpoint-reconciler-type=none",
			"--disable-admission-plugins=ServiceAccount",
			"--allow-privileged=true",
			"--profiling=false",
		}, opts.APIServerArgs...),
		dir:     dir,
		logPath: filepath.Join(dir, "kube-apiserver.log"),
	})
	tb.Cleanup(k.Close)

	if err := k.etcd.start(); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	if err := waitReady(k.etcd, 30*time.Second, httpOK(etcdURL+"/health", nil)); err != nil {
		tb.Fatalf("testenv: %v\n%s", err, k.etcd.logTail(40))
	}
	etcdReady := time.Since(began)

	cs, err := kubernetes.NewForConfig(k.RESTConfig())
	if err != nil {
		tb.Fatalf("testenv: kube client: %v", err)
	}
	k.client = cs
	k.Start()
	apiReady := time.Since(began)

	if opts.ControllerManager {
		k.kcm = g.add(&process{
			name: "kube-controller-manager",
			path: filepath.Join(assets, "kube-controller-manager"),
			args: []string{
				"--kubeconfig=" + k.kubeconfig,
				"--controllers=" + opts.Controllers,
				"--leader-elect=false",
				"--secure-port=0",
				"--use-service-account-credentials=false",
			},
			dir:     dir,
			logPath: filepath.Join(dir, "kube-controller-manager.log"),
		})
		if err := k.kcm.start(); err != nil {
			tb.Fatalf("testenv: %v", err)
		}
		if slices.Contains(strings.Split(opts.Controllers, ","), "serviceaccount") {
			// The default ServiceAccount appearing shows the controllers run.
			if err := waitReady(k.kcm, 60*time.Second, func(ctx context.Context) error {
				_, err := k.client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
				return err
			}); err != nil {
				tb.Fatalf("testenv: %v\n%s", err, k.kcm.logTail(40))
			}
		}
	}
	if opts.Scheduler {
		k.scheduler = g.add(&process{
			name: "kube-scheduler",
			path: filepath.Join(assets, "kube-scheduler"),
			args: []string{
				"--kubeconfig=" + k.kubeconfig,
				"--authentication-kubeconfig=" + k.kubeconfig,
				"--authorization-kubeconfig=" + k.kubeconfig,
				"--leader-elect=false",
				"--secure-port=0",
			},
			dir:     dir,
			logPath: filepath.Join(dir, "kube-scheduler.log"),
		})
		if err := k.scheduler.start(); err != nil {
			tb.Fatalf("testenv: %v", err)
		}
	}
	if opts.KWOK {
		kwokPort := freePort(tb)
		args := []string{
			"--kubeconfig=" + k.kubeconfig,
			"--manage-all-nodes=true",
			fmt.Sprintf("--server-address=127.0.0.1:%d", kwokPort),
		}
		for _, s := range kwokStages {
			args = append(args, "--config="+filepath.Join(assets, "stages", s+".yaml"))
		}
		k.kwok = g.add(&process{
			name:    "kwok",
			path:    filepath.Join(assets, "kwok"),
			args:    args,
			dir:     dir,
			logPath: filepath.Join(dir, "kwok.log"),
		})
		if err := k.kwok.start(); err != nil {
			tb.Fatalf("testenv: %v", err)
		}
		if err := waitReady(k.kwok, 60*time.Second, httpOK(fmt.Sprintf("http://127.0.0.1:%d/healthz", kwokPort), nil)); err != nil {
			tb.Fatalf("testenv: %v\n%s", err, k.kwok.logTail(40))
		}
	}
	tb.Logf("testenv: kube %s ready on %s in %s (etcd %s, apiserver %s; controller-manager %v, scheduler %v, kwok %v)",
		KubeVersion, k.host, time.Since(began).Round(time.Millisecond),
		etcdReady.Round(time.Millisecond), apiReady.Round(time.Millisecond), opts.ControllerManager, opts.Scheduler, opts.KWOK)
	return k
}

// RESTConfig returns a new client config for the apiserver with the admin
// token (QPS 100, burst 200).
func (k *Kube) RESTConfig() *rest.Config {
	return &rest.Config{
		Host:            k.host,
		BearerToken:     k.token,
		TLSClientConfig: rest.TLSClientConfig{CAData: append([]byte(nil), k.caPEM...)},
		QPS:             100,
		Burst:           200,
		Timeout:         30 * time.Second,
	}
}

// Delayed returns a copy of rc whose every request is held for *delay
// (read at each request, so a test can slow the API server down and speed
// it up again) before it is sent: an API server that answers, but late —
// its etcd slow, a region far away.
func Delayed(rc *rest.Config, delay *atomic.Int64) *rest.Config {
	rc = rest.CopyConfig(rc)
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			select {
			case <-time.After(time.Duration(delay.Load())):
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
			return rt.RoundTrip(r)
		})
	})
	return rc
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Kubeconfig returns the path of a kubeconfig file for the admin user, for
// binaries under test that take --kubeconfig.
func (k *Kube) Kubeconfig() string { return k.kubeconfig }

// Client returns a clientset for the admin user.
func (k *Kube) Client() kubernetes.Interface { return k.client }

// Start starts kube-apiserver again after Stop, on the same port and over
// the same etcd, so every object survives; it waits until it is ready.
func (k *Kube) Start() {
	k.tb.Helper()
	if err := k.apiserver.start(); err != nil {
		k.tb.Fatalf("testenv: %v", err)
	}
	began := time.Now()
	if err := waitReady(k.apiserver, 90*time.Second, k.ready); err != nil {
		k.tb.Fatalf("testenv: %v\n%s", err, k.apiserver.logTail(60))
	}
	k.tb.Logf("testenv: kube-apiserver ready on %s in %s", k.host, time.Since(began).Round(time.Millisecond))
}

// ready succeeds once /readyz answers ok and the default namespace exists.
func (k *Kube) ready(ctx context.Context) error {
	body, err := k.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("readyz: %w: %s", err, body)
	}
	_, err = k.client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{})
	return err
}

// Stop stops kube-apiserver gracefully (SIGTERM; killed after 30 s), to
// test API outages. etcd, the controller manager and kwok keep running.
func (k *Kube) Stop() {
	k.tb.Helper()
	began := time.Now()
	k.apiserver.stop(syscall.SIGTERM, 30*time.Second)
	k.tb.Logf("testenv: kube-apiserver stopped in %s", time.Since(began).Round(time.Millisecond))
}

// Kill kills kube-apiserver (SIGKILL): an apiserver that died or was cut
// off, at once — a graceful Stop waits out its 30 s while clients hold
// watches open. Start brings it back.
func (k *Kube) Kill() {
	k.tb.Helper()
	k.apiserver.stop(syscall.SIGKILL, 0)
	k.tb.Logf("testenv: kube-apiserver killed")
}

// Close stops every process of the control plane. It is called by the test
// cleanup and is safe to call more than once.
func (k *Kube) Close() {
	k.closeOnce.Do(func() {
		for _, p := range []*process{k.kwok, k.scheduler, k.kcm, k.apiserver, k.etcd} {
			if p != nil {
				p.stop(syscall.SIGKILL, 10*time.Second)
			}
		}
	})
}

// kubeconfigYAML is a kubeconfig for the admin token.
func (k *Kube) kubeconfigYAML() []byte {
	return []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: testenv
  context:
    cluster: testenv
    user: admin
current-context: testenv
`, k.host, base64.StdEncoding.EncodeToString(k.caPEM), k.token))
}

// httpOK returns a check that GETs url and wants a 200.
func httpOK(url string, client *http.Client) func(ctx context.Context) error {
	if client == nil {
		client = http.DefaultClient
	}
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	}
}

// selfSignedCert returns a serving certificate for 127.0.0.1 and localhost
// that is its own CA, so clients can trust it directly.
func selfSignedCert(tb testing.TB) (certPEM, keyPEM []byte) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "faultline-testenv-apiserver"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.ParseIP("10.96.0.1")},
		DNSNames:              []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// serviceAccountKeys returns the PEM public and private key that sign and
// verify service-account tokens.
func serviceAccountKeys(tb testing.TB) (pubPEM, keyPEM []byte) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	pder, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pder}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// randomHex returns n random bytes, hex encoded.
func randomHex(tb testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	return hex.EncodeToString(b)
}
