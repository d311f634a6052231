package clusters

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/faultline/faultline/internal/testenv"
)

// TestWatchClientsOutliveTimeout: on a real apiserver with kube.timeout
// 1s, a watch through the request clients is cut at the timeout (client-go
// makes it the http.Client's), while the same watch through the watch
// clients, which the roles' informers use, stays open.
func TestWatchClientsOutliveTimeout(t *testing.T) {
	t.Parallel() // waits on its own API server; mostly idle
	k := testenv.StartKube(t, testenv.KubeOptions{})
	cfg := DefaultConfig()
	cfg.Timeout = time.Second
	cfg.Clusters = []Cluster{{Name: "c", Kubeconfig: k.Kubeconfig()}}
	cl, err := NewRegistry(cfg, nil).Get("c")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	type watchFunc func(context.Context, metav1.ListOptions) (watch.Interface, error)
	watches := []struct {
		name  string
		cut   bool // at kube.timeout
		watch watchFunc
	}{
		{"Kube", true, cl.Kube.CoreV1().Namespaces().Watch},
		{"Dynamic", true, cl.Dynamic.Resource(ns).Watch},
		{"WatchKube", false, cl.WatchKube.CoreV1().Namespaces().Watch},
		{"WatchDynamic", false, cl.WatchDynamic.Resource(ns).Watch},
	}
	start := time.Now()
	ended := make([]chan time.Duration, len(watches))
	for i, w := range watches {
		wi, err := w.watch(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("%s: watch: %v", w.name, err)
		}
		defer wi.Stop()
		ended[i] = make(chan time.Duration, 1)
		go func() {
			for range wi.ResultChan() { // the namespaces there, then nothing
			}
			ended[i] <- time.Since(start)
		}()
	}
	time.Sleep(4 * time.Second)
	for i, w := range watches {
		select {
		case after := <-ended[i]:
			if !w.cut {
				t.Errorf("%s: watch ended after %v; want it open past kube.timeout", w.name, after.Round(time.Millisecond))
			}
		default:
			if w.cut {
				t.Errorf("%s: watch still open after 4s with kube.timeout 1s; this test no longer shows why the watch clients exist", w.name)
			}
		}
	}
}

// TestRotatedCredentialsFollowed: a cluster's credentials rotated on disk
// (a kubeconfig Secret rewritten with a new token, or the token_file
// renewed) while the old one is revoked: the cluster's clients — requests
// and watches, typed and dynamic — use the new one within seconds, without
// a restart. Before, a kubeconfig's clients kept the credentials of its
// first read and every request was refused (401) until the processor was
// restarted.
func TestRotatedCredentialsFollowed(t *testing.T) {
	t.Parallel() // waits on its own API server; mostly idle
	k := testenv.StartKube(t, testenv.KubeOptions{})
	ctx := context.Background()
	admin := k.Client()
	rc := k.RESTConfig()
	const ns = "default"
	for i, tc := range []struct {
		name string
		// write puts token in the cluster's files under dir (atomically, as
		// the kubelet updates a mounted Secret) and returns its Cluster.
		write func(t *testing.T, dir, token string) Cluster
	}{
		{"kubeconfig token", func(t *testing.T, dir, token string) Cluster {
			writeAtomic(t, filepath.Join(dir, "kubeconfig"), kubeconfigWith(t, rc, token))
			return Cluster{Name: "c", Kubeconfig: filepath.Join(dir, "kubeconfig")}
		}},
		{"token_file", func(t *testing.T, dir, token string) Cluster {
			writeAtomic(t, filepath.Join(dir, "kubeconfig"), kubeconfigWith(t, rc, ""))
			writeAtomic(t, filepath.Join(dir, "token"), []byte(token))
			return Cluster{Name: "c", Kubeconfig: filepath.Join(dir, "kubeconfig"), TokenFile: filepath.Join(dir, "token")}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sa := fmt.Sprintf("rotated-%d", i)
			if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: sa},
				RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
				Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}},
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			// A token valid while its Secret exists: deleting the Secret
			// revokes it.
			token := func(secret string) (string, *corev1.Secret) {
				s, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: secret}}, metav1.CreateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				tr, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
					BoundObjectRef: &authnv1.BoundObjectReference{APIVersion: "v1", Kind: "Secret", Name: s.Name, UID: s.UID},
				}}, metav1.CreateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				return tr.Status.Token, s
			}
			dir := t.TempDir()
			old, oldSecret := token(sa + "-old")
			cfg := DefaultConfig()
			cfg.Clusters = []Cluster{tc.write(t, dir, old)}
			cl, err := NewRegistry(cfg, nil).Get("c")
			if err != nil {
				t.Fatal(err)
			}
			nsRes := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
			calls := []struct {
				name string
				call func(context.Context) error
			}{
				{"Kube", func(ctx context.Context) error {
					_, err := cl.Kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
					return err
				}},
				{"WatchKube", func(ctx context.Context) error {
					_, err := cl.WatchKube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
					return err
				}},
				{"Dynamic", func(ctx context.Context) error {
					_, err := cl.Dynamic.Resource(nsRes).List(ctx, metav1.ListOptions{})
					return err
				}},
				{"WatchDynamic", func(ctx context.Context) error {
					_, err := cl.WatchDynamic.Resource(nsRes).List(ctx, metav1.ListOptions{})
					return err
				}},
			}
			for _, c := range calls {
				if err := c.call(ctx); err != nil {
					t.Fatalf("%s before the rotation: %v", c.name, err)
				}
			}

			// Rotate: the new token on disk, the old one revoked.
			fresh, _ := token(sa + "-new")
			tc.write(t, dir, fresh)
			if err := admin.CoreV1().Secrets(ns).Delete(ctx, oldSecret.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			oldClient := kubernetes.NewForConfigOrDie(&rest.Config{Host: rc.Host, BearerToken: old, TLSClientConfig: rc.TLSClientConfig})
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
				_, err := oldClient.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
				if apierrors.IsUnauthorized(err) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the old token still works 30s after its Secret was deleted: %v", err)
				}
			}
			for _, c := range calls {
				var err error
				for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(200 * time.Millisecond) {
					if err = c.call(ctx); err == nil || time.Now().After(deadline) {
						break
					}
				}
				if err != nil {
					t.Errorf("%s: 5s after the credentials were rotated on disk: %v", c.name, err)
				}
			}
		})
	}
}

// kubeconfigWith is a kubeconfig for rc's API server and CA with token as
// its user's credential (none when empty).
func kubeconfigWith(t *testing.T, rc *rest.Config, token string) []byte {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	b, err := clientcmd.Write(*kc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeAtomic replaces path with b by a rename, as the kubelet updates a
// mounted Secret.
func writeAtomic(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// switchProxy forwards TCP to a real API server, or — as a cluster's
// network or API server can fail — holds every connection without a byte
// (hang: packets dropped, a frozen apiserver) or closes it at once
// (refuse). Switching mode cuts the connections open.
type switchProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	mode   string
	conns  []net.Conn
}

func newSwitchProxy(t *testing.T, target string) *switchProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &switchProxy{l: l, target: target, mode: "forward"}
	t.Cleanup(func() {
		l.Close()
		p.set("refuse")
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			mode := p.mode
			if mode != "refuse" {
				p.conns = append(p.conns, c)
			}
			p.mu.Unlock()
			switch mode {
			case "refuse":
				c.Close()
			case "forward":
				go func() {
					up, err := net.Dial("tcp", target)
					if err != nil {
						c.Close()
						return
					}
					go func() { _, _ = io.Copy(up, c); up.Close() }()
					_, _ = io.Copy(c, up)
					c.Close()
				}()
			}
		}
	}()
	return p
}

func (p *switchProxy) set(mode string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = mode
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestSilentClusterNotWaitedFor: a cluster whose API server stops
// answering — its network dropping packets, or the server frozen — costs
// the request that finds it out kube.timeout, and then no more: the next
// tries are not run (a probe of at most 500 ms decides), so the batches
// that mix its nodes with other clusters' are not held kube.timeout again
// at every end of its backoff; its work resumes within about a second of
// it answering. A cluster that refuses connections behaves the same.
func TestSilentClusterNotWaitedFor(t *testing.T) {
	t.Parallel() // waits on its own API server; mostly idle
	k := testenv.StartKube(t, testenv.KubeOptions{})
	rc := k.RESTConfig()
	host := strings.TrimPrefix(rc.Host, "https://")
	const timeout = 3 * time.Second
	list := func(ctx context.Context, cl *Client) error {
		_, err := cl.Kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		return err
	}
	for _, mode := range []string{"hang", "refuse"} {
		t.Run(mode, func(t *testing.T) {
			p := newSwitchProxy(t, host)
			kc := clientcmdapi.NewConfig()
			kc.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://" + p.l.Addr().String(), CertificateAuthorityData: rc.CAData,
				TLSServerName: "127.0.0.1"}
			kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: rc.BearerToken}
			kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
			kc.CurrentContext = "c"
			path := filepath.Join(t.TempDir(), "kubeconfig")
			if err := clientcmd.WriteToFile(*kc, path); err != nil {
				t.Fatal(err)
			}
			cfg := DefaultConfig()
			cfg.Timeout = timeout
			cfg.Clusters = []Cluster{{Name: "c", Kubeconfig: path}}
			reg := NewRegistry(cfg, nil)
			ctx := context.Background()
			if a := reg.Try(ctx, "c", list); a.Err != nil {
				t.Fatalf("through the proxy: %v", a.Err)
			}

			p.set(mode)
			a := reg.Try(ctx, "c", list)
			if !a.Ran || !a.Retriable {
				t.Fatalf("the first try after the cluster went silent: %+v", a)
			}
			// Past its first backoff (at most MinBackoff), each try is
			// decided at once.
			time.Sleep(600 * time.Millisecond)
			for i := range 3 {
				start := time.Now()
				a = reg.Try(ctx, "c", list)
				if took := time.Since(start); took > time.Second || a.Ran || !a.Retriable {
					t.Fatalf("try %d while the cluster is silent: ran %v, retriable %v, took %v (kube.timeout %v): %v",
						i+2, a.Ran, a.Retriable, took.Round(time.Millisecond), timeout, a.Err)
				}
				time.Sleep(700 * time.Millisecond)
			}

			p.set("forward")
			back := time.Now()
			for a = reg.Try(ctx, "c", list); a.Err != nil || !a.Ran; a = reg.Try(ctx, "c", list) {
				if time.Since(back) > 3*time.Second {
					t.Fatalf("3s after the cluster answers again: ran %v: %v", a.Ran, a.Err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Logf("%s: work resumed %v after the cluster answered", mode, time.Since(back).Round(time.Millisecond))
		})
	}
}

// TestSlowClusterNotTakenForSilent: a cluster whose API server answers,
// but slowly — every request, /readyz too, answered in about a second
// (its etcd slow) — after one request took longer than kube.timeout. The
// request that timed out gates it (TestSilentClusterNotWaitedFor), but
// its work resumes once its backoff ends: the probe that reopens the gate
// may take kube.timeout in the background, no try waiting for it more
// than ProbeInterval. Before, a probe was cut at ProbeInterval (500 ms)
// and taken for silence, so such a cluster stayed gated for good — its
// work deferred while it answered every request.
func TestSlowClusterNotTakenForSilent(t *testing.T) {
	t.Parallel() // waits on its own API server; mostly idle
	k := testenv.StartKube(t, testenv.KubeOptions{})
	const timeout = 3 * time.Second
	list := func(ctx context.Context, cl *Client) error {
		_, err := cl.Kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		return err
	}
	for _, tc := range []struct {
		name  string
		delay time.Duration // every request's, once the cluster turned slow
	}{
		{"answers within the probe interval", 100 * time.Millisecond},
		{"answers in a second", time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var delay atomic.Int64
			rc := testenv.Delayed(k.RESTConfig(), &delay)
			rc.Timeout = timeout
			kube, err := kubernetes.NewForConfig(rc)
			if err != nil {
				t.Fatal(err)
			}
			cfg := DefaultConfig()
			cfg.Timeout = timeout
			reg := NewRegistry(cfg, nil)
			cl := reg.SetClient("c", kube, false)
			cl.Gate.MinBackoff, cl.Gate.MaxBackoff = 500*time.Millisecond, 500*time.Millisecond
			ctx := context.Background()

			delay.Store(int64(2 * timeout)) // one request past kube.timeout
			if a := reg.Try(ctx, "c", list); !a.Ran || !a.Retriable || !TimedOut(a.Err) {
				t.Fatalf("the request past kube.timeout: ran %v, retriable %v: %v", a.Ran, a.Retriable, a.Err)
			}
			delay.Store(int64(tc.delay))
			start := time.Now()
			for {
				tryStart := time.Now()
				a := reg.Try(ctx, "c", list)
				if took := time.Since(tryStart); !a.Ran && took > time.Second {
					t.Fatalf("a try of the gated cluster took %v", took.Round(time.Millisecond))
				}
				if a.Ran && a.Err == nil {
					t.Logf("work resumed %v after the cluster answered again", time.Since(start).Round(time.Millisecond))
					return
				}
				if time.Since(start) > 4*timeout {
					t.Fatalf("%v after the cluster answers again (each request in %v): ran %v: %v",
						time.Since(start).Round(time.Second), tc.delay, a.Ran, a.Err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}
