package quarantine

import (
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/schemas/events"
)

// saQuarantine is the ServiceAccount of deploy/rbac/quarantine.yaml.
const saQuarantine = "system:serviceaccount:faultline:faultline-quarantine"

// TestRBACIsEnough runs quarantine, breaker, node Event and recovery as
// the ServiceAccount of deploy/rbac/quarantine.yaml (impersonated): the
// shipped RBAC grants everything the role does, on an apiserver with RBAC
// on, and nothing more than it calls (Events only in the namespace of node
// events, never cluster-wide; no update or delete of nodes; no pods).
func TestRBACIsEnough(t *testing.T) {
	t.Parallel() // its own servers; mostly waiting
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	kube.ApplyRBAC(t, "../../deploy/rbac/quarantine.yaml")
	createNodes(t, kube.Client(), "rbac", "rbac-1", "rbac-2")
	sa, _ := kube.ClientAs(t, saQuarantine)
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
		if a.Outcome == events.OutcomeFailed {
			t.Fatalf("failed: %s", a.Reason)
		}
	}
	// The breaker is read from its watch: allowed to list and watch it.
	cl, _ := h.reg.Get("c1")
	waitUntil(t, 10*time.Second, func() bool {
		cm, ok := h.breaker(cl).watch.get(time.Now())
		return ok && cm != nil
	}, "the breaker's watch to sync under the shipped RBAC")
	for _, tc := range []struct {
		a    testenv.Access
		want bool
	}{
		{testenv.Access{Verb: "create", Resource: "events", Namespace: "default"}, true},
		{testenv.Access{Verb: "create", Resource: "events", Namespace: "kube-system"}, false},
		{testenv.Access{Verb: "create", Resource: "events"}, false},
		{testenv.Access{Verb: "create", Group: "events.k8s.io", Resource: "events", Namespace: "default"}, false},
		{testenv.Access{Verb: "patch", Resource: "nodes"}, true},
		{testenv.Access{Verb: "patch", Resource: "nodes/status"}, true},
		{testenv.Access{Verb: "update", Resource: "nodes"}, false},
		{testenv.Access{Verb: "update", Resource: "nodes/status"}, false},
		{testenv.Access{Verb: "delete", Resource: "nodes"}, false},
		{testenv.Access{Verb: "list", Resource: "pods"}, false},
		{testenv.Access{Verb: "get", Resource: "configmaps", Namespace: "kube-system"}, false},
		{testenv.Access{Verb: "watch", Resource: "configmaps", Namespace: "default", Name: cfg.Breaker.Name}, true},
		{testenv.Access{Verb: "list", Resource: "configmaps", Namespace: "default", Name: cfg.Breaker.Name}, true},
		{testenv.Access{Verb: "watch", Resource: "configmaps", Namespace: "default"}, false},
		{testenv.Access{Verb: "list", Resource: "configmaps", Namespace: "default"}, false},
		{testenv.Access{Verb: "get", Resource: "secrets", Namespace: "default"}, false},
	} {
		if got := kube.Allowed(t, saQuarantine, tc.a); got != tc.want {
			t.Errorf("%+v: allowed %v, want %v", tc.a, got, tc.want)
		}
	}
}
