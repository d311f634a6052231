package webhook_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/agents/preflight/internal/preflighttest"
	"github.com/faultline/faultline/agents/preflight/webhook"
	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/internal/testenv"
)

const deployManifest = "../../../deploy/preflight/preflight.yaml"

// TestDeployManifest: deploy/preflight/preflight.yaml's config.toml loads and
// validates as the webhook's configuration, and the manifest is accepted by
// a real API server with strict field validation (after
// deploy/rbac/preflight.yaml).
func TestDeployManifest(t *testing.T) {
	var cm *corev1.ConfigMap
	for _, obj := range preflighttest.Decode(t, deployManifest) {
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			cm = o
		case *appsv1.Deployment:
			if o.Spec.Template.Spec.ServiceAccountName != "faultline-preflight" {
				t.Errorf("Deployment runs as %q", o.Spec.Template.Spec.ServiceAccountName)
			}
		}
	}
	if cm == nil || cm.Data["config.toml"] == "" {
		t.Fatal("no ConfigMap with config.toml")
	}
	path := filepath.Join(t.TempDir(), "config.toml")
	must(t, os.WriteFile(path, []byte(cm.Data["config.toml"]), 0o600))
	cfg := webhook.DefaultConfig()
	if _, err := config.Load("faultline-preflight webhook", []string{"--config", path}, &cfg, cfg.RegisterFlags, cfg.Validate, io.Discard); err != nil {
		t.Fatalf("config.toml: %v", err)
	}
	if len(cfg.Checks) != 2 || cfg.Namespaces.Include[0] != "training" || cfg.Check.Gateway.CAFile != "/var/run/secrets/faultline-preflight/ca.crt" ||
		cfg.Check.Gang.Timeout.Seconds() != 600 || cfg.Webhook.ServiceNamespace != "faultline" ||
		cfg.Inject.RelaySocket != "/run/faultline-agent/agent.sock" || cfg.Inject.RelaySocketGroup != 64500 || cfg.Inject.TokenSecret != "" {
		t.Errorf("config.toml read as %+v", cfg)
	}

	if testing.Short() {
		t.Skip("-short: not starting a real kube-apiserver")
	}
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	k := kube.Client()
	for _, ns := range []string{"faultline", "training"} {
		_, err := k.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		must(t, err)
	}
	applyRBAC(t, k)
	preflighttest.Apply(t, k, deployManifest)
}
