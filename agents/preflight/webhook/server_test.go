package webhook_test

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/faultline/faultline/agents/preflight/webhook"
)

// TestShutdownDrains: on cancellation (SIGTERM) the webhook first fails
// its readiness probe and keeps answering for the drain delay, so the
// endpoints and kube-proxy stop sending it calls before it closes its
// port. It used to close the port at once: for the second or so until
// they caught up the API server's calls got connection refused and, with
// failure_policy Fail, pod CREATEs in the opted-in namespaces were refused
// on every webhook restart, even with two replicas.
func TestShutdownDrains(t *testing.T) {
	const delay = 700 * time.Millisecond
	cfg := webhook.DefaultConfig()
	cfg.Webhook.Listen = "127.0.0.1:0"
	cfg.Webhook.MetricsAddr = ""
	cfg.Webhook.URL = "https://127.0.0.1/mutate-pod"
	cfg.TLS.IPAddresses = []string{"127.0.0.1"}
	cfg.Namespaces.Include = []string{"training"}
	cfg.Gang.Controller = false
	must(t, cfg.Validate())
	srv, err := webhook.New(cfg, slog.New(slog.DiscardHandler), webhook.Options{Kube: fake.NewClientset(),
		Dynamic: dynfake.NewSimpleDynamicClient(runtime.NewScheme()), Registry: prometheus.NewRegistry(), DrainDelay: delay})
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()

	// A new connection per request, as the API server makes through the
	// Service once the old one is closed.
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a test of the listener, not of the certificate
	get := func(path string) (int, error) {
		resp, err := c.Get("https://" + srv.Addr() + path)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, _ := get("/readyz"); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never ready")
		}
		time.Sleep(20 * time.Millisecond)
	}

	cancel()
	start := time.Now()
	time.Sleep(delay / 4)
	if code, err := get("/readyz"); err != nil || code != http.StatusServiceUnavailable {
		t.Errorf("draining: /readyz %d, %v; want 503 (the endpoints drop the pod)", code, err)
	}
	if code, err := get("/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("draining: /healthz %d, %v; want it still served (the API server's calls still arrive)", code, err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the drain")
	}
	if took := time.Since(start); took < delay {
		t.Errorf("Run returned %v after cancellation, before the drain delay %v", took, delay)
	}
	if _, err := get("/healthz"); err == nil {
		t.Error("still serving after Run returned")
	}
}
