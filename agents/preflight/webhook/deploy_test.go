package webhook_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/faultline/faultline/agents/preflight/webhook"
	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/internal/testenv"
)

// TestDeployManifest: deploy/preflight/preflight.yaml is accepted by a real
// API server with strict field validation (after deploy/rbac/preflight.yaml),
// and its config.toml loads and validates as the webhook's configuration.
func TestDeployManifest(t *testing.T) {
	raw, err := os.ReadFile("../../../deploy/preflight/preflight.yaml")
	must(t, err)
	var cm *corev1.ConfigMap
	var objs []any
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("decode: %v\n%s", err, doc)
		}
		if c, ok := obj.(*corev1.ConfigMap); ok {
			cm = c
		}
		objs = append(objs, obj)
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
		cfg.Check.Gang.Timeout.Seconds() != 600 || cfg.Webhook.ServiceNamespace != "faultline" {
		t.Errorf("config.toml read as %+v", cfg)
	}

	if testing.Short() {
		t.Skip("-short: not starting a real kube-apiserver")
	}
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	k := kube.Client()
	ctx := context.Background()
	for _, ns := range []string{"faultline", "training"} {
		_, err := k.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		must(t, err)
	}
	applyRBAC(t, k)
	strict := metav1.CreateOptions{FieldValidation: "Strict"}
	for _, obj := range objs {
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			_, err = k.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, strict)
		case *corev1.Service:
			_, err = k.CoreV1().Services(o.Namespace).Create(ctx, o, strict)
		case *appsv1.Deployment:
			if o.Spec.Template.Spec.ServiceAccountName != "faultline-preflight" {
				t.Errorf("Deployment runs as %q", o.Spec.Template.Spec.ServiceAccountName)
			}
			_, err = k.AppsV1().Deployments(o.Namespace).Create(ctx, o, strict)
		default:
			t.Fatalf("unexpected object %T", obj)
		}
		if err != nil {
			t.Fatalf("%T: %v", obj, err)
		}
	}
}
