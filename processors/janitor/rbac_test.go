package janitor

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/schemas/events"
)

const saJanitor = "system:serviceaccount:faultline:faultline-janitor"

// TestRBACIsEnough runs the janitor as the ServiceAccount of
// deploy/rbac/janitor.yaml: a Redfish reboot (watch, state update, status
// patch, Secret read; its Lease held) and a terminate (node delete)
// complete; and the role grants nothing more (no Secret but the BMC
// credentials, none outside its namespace, no node update, no create or delete of the resources, no Lease
// outside its namespace).
func TestRBACIsEnough(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	e.kc.ApplyRBAC(t, "../../deploy/rbac/janitor.yaml")
	sa, rc := e.kc.ClientAs(t, saJanitor)
	sdyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	e.node("rbac-1", sysID(0), true, nil)
	e.node("rbac-2", sysID(1), true, nil)
	cfg := e.config()
	provs := e.providers(cfg)
	rec := &recorder{}
	j := e.janitorOn(sa, sdyn, rec, cfg, false, provs)
	run(t, j)
	e.create(kindReboot, "rbac-reboot", "rbac-1", false)
	e.create(kindTerminate, "rbac-terminate", "rbac-2", false)
	if o := e.wait(kindReboot, "rbac-reboot", 40*time.Second); condOf(o, CondNodeReady) != "True/Succeeded" {
		t.Fatalf("reboot: %v", o.Object["status"])
	}
	if o := e.wait(kindTerminate, "rbac-terminate", 40*time.Second); condOf(o, CondNodeTerminated) != "True/Succeeded" {
		t.Fatalf("terminate: %v", o.Object["status"])
	}
	if _, err := e.kube.CoreV1().Nodes().Get(context.Background(), "rbac-2", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("terminated node still there: %v", err)
	}
	rec.expect(t, "rbac-1", []string{"reboot/applied", "reboot/succeeded"})
	// Recorded on the nodes with the role's own rights (the signals as
	// Warnings: they followed the nodes' own BMC annotations).
	nodeEvents(t, e.kube, "rbac-1", "Warning/RebootNodeApplied", "Normal/RebootNodeSucceeded")
	nodeEvents(t, e.kube, "rbac-2", "Warning/TerminateNodeApplied", "Normal/TerminateNodeSucceeded")
	// The maintenance monitor's state: created, read and updated.
	state := j.maintenanceState(cluster)
	standing := map[string]standingEvent{"i-0rbac/ev-1": {node: "rbac-1", instance: "i-0rbac", region: "us-east-1", code: "system-reboot",
		start: time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC)}}
	pending := []*kgo.Record{{Topic: events.TopicEvents, Key: events.Key(cluster, "rbac-1"), Value: []byte("\x08\x01\x12\x03\xff\x00\n")}}
	for range 2 {
		if err := state.Save(context.Background(), keptReports{standing: standing, pending: pending}); err != nil {
			t.Fatalf("the maintenance state: %v", err)
		}
		got, err := state.Load(context.Background())
		if err != nil || !maps.Equal(got.standing, standing) || !slices.EqualFunc(got.pending, pending, func(a, b *kgo.Record) bool {
			return a.Topic == b.Topic && bytes.Equal(a.Key, b.Key) && bytes.Equal(a.Value, b.Value)
		}) {
			t.Fatalf("the maintenance state read back %v (%v), want %v and %v", got, err, standing, pending)
		}
		standing["i-0rbac/ev-2"] = standingEvent{node: "rbac-2", instance: "i-0rbac2", region: "us-east-1", code: "instance-retirement",
			start: time.Date(2026, 12, 8, 3, 0, 0, 0, time.UTC), end: time.Date(2026, 12, 8, 5, 0, 0, 0, time.UTC)}
		pending = nil
	}
	for _, tc := range []struct {
		a    testenv.Access
		want bool
	}{
		{testenv.Access{Verb: "get", Resource: "secrets", Namespace: "faultline", Name: "bmc-credentials"}, true},
		{testenv.Access{Verb: "get", Resource: "secrets", Namespace: "faultline", Name: "faultline-gateway-tokens"}, false},
		{testenv.Access{Verb: "list", Resource: "secrets", Namespace: "faultline"}, false},
		{testenv.Access{Verb: "get", Resource: "secrets", Namespace: "default"}, false},
		{testenv.Access{Verb: "update", Resource: "nodes"}, false},
		{testenv.Access{Verb: "patch", Resource: "nodes"}, false},
		{testenv.Access{Verb: "delete", Resource: "nodes"}, true},
		{testenv.Access{Verb: "create", Group: Group, Resource: "rebootnodes"}, false},
		{testenv.Access{Verb: "delete", Group: Group, Resource: "rebootnodes"}, false},
		{testenv.Access{Verb: "patch", Group: Group, Resource: "rebootnodes/status"}, true},
		{testenv.Access{Verb: "list", Resource: "pods"}, false},
		{testenv.Access{Verb: "create", Resource: "events", Namespace: "default"}, true},
		{testenv.Access{Verb: "create", Resource: "events", Namespace: "faultline"}, false},
		{testenv.Access{Verb: "update", Resource: "events", Namespace: "default"}, false},
		{testenv.Access{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "faultline"}, true},
		{testenv.Access{Verb: "delete", Group: "coordination.k8s.io", Resource: "leases", Namespace: "faultline"}, false},
		{testenv.Access{Verb: "create", Group: "coordination.k8s.io", Resource: "leases", Namespace: "default"}, false},
		{testenv.Access{Verb: "get", Resource: "configmaps", Namespace: "faultline", Name: MaintenanceStateName}, true},
		{testenv.Access{Verb: "get", Resource: "configmaps", Namespace: "faultline", Name: "faultline-config"}, false},
		{testenv.Access{Verb: "update", Resource: "configmaps", Namespace: "faultline", Name: "faultline-config"}, false},
		{testenv.Access{Verb: "list", Resource: "configmaps", Namespace: "faultline"}, false},
		{testenv.Access{Verb: "create", Resource: "configmaps", Namespace: "default"}, false},
	} {
		if got := e.kc.Allowed(t, saJanitor, tc.a); got != tc.want {
			t.Errorf("%+v: allowed %v, want %v", tc.a, got, tc.want)
		}
	}
}
