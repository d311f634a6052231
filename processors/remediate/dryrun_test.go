package remediate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// TestFollowUpOnADryRunClusterFollowsItsResource: a cluster switched to
// dry_run while a live RebootNode is in progress still has that
// RebootNode's trigger followed, read-only, to its result: succeeded,
// or failed and escalated without annotating the node (nor counting an
// escalation). Before, its next follow-up recorded remediate/dry_run
// "would create" and was dropped: the janitor rebooted the node all the
// same, faultline never said how it ended, and a failed reboot never
// escalated. A trigger that starts on a dry-run cluster, or a follow-up
// that no resource lists (it waited for another), still would create
// (no server: client-go's fake clients).
func TestFollowUpOnADryRunClusterFollowsItsResource(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	conds := map[string][]any{
		"in progress": {map[string]any{"type": "SignalSent", "status": "True", "reason": "Succeeded"},
			map[string]any{"type": "NodeReady", "status": "Unknown", "reason": "Initializing"}},
		"completed": {map[string]any{"type": "SignalSent", "status": "True", "reason": "Succeeded"},
			map[string]any{"type": "NodeReady", "status": "True", "reason": "Succeeded"}},
		"failed": {map[string]any{"type": "SignalSent", "status": "True", "reason": "Succeeded"},
			map[string]any{"type": "NodeReady", "status": "False", "reason": "Timeout"}},
	}
	for _, tc := range []struct {
		name     string
		status   string
		id       string // the trigger's id; ev-1 is the RebootNode's
		attempt  string
		outcomes []string // kind/outcome of each action
		again    bool
	}{
		{"in progress", "in progress", "ev-1", "2", nil, true},
		{"completed", "completed", "ev-1", "2", []string{"remediate/succeeded"}, false},
		{"failed", "failed", "ev-1", "2", []string{"remediate/failed", "escalate/applied"}, false},
		{"a new trigger", "in progress", "ev-2", "", []string{"remediate/dry_run"}, false},
		{"a follow-up no resource lists", "in progress", "ev-2", "2", []string{"remediate/dry_run"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := New(DefaultConfig(), clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(h.Close)
			tm := h.cfg.byAction["RESTART_VM"]
			r1 := firstOfN1(h, tm, "ev-1", now.Add(-10*time.Minute))
			r1.Object["status"] = map[string]any{"startTime": now.Add(-9 * time.Minute).Format(time.RFC3339), "conditions": conds[tc.status]}
			if tc.status != "in progress" {
				r1.Object["status"].(map[string]any)["completionTime"] = now.Add(-time.Minute).Format(time.RFC3339)
			}
			dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{tm.gvr: tm.kind + "List"}, r1)
			kube := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
			cl := &clusters.Client{Name: cluster, Kube: kube, Dynamic: dyn, DryRun: true}
			rec := &kgo.Record{}
			if tc.attempt != "" {
				rec.Headers = []kgo.RecordHeader{{Key: requeue.HeaderAttempt, Value: []byte(tc.attempt)}}
			}
			src := &faultlinev1.Action{Role: events.RoleDrain, Kind: events.KindDrain, Outcome: events.OutcomeSucceeded,
				RecommendedAction: "RESTART_VM", EventIds: []string{tc.id}, Timestamp: timestamppb.New(now.Add(-11 * time.Minute))}
			tr := trigger{cluster: cluster, node: "n1", id: tc.id, src: src, rec: rec}

			acts, again, err := h.step(context.Background(), cl, tr)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, a := range acts {
				got = append(got, a.GetKind()+"/"+a.GetOutcome())
			}
			if strings.Join(got, " ") != strings.Join(tc.outcomes, " ") || again.IsZero() == tc.again {
				t.Fatalf("step: %v (%v), next look %v; want %v, next look %v", got, acts, again, tc.outcomes, tc.again)
			}
			for _, a := range acts {
				if a.GetKind() == events.KindEscalate && !a.GetDryRun() {
					t.Errorf("escalation on a dry-run cluster not marked dryRun: %v", a)
				}
			}
			n, err := kube.CoreV1().Nodes().Get(context.Background(), "n1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if v, ok := n.Annotations[AnnotationEscalated]; ok {
				t.Errorf("a dry-run cluster's node annotated %s=%q", AnnotationEscalated, v)
			}
			if esc := testutil.ToFloat64(h.m.escalations.WithLabelValues(cluster)); esc != 0 {
				t.Errorf("%v escalations counted on a dry-run cluster, want none", esc)
			}
			for _, a := range dyn.Actions() {
				if v := a.GetVerb(); v != "list" && v != "get" && v != "watch" {
					t.Errorf("a dry-run cluster was written: %s %s", v, a.GetResource().Resource)
				}
			}
			for _, a := range kube.Actions() {
				if v := a.GetVerb(); v != "list" && v != "get" && v != "watch" {
					t.Errorf("a dry-run cluster was written: %s %s", v, a.GetResource().Resource)
				}
			}
		})
	}
}

// TestConflictsInARowRequeued: a step whose write met a conflict on each
// of requeue.Step's redos (a resource rewritten as fast as it is read)
// is looked at again after poll_interval. Before, it was recorded
// remediate/failed and dropped: neither remediated nor escalated, the
// node left cordoned and drained with nothing pending (no server:
// client-go's fake clients).
func TestConflictsInARowRequeued(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	h, err := New(DefaultConfig(), reg, Options{Log: testLog, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	tm := h.cfg.byAction["RESTART_VM"]
	r1 := firstOfN1(h, tm, "ev-1", now.Add(-time.Minute))
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{tm.gvr: tm.kind + "List"}, r1)
	patches := 0
	dyn.PrependReactor("patch", tm.gvr.Resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		patches++
		return true, nil, apierrors.NewConflict(tm.gvr.GroupResource(), r1.GetName(), nil)
	})
	reg.SetClient(cluster, fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}), false)
	reg.SetDynamic(cluster, dyn)
	src := &faultlinev1.Action{Role: events.RoleDrain, Kind: events.KindDrain, Outcome: events.OutcomeSucceeded,
		RecommendedAction: "RESTART_VM", EventIds: []string{"ev-2"}, Timestamp: timestamppb.New(now)}
	tr := trigger{cluster: cluster, node: "n1", id: "ev-2", src: src, rec: &kgo.Record{}}
	acts, again := h.process(context.Background(), tr)
	if patches < 2 {
		t.Fatalf("%d joins tried, want requeue.Step's redos", patches)
	}
	for _, a := range acts {
		if a.GetOutcome() == events.OutcomeFailed {
			t.Fatalf("conflicts in a row recorded %v", a)
		}
	}
	if want := now.Add(h.cfg.PollInterval); !again.At.Equal(want) {
		t.Fatalf("conflicts in a row: next look %v, want %v (poll_interval)", again.At, want)
	}
}
