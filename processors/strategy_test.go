package processors_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/internal/clickhouse/chtest"
	"github.com/faultline/faultline/internal/history"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// TestStoreAndAnalyse runs every processor role over a real Kafka broker,
// ClickHouse and kube-apiserver with the shipped rules, and sends what
// NVSentinel's monitors send with processingStrategy STORE_AND_ANALYSE:
//
//   - a fatal Xid 79 on sa-1 is stored (in the history with its strategy)
//     and evaluated by correlation, but quarantine skips it, saying why,
//     and the node, drain and remediate are untouched; the same event with
//     EXECUTE_REMEDIATION cordons er-1 (so the rules would act on it);
//   - two Xid 31 on one GPU of sa-2 are both skipped by quarantine, and
//     correlated: RepeatedXID31OnSameGPU derives a verdict from the two,
//     which carries its rule's own strategy (EXECUTE_REMEDIATION) and is
//     what quarantines sa-2.
func TestStoreAndAnalyse(t *testing.T) {
	if testing.Short() {
		t.Skip("real Kafka, ClickHouse and kube-apiserver")
	}
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	kube.ApplyCRDs(t, "../deploy/crds/*.yaml")
	k := kube.Client()
	kf := testenv.StartKafka(t)
	ch := chtest.Start(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("E2E_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for _, n := range []string{"sa-1", "sa-2", "er-1", "spare-1"} { // 50%: two quarantines
		if _, err := k.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"gpu": "true"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sa1, _ := k.CoreV1().Nodes().Get(ctx, "sa-1", metav1.GetOptions{})

	cfg := processors.DefaultConfig()
	cfg.Roles = "all"
	cfg.ClickHouse = ch.Config
	cfg.Store.BatchLinger = 100 * time.Millisecond
	cfg.Correlate.BatchLinger = 100 * time.Millisecond
	cfg.Kube.Clusters = []clusters.Cluster{{Name: "prod", Kubeconfig: kube.Kubeconfig()}}
	cfg.Quarantine.Identity = "faultline-quarantine/e2e"
	cfg.Quarantine.Breaker.GPUNodeSelector = "gpu=true"
	cfg.Quarantine.Breaker.MaxPercent = 50
	cfg.Quarantine.Breaker.AutoClose = false
	cfg.Drain.GracePeriod = 0
	cfg.Drain.PollInterval = time.Second
	runProcessors(ctx, t, cfg, kf.Addr(), log)

	cl := kf.Client(t, kgo.ConsumeTopics(events.TopicActions, events.TopicEvents), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var (
		acts    []*faultlinev1.Action
		derived []*datamodels.HealthEvent
	)
	poll := func() {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		defer pcancel()
		cl.PollFetches(pctx).EachRecord(func(r *kgo.Record) {
			switch r.Topic {
			case events.TopicActions:
				if a, err := events.UnmarshalAction(r.Value); err == nil {
					acts = append(acts, a)
				}
			case events.TopicEvents:
				if ev, err := events.Unmarshal(r.Value); err == nil && events.IsDerived(ev) {
					derived = append(derived, ev)
				}
			}
		})
	}
	// waitAction returns the first action about one of ids (or, ids
	// empty, of node) matching role/kind/outcome.
	waitAction := func(node, role, kind, outcome string, ids ...string) *faultlinev1.Action {
		t.Helper()
		for deadline := time.Now().Add(90 * time.Second); ; poll() {
			for _, a := range acts {
				if a.Node == node && a.Role == role && a.Kind == kind && a.Outcome == outcome &&
					(len(ids) == 0 || slices.ContainsFunc(a.GetEventIds(), func(id string) bool { return slices.Contains(ids, id) })) {
					return a
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s %s/%s action for %s %v; actions: %s", role, kind, outcome, node, ids, describe(acts))
			}
		}
	}
	send := func(node, code, gpu string, strategy datamodels.ProcessingStrategy) string {
		t.Helper()
		ev := &datamodels.HealthEvent{
			Version: 1, Agent: "syslog-health-monitor", ComponentClass: "GPU", CheckName: "SysLogsXIDError", IsFatal: true,
			Message: code + " on " + gpu, RecommendedAction: datamodels.RecommendedAction_REPLACE_VM, ErrorCode: []string{code},
			EntitiesImpacted: []*datamodels.Entity{{EntityType: events.EntityGPU, EntityValue: gpu}}, NodeName: node,
			GeneratedTimestamp: timestamppb.Now(), ProcessingStrategy: strategy,
			// What the gateway stamps.
			Cluster: "prod", Id: events.NewID(), ReceivedTimestamp: timestamppb.Now(),
			Submitter: &datamodels.Submitter{Name: "token:prod#1", Role: datamodels.SubmitterRole_SUBMITTER_ROLE_AGENT},
		}
		b, err := events.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: events.TopicEvents, Key: events.Key("prod", node), Value: b}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		return ev.Id
	}
	const sa = datamodels.ProcessingStrategy_STORE_AND_ANALYSE

	// One STORE_AND_ANALYSE fatal Xid: skipped; the same with
	// EXECUTE_REMEDIATION on another node: quarantined.
	id1 := send("sa-1", "XID-79", "GPU-a", sa)
	skip := waitAction("sa-1", "quarantine", "skip", "skipped", id1)
	if skip.Reason != "processingStrategy STORE_AND_ANALYSE: stored, never acted on" {
		t.Fatalf("sa-1 decision %q", skip.Reason)
	}
	idER := send("er-1", "XID-79", "GPU-a", datamodels.ProcessingStrategy_EXECUTE_REMEDIATION)
	if q := waitAction("er-1", "quarantine", "quarantine", "applied", idER); q.Rule != "nvsentinel-monitors-fatal" {
		t.Fatalf("er-1 quarantined by %q", q.Rule)
	}

	// Two STORE_AND_ANALYSE Xid 31 on one GPU: each skipped, and the
	// verdict correlated from them quarantines the node.
	id2 := send("sa-2", "XID-31", "GPU-b", sa)
	id3 := send("sa-2", "XID-31", "GPU-b", sa)
	for _, id := range []string{id2, id3} {
		if a := waitAction("sa-2", "quarantine", "skip", "skipped", id); a.Reason != "processingStrategy STORE_AND_ANALYSE: stored, never acted on" {
			t.Fatalf("sa-2 decision %q", a.Reason)
		}
	}
	var verdict *datamodels.HealthEvent
	for deadline := time.Now().Add(90 * time.Second); verdict == nil; poll() {
		for _, ev := range derived {
			if ev.GetNodeName() == "sa-2" && ev.GetDerivedBy() == "RepeatedXID31OnSameGPU" && !ev.GetIsHealthy() {
				verdict = ev
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no RepeatedXID31OnSameGPU verdict for sa-2; derived: %v", derived)
		}
	}
	if !slices.Contains(verdict.GetCauseIds(), id2) || !slices.Contains(verdict.GetCauseIds(), id3) ||
		verdict.GetProcessingStrategy() != datamodels.ProcessingStrategy_EXECUTE_REMEDIATION {
		t.Fatalf("verdict causes %v strategy %v, want both Xid 31 events and its rule's EXECUTE_REMEDIATION", verdict.GetCauseIds(), verdict.GetProcessingStrategy())
	}
	if q := waitAction("sa-2", "quarantine", "quarantine", "applied", verdict.GetId()); q.Rule != "faultline-derived-verdicts" {
		t.Fatalf("sa-2 quarantined by %q", q.Rule)
	}

	// sa-1: nothing acted on it; its event is stored with its strategy.
	time.Sleep(2 * time.Second) // let any late action arrive
	poll()
	for _, a := range acts {
		if a.Node == "sa-1" && (a.Role != "quarantine" || a.Kind != "skip") {
			t.Errorf("sa-1: %s %s/%s %s", a.Role, a.Kind, a.Outcome, a.Reason)
		}
		for _, id := range []string{id1, id2, id3} {
			if slices.Contains(a.GetEventIds(), id) && a.Kind != "skip" {
				t.Errorf("a STORE_AND_ANALYSE event was acted on: %s %s/%s %s", a.Role, a.Kind, a.Outcome, a.Reason)
			}
		}
	}
	if n, _ := k.CoreV1().Nodes().Get(ctx, "sa-1", metav1.GetOptions{}); n.ResourceVersion != sa1.ResourceVersion || n.Spec.Unschedulable {
		t.Errorf("sa-1 changed: unschedulable %v, taints %v", n.Spec.Unschedulable, n.Spec.Taints)
	}
	h := history.New(ch.Conn, log)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got, err := h.ListEvents(ctx, "prod", &faultlinev1.ListEventsRequest{Node: "sa-1"})
		if err == nil && len(got.GetEvents()) == 1 {
			if ev := got.Events[0]; ev.GetId() != id1 || ev.GetProcessingStrategy() != sa {
				t.Fatalf("stored %v", ev)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sa-1's event not stored: %v %v", got, err)
		}
	}
}
