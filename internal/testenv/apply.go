package testenv

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// ApplyCRDs creates the CustomResourceDefinitions of the files matching
// glob (deploy/crds/*.yaml) and waits until the apiserver serves them
// (condition Established).
func (k *Kube) ApplyCRDs(tb testing.TB, glob string) {
	tb.Helper()
	files, _ := filepath.Glob(glob)
	if len(files) == 0 {
		tb.Fatalf("no CRDs match %s", glob)
	}
	dyn, err := dynamic.NewForConfig(k.RESTConfig())
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		m := map[string]any{}
		if err := yaml.Unmarshal(b, &m); err != nil {
			tb.Fatalf("%s: %v", f, err)
		}
		o, err := dyn.Resource(crdGVR).Create(ctx, &unstructured.Unstructured{Object: m}, metav1.CreateOptions{})
		if err != nil {
			tb.Fatalf("%s: %v", f, err)
		}
		names = append(names, o.GetName())
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, name := range names {
		for {
			o, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
			if err == nil && established(o) {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("CRD %s not established: %v", name, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func established(o *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(o.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// ApplyRBAC creates the objects of an RBAC manifest (deploy/rbac/*.yaml:
// ServiceAccounts, ClusterRoles, Roles and their bindings, separated by
// "---"), and the namespaces they name, on the test's apiserver.
func (k *Kube) ApplyRBAC(tb testing.TB, path string) {
	tb.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	c := k.Client()
	ns := func(name string) {
		if name == "" {
			return
		}
		_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			tb.Fatal(err)
		}
	}
	rules := map[string][]rbacv1.PolicyRule{} // "ClusterRole/name", "Role/ns/name"
	var bindings []binding
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			tb.Fatalf("%s: decode: %v\n%s", path, err, doc)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			ns(o.Namespace)
			_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			rules["ClusterRole/"+o.Name] = o.Rules
			_, err = c.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			bindings = append(bindings, binding{"", o.RoleRef, o.Subjects})
			_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			ns(o.Namespace)
			rules["Role/"+o.Namespace+"/"+o.Name] = o.Rules
			_, err = c.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			ns(o.Namespace)
			bindings = append(bindings, binding{o.Namespace, o.RoleRef, o.Subjects})
			_, err = c.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			tb.Fatalf("%s: unexpected object %T", path, obj)
		}
		if err != nil {
			tb.Fatalf("%s: %v", path, err)
		}
	}
	// The apiserver's RBAC authorizer learns of new objects through its
	// own watch, a moment after they are created: wait until each
	// binding's subjects are granted its role's first resource rule, so a
	// test's first call does not meet a 403 the manifest does not cause.
	for _, b := range bindings {
		key := b.ref.Kind + "/" + b.ref.Name
		if b.ref.Kind == "Role" {
			key = "Role/" + b.ns + "/" + b.ref.Name
		}
		for _, r := range rules[key] {
			if len(r.Resources) == 0 || len(r.Verbs) == 0 || len(r.APIGroups) == 0 {
				continue
			}
			ra := &authorizationv1.ResourceAttributes{Verb: r.Verbs[0], Group: r.APIGroups[0], Namespace: b.ns}
			ra.Resource, ra.Subresource, _ = strings.Cut(r.Resources[0], "/")
			if len(r.ResourceNames) > 0 {
				ra.Name = r.ResourceNames[0]
			}
			for _, sub := range b.subjects {
				k.waitGranted(tb, path, sub, ra)
			}
			break
		}
	}
}

type binding struct {
	ns       string // "" for a ClusterRoleBinding
	ref      rbacv1.RoleRef
	subjects []rbacv1.Subject
}

// waitGranted waits (30 s) until the apiserver allows the subject ra.
func (k *Kube) waitGranted(tb testing.TB, path string, sub rbacv1.Subject, ra *authorizationv1.ResourceAttributes) {
	tb.Helper()
	spec := authorizationv1.SubjectAccessReviewSpec{User: sub.Name, ResourceAttributes: ra}
	switch sub.Kind {
	case rbacv1.ServiceAccountKind:
		spec.User = "system:serviceaccount:" + sub.Namespace + ":" + sub.Name
	case rbacv1.GroupKind:
		spec.User, spec.Groups = "testenv:member", []string{sub.Name}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, err := k.review(spec)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: %s %s is not granted %s %s/%s within 30 s (err %v)", path, sub.Kind, sub.Name, ra.Verb, ra.Group, ra.Resource, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ClientAs returns a client of the apiserver that impersonates user (e.g.
// "system:serviceaccount:faultline:faultline-drain"), so a test runs with
// exactly the permissions RBAC gives it.
func (k *Kube) ClientAs(tb testing.TB, user string) (kubernetes.Interface, *rest.Config) {
	tb.Helper()
	rc := k.RESTConfig()
	rc.Impersonate = rest.ImpersonationConfig{UserName: user}
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		tb.Fatal(err)
	}
	return c, rc
}

// Access is one request for Allowed: verb on resource (subresource after
// a "/", e.g. "pods/eviction") of group, in namespace ("" for cluster
// scope or all namespaces), of the object named Name ("": any).
type Access struct {
	Verb, Group, Resource, Namespace, Name string
}

// Allowed asks the apiserver (SubjectAccessReview) whether user may do a.
func (k *Kube) Allowed(tb testing.TB, user string, a Access) bool {
	tb.Helper()
	res, sub, _ := strings.Cut(a.Resource, "/")
	ok, err := k.review(authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &authorizationv1.ResourceAttributes{
		Verb: a.Verb, Group: a.Group, Resource: res, Subresource: sub, Namespace: a.Namespace, Name: a.Name}})
	if err != nil {
		tb.Fatal(err)
	}
	return ok
}

// review asks the apiserver whether spec's subject may do its request.
func (k *Kube) review(spec authorizationv1.SubjectAccessReviewSpec) (bool, error) {
	r, err := k.Client().AuthorizationV1().SubjectAccessReviews().Create(context.Background(),
		&authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	return r.Status.Allowed, nil
}
