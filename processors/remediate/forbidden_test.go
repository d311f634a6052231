package remediate

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/requeue"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// attemptRec is a trigger's record requeued n times.
func attemptRec(n int) *kgo.Record {
	if n == 0 {
		return &kgo.Record{}
	}
	return &kgo.Record{Headers: []kgo.RecordHeader{{Key: requeue.HeaderAttempt, Value: []byte(strconv.Itoa(n))}}}
}

// said is the actions' kind/outcome, space-separated.
func said(acts []*faultlinev1.Action) string {
	var out []string
	for _, a := range acts {
		out = append(out, a.GetKind()+"/"+a.GetOutcome())
	}
	return strings.Join(out, " ")
}

func kinds(tm *Template) map[schema.GroupVersionResource]string {
	return map[schema.GroupVersionResource]string{tm.gvr: tm.kind + "List"}
}

// TestForbiddenCreateIsRecorded: a create refused with 403 Forbidden for
// this object — an admission webhook's denial (OPA Gatekeeper), a
// namespace being terminated — cannot be created by trying again: it is
// failed and escalated at once, as an Invalid one is; any other 403
// (RBAC: "cannot create resource", a grant maybe being rolled out) is
// retried as the cluster's trouble, however often. Before, every
// 403 was retried for ever: the node cordoned for ever, never escalated,
// no remediate/* action, and each retry backed off the cluster's Gate
// (no server: client-go's fake clients).
func TestForbiddenCreateIsRecorded(t *testing.T) {
	gr := schema.GroupResource{Group: JanitorGroup, Resource: "rebootnodes"}
	admission := apierrors.NewForbidden(gr, "maintenance-n1-x",
		errors.New(`admission webhook "validation.gatekeeper.sh" denied the request: [no-reboots] reboots are frozen`))
	terminating := apierrors.NewForbidden(gr, "maintenance-n1-x",
		errors.New("unable to create new content in namespace janitor because it is being terminated"))
	terminating.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: corev1.NamespaceTerminatingCause, Message: "janitor is being terminated"}}
	rbac := apierrors.NewForbidden(gr, "", errors.New(`User "system:serviceaccount:faultline:faultline-remediate" cannot create resource "rebootnodes" in API group "janitor.dgxc.nvidia.com" at the cluster scope`))
	for name, tc := range map[string]struct {
		err       error
		attempt   int
		escalated bool
	}{
		"admission webhook denial": {admission, 0, true},
		"namespace terminating":    {terminating, 0, true},
		"RBAC, first try":          {rbac, 0, false},
		"RBAC, tenth try":          {rbac, 9, false},
	} {
		t.Run(name, func(t *testing.T) {
			h, err := New(DefaultConfig(), clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Now: time.Now})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(h.Close)
			tm := h.cfg.byAction["RESTART_VM"]
			dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), kinds(tm))
			dyn.PrependReactor("create", tm.gvr.Resource, func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, tc.err })
			kube := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
			cl := &clusters.Client{Name: cluster, Kube: kube, Dynamic: dyn, WatchDynamic: dyn}
			tr := trigger{cluster: cluster, node: "n1", id: "d-1", rec: attemptRec(tc.attempt),
				src: &faultlinev1.Action{RecommendedAction: "RESTART_VM", Outcome: events.OutcomeSucceeded, Timestamp: timestamppb.Now()}}
			acts, _, err := h.step(context.Background(), cl, tr)
			if !tc.escalated {
				if !apierrors.IsForbidden(err) || len(acts) != 0 {
					t.Fatalf("step: %v, %v; want the 403 retried, nothing said", outcomes(acts), err)
				}
				return
			}
			if err != nil || said(acts) != "remediate/failed escalate/applied" {
				t.Fatalf("step: %v, %v; want remediate/failed escalate/applied", outcomes(acts), err)
			}
			if !strings.Contains(acts[0].GetReason(), "forbidden") {
				t.Errorf("failed action's reason %q does not say the 403", acts[0].GetReason())
			}
			n, _ := kube.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
			if _, ok := n.Annotations[AnnotationEscalated]; !ok {
				t.Errorf("node not annotated %s", AnnotationEscalated)
			}
		})
	}
}

// TestOldTriggerFollowsItsOwnResource: a trigger that first waited (for a
// remediation of other GPUs, or its cluster unreachable) and then created
// its RebootNode, queued behind the janitor, is followed to its result
// when its drain result grows older than remediate.retention; before, it
// was skipped "older than remediate.retention" at its next look: the
// reboot's result never recorded, its failure never escalated. A replay
// (a first look) of an old trigger is still skipped, and so is a
// requeued old one that no resource lists (its resource may be pruned:
// nothing is created for it) (no server: client-go's fake clients).
func TestOldTriggerFollowsItsOwnResource(t *testing.T) {
	now := time.Date(2026, 1, 2, 12, 0, 0, 0, time.UTC)
	cfg := DefaultConfig()
	cfg.Retention = 14 * time.Hour
	cfg.BudgetWindow = time.Hour
	at := now.Add(-15 * time.Hour) // the drain result
	for name, tc := range map[string]struct {
		attempt   int
		listed    bool
		listFails bool   // its cluster answers every list 503 (down for days)
		want      string // the outcome; "" none (followed, in progress, said before)
	}{
		"requeued, its resource queued":      {40, true, false, ""},
		"a replay":                           {0, true, false, events.OutcomeSkipped},
		"requeued, listed by none":           {40, false, false, events.OutcomeSkipped},
		"requeued, its cluster's list fails": {40, true, true, events.OutcomeSkipped},
	} {
		t.Run(name, func(t *testing.T) {
			h, err := New(cfg, clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(h.Close)
			tm := h.cfg.byAction["RESTART_VM"]
			trs := "d-other"
			if tc.listed {
				trs = "d-1"
			}
			// Created 3h after the trigger, queued 12h since.
			o := firstOfN1(h, tm, trs, now.Add(-11*time.Hour))
			if !tc.listed { // finished: the trigger would create the next
				o.Object["status"] = map[string]any{"conditions": []any{map[string]any{"type": "NodeReady", "status": "True"}}}
			}
			dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), kinds(tm), o)
			if tc.listFails {
				dyn.PrependReactor("list", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewServiceUnavailable("down")
				})
			}
			kube := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
			tr := trigger{cluster: cluster, node: "n1", id: "d-1", rec: attemptRec(tc.attempt),
				src: &faultlinev1.Action{RecommendedAction: "RESTART_VM", Outcome: events.OutcomeSucceeded, Timestamp: timestamppb.New(at)}}
			acts, again, err := h.step(context.Background(), &clusters.Client{Name: cluster, Kube: kube, Dynamic: dyn, WatchDynamic: dyn}, tr)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == "" {
				if len(acts) != 0 || again.IsZero() {
					t.Fatalf("step: %v, next look %v; want its queued RebootNode followed", outcomes(acts), again)
				}
				return
			}
			if len(acts) != 1 || acts[0].GetOutcome() != tc.want || !again.IsZero() {
				t.Fatalf("step: %v, next look %v; want %s", outcomes(acts), again, tc.want)
			}
			if l, _ := dyn.Resource(tm.gvr).List(context.Background(), metav1.ListOptions{}); !tc.listFails && len(l.Items) != 1 {
				t.Errorf("%d resources, want nothing created", len(l.Items))
			}
		})
	}
}

// TestOneFailureEscalatedOnce: the faults that joined one RebootNode,
// each told its failure, escalate the node once: the node's annotation
// keeps the first escalation's time (the janitor refuses a resource
// created before it: re-stamped, it cancelled a reboot legitimately
// created after the first escalation), faultline_remediate_escalations_total
// counts one, and each later escalate action says it repeats the first.
// A failure after the annotation's time (a later resource's) is escalated
// anew (no server: client-go's fake clients).
func TestOneFailureEscalatedOnce(t *testing.T) {
	now := time.Date(2026, 1, 2, 12, 0, 0, 0, time.UTC)
	h, err := New(DefaultConfig(), clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	tm := h.cfg.byAction["RESTART_VM"]
	failedAt := now.Add(-10 * time.Minute)
	o := &unstructured.Unstructured{}
	o.SetAPIVersion(tm.gvr.GroupVersion().String())
	o.SetKind(tm.kind)
	o.SetName(h.name("n1", tm.Group, 1))
	o.SetAnnotations(map[string]string{AnnotationTriggers: "d-1,d-2,d-3", AnnotationCreated: now.Add(-time.Hour).Format(time.RFC3339Nano)})
	o.Object["status"] = map[string]any{"completionTime": failedAt.Format(time.RFC3339), "conditions": []any{
		map[string]any{"type": "NodeReady", "status": "False", "reason": "Timeout", "lastTransitionTime": failedAt.Format(time.RFC3339)}}}
	kube := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	cl := &clusters.Client{Name: cluster, Kube: kube}
	escalated := func() string {
		n, _ := kube.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
		return n.Annotations[AnnotationEscalated]
	}
	var first string
	for i, id := range []string{"d-1", "d-2", "d-3"} {
		tr := trigger{cluster: cluster, node: "n1", id: id, rec: attemptRec(2),
			src: &faultlinev1.Action{RecommendedAction: "RESTART_VM", Outcome: events.OutcomeSucceeded}}
		acts, _, err := h.follow(context.Background(), cl, tr, tm, o, false)
		if err != nil || said(acts) != "remediate/failed escalate/applied" {
			t.Fatalf("%s: %v, %v", id, outcomes(acts), err)
		}
		if i == 0 {
			first = escalated()
			if acts[1].GetDetails()[DetailEscalatedAt] != "" {
				t.Errorf("the first escalation says it repeats %q", acts[1].GetDetails()[DetailEscalatedAt])
			}
		} else if v := acts[1].GetDetails()[DetailEscalatedAt]; v == "" || !strings.HasPrefix(first, v) {
			t.Errorf("%s: escalate action's %s = %q, want the first escalation's time (%q)", id, DetailEscalatedAt, v, first)
		}
		now = now.Add(time.Minute)
	}
	if v := escalated(); v != first {
		t.Errorf("annotation re-stamped: %q, want the first %q", v, first)
	}
	if n := testutil.ToFloat64(h.m.escalations.WithLabelValues(cluster)); n != 1 {
		t.Errorf("%v escalations counted for one failure, want 1", n)
	}
	// A later resource's failure, after the escalation: escalated anew.
	later := now.Add(time.Minute)
	o.Object["status"] = map[string]any{"completionTime": later.Format(time.RFC3339), "conditions": []any{
		map[string]any{"type": "NodeReady", "status": "False", "reason": "Timeout", "lastTransitionTime": later.Format(time.RFC3339)}}}
	now = later.Add(time.Minute)
	tr := trigger{cluster: cluster, node: "n1", id: "d-4", src: &faultlinev1.Action{RecommendedAction: "RESTART_VM", Outcome: events.OutcomeSucceeded}}
	acts, _, err := h.follow(context.Background(), cl, tr, tm, o, false)
	if err != nil || len(acts) != 2 || acts[1].GetDetails()[DetailEscalatedAt] != "" {
		t.Fatalf("later failure: %v, %v", acts, err)
	}
	if escalated() == first || testutil.ToFloat64(h.m.escalations.WithLabelValues(cluster)) != 2 {
		t.Errorf("a later failure was not escalated anew: %q", escalated())
	}
}
