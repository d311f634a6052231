package remediate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// TestFaultAfterTheStartDoesNotJoin: a fault generated after a reboot in
// progress had started (the node came back, the GPU fell off the bus
// again at driver load, NodeReady not yet True) waits for that reboot
// instead of joining it; when it finishes, the fault is decided again: a
// second reboot, or CONTACT_SUPPORT once the budget is spent. Before, it
// joined and was recorded succeeded with the reboot: the fault still
// active, the node cordoned and drained for ever, never escalated. A
// fault generated before the start, one of unknown generation, and a
// reboot not started yet are joined as before (no server: client-go's
// fake dynamic client).
func TestFaultAfterTheStartDoesNotJoin(t *testing.T) {
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	for name, tc := range map[string]struct {
		started   bool
		generated time.Duration // after the start; 0: not known
		budget    int
		joins     bool
		then      string // the trigger's outcome once the reboot completed; "": CONTACT_SUPPORT
		reboots   int    // RebootNodes then
		later     bool   // a fault generated before the start joins after this one's look
	}{
		"generated after the start":                       {true, 2 * time.Minute, 3, false, events.OutcomeApplied, 2, false},
		"generated after the start, budget spent":         {true, 2 * time.Minute, 1, false, "", 1, false},
		"generated after the start, another joined since": {true, 2 * time.Minute, 3, false, events.OutcomeApplied, 2, true},
		"generated before the start":                      {true, -time.Minute, 3, true, events.OutcomeSucceeded, 1, false},
		"generation not known":                            {true, 0, 3, true, events.OutcomeSucceeded, 1, false},
		"not started yet (queued behind the janitor)":     {false, 2 * time.Minute, 3, true, events.OutcomeSucceeded, 1, false},
	} {
		t.Run(name, func(t *testing.T) {
			now := start.Add(3 * time.Minute)
			cfg := DefaultConfig()
			cfg.Budget = tc.budget
			h, err := New(cfg, clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(h.Close)
			tm := h.cfg.byAction["RESTART_VM"]
			r1 := firstOfN1(h, tm, "ev-1", start.Add(-10*time.Second))
			if tc.started {
				r1.Object["status"] = map[string]any{"startTime": start.Format(time.RFC3339), "conditions": []any{
					map[string]any{"type": "SignalSent", "status": "True", "reason": "Succeeded"},
					map[string]any{"type": "NodeReady", "status": "Unknown", "reason": "Initializing"},
				}}
			}
			dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{tm.gvr: tm.kind + "List"}, r1)
			kube := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
			cl := &clusters.Client{Name: cluster, Kube: kube, Dynamic: dyn}
			res := dyn.Resource(tm.gvr)
			src := &faultlinev1.Action{RecommendedAction: "RESTART_VM", EventIds: []string{"ev-2"}, Timestamp: timestamppb.New(now), Details: map[string]string{}}
			if tc.generated != 0 {
				src.Details[events.DetailGeneratedAt] = start.Add(tc.generated).Format(time.RFC3339Nano)
			}
			tr := trigger{cluster: cluster, node: "n1", id: "ev-2", src: src, rec: &kgo.Record{}}
			decide := func() ([]*faultlinev1.Action, time.Time) {
				t.Helper()
				acts, again, err := h.decide(context.Background(), cl, tr, tm, h.data(tr, tm), true)
				if err != nil {
					t.Fatal(err)
				}
				return acts, again
			}

			acts, again := decide()
			cur, err := res.Get(context.Background(), r1.GetName(), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			joined := strings.Contains(cur.GetAnnotations()[AnnotationTriggers], "ev-2")
			if joined != tc.joins || len(acts) != 1 || acts[0].GetOutcome() != events.OutcomeInProgress || again.IsZero() {
				t.Fatalf("in progress: joined %v, want %v; %v, next look %v", joined, tc.joins, acts, again)
			}
			if !tc.joins && !strings.Contains(acts[0].GetReason(), "before this fault was generated") {
				t.Fatalf("waiting said %q", acts[0].GetReason())
			}

			if tc.later {
				// A repeat from the agent's spool, generated before the
				// reboot, drained after this trigger: its covers-until is
				// later than this trigger's time.
				ann := cur.GetAnnotations()
				ann[AnnotationTriggers] += ",ev-3"
				ann[AnnotationCovers] = now.Add(time.Minute).Format(time.RFC3339Nano)
				cur.SetAnnotations(ann)
			}
			// The reboot completes (NodeReady=True); the trigger is looked at again.
			cur.Object["status"] = map[string]any{"startTime": start.Format(time.RFC3339), "completionTime": start.Add(2 * time.Minute).Format(time.RFC3339),
				"conditions": []any{
					map[string]any{"type": "SignalSent", "status": "True", "reason": "Succeeded"},
					map[string]any{"type": "NodeReady", "status": "True", "reason": "Succeeded"},
				}}
			if _, err := res.Update(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			now = now.Add(cfg.PollInterval)
			acts, _ = decide()
			l, err := res.List(context.Background(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(acts) == 0 || len(l.Items) != tc.reboots {
				t.Fatalf("after the reboot: %v, %d RebootNodes, want %s and %d", acts, len(l.Items), tc.then, tc.reboots)
			}
			switch {
			case tc.then == "":
				if acts[len(acts)-1].GetKind() != events.KindEscalate {
					t.Fatalf("after the reboot, the budget spent: %v, want an escalation", acts)
				}
			case acts[0].GetOutcome() != tc.then:
				t.Fatalf("after the reboot: %v, want %s", acts, tc.then)
			}
		})
	}
}

// firstOfN1 is node n1's first resource of tm's group, as the role
// creates it: listing triggers, created at created.
func firstOfN1(h *Handler, tm *Template, triggers string, created time.Time) *unstructured.Unstructured {
	o := &unstructured.Unstructured{}
	o.SetAPIVersion(tm.gvr.GroupVersion().String())
	o.SetKind(tm.kind)
	o.SetName(h.name("n1", tm.Group, 1))
	o.SetLabels(map[string]string{LabelNode: "n1", LabelGroup: tm.Group, LabelManagedBy: "faultline"})
	o.SetAnnotations(map[string]string{AnnotationTriggers: triggers, AnnotationSeq: "1",
		AnnotationCreated: created.Format(time.RFC3339Nano)})
	return o
}
