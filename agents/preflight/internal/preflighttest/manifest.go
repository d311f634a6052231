// Package preflighttest is test support shared by the preflight packages:
// it applies the repository's plain-YAML manifests (deploy/rbac,
// deploy/preflight) to a test API server.
package preflighttest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
)

// Decode reads a multi-document manifest.
func Decode(tb testing.TB, path string) []runtime.Object {
	tb.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	var out []runtime.Object
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			tb.Fatalf("%s: decode: %v\n%s", path, err, doc)
		}
		out = append(out, obj)
	}
	return out
}

// Apply creates every object of the manifest at path, with strict field
// validation (an unknown field fails), and returns them.
func Apply(tb testing.TB, k kubernetes.Interface, path string) []runtime.Object {
	tb.Helper()
	objs := Decode(tb, path)
	ctx := context.Background()
	opts := metav1.CreateOptions{FieldValidation: "Strict"}
	for _, obj := range objs {
		var err error
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = k.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, opts)
		case *corev1.ConfigMap:
			_, err = k.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, opts)
		case *corev1.Service:
			_, err = k.CoreV1().Services(o.Namespace).Create(ctx, o, opts)
		case *appsv1.Deployment:
			_, err = k.AppsV1().Deployments(o.Namespace).Create(ctx, o, opts)
		case *rbacv1.ClusterRole:
			_, err = k.RbacV1().ClusterRoles().Create(ctx, o, opts)
		case *rbacv1.ClusterRoleBinding:
			_, err = k.RbacV1().ClusterRoleBindings().Create(ctx, o, opts)
		case *rbacv1.Role:
			_, err = k.RbacV1().Roles(o.Namespace).Create(ctx, o, opts)
		case *rbacv1.RoleBinding:
			_, err = k.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, opts)
		default:
			err = fmt.Errorf("unexpected object %T", obj)
		}
		if err != nil {
			tb.Fatalf("%s: %v", path, err)
		}
	}
	return objs
}
