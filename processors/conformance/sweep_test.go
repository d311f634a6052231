package conformance

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/faultline/faultline/internal/clickhouse/chtest"
	"github.com/faultline/faultline/processors/clusters"
	storerole "github.com/faultline/faultline/processors/store"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// fakeEnv is a real ClickHouse (the reports) with a cluster whose nodes
// are client-go's fake clientset.
type fakeEnv struct {
	s       *chtest.Server
	kube    *fake.Clientset
	reg     *clusters.Registry
	h       *Handler
	clk     *clock
	cluster string
}

func startFake(t *testing.T, dryRun bool) *fakeEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a real ClickHouse server")
	}
	s := chtest.Start(t)
	clk := &clock{t: time.Now().UTC().Truncate(time.Second)}
	e := &fakeEnv{s: s, kube: fake.NewSimpleClientset(), clk: clk, h: NewHandler(s.Conn, testLog, clk.Now), cluster: uniq("f")}
	e.reg = clusters.NewRegistry(clusters.DefaultConfig(), clk.Now)
	e.reg.SetClient(e.cluster, e.kube, dryRun)
	return e
}

// nodes creates n nodes, <cluster>-n1…, and returns the last one's name.
func (e *fakeEnv) nodes(t *testing.T, n int) string {
	t.Helper()
	var name string
	for i := 1; i <= n; i++ {
		name = fmt.Sprintf("%s-n%d", e.cluster, i)
		if _, err := e.kube.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return name
}

// report stores a report of every node of nodes: the last one's
// firmware is fw ("" conforms), the others conform.
func (e *fakeEnv) report(t *testing.T, n int, fw string) {
	t.Helper()
	for i := 1; i <= n; i++ {
		c := comps("")
		if i == n {
			c = comps(fw)
		}
		store(t, e.h, record(t, e.cluster, fmt.Sprintf("%s-n%d", e.cluster, i), c, e.clk.Now()))
	}
}

func (e *fakeEnv) sweep(t *testing.T, sw *Sweeper, step string) Output {
	t.Helper()
	out, err := sw.Sweep(context.Background(), e.cluster)
	if err != nil {
		t.Fatalf("%s: %v", step, err)
	}
	return out
}

// TestSensitiveAfterDriftIsDrained: a node drifts while not sensitive,
// then an operator labels it sensitive: the next sweep drains it (the
// fatal event, one conformance_drain) and records it sensitive, so its
// return waits for an approval. It was drained only by the timeout's
// escalation, up to 4h later, and never awaited an approval.
func TestSensitiveAfterDriftIsDrained(t *testing.T) {
	e := startFake(t, false)
	ctx := context.Background()
	node := e.nodes(t, 4)
	e.report(t, 4, "28.41.1000")
	sw := NewSweeper(testConfig(), e.s.Conn, e.reg, testLog, e.clk.Now, nil)

	var drains []*faultlinev1.Action
	out := e.sweep(t, sw, "not sensitive")
	if k := kinds(out.Actions); len(k[events.KindConformanceDrift]) != 1 || len(k[events.KindConformanceDrain]) != 0 || len(out.Events) != 0 {
		t.Fatalf("not sensitive: actions %v, events %v", out.Actions, out.Events)
	}
	n := e.get(t, node)
	n.Labels = map[string]string{"faultline.io/sensitive": "true"}
	if _, err := e.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		e.clk.Add(time.Minute)
		out := e.sweep(t, sw, "sensitive")
		drains = append(drains, kinds(out.Actions)[events.KindConformanceDrain]...)
		if i == 0 && (len(out.Events) != 1 || out.Events[0].CheckName != CheckDriftSensitive || !out.Events[0].IsFatal) {
			t.Fatalf("labelled sensitive: events %v, want the fatal %s", out.Events, CheckDriftSensitive)
		}
	}
	if len(drains) != 1 || drains[0].Node != node {
		t.Fatalf("drains %v, want one of %s", drains, node)
	}
	st, has := sw.readState(e.cluster, member{node: e.get(t, node), name: node}, true)
	if !has || !st.Sensitive || !st.Drained {
		t.Fatalf("state %+v, want sensitive and drained", st)
	}
}

func (e *fakeEnv) get(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := e.kube.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDriftNotifiedOnceWithTheProductionClock: with time.Now (its
// monotonic reading, not a test clock's truncated time) a drift is
// notified once. The notification's key was the start's String(): with
// "m=+…" at the first sweep, without it once read back from the
// annotation, so the next sweep queued the drift again.
func TestDriftNotifiedOnceWithTheProductionClock(t *testing.T) {
	e := startFake(t, false)
	e.clk = &clock{t: time.Now()}
	e.h = NewHandler(e.s.Conn, testLog, time.Now)
	node := e.nodes(t, 4)
	e.report(t, 4, "28.41.1000")
	rec := &recordingNotifier{}
	cfg := testConfig()
	q := NewQueue(rec, cfg.Notifier, testLog, func(Notification, int, error) {})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go q.Run(ctx)
	sw := NewSweeper(cfg, e.s.Conn, e.reg, testLog, nil, q)

	e.sweep(t, sw, "the drift")
	rec.wait(t, node+" drifted")
	for i := 0; i < 2; i++ {
		e.sweep(t, sw, "still drifted")
	}
	time.Sleep(200 * time.Millisecond) // a second notice would be delivered by now
	rec.wait(t, node+" drifted")
}

// audit writes the actions to ClickHouse through the store role, as the
// role's output would be.
func (e *fakeEnv) audit(t *testing.T, acts []*faultlinev1.Action) {
	t.Helper()
	var recs []*kgo.Record
	for _, a := range acts {
		b, err := events.MarshalAction(a)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Topic: events.TopicActions, Key: events.Key(e.cluster, a.Node), Value: b, Timestamp: e.clk.Now()})
	}
	if res, err := storerole.New(e.s.Conn, testLog, nil).Handle(context.Background(), recs); err != nil || len(res.Dead) > 0 {
		t.Fatalf("storing the actions: %v, dead %v", err, res.Dead)
	}
}

// TestSecondDriftToTheSameFingerprint: a node drifts, conforms, and drifts
// to the same fingerprint again (dry-run): the two drifts are two actions
// (the id was the fingerprints' alone, so the audit kept one of them), and
// a restart reads the second drift back: not recorded again, its start
// the second drift's. It came back with no state (the audit's oldest row
// of the id, then the return) and the drift was recorded again, its
// timeout counted from the restart.
func TestSecondDriftToTheSameFingerprint(t *testing.T) {
	e := startFake(t, true)
	node := e.nodes(t, 4)
	sw := NewSweeper(testConfig(), e.s.Conn, e.reg, testLog, e.clk.Now, nil)
	var drifts []*faultlinev1.Action
	for i, fw := range []string{"28.41.1000", "", "28.41.1000"} {
		e.clk.Add(time.Minute)
		e.report(t, 4, fw)
		out := e.sweep(t, sw, fmt.Sprintf("sweep %d", i))
		e.audit(t, out.Actions)
		drifts = append(drifts, kinds(out.Actions)[events.KindConformanceDrift]...)
	}
	if len(drifts) != 2 || drifts[0].Id == drifts[1].Id {
		t.Fatalf("drift actions %v, want two with different ids", drifts)
	}
	second := drifts[1].Details[events.DetailDriftSince]
	if second == drifts[0].Details[events.DetailDriftSince] {
		t.Fatalf("both drifts start at %s", second)
	}

	e.clk.Add(time.Minute)
	e.report(t, 4, "28.41.1000")
	sw = NewSweeper(testConfig(), e.s.Conn, e.reg, testLog, e.clk.Now, nil) // restarted
	if out := e.sweep(t, sw, "restarted"); len(out.Actions) != 0 {
		t.Fatalf("restarted: actions %v, want none (the second drift read back)", out.Actions)
	}
	st, has := sw.readState(e.cluster, member{name: node}, false)
	if !has || sinceKey(st.Since) != second {
		t.Fatalf("restored state %+v (%v), want the drift since %s", st, has, second)
	}
}

// TestDriftResumedWhileAwaitingApproval: a drained sensitive node (dry-run)
// conforms, drifts back to the same fingerprint before it is approved,
// and conforms again: each drift and each wait for approval is an action
// of its own (their ids were the same: the audit kept the first of each),
// and a restart reads back a node awaiting approval.
func TestDriftResumedWhileAwaitingApproval(t *testing.T) {
	e := startFake(t, true)
	node := e.nodes(t, 4)
	n := e.get(t, node)
	n.Labels = map[string]string{"faultline.io/sensitive": "true"}
	if _, err := e.kube.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sw := NewSweeper(testConfig(), e.s.Conn, e.reg, testLog, e.clk.Now, nil)
	ids := map[string]bool{}
	var steps []string
	for i, fw := range []string{"28.41.1000", "", "28.41.1000", ""} {
		e.clk.Add(time.Minute)
		e.report(t, 4, fw)
		out := e.sweep(t, sw, fmt.Sprintf("sweep %d", i))
		e.audit(t, out.Actions)
		for _, a := range out.Actions {
			ids[a.Id] = true
			steps = append(steps, a.Kind+"/"+a.Outcome)
		}
	}
	want := []string{"conformance_drift/dry_run", "conformance_drain/dry_run", "conformance_undrain/in_progress",
		"conformance_drift/dry_run", "conformance_undrain/in_progress"}
	if fmt.Sprint(steps) != fmt.Sprint(want) || len(ids) != len(want) {
		t.Fatalf("steps %v (%d ids), want %v, each its own id", steps, len(ids), want)
	}
	e.clk.Add(time.Minute)
	e.report(t, 4, "")
	sw = NewSweeper(testConfig(), e.s.Conn, e.reg, testLog, e.clk.Now, nil) // restarted
	if out := e.sweep(t, sw, "restarted"); len(out.Actions) != 0 {
		t.Fatalf("restarted: actions %v, want none (awaiting approval read back)", out.Actions)
	}
	if st, _ := sw.readState(e.cluster, member{name: node}, false); !st.Awaiting || !st.Drained || st.Resumed != 1 {
		t.Fatalf("restored state %+v, want drained, awaiting, resumed once", st)
	}
}

// TestDriftEscalatedAfterReportsStop: a drifted node whose agent stops
// reporting (StateUnknown once its last report is stale) is still
// escalated at drift_remediation_timeout, from the drift's start, with the
// last known fingerprints. The sweep did nothing for it: the taint and
// state stayed forever, with no escalation.
func TestDriftEscalatedAfterReportsStop(t *testing.T) {
	e := startFake(t, false)
	node := e.nodes(t, 4)
	e.report(t, 4, "28.41.1000")
	cfg := testConfig()
	sw := NewSweeper(cfg, e.s.Conn, e.reg, testLog, e.clk.Now, nil)
	if out := e.sweep(t, sw, "drift"); len(kinds(out.Actions)[events.KindConformanceDrift]) != 1 {
		t.Fatalf("drift: actions %v", out.Actions)
	}
	st, _ := sw.readState(e.cluster, member{node: e.get(t, node), name: node}, true)
	// Past staleness and the timeout; the others report, the drifted node
	// does not.
	e.clk.Add(cfg.DriftRemediationTimeout + time.Hour)
	e.report(t, 3, "")
	out := e.sweep(t, sw, "reports stopped")
	esc := kinds(out.Actions)[events.KindEscalate]
	if len(esc) != 1 || esc[0].Node != node || !strings.Contains(esc[0].Reason, "stopped reporting") {
		t.Fatalf("reports stopped: actions %v, want one escalation of %s", out.Actions, node)
	}
	if len(out.Events) != 1 || out.Events[0].CheckName != CheckDriftTimeout || !out.Events[0].IsFatal ||
		out.Events[0].Metadata[events.DetailActual] != st.Actual || !strings.Contains(out.Events[0].Message, "stopped reporting") {
		t.Fatalf("reports stopped: events %v, want the fatal %s with the last actual %s", out.Events, CheckDriftTimeout, st.Actual)
	}
	if st, _ := sw.readState(e.cluster, member{node: e.get(t, node), name: node}, true); !st.Escalated {
		t.Fatalf("state %+v, want escalated", st)
	}
	e.clk.Add(time.Minute)
	if out := e.sweep(t, sw, "again"); len(out.Actions) != 0 || len(out.Events) != 0 {
		t.Fatalf("escalated again: %v %v", out.Actions, out.Events)
	}
}

// reportEach stores a report of nodes 1…len(fws): node i's NIC firmware is
// fws[i-1] ("" is the default's).
func (e *fakeEnv) reportEach(t *testing.T, fws ...string) {
	t.Helper()
	for i, fw := range fws {
		store(t, e.h, record(t, e.cluster, fmt.Sprintf("%s-n%d", e.cluster, i+1), comps(fw), e.clk.Now()))
	}
}

// upgraded is a pool of 10 of which the first k run the new firmware.
func upgraded(k int) []string {
	fws := make([]string, 10)
	for i := 0; i < k; i++ {
		fws[i] = "28.41.1000"
	}
	return fws
}

// TestRollingUpgrade: a pool of 10 upgraded a few nodes at a time, no
// baseline. The first 4 upgraded are a minority and drift; a tie (5/5)
// past drift_remediation_timeout escalated them anyway ("its group has no
// expected fingerprint now"), and once escalated at 4/10 they kept the
// timeout's quarantine (cordon + drain) after the majority flipped to
// their fingerprint. Now a tie escalates nobody, and the flip lifts the
// quarantine of the nodes whose fingerprint the pool came to expect with
// a healthy NodeConformanceDriftTimeout event (same check and node as the
// fatal one).
func TestRollingUpgrade(t *testing.T) {
	cfg := testConfig()
	t.Run("a tie escalates nobody", func(t *testing.T) {
		e := startFake(t, false)
		e.nodes(t, 10)
		sw := NewSweeper(cfg, e.s.Conn, e.reg, testLog, e.clk.Now, nil)
		e.reportEach(t, upgraded(4)...)
		if out := e.sweep(t, sw, "4/10"); len(kinds(out.Actions)[events.KindConformanceDrift]) != 4 {
			t.Fatalf("4/10: actions %v, want 4 drifts", out.Actions)
		}
		e.clk.Add(cfg.DriftRemediationTimeout + time.Minute)
		e.reportEach(t, upgraded(5)...)
		if out := e.sweep(t, sw, "5/5"); len(out.Actions) != 0 || len(out.Events) != 0 {
			t.Fatalf("5/5 past the timeout: actions %v, events %v, want none (no expected fingerprint)", out.Actions, out.Events)
		}
	})
	t.Run("the flip lifts the timeout quarantine", func(t *testing.T) {
		e := startFake(t, false)
		e.nodes(t, 10)
		sw := NewSweeper(cfg, e.s.Conn, e.reg, testLog, e.clk.Now, nil)
		e.reportEach(t, upgraded(4)...)
		e.sweep(t, sw, "4/10")
		e.clk.Add(cfg.DriftRemediationTimeout + time.Minute)
		e.reportEach(t, upgraded(4)...)
		out := e.sweep(t, sw, "4/10 a day later")
		fatal := map[string]string{} // node -> fatal event's check
		for _, ev := range out.Events {
			if ev.IsFatal && ev.CheckName == CheckDriftTimeout {
				fatal[ev.NodeName] = ev.EntitiesImpacted[0].EntityValue
			}
		}
		if len(kinds(out.Actions)[events.KindEscalate]) != 4 || len(fatal) != 4 {
			t.Fatalf("4/10 a day later: actions %v, events %v, want 4 escalations", out.Actions, out.Events)
		}
		e.clk.Add(time.Hour)
		e.reportEach(t, upgraded(6)...)
		out = e.sweep(t, sw, "6/10")
		lifted := map[string]bool{}
		for _, ev := range out.Events {
			if ev.CheckName != CheckDriftTimeout || ev.IsFatal || !ev.IsHealthy {
				t.Errorf("6/10: event %v, want only healthy %s", ev, CheckDriftTimeout)
				continue
			}
			if entity, ok := fatal[ev.NodeName]; !ok || len(ev.EntitiesImpacted) != 1 || ev.EntitiesImpacted[0].EntityValue != entity {
				t.Errorf("6/10: healthy event of %s (%v) matches no fatal one", ev.NodeName, ev.EntitiesImpacted)
			}
			lifted[ev.NodeName] = true
		}
		if len(lifted) != 4 {
			t.Fatalf("6/10: lifted %v, want the 4 escalated nodes", lifted)
		}
		for _, a := range kinds(out.Actions)[events.KindConformanceRestored] {
			if !strings.Contains(a.Reason, "quarantine lifted") {
				t.Errorf("restored %s: %q, want the quarantine lifted", a.Node, a.Reason)
			}
		}
		if k := kinds(out.Actions); len(k[events.KindConformanceRestored]) != 4 || len(k[events.KindConformanceDrift]) != 4 {
			t.Fatalf("6/10: actions %v, want 4 restored and the 4 not upgraded drifted", out.Actions)
		}
	})
}

// TestOtherHardwareIsAnotherGroup: 10 GPU nodes without a pool label, 3
// of another server model (another nvidia.com/gpu.product, and so another
// BIOS and NIC firmware): two groups by default, nobody drifted. They
// were one group: the 3 drifted from the 7, were tainted, and were
// escalated (cordon + drain) a day later, healthy nodes all. With
// hardware_labels empty the pool alone groups them again.
func TestOtherHardwareIsAnotherGroup(t *testing.T) {
	ctx := context.Background()
	e := startFake(t, false)
	e.nodes(t, 10)
	for i := 1; i <= 10; i++ {
		name := fmt.Sprintf("%s-n%d", e.cluster, i)
		n := e.get(t, name)
		c := comps("")
		n.Labels = map[string]string{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
		if i > 7 {
			n.Labels["nvidia.com/gpu.product"] = "NVIDIA-H200"
			c["bios_version"], c["nic_firmware"] = "3.0.2", "28.41.1000"
		}
		if _, err := e.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		store(t, e.h, record(t, e.cluster, name, c, e.clk.Now()))
	}
	for _, tc := range []struct {
		name   string
		labels []string
		drifts int
	}{
		{"default", DefaultConfig().HardwareLabels, 0},
		{"by pool alone", nil, 3},
	} {
		cfg := DefaultConfig()
		cfg.HardwareLabels = tc.labels
		if err := cfg.Validate("conformance."); err != nil {
			t.Fatal(err)
		}
		// Dry-run: decided, nothing written to the nodes between cases.
		e.reg.SetClient(e.cluster, e.kube, true)
		sw := NewSweeper(cfg, e.s.Conn, e.reg, testLog, e.clk.Now, nil)
		out := e.sweep(t, sw, tc.name)
		drifts := kinds(out.Actions)[events.KindConformanceDrift]
		if len(drifts) != tc.drifts {
			t.Fatalf("%s: drifts %v, want %d", tc.name, drifts, tc.drifts)
		}
		if tc.drifts == 0 {
			continue
		}
		if g := drifts[0].Details[events.DetailConformanceGroup]; g != e.cluster {
			t.Errorf("%s: group %q, want %q", tc.name, g, e.cluster)
		}
	}
}

// TestGFDProductSuffixIsSameHardware: GPU Feature Discovery writes
// nvidia.com/gpu.product as "<product>-SHARED" on a time-sliced or MPS
// node and "<product>-MIG-<profile>" on a MIG node (single strategy), on
// the same hardware. Such a node was a hardware group of one, its own
// majority: its drift was never caught. Now it groups with its model, and
// a node alone of its model is logged as not judged, once per sweep.
func TestGFDProductSuffixIsSameHardware(t *testing.T) {
	ctx := context.Background()
	for _, product := range []string{"NVIDIA-H100-80GB-HBM3-SHARED", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb-SHARED"} {
		t.Run(product, func(t *testing.T) {
			e := startFake(t, true)
			node := e.nodes(t, 5)
			for i := 1; i <= 5; i++ {
				name := fmt.Sprintf("%s-n%d", e.cluster, i)
				n := e.get(t, name)
				n.Labels = map[string]string{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
				if name == node {
					n.Labels["nvidia.com/gpu.product"] = product
				}
				if _, err := e.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			e.report(t, 5, "28.41.1000")
			sw := NewSweeper(testConfig(), e.s.Conn, e.reg, testLog, e.clk.Now, nil)
			drifts := kinds(e.sweep(t, sw, product).Actions)[events.KindConformanceDrift]
			if len(drifts) != 1 || drifts[0].Node != node {
				t.Fatalf("drifts %v, want %s's", drifts, node)
			}
		})
	}
	t.Run("a model alone is logged", func(t *testing.T) {
		e := startFake(t, true)
		node := e.nodes(t, 5)
		for i := 1; i <= 5; i++ {
			name := fmt.Sprintf("%s-n%d", e.cluster, i)
			n := e.get(t, name)
			n.Labels = map[string]string{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
			if name == node {
				n.Labels["nvidia.com/gpu.product"] = "NVIDIA-H200"
			}
			if _, err := e.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		e.report(t, 5, "")
		var logs bytes.Buffer
		sw := NewSweeper(testConfig(), e.s.Conn, e.reg, slog.New(slog.NewTextHandler(&logs, nil)), e.clk.Now, nil)
		e.sweep(t, sw, "alone")
		if got := strings.Count(logs.String(), "hardware groups of one not judged"); got != 1 || !strings.Contains(logs.String(), "NVIDIA-H200") {
			t.Fatalf("%d logs of hardware groups of one, want 1 naming NVIDIA-H200:\n%s", got, logs.String())
		}
	})
}

// TestQuarantineKeptWhenPeersGoPartial: 3 nodes, n3 drifted and escalated
// a day later; n1 and n2 then send partial reports (the driver unreadable
// after a reboot). n3's fingerprint is that of the one complete report,
// its own, not of a majority of the 3: the group is undecided, so the
// timeout's quarantine, its taint and its drift state (the start) stay.
// It was lifted, and when
// the peers read everything again n3 drifted with a new start, not
// escalated for another day.
func TestQuarantineKeptWhenPeersGoPartial(t *testing.T) {
	e := startFake(t, false)
	node := e.nodes(t, 3)
	cfg := testConfig()
	sw := NewSweeper(cfg, e.s.Conn, e.reg, testLog, e.clk.Now, nil)
	e.report(t, 3, "28.41.1000")
	e.sweep(t, sw, "drift")
	e.clk.Add(cfg.DriftRemediationTimeout + time.Minute)
	e.report(t, 3, "28.41.1000")
	if out := e.sweep(t, sw, "a day later"); len(kinds(out.Actions)[events.KindEscalate]) != 1 {
		t.Fatalf("a day later: actions %v, want %s escalated", out.Actions, node)
	}
	e.clk.Add(time.Hour)
	for i := 1; i <= 2; i++ {
		store(t, e.h, record(t, e.cluster, fmt.Sprintf("%s-n%d", e.cluster, i), unreadDriver(comps("")), e.clk.Now()))
	}
	store(t, e.h, record(t, e.cluster, node, comps("28.41.1000"), e.clk.Now()))
	before := e.get(t, node).Annotations[AnnotationState]
	out := e.sweep(t, sw, "peers partial")
	for _, ev := range out.Events {
		if ev.NodeName == node && ev.CheckName == CheckDriftTimeout && ev.IsHealthy {
			t.Fatalf("peers partial: %s's timeout quarantine lifted (%s)", node, ev.Message)
		}
	}
	if restored := kinds(out.Actions)[events.KindConformanceRestored]; len(restored) != 0 {
		t.Fatalf("peers partial: restored %v, want %s's quarantine kept", restored, node)
	}
	if n := e.get(t, node); hasTaint(n) == nil || n.Annotations[AnnotationState] != before {
		t.Fatalf("peers partial: taint %v, state %q, want both kept (%q)", hasTaint(n), n.Annotations[AnnotationState], before)
	}
}

// TestFlipWithAPeerRebootingLiftsLater: a pool of 10 upgraded a node at a
// time, the first 4 escalated. At 5 of 9 complete reports (one node
// rebooting, partial) the group is undecided (5 of 10 is no majority), so
// nothing is cleared. At 6/10 their quarantine is lifted. Their state was
// cleared at 5/9, and at 6/10 nothing lifted it: drained for good.
func TestFlipWithAPeerRebootingLiftsLater(t *testing.T) {
	cfg := testConfig()
	e := startFake(t, false)
	e.nodes(t, 10)
	sw := NewSweeper(cfg, e.s.Conn, e.reg, testLog, e.clk.Now, nil)
	e.reportEach(t, upgraded(4)...)
	e.sweep(t, sw, "4/10")
	e.clk.Add(cfg.DriftRemediationTimeout + time.Minute)
	e.reportEach(t, upgraded(4)...)
	if out := e.sweep(t, sw, "4/10 a day later"); len(kinds(out.Actions)[events.KindEscalate]) != 4 {
		t.Fatalf("4/10 a day later: actions %v, want 4 escalations", out.Actions)
	}
	e.clk.Add(time.Hour)
	e.reportEach(t, upgraded(5)[:9]...)
	store(t, e.h, record(t, e.cluster, e.cluster+"-n10", unreadDriver(comps("")), e.clk.Now()))
	out := e.sweep(t, sw, "5 of 9 complete")
	if restored := kinds(out.Actions)[events.KindConformanceRestored]; len(restored) != 0 {
		t.Fatalf("5 of 9 complete: restored %v, want none (not firm)", restored)
	}
	for i := 1; i <= 4; i++ {
		if n := e.get(t, fmt.Sprintf("%s-n%d", e.cluster, i)); hasTaint(n) == nil || !strings.Contains(n.Annotations[AnnotationState], `"escalated":true`) {
			t.Fatalf("5 of 9 complete: %s taint %v, state %q, want both kept", n.Name, hasTaint(n), n.Annotations[AnnotationState])
		}
	}
	e.clk.Add(time.Hour)
	e.reportEach(t, upgraded(6)...)
	out = e.sweep(t, sw, "6/10")
	lifted := map[string]bool{}
	for _, ev := range out.Events {
		if ev.CheckName == CheckDriftTimeout && ev.IsHealthy {
			lifted[ev.NodeName] = true
		}
	}
	if len(lifted) != 4 {
		t.Fatalf("6/10: lifted %v, want the 4 escalated nodes", lifted)
	}
}

// TestStragglerDecidesNothing: 10 sensitive nodes, 9 rebooted into a new
// image report partial (the GPU driver not loaded yet), the one not
// rebooted reports complete on the old one. It was the majority (1 of 1):
// the 9 drifted in their kernel and were drained, then the majority
// flipped, the straggler was drained and the 9 awaited an approval each.
// Now nothing is decided until more than half of the 10 agree; then the
// straggler alone drifts.
func TestStragglerDecidesNothing(t *testing.T) {
	ctx := context.Background()
	e := startFake(t, false)
	e.nodes(t, 10)
	for i := 1; i <= 10; i++ {
		n := e.get(t, fmt.Sprintf("%s-n%d", e.cluster, i))
		n.Labels = map[string]string{"faultline.io/sensitive": "true"}
		if _, err := e.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var logs bytes.Buffer
	sw := NewSweeper(testConfig(), e.s.Conn, e.reg, slog.New(slog.NewTextHandler(&logs, nil)), e.clk.Now, nil)
	newImage := func() map[string]string {
		c := comps("")
		c["kernel"] = "6.8.0-50-generic"
		return c
	}
	straggler := e.cluster + "-n1"
	store(t, e.h, record(t, e.cluster, straggler, comps(""), e.clk.Now()))
	for i := 2; i <= 10; i++ {
		store(t, e.h, record(t, e.cluster, fmt.Sprintf("%s-n%d", e.cluster, i), unreadDriver(newImage()), e.clk.Now()))
	}
	if out := e.sweep(t, sw, "9 partial"); len(out.Actions) != 0 || len(out.Events) != 0 {
		t.Fatalf("9 partial, 1 complete: actions %v, events %v, want none", out.Actions, out.Events)
	}
	// The operator is told the pool is not judged, and why: once per
	// sweep, naming the group and how many of its nodes reported complete.
	const undecidedLog = "groups undecided: too few fresh complete reports"
	want := fmt.Sprintf("groups=1 first=\"%s (1/10 complete, 9 partial)\"", e.cluster)
	if got := strings.Count(logs.String(), undecidedLog); got != 1 || !strings.Contains(logs.String(), want) {
		t.Fatalf("%d logs of groups undecided for missing reports, want 1 with %s:\n%s", got, want, logs.String())
	}
	logs.Reset()
	e.clk.Add(5 * time.Minute)
	for i := 2; i <= 10; i++ {
		store(t, e.h, record(t, e.cluster, fmt.Sprintf("%s-n%d", e.cluster, i), newImage(), e.clk.Now()))
	}
	out := e.sweep(t, sw, "9 complete")
	k := kinds(out.Actions)
	if len(k[events.KindConformanceDrift]) != 1 || k[events.KindConformanceDrift][0].Node != straggler ||
		len(k[events.KindConformanceDrain]) != 1 || len(k[events.KindConformanceUndrain]) != 0 {
		t.Fatalf("9 complete: actions %v, want the straggler %s drifted and drained, nobody awaiting approval", out.Actions, straggler)
	}
	if strings.Contains(logs.String(), undecidedLog) {
		t.Fatalf("decided group logged as undecided:\n%s", logs.String())
	}
}

// TestTieWithPeersNotReportingEscalates: 3 nodes, n3 drifted; n1 then
// reports partial, or stops reporting: a 1/1 tie of n2 and n3, no
// expected fingerprint. n3 is escalated at drift_remediation_timeout, as
// a node that cannot be judged; it kept its taint for ever, never
// escalated (only a tie of members all reporting complete, a rolling
// upgrade at 5/5, escalates nobody: TestRollingUpgrade).
func TestTieWithPeersNotReportingEscalates(t *testing.T) {
	cfg := testConfig()
	for _, tc := range []struct {
		name string
		n1   map[string]string // nil: no report
	}{
		{"n1 partial", unreadDriver(comps(""))},
		{"n1 stopped reporting", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startFake(t, false)
			node := e.nodes(t, 3)
			sw := NewSweeper(cfg, e.s.Conn, e.reg, testLog, e.clk.Now, nil)
			e.report(t, 3, "28.41.1000")
			e.sweep(t, sw, "drift")
			e.clk.Add(cfg.DriftRemediationTimeout + time.Minute)
			if tc.n1 != nil {
				store(t, e.h, record(t, e.cluster, e.cluster+"-n1", tc.n1, e.clk.Now()))
			}
			store(t, e.h, record(t, e.cluster, e.cluster+"-n2", comps(""), e.clk.Now()))
			store(t, e.h, record(t, e.cluster, node, comps("28.41.1000"), e.clk.Now()))
			out := e.sweep(t, sw, "tie")
			esc := kinds(out.Actions)[events.KindEscalate]
			if len(esc) != 1 || esc[0].Node != node || len(out.Events) != 1 || out.Events[0].CheckName != CheckDriftTimeout || !out.Events[0].IsFatal {
				t.Fatalf("tie past the timeout: actions %v, events %v, want %s escalated", out.Actions, out.Events, node)
			}
		})
	}
}

// TestMissingHardwareLabelIsUndecided: a drifted node of a pool whose
// nodes carry nvidia.com/gpu.product and an instance type loses its GPU
// Feature Discovery label (its pod down): it is judged against nobody, its
// drift kept. It was a group of its own, its own majority: conforming,
// its taint removed, drift silently undetected.
func TestMissingHardwareLabelIsUndecided(t *testing.T) {
	ctx := context.Background()
	e := startFake(t, false)
	node := e.nodes(t, 4)
	label := func(name string, labels map[string]string) {
		n := e.get(t, name)
		n.Labels = labels
		if _, err := e.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 4; i++ {
		label(fmt.Sprintf("%s-n%d", e.cluster, i), map[string]string{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "node.kubernetes.io/instance-type": "p5.48xlarge"})
	}
	var logs bytes.Buffer
	sw := NewSweeper(testConfig(), e.s.Conn, e.reg, slog.New(slog.NewTextHandler(&logs, nil)), e.clk.Now, nil)
	e.report(t, 4, "28.41.1000")
	if out := e.sweep(t, sw, "drift"); len(kinds(out.Actions)[events.KindConformanceDrift]) != 1 {
		t.Fatalf("drift: actions %v", out.Actions)
	}
	n := e.get(t, node)
	delete(n.Labels, "nvidia.com/gpu.product")
	if _, err := e.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.clk.Add(time.Minute)
	e.report(t, 4, "28.41.1000")
	if out := e.sweep(t, sw, "label gone"); len(out.Actions) != 0 || len(out.Events) != 0 {
		t.Fatalf("label gone: actions %v, events %v, want none", out.Actions, out.Events)
	}
	if hasTaint(e.get(t, node)) == nil {
		t.Fatalf("label gone: %s's drift taint removed", node)
	}
	// The operator is told why the node is not judged, once for its group.
	if got := strings.Count(logs.String(), "nodes not judged"); got != 1 || !strings.Contains(logs.String(), "nodes=1 missing_labels=nvidia.com/gpu.product") {
		t.Fatalf("label gone: %d not-judged logs, want 1 naming nvidia.com/gpu.product:\n%s", got, logs.String())
	}
}

// TestTooFewReports: a group is listed as undecided for want of reports
// only when its nodes without a fresh complete report could make a
// majority; a tie of nodes all reporting, or a split they cannot end, is
// not.
func TestTooFewReports(t *testing.T) {
	for _, tc := range []struct {
		name string
		t    tally
		want bool
	}{
		{"straggler, 9 partial", tally{members: 10, complete: 1, partial: 9, agree: map[string]int{"a": 1}}, true},
		{"all silent", tally{members: 3, agree: map[string]int{}}, true},
		{"tie, all complete", tally{members: 10, complete: 10, agree: map[string]int{"a": 5, "b": 5}}, false},
		{"split one silent cannot end", tally{members: 10, complete: 9, agree: map[string]int{"a": 4, "b": 4, "c": 1}}, false},
		{"split one silent ends", tally{members: 10, complete: 9, agree: map[string]int{"a": 5, "b": 4}}, true},
	} {
		if got := tc.t.tooFewReports(); got != tc.want {
			t.Errorf("%s: tooFewReports = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestAwaitingApprovalNotEscalated: a sensitive node drifts, is
// remediated and reports the expected fingerprint (an hour later: it
// awaits an operator's approval); at 5h its peers reboot and report
// partial, or it does itself: the group is undecided, or its report
// differs only in unreadable components. It is not escalated: it was
// remediated and waits for the operator, not for remediation. It was:
// a fatal CONTACT_SUPPORT event past the 4h sensitive timeout, and
// after the approval that quarantine stayed. Silent past staleness it is
// escalated: its approval needs a fresh conforming report.
func TestAwaitingApprovalNotEscalated(t *testing.T) {
	for _, tc := range []struct {
		name      string
		at5h      func(e *fakeEnv, node string)
		escalated bool
	}{
		{"peers partial", func(e *fakeEnv, node string) {
			for i := 1; i <= 2; i++ {
				store(t, e.h, record(t, e.cluster, fmt.Sprintf("%s-n%d", e.cluster, i), unreadDriver(comps("")), e.clk.Now()))
			}
			store(t, e.h, record(t, e.cluster, e.cluster+"-n3", comps(""), e.clk.Now()))
			store(t, e.h, record(t, e.cluster, node, comps(""), e.clk.Now()))
		}, false},
		{"itself partial", func(e *fakeEnv, node string) {
			e.report(t, 3, "")
			store(t, e.h, record(t, e.cluster, node, unreadDriver(comps("")), e.clk.Now()))
		}, false},
		{"it stopped reporting", func(e *fakeEnv, node string) {
			e.clk.Add(testConfig().Staleness)
			e.report(t, 3, "")
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			e := startFake(t, false)
			node := e.nodes(t, 4)
			n := e.get(t, node)
			n.Labels = map[string]string{"faultline.io/sensitive": "true"}
			if _, err := e.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			cfg := testConfig()
			sw := NewSweeper(cfg, e.s.Conn, e.reg, testLog, e.clk.Now, nil)
			e.report(t, 4, "28.41.1000")
			if k := kinds(e.sweep(t, sw, "drift").Actions); len(k[events.KindConformanceDrain]) != 1 {
				t.Fatalf("drift: actions %v, want %s drained", k, node)
			}
			e.clk.Add(time.Hour)
			e.report(t, 4, "")
			if k := kinds(e.sweep(t, sw, "remediated").Actions); len(k[events.KindConformanceUndrain]) != 1 {
				t.Fatalf("remediated: actions %v, want %s awaiting approval", k, node)
			}
			e.clk.Add(cfg.SensitiveTimeout)
			tc.at5h(e, node)
			out := e.sweep(t, sw, "5h")
			if esc := kinds(out.Actions)[events.KindEscalate]; (len(esc) == 1 && len(out.Events) == 1) != tc.escalated {
				t.Fatalf("5h: actions %v, events %v, want %s escalated %v", out.Actions, out.Events, node, tc.escalated)
			}
			if st, _ := sw.readState(e.cluster, member{node: e.get(t, node), name: node}, true); st.Escalated != tc.escalated {
				t.Fatalf("5h: state %+v, want escalated %v", st, tc.escalated)
			}
		})
	}
}
