package quarantine

import (
	"context"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/faultline/faultline/internal/testenv"
)

// applyRBAC creates the objects of deploy/rbac/quarantine.yaml.
func applyRBAC(t *testing.T, k kubernetes.Interface) {
	t.Helper()
	raw, err := os.ReadFile("../../deploy/rbac/quarantine.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := k.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "faultline"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("decode: %v\n%s", err, doc)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = k.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = k.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = k.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = k.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = k.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("unexpected object %T", obj)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestRBACIsEnough runs quarantine, breaker, node Event and recovery as
// the ServiceAccount of deploy/rbac/quarantine.yaml (impersonated): the
// shipped RBAC grants everything the role does, on an apiserver with RBAC on.
func TestRBACIsEnough(t *testing.T) {
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	applyRBAC(t, kube.Client())
	createNodes(t, kube.Client(), "rbac", "rbac-1", "rbac-2")
	rc := kube.RESTConfig()
	rc.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:faultline:faultline-quarantine"}
	sa, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("rbac")
	cfg.Breaker.Name = DefaultConfig().Breaker.Name
	cfg.Breaker.MaxPercent = 50
	h := newTestHandler(t, cfg, map[string]kubernetes.Interface{"c1": sa})
	nonFatal := fatal("rbac-2", "GPU_THERMAL", "GPU-1")
	nonFatal.IsFatal = false
	acts, _ := handle(t, h,
		record("c1", fatal("rbac-1", "XID_ERROR_48", "GPU-1")),
		record("c1", nonFatal))
	acts2, _ := handle(t, h, record("c1", fatal("rbac-2", "XID_ERROR_48", "GPU-1")))
	acts3, _ := handle(t, h, record("c1", healthy("rbac-1", "XID_ERROR_48", "GPU-1")))
	got := kinds(append(append(acts, acts2...), acts3...))
	if got != "quarantine/applied,event/applied,breaker_open/applied,quarantine/held_by_breaker,unquarantine/applied" {
		t.Fatalf("actions %s", got)
	}
	for _, a := range append(acts, acts2...) {
		if a.Outcome == OutcomeFailed {
			t.Fatalf("failed: %s", a.Reason)
		}
	}
}
