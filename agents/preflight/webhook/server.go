// Package webhook is ADR-026's mutating admission webhook: a TLS server
// that answers AdmissionReviews for pod CREATE in the opted-in namespaces
// by injecting the preflight init containers (package injection), its own
// certificate (a self-signed CA and serving certificate kept in a Secret
// and renewed, or files written by cert-manager), the
// MutatingWebhookConfiguration it keeps (rules, namespace selector,
// failure policy, timeout, caBundle), and the gang controller (package
// coordination) run alongside.
package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/faultline/faultline/agents/preflight/coordination"
	"github.com/faultline/faultline/agents/preflight/gang"
	"github.com/faultline/faultline/agents/preflight/injection"
)

// DrainDelay is how long, by default, the webhook keeps answering after
// it is told to stop (SIGTERM), its readiness probe failing meanwhile:
// until the endpoints and kube-proxy have dropped the pod the API server
// still calls it, and a closed port refuses (failure_policy Fail) the pod
// being admitted. The pod's terminationGracePeriodSeconds (30s by
// default) covers it and the 5s shutdown after it.
const DrainDelay = 5 * time.Second

// Options are the server's collaborators, for tests.
type Options struct {
	// Registry receives the metrics (default a new one with the Go and
	// process collectors).
	Registry *prometheus.Registry
	// Kube and Dynamic replace the clients built from the configuration.
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// DrainDelay is how long the webhook keeps answering after Run's
	// context ends, its readiness probe failing, before it closes its
	// port (default DrainDelay).
	DrainDelay time.Duration
}

// Server is the webhook process.
type Server struct {
	cfg   Config
	log   *slog.Logger
	reg   *prometheus.Registry
	kc    kubernetes.Interface
	dyn   dynamic.Interface
	ln    net.Listener
	ready atomic.Bool
	certs atomic.Pointer[certSource] // set by Run
	drain time.Duration
}

// New builds the server and binds its listener.
func New(cfg Config, log *slog.Logger, opt Options) (*Server, error) {
	s := &Server{cfg: cfg, log: log, reg: opt.Registry, kc: opt.Kube, dyn: opt.Dynamic, drain: opt.DrainDelay}
	if s.drain <= 0 {
		s.drain = DrainDelay
	}
	if s.reg == nil {
		s.reg = prometheus.NewRegistry()
		s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "preflight_webhook_certificate_expiry_timestamp_seconds",
		Help: "When the certificate the webhook serves expires (Unix seconds); 0 before it has one. The API server refuses an expired one: with failurePolicy Fail, no selected pod is admitted."},
		s.certExpiry))
	if s.kc == nil || s.dyn == nil {
		rc, err := restConfig(cfg.Kube)
		if err != nil {
			return nil, err
		}
		if s.kc == nil {
			if s.kc, err = kubernetes.NewForConfig(rc); err != nil {
				return nil, fmt.Errorf("kube: %w", err)
			}
		}
		if s.dyn == nil {
			if s.dyn, err = dynamic.NewForConfig(rc); err != nil {
				return nil, fmt.Errorf("kube: %w", err)
			}
		}
	}
	ln, err := net.Listen("tcp", cfg.Webhook.Listen)
	if err != nil {
		return nil, fmt.Errorf("webhook.listen: %w", err)
	}
	s.ln = ln
	return s, nil
}

func restConfig(k KubeConfig) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if k.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", k.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kube.kubeconfig: %w", err)
	}
	rc.QPS, rc.Burst = k.QPS, k.Burst
	return rc, nil
}

// Addr is the bound admission address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Registry is the server's metrics registry.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Discovery builds the configured gang discovery.
func Discovery(cfg *Config, dyn dynamic.Interface) *gang.Discovery {
	var ms []gang.Method
	for _, m := range cfg.Gang.Methods {
		switch m {
		case "workloadRef":
			ms = append(ms, gang.WorkloadMethod{Dyn: dyn})
		case "volcano":
			ms = append(ms, gang.VolcanoMethod{Dyn: dyn, Annotations: cfg.Gang.VolcanoAnnotations})
		case "kueue":
			ms = append(ms, gang.KueueMethod{Dyn: dyn})
		case "labels":
			ms = append(ms, gang.LabelsMethod{IDLabel: cfg.Gang.IDLabel, SizeLabel: cfg.Gang.SizeLabel})
		}
	}
	return gang.NewDiscovery(ms...)
}

// InjectionConfig derives the injection's configuration.
func InjectionConfig(cfg *Config) injection.Config {
	return injection.Config{
		Checks: cfg.Checks, GPU: cfg.GPU, Network: cfg.Network, EnvPatterns: cfg.NCCL.EnvPatterns,
		Image: cfg.Inject.Image, ImagePullPolicy: corev1.PullPolicy(cfg.Inject.ImagePullPolicy),
		StateHostPath: cfg.Inject.StateHostPath, TokenSecret: cfg.Inject.TokenSecret,
		RelaySocket: cfg.Inject.RelaySocket, RelayGroup: cfg.Inject.RelaySocketGroup,
		GangMountPath: cfg.Gang.MountPath, Runner: cfg.Check,
	}
}

// certExpiry is when the served certificate expires, in Unix seconds; 0
// before Run has one.
func (s *Server) certExpiry() float64 {
	c := s.certs.Load()
	if c == nil {
		return 0
	}
	cert, err := (*c).GetCertificate(nil)
	if err != nil || cert == nil || len(cert.Certificate) == 0 {
		return 0
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return 0
		}
	}
	return float64(leaf.NotAfter.Unix())
}

// Run serves until ctx ends or a part fails.
func (s *Server) Run(ctx context.Context) error {
	cfg := &s.cfg
	var certs certSource
	switch cfg.TLS.Mode {
	case "files":
		certs = newFileCerts(cfg.TLS.CertFile, cfg.TLS.KeyFile, cfg.TLS.CAFile)
	default:
		ss, err := newSelfSigned(s.kc, cfg.Webhook.ServiceNamespace, cfg.TLS, cfg.Webhook, s.log)
		if err != nil {
			return err
		}
		certs = ss
	}
	if err := certs.Refresh(ctx); err != nil {
		return err
	}
	s.certs.Store(&certs)
	if _, err := ensureConfiguration(ctx, s.kc, cfg, certs.CABundle); err != nil {
		return err
	}
	disc := Discovery(cfg, s.dyn)
	var claims injection.ClaimResolver
	if len(cfg.GPU.DeviceClasses)+len(cfg.Network.DeviceClasses) > 0 {
		kc, err := injection.NewKubeClaims(ctx, s.kc, cfg.Namespaces.Include)
		if err != nil {
			return err
		}
		claims = kc
	}
	inj := injection.New(InjectionConfig(cfg), claims, disc)
	h := NewHandler(cfg, inj, s.log, NewMetrics(s.reg))
	mux := http.NewServeMux()
	mux.Handle(cfg.Webhook.Path, h)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 90 * time.Second,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate}}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		err := srv.ServeTLS(s.ln, "", "")
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("webhook server: %w", err)
	})
	var msrv *http.Server
	if cfg.Webhook.MetricsAddr != "" {
		mln, err := net.Listen("tcp", cfg.Webhook.MetricsAddr)
		if err != nil {
			_ = srv.Close()
			return fmt.Errorf("webhook.metrics_addr: %w", err)
		}
		mm := http.NewServeMux()
		mm.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
		msrv = &http.Server{Handler: mm, ReadHeaderTimeout: 5 * time.Second}
		g.Go(func() error {
			if err := msrv.Serve(mln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("metrics server: %w", err)
			}
			return nil
		})
	}
	if cfg.Gang.Controller {
		ctrl := coordination.New(s.kc, disc, s.log, coordination.Options{Workers: cfg.Gang.Workers, Registry: s.reg})
		g.Go(func() error { return ctrl.Run(gctx) })
	}
	g.Go(func() error {
		t := time.NewTicker(cfg.Webhook.Resync)
		defer t.Stop()
		for {
			select {
			case <-gctx.Done():
				return nil
			case <-t.C:
			}
			if err := certs.Refresh(gctx); err != nil {
				s.log.Error("certificate refresh failed; serving the current one", "err", err)
				continue
			}
			if changed, err := ensureConfiguration(gctx, s.kc, cfg, certs.CABundle); err != nil {
				s.log.Error("webhook configuration not reconciled", "err", err)
			} else if changed {
				s.log.Info("webhook configuration corrected", "configuration", cfg.Webhook.ConfigurationName)
			}
		}
	})
	s.ready.Store(true)
	g.Go(func() error {
		<-gctx.Done()
		if ctx.Err() != nil { // told to stop, not a part failing
			// Not ready: the endpoints drop the pod; meanwhile calls
			// still routed here are answered, each on a connection
			// closed after it so the next goes to another replica.
			s.ready.Store(false)
			srv.SetKeepAlivesEnabled(false)
			s.log.Info("preflight webhook draining before it stops", "delay", s.drain)
			time.Sleep(s.drain)
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		if msrv != nil {
			_ = msrv.Shutdown(sctx)
		}
		return nil
	})
	s.log.Info("preflight webhook serving", "addr", s.Addr(), "path", cfg.Webhook.Path, "namespaces", cfg.Namespaces.Include,
		"failure_policy", cfg.Webhook.FailurePolicy, "gang_controller", cfg.Gang.Controller)
	return g.Wait()
}
