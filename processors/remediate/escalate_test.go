package remediate

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
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

// TestEscalationCountedOnceWritten: an escalation whose node annotation
// cannot be written (the API server's 500, RBAC without nodes/patch) is
// an error the step retries, and counts nothing; before, every retry
// counted an escalation and an escalate action, and
// FaultlineEscalatedToSupport fired for nodes never escalated (no server:
// client-go's fake clientset).
func TestEscalationCountedOnceWritten(t *testing.T) {
	h, err := New(DefaultConfig(), clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Now: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	kube := fake.NewClientset()
	fail := true
	kube.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if fail {
			return true, nil, apierrors.NewInternalError(errors.New("etcd leader changed"))
		}
		return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, "n1")
	})
	cl := &clusters.Client{Name: cluster, Kube: kube}
	tr := trigger{cluster: cluster, node: "n1", id: "ev-1", src: &faultlinev1.Action{RecommendedAction: "RESTART_VM"}}
	counted := func() (float64, float64) {
		return testutil.ToFloat64(h.m.escalations.WithLabelValues(cluster)),
			testutil.ToFloat64(h.m.actions.WithLabelValues(cluster, events.KindEscalate, events.OutcomeApplied))
	}
	for range 3 {
		if acts, err := h.escalate(context.Background(), cl, tr, "reboot", "budget spent", time.Time{}); err == nil || len(acts) != 0 {
			t.Fatalf("the annotation's write failed: %d actions, err %v; want none and the error", len(acts), err)
		}
	}
	if esc, acts := counted(); esc != 0 || acts != 0 {
		t.Fatalf("3 failed writes counted %v escalations and %v escalate actions, want none", esc, acts)
	}
	fail = false // the node gone meanwhile: nothing to annotate, escalated all the same
	acts, err := h.escalate(context.Background(), cl, tr, "reboot", "budget spent", time.Time{})
	if err != nil || len(acts) != 1 || acts[0].GetKind() != events.KindEscalate || acts[0].GetDryRun() {
		t.Fatalf("escalation: %v, %v", acts, err)
	}
	if esc, acts := counted(); esc != 1 || acts != 1 {
		t.Fatalf("one escalation counted %v and %v escalate actions, want 1 and 1", esc, acts)
	}
}

// TestJoinOfADeletedResourceIsDecidedAgain: a resource in progress that is
// deleted between the read and the join's patch (an operator resetting
// the budget, the retention's prune) is a conflict, which requeue.Step
// redoes on a live list; before, NotFound was the request's own error:
// the fault was recorded failed and dropped, neither remediated nor
// escalated (no server: client-go's fake dynamic client).
func TestJoinOfADeletedResourceIsDecidedAgain(t *testing.T) {
	h, err := New(DefaultConfig(), clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Now: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	tm := h.cfg.byAction["RESTART_VM"]
	dyn := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	dyn.PrependReactor("patch", tm.gvr.Resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(tm.gvr.GroupResource(), "maintenance-n1-0")
	})
	o := &unstructured.Unstructured{}
	o.SetName("maintenance-n1-0")
	o.SetResourceVersion("7")
	tr := trigger{cluster: cluster, node: "n1", id: "ev-2", src: &faultlinev1.Action{RecommendedAction: "RESTART_VM"}}
	_, _, err = h.join(context.Background(), &clusters.Client{Name: cluster, Dynamic: dyn}, tr, tm, dyn.Resource(tm.gvr), nodeGroup{node: "n1", group: tm.Group}, o)
	if !apierrors.IsConflict(err) {
		t.Fatalf("join of a deleted resource: %v, want a conflict (decided again)", err)
	}
}

// TestJoinAtALaterLookIsAudited: a trigger that joins a remediation in
// progress at a later look (it waited for a remediation of other GPUs,
// then another fault's was created for its GPUs too) says it joined;
// before, only a first look or one after trouble did, and the audit trail
// had no record of the join (no server: client-go's fake dynamic client).
func TestJoinAtALaterLookIsAudited(t *testing.T) {
	h, err := New(DefaultConfig(), clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Now: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	tm := h.cfg.byAction["RESTART_VM"]
	o := &unstructured.Unstructured{}
	o.SetAPIVersion(tm.gvr.GroupVersion().String())
	o.SetKind(tm.kind)
	o.SetName("maintenance-n1-0")
	o.SetAnnotations(map[string]string{AnnotationTriggers: "ev-1", AnnotationCreated: time.Now().UTC().Format(time.RFC3339Nano)})
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{tm.gvr: tm.kind + "List"}, o)
	later := &kgo.Record{Headers: []kgo.RecordHeader{{Key: requeue.HeaderAttempt, Value: []byte("3")}}}
	tr := trigger{cluster: cluster, node: "n1", id: "ev-3", rec: later, src: &faultlinev1.Action{RecommendedAction: "RESTART_VM"}}
	acts, again, err := h.join(context.Background(), &clusters.Client{Name: cluster, Dynamic: dyn}, tr, tm, dyn.Resource(tm.gvr), nodeGroup{node: "n1", group: tm.Group}, o)
	if err != nil || again.IsZero() {
		t.Fatalf("join: %v, next look %v, %v", err, again, acts)
	}
	if len(acts) != 1 || acts[0].GetOutcome() != events.OutcomeInProgress || !strings.HasPrefix(acts[0].GetReason(), "joined ") {
		t.Fatalf("join at a later look said %v, want the joined record", acts)
	}
}

// TestDryRunTriggerEscalatesNothing: a dry-run drain result that
// recommends CONTACT_SUPPORT (drain/dry_run, or marked dry-run: in flight
// when its cluster was switched to live, or replayed) annotates no node,
// on a live cluster too; before, only the cluster's dry-run was asked and
// faultline.io/remediation-escalated was patched onto the live node while
// the action said dryRun. Nor is it counted in
// faultline_remediate_escalations_total: before, it was, and
// FaultlineEscalatedToSupport fired for escalations that never happened
// (no server: client-go's fake clientset).
func TestDryRunTriggerEscalatesNothing(t *testing.T) {
	h, err := New(DefaultConfig(), clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Now: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		src       *faultlinev1.Action
		annotated bool
	}{
		{"marked dry-run", &faultlinev1.Action{RecommendedAction: "CONTACT_SUPPORT", Outcome: events.OutcomeSucceeded, DryRun: true}, false},
		{"a drain/dry_run result", &faultlinev1.Action{RecommendedAction: "CONTACT_SUPPORT", Outcome: events.OutcomeDryRun}, false},
		{"live", &faultlinev1.Action{RecommendedAction: "CONTACT_SUPPORT", Outcome: events.OutcomeSucceeded}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
			cl := &clusters.Client{Name: cluster, Kube: kube}
			tr := trigger{cluster: cluster, node: "n1", id: "ev-" + tc.name, src: tc.src}
			before := testutil.ToFloat64(h.m.escalations.WithLabelValues(cluster))
			acts, _, err := h.step(context.Background(), cl, tr)
			if err != nil || len(acts) != 1 || acts[0].GetKind() != events.KindEscalate {
				t.Fatalf("step: %v, %v; want one escalate action", acts, err)
			}
			if acts[0].GetDryRun() == tc.annotated {
				t.Errorf("escalate action dryRun %v, want %v", acts[0].GetDryRun(), !tc.annotated)
			}
			n, err := kube.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			v, ok := n.Annotations[AnnotationEscalated]
			if ok != tc.annotated {
				t.Errorf("node annotated %s: %v, want %v", AnnotationEscalated, ok, tc.annotated)
			}
			// Counted only when written: FaultlineEscalatedToSupport fired
			// for dry-run escalations, which escalate nothing.
			if counted := testutil.ToFloat64(h.m.escalations.WithLabelValues(cluster)) - before; counted != 0 && !tc.annotated || counted != 1 && tc.annotated {
				t.Errorf("%v escalations counted, want 1 only when the node was annotated", counted)
			}
			// With nanoseconds, as AnnotationCreated: the janitor refuses a
			// resource created before it, and only before it (to the
			// second, one created just after it in its second was refused).
			if ts, _, _ := strings.Cut(v, " "); ok && !strings.Contains(ts, ".") {
				t.Errorf("%s = %q: its time has no fraction of a second", AnnotationEscalated, v)
			}
		})
	}
}
