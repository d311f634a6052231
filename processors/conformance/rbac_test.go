package conformance

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/internal/clickhouse/chtest"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
)

// saConformance is the ServiceAccount of deploy/rbac/conformance.yaml.
const saConformance = "system:serviceaccount:faultline:faultline-conformance"

// TestRBACIsEnough runs a drift and its end as the ServiceAccount of
// deploy/rbac/conformance.yaml (impersonated) on an apiserver with RBAC
// on: the shipped RBAC grants what the role does, and no more.
func TestRBACIsEnough(t *testing.T) {
	if testing.Short() {
		t.Skip("needs real ClickHouse and kube-apiserver")
	}
	s := chtest.Start(t)
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	kube.ApplyRBAC(t, "../../deploy/rbac/conformance.yaml")
	e := &kubeEnv{kube: kube.Client()}
	for _, n := range []string{"rb1", "rb2", "rb3"} {
		e.node(t, n, nil)
	}
	sa, _ := kube.ClientAs(t, saConformance)
	clk := &clock{t: time.Now().UTC().Truncate(time.Second)}
	h := NewHandler(s.Conn, testLog, clk.Now)
	store(t, h, record(t, "rbac", "rb1", comps(""), clk.Now()), record(t, "rbac", "rb2", comps(""), clk.Now()),
		record(t, "rbac", "rb3", comps("x"), clk.Now()))
	reg := clusters.NewRegistry(clusters.DefaultConfig(), clk.Now)
	reg.SetClient("rbac", sa, false)
	sw := NewSweeper(testConfig(), s.Conn, reg, testLog, clk.Now, nil)
	out, err := sw.Sweep(context.Background(), "rbac")
	if err != nil || len(out.Actions) != 1 || out.Actions[0].Kind != events.KindConformanceDrift {
		t.Fatalf("sweep as %s: %v %v", saConformance, out.Actions, err)
	}
	if hasTaint(e.get(t, "rb3")) == nil {
		t.Fatal("not tainted")
	}
	evl, _ := e.kube.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=rb3"})
	if len(evl.Items) != 1 {
		t.Fatalf("%d node events", len(evl.Items))
	}
	clk.Add(time.Second)
	store(t, h, record(t, "rbac", "rb3", comps(""), clk.Now()))
	out, _ = sw.Sweep(context.Background(), "rbac")
	if len(out.Actions) != 1 || out.Actions[0].Kind != events.KindConformanceRestored || hasTaint(e.get(t, "rb3")) != nil {
		t.Fatalf("restore as %s: %v", saConformance, out.Actions)
	}
	for _, tc := range []struct {
		a    testenv.Access
		want bool
	}{
		{testenv.Access{Verb: "list", Resource: "nodes"}, true},
		{testenv.Access{Verb: "update", Resource: "nodes"}, true},
		{testenv.Access{Verb: "create", Resource: "events", Namespace: "default"}, true},
		{testenv.Access{Verb: "create", Resource: "events", Namespace: "kube-system"}, false},
		{testenv.Access{Verb: "patch", Resource: "nodes"}, false},
		{testenv.Access{Verb: "delete", Resource: "nodes"}, false},
		{testenv.Access{Verb: "update", Resource: "nodes/status"}, false},
		{testenv.Access{Verb: "list", Resource: "pods"}, false},
		{testenv.Access{Verb: "get", Resource: "secrets", Namespace: "default"}, false},
	} {
		if got := kube.Allowed(t, saConformance, tc.a); got != tc.want {
			t.Errorf("%+v: allowed %v, want %v", tc.a, got, tc.want)
		}
	}
}
