package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	agentconf "github.com/faultline/faultline/agents/conformance"
	"github.com/faultline/faultline/internal/clickhouse/chtest"
	ic "github.com/faultline/faultline/internal/conformance"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/quarantine"
	storerole "github.com/faultline/faultline/processors/store"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

var testLog = slog.New(slog.NewTextHandler(io.Discard, nil))

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

var seq atomic.Int64

func uniq(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e6, seq.Add(1))
}

// comps is a component set; variant changes the NIC firmware.
func comps(variant string) map[string]string {
	c := map[string]string{"gpu_driver": "550.54.14", "nic_firmware": "28.39.1002", "kernel": "6.8.0-45-generic", "bios_version": "2.1.5"}
	if variant != "" {
		c["nic_firmware"] = variant
	}
	return c
}

// unreadDriver is c with the GPU driver version unread (the module not
// loaded yet after a reboot).
func unreadDriver(c map[string]string) map[string]string {
	c["gpu_driver"] = agentconf.Unreadable + "open /host/sys/module/nvidia/version: no such file or directory"
	return c
}

// record is the events-topic record of a node's NodeConformance report.
func record(t testing.TB, cluster, node string, c map[string]string, at time.Time) *kgo.Record {
	t.Helper()
	ev := agentconf.Event(c)
	ev.Id = events.NewID()
	ev.Cluster, ev.NodeName = cluster, node
	ev.GeneratedTimestamp, ev.ReceivedTimestamp = timestamppb.New(at), timestamppb.New(at)
	b, err := events.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	return &kgo.Record{Topic: events.TopicEvents, Key: events.Key(cluster, node), Value: b}
}

func store(t testing.TB, h *Handler, recs ...*kgo.Record) {
	t.Helper()
	res, err := h.Handle(context.Background(), recs)
	if err != nil || len(res.Dead) > 0 {
		t.Fatalf("Handle: %v, dead %v", err, res.Dead)
	}
}

func server(t *testing.T) *chtest.Server {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a real ClickHouse server")
	}
	return chtest.Start(t)
}

func testConfig() Config {
	c := DefaultConfig()
	if err := c.Validate("conformance."); err != nil {
		panic(err)
	}
	return c
}

func kinds(acts []*faultlinev1.Action) map[string][]*faultlinev1.Action {
	m := map[string][]*faultlinev1.Action{}
	for _, a := range acts {
		m[a.Kind] = append(m[a.Kind], a)
	}
	return m
}

func TestHandlerDeadLettersBadFingerprint(t *testing.T) {
	h := NewHandler(nil, testLog, nil)
	ev := agentconf.Event(comps(""))
	ev.Cluster, ev.NodeName = "c", "n1"
	ev.Metadata[agentconf.MetaFingerprint] = "not-a-hash"
	b, _ := events.Marshal(ev)
	other := &datamodels.HealthEvent{CheckName: "GpuMemWatch", Cluster: "c", NodeName: "n1"}
	ob, _ := events.Marshal(other)
	res, err := h.Handle(context.Background(), []*kgo.Record{
		{Topic: events.TopicEvents, Key: events.Key("c", "n1"), Value: b},
		{Topic: events.TopicEvents, Key: events.Key("c", "n1"), Value: ob},
	})
	if err != nil || len(res.Dead) != 1 || !strings.Contains(res.Dead[0].Reason.Error(), "metadata.fingerprint") {
		t.Fatalf("Handle = %v, dead %v", err, res.Dead)
	}
}

// TestGroupsOnClickHouse: reports stored through the handler in a real
// ClickHouse; the majority decides a group without a baseline, a baseline
// overrides it, a stale report is unknown; a cluster without a client is
// decided in dry-run, each decision once.
func TestGroupsOnClickHouse(t *testing.T) {
	s := server(t)
	clk := &clock{t: time.Now().UTC().Truncate(time.Second)}
	h := NewHandler(s.Conn, testLog, clk.Now)
	ctx := context.Background()
	// storeAndSweep stores the reports and sweeps cluster c once.
	storeAndSweep := func(t *testing.T, c string, recs ...*kgo.Record) Output {
		t.Helper()
		store(t, h, recs...)
		sw := NewSweeper(testConfig(), s.Conn, clusters.NewRegistry(clusters.DefaultConfig(), nil), testLog, clk.Now, nil)
		out, err := sw.Sweep(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	t.Run("majority", func(t *testing.T) {
		c := uniq("maj")
		var recs []*kgo.Record
		for i := 1; i <= 3; i++ {
			recs = append(recs, record(t, c, fmt.Sprintf("n%d", i), comps(""), clk.Now().Add(-time.Minute)))
		}
		recs = append(recs, record(t, c, "n4", comps("28.41.1000"), clk.Now().Add(-time.Minute)))
		store(t, h, recs...)
		sw := NewSweeper(testConfig(), s.Conn, clusters.NewRegistry(clusters.DefaultConfig(), nil), testLog, clk.Now, nil)
		out, err := sw.Sweep(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		k := kinds(out.Actions)
		if len(out.Actions) != 1 || len(k[events.KindConformanceDrift]) != 1 {
			t.Fatalf("actions %v", out.Actions)
		}
		a := k[events.KindConformanceDrift][0]
		if a.Node != "n4" || a.Outcome != events.OutcomeDryRun || a.Details[events.DetailBasis] != ic.BasisMajority ||
			a.Details[events.DetailExpected] != agentconf.Fingerprint(comps("")) ||
			a.Details[events.DetailDiffering] != `nic_firmware: expected "28.39.1002", actual "28.41.1000"` {
			t.Fatalf("drift action %+v", a)
		}
		if out, _ := sw.Sweep(ctx, c); len(out.Actions) != 0 {
			t.Fatalf("second sweep repeated %v", out.Actions)
		}
		// n4 conforms again: restored.
		store(t, h, record(t, c, "n4", comps(""), clk.Now()))
		out, _ = sw.Sweep(ctx, c)
		if k := kinds(out.Actions); len(out.Actions) != 1 || len(k[events.KindConformanceRestored]) != 1 {
			t.Fatalf("after conform: %v", out.Actions)
		}
	})

	// A component the node could not read (a driver not loaded yet after a
	// reboot, a BMC tool that timed out) is no drift: that one report
	// tainted the node, and drained a sensitive one. An unreadable
	// component beside a real difference is still drift.
	t.Run("unreadable only is not drift", func(t *testing.T) {
		c := uniq("unread")
		unread := unreadDriver(comps(""))
		both := unreadDriver(comps("28.41.1000"))
		var recs []*kgo.Record
		for i := 1; i <= 3; i++ {
			recs = append(recs, record(t, c, fmt.Sprintf("n%d", i), comps(""), clk.Now()))
		}
		recs = append(recs, record(t, c, "n4", unread, clk.Now()), record(t, c, "n5", both, clk.Now()))
		out := storeAndSweep(t, c, recs...)
		drift := kinds(out.Actions)[events.KindConformanceDrift]
		if len(out.Actions) != 1 || len(drift) != 1 || drift[0].Node != "n5" {
			t.Fatalf("actions %v; want n5's drift only (n4 differs only by what it could not read)", out.Actions)
		}
	})

	// Reports with unreadable components vote for no fingerprint (the
	// unreadable one is never expected): a real drift beside them is
	// reported once more than half of all the members agree (4 of 7).
	// With fewer (2 of 5) the group is undecided: the few complete
	// reports decided it, a straggler on the old image drifting every
	// rebooted node.
	t.Run("unreadable reports do not vote", func(t *testing.T) {
		for _, tc := range []struct {
			agree int
			drift []string
		}{{4, []string{"n5"}}, {2, nil}} {
			c := uniq("unvote")
			unread := unreadDriver(comps(""))
			var recs []*kgo.Record
			for i := 1; i <= tc.agree; i++ {
				recs = append(recs, record(t, c, fmt.Sprintf("n%d", i), comps(""), clk.Now()))
			}
			recs = append(recs, record(t, c, fmt.Sprintf("n%d", tc.agree+1), comps("28.41.1000"), clk.Now()))
			for i := tc.agree + 2; i <= tc.agree+3; i++ {
				recs = append(recs, record(t, c, fmt.Sprintf("n%d", i), unread, clk.Now()))
			}
			out := storeAndSweep(t, c, recs...)
			var drifted []string
			for _, a := range kinds(out.Actions)[events.KindConformanceDrift] {
				if a.Details[events.DetailBasis] != ic.BasisMajority {
					t.Errorf("%d agree: %s's basis %q", tc.agree, a.Node, a.Details[events.DetailBasis])
				}
				drifted = append(drifted, a.Node)
			}
			if len(out.Actions) != len(tc.drift) || fmt.Sprint(drifted) != fmt.Sprint(tc.drift) {
				t.Fatalf("%d agree: actions %v; want the drifts of %v", tc.agree, out.Actions, tc.drift)
			}
		}
	})

	t.Run("no majority is undecided", func(t *testing.T) {
		c := uniq("tie")
		store(t, h, record(t, c, "a", comps(""), clk.Now()), record(t, c, "b", comps("x"), clk.Now()))
		sw := NewSweeper(testConfig(), s.Conn, clusters.NewRegistry(clusters.DefaultConfig(), nil), testLog, clk.Now, nil)
		if out, err := sw.Sweep(ctx, c); err != nil || len(out.Actions) != 0 {
			t.Fatalf("tie: %v %v", out.Actions, err)
		}
	})

	t.Run("baseline", func(t *testing.T) {
		c := uniq("base")
		var recs []*kgo.Record
		for i := 1; i <= 3; i++ {
			recs = append(recs, record(t, c, fmt.Sprintf("n%d", i), comps(""), clk.Now()))
		}
		recs = append(recs, record(t, c, "n4", comps("28.41.1000"), clk.Now()))
		store(t, h, recs...)
		cfg := DefaultConfig()
		cfg.Baselines = []Baseline{{Cluster: c, Fingerprint: agentconf.Fingerprint(comps("28.41.1000"))}}
		if err := cfg.Validate("conformance."); err != nil {
			t.Fatal(err)
		}
		sw := NewSweeper(cfg, s.Conn, clusters.NewRegistry(clusters.DefaultConfig(), nil), testLog, clk.Now, nil)
		out, _ := sw.Sweep(ctx, c)
		drift := kinds(out.Actions)[events.KindConformanceDrift]
		if len(drift) != 3 {
			t.Fatalf("baseline: %d drifted, want the 3 majority nodes: %v", len(drift), out.Actions)
		}
		for _, a := range drift {
			if a.Node == "n4" || a.Details[events.DetailBasis] != ic.BasisBaseline {
				t.Fatalf("baseline drift %+v", a)
			}
		}
	})

	t.Run("stale is unknown", func(t *testing.T) {
		c := uniq("stale")
		cfg := testConfig()
		store(t, h, record(t, c, "fresh1", comps(""), clk.Now()), record(t, c, "fresh2", comps(""), clk.Now()),
			record(t, c, "old", comps("other"), clk.Now().Add(-cfg.Staleness-time.Minute)))
		latest, err := ic.Latest(ctx, s.Conn, c, clk.Now().Add(-cfg.Staleness), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := latest["old"]; ok || len(latest) != 2 {
			t.Fatalf("latest %v", latest)
		}
		sc := ic.ComputeScore([]string{"fresh1", "fresh2", "old", "never"}, latest)
		if sc.F9 != 0.5 || len(sc.Groups) != 3 || sc.Groups[1].Fingerprint != ic.Unknown || sc.Groups[2].Fingerprint != ic.Unknown {
			t.Fatalf("score %+v", sc)
		}
		sw := NewSweeper(cfg, s.Conn, clusters.NewRegistry(clusters.DefaultConfig(), nil), testLog, clk.Now, nil)
		if out, _ := sw.Sweep(ctx, c); len(out.Actions) != 0 {
			t.Fatalf("a stale node was decided: %v", out.Actions)
		}
	})

	t.Run("latest report wins", func(t *testing.T) {
		c := uniq("latest")
		store(t, h, record(t, c, "n", comps("new"), clk.Now()), record(t, c, "n", comps(""), clk.Now().Add(-time.Hour)))
		latest, _ := ic.Latest(ctx, s.Conn, c, clk.Now().Add(-2*time.Hour), []string{"n", "absent"})
		if latest["n"].Fingerprint != agentconf.Fingerprint(comps("new")) || len(latest) != 1 {
			t.Fatalf("latest %v", latest)
		}
	})

	// A restart reads the dry-run state back from the audit trail: the drift
	// is not recorded again, its timeout counts from the drift (not from the
	// restart), the escalation is recorded once, and a return to
	// conformance ends it.
	t.Run("dry-run state survives a restart", func(t *testing.T) {
		c := uniq("restart")
		rc := &clock{t: clk.Now()}
		rh := NewHandler(s.Conn, testLog, rc.Now)
		report := func(n4 string) {
			t.Helper()
			var recs []*kgo.Record
			for i := 1; i <= 3; i++ {
				recs = append(recs, record(t, c, fmt.Sprintf("n%d", i), comps(""), rc.Now()))
			}
			store(t, rh, append(recs, record(t, c, "n4", comps(n4), rc.Now()))...)
		}
		audit := storerole.New(s.Conn, testLog, nil) // the store role: actions into ClickHouse
		restart := func(step string) (Output, *Sweeper) {
			t.Helper()
			sw := NewSweeper(testConfig(), s.Conn, clusters.NewRegistry(clusters.DefaultConfig(), nil), testLog, rc.Now, nil)
			out, err := sw.Sweep(ctx, c)
			if err != nil {
				t.Fatalf("%s: %v", step, err)
			}
			var recs []*kgo.Record
			for _, a := range out.Actions {
				b, err := events.MarshalAction(a)
				if err != nil {
					t.Fatal(err)
				}
				recs = append(recs, &kgo.Record{Topic: events.TopicActions, Key: events.Key(c, a.Node), Value: b, Timestamp: rc.Now()})
			}
			if res, err := audit.Handle(ctx, recs); err != nil || len(res.Dead) > 0 {
				t.Fatalf("%s: storing the actions: %v, dead %v", step, err, res.Dead)
			}
			return out, sw
		}
		want := func(step string, out Output, kind string) {
			t.Helper()
			if kind == "" && len(out.Actions) == 0 || len(out.Actions) == 1 && out.Actions[0].Kind == kind && out.Actions[0].Node == "n4" {
				return
			}
			t.Fatalf("%s: actions %v, want %q of n4", step, out.Actions, kind)
		}

		report("28.41.1000")
		out, _ := restart("first sweep")
		want("first sweep", out, events.KindConformanceDrift)
		since := out.Actions[0].Details[events.DetailDriftSince]

		rc.Add(12 * time.Hour)
		report("28.41.1000")
		out, _ = restart("restarted 12h later")
		want("restarted 12h later", out, "") // the drift is not recorded again

		rc.Add(12*time.Hour + time.Minute) // 24h01m after the drift: past drift_remediation_timeout
		report("28.41.1000")
		out, _ = restart("restarted past the timeout")
		want("restarted past the timeout", out, events.KindEscalate)
		if got := out.Actions[0].Details[events.DetailDriftSince]; got != since {
			t.Fatalf("escalated the drift since %s, want the first sweep's %s", got, since)
		}

		rc.Add(time.Hour)
		report("28.41.1000")
		out, _ = restart("restarted after the escalation")
		want("restarted after the escalation", out, "")

		rc.Add(time.Minute)
		report("")
		out, sw := restart("conforms again")
		want("conforms again", out, events.KindConformanceRestored)
		if out, _ := sw.Sweep(ctx, c); len(out.Actions) != 0 {
			t.Fatalf("restored twice: %v", out.Actions)
		}
		out, _ = restart("restarted after its return")
		want("restarted after its return", out, "")
	})
}

// kubeEnv is a real apiserver with a cluster "k" client and ClickHouse.
type kubeEnv struct {
	s    *chtest.Server
	kube kubernetes.Interface
	rest *rest.Config
	reg  *clusters.Registry
	h    *Handler
	clk  *clock
}

func startKube(t *testing.T) *kubeEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("needs real ClickHouse and kube-apiserver")
	}
	s := chtest.Start(t)
	k := testenv.StartKube(t, testenv.KubeOptions{})
	clk := &clock{t: time.Now().UTC().Truncate(time.Second)}
	return &kubeEnv{s: s, kube: k.Client(), rest: k.RESTConfig(), clk: clk, h: NewHandler(s.Conn, testLog, clk.Now)}
}

func (e *kubeEnv) node(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := e.kube.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// oneDrifted creates n nodes of cluster, <cluster>-n1…, each reporting
// the same components but the last, which reports firmware fw; it returns
// the last one's name. The nodes are in a pool named after the cluster:
// the apiserver is shared by a test's clusters, and every node listed is
// a member of its group (the others' nodes, reporting to no cluster of
// theirs, would leave it without a majority).
func (e *kubeEnv) oneDrifted(t *testing.T, cluster string, n int, fw string) string {
	t.Helper()
	var name string
	for i := 1; i <= n; i++ {
		name = fmt.Sprintf("%s-n%d", cluster, i)
		e.node(t, name, map[string]string{DefaultConfig().PoolLabel: cluster})
		c := comps("")
		if i == n {
			c = comps(fw)
		}
		store(t, e.h, record(t, cluster, name, c, e.clk.Now()))
	}
	return name
}

func (e *kubeEnv) get(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := e.kube.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func hasTaint(n *corev1.Node) *corev1.Taint {
	for _, t := range n.Spec.Taints {
		if t.Key == TaintDrift {
			return &t
		}
	}
	return nil
}

// TestDriftOnKube: on a real apiserver, a drifted node of pool "h100"
// gets the PreferNoSchedule taint, the group label and a Warning Event
// naming the differing component; a node of another pool is its own
// group; past the timeout (injected clock) a fatal CONTACT_SUPPORT event is
// produced once; when the node conforms again the taint and label go.
// Then the sensitive path: drained (fatal event) at once, 4h timeout,
// conforming is not enough: only the approval annotation lifts it.
func TestDriftOnKube(t *testing.T) {
	e := startKube(t)
	ctx := context.Background()
	cluster := uniq("k")
	reg := clusters.NewRegistry(clusters.DefaultConfig(), e.clk.Now)
	reg.SetClient(cluster, e.kube, false)
	pool := map[string]string{"faultline.io/node-pool": "h100"}
	for i := 1; i <= 4; i++ {
		e.node(t, fmt.Sprintf("%s-n%d", cluster, i), pool)
	}
	// A lone node of another pool, on other firmware: a group of its own,
	// its own majority.
	e.node(t, cluster+"-a100", map[string]string{"faultline.io/node-pool": "a100"})
	var recs []*kgo.Record
	for i := 1; i <= 3; i++ {
		recs = append(recs, record(t, cluster, fmt.Sprintf("%s-n%d", cluster, i), comps(""), e.clk.Now()))
	}
	drifted := cluster + "-n4"
	recs = append(recs, record(t, cluster, drifted, comps("28.41.1000"), e.clk.Now()), record(t, cluster, cluster+"-a100", comps("a100"), e.clk.Now()))
	store(t, e.h, recs...)
	sw := NewSweeper(testConfig(), e.s.Conn, reg, testLog, e.clk.Now, nil)

	out, err := sw.Sweep(ctx, cluster)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Actions) != 1 || out.Actions[0].Node != drifted || out.Actions[0].Outcome != events.OutcomeApplied || len(out.Events) != 0 {
		t.Fatalf("sweep: actions %v events %v", out.Actions, out.Events)
	}
	n := e.get(t, drifted)
	if tt := hasTaint(n); tt == nil || tt.Effect != corev1.TaintEffectPreferNoSchedule || tt.Value != "h100" || n.Labels[LabelGroup] != "h100" {
		t.Fatalf("drifted node: taints %v labels %v", n.Spec.Taints, n.Labels)
	}
	if n.Spec.Unschedulable {
		t.Fatal("a drifted (not sensitive) node was cordoned; running work must keep running")
	}
	evl, _ := e.kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + drifted})
	if len(evl.Items) != 1 || evl.Items[0].Reason != "ConformanceDrift" || !strings.Contains(evl.Items[0].Message, `nic_firmware: expected "28.39.1002", actual "28.41.1000"`) {
		t.Fatalf("node events %v", evl.Items)
	}
	if hasTaint(e.get(t, cluster+"-n1")) != nil || hasTaint(e.get(t, cluster+"-a100")) != nil {
		t.Fatal("a conforming node was tainted")
	}

	// 23h later, still drifted (a fresh report): nothing new. 24h: escalated once.
	e.clk.Add(23 * time.Hour)
	for i := 1; i <= 4; i++ {
		c := comps("")
		if i == 4 {
			c = comps("28.41.1000")
		}
		store(t, e.h, record(t, cluster, fmt.Sprintf("%s-n%d", cluster, i), c, e.clk.Now()))
	}
	if out, _ := sw.Sweep(ctx, cluster); len(out.Actions) != 0 {
		t.Fatalf("before the timeout: %v", out.Actions)
	}
	e.clk.Add(time.Hour)
	out, _ = sw.Sweep(ctx, cluster)
	if k := kinds(out.Actions); len(k[events.KindEscalate]) != 1 || len(out.Events) != 1 {
		t.Fatalf("timeout: actions %v events %v", out.Actions, out.Events)
	}
	fatal := out.Events[0]
	if fatal.CheckName != CheckDriftTimeout || !fatal.IsFatal || fatal.DerivedBy != Role || fatal.RecommendedAction != datamodels.RecommendedAction_CONTACT_SUPPORT || fatal.NodeName != drifted {
		t.Fatalf("fatal event %v", fatal)
	}
	if out, _ := sw.Sweep(ctx, cluster); len(out.Actions) != 0 || len(out.Events) != 0 {
		t.Fatalf("escalated twice: %v", out.Actions)
	}

	// Remediated: conforms again: taint, label, state removed.
	store(t, e.h, record(t, cluster, drifted, comps(""), e.clk.Now()))
	out, _ = sw.Sweep(ctx, cluster)
	if k := kinds(out.Actions); len(k[events.KindConformanceRestored]) != 1 {
		t.Fatalf("restore: %v", out.Actions)
	}
	n = e.get(t, drifted)
	if hasTaint(n) != nil || n.Labels[LabelGroup] != "" || n.Annotations[AnnotationState] != "" {
		t.Fatalf("restored node still has taints %v labels %v annotations %v", n.Spec.Taints, n.Labels, n.Annotations)
	}

	t.Run("dry run", func(t *testing.T) {
		dc := uniq("dry")
		dreg := clusters.NewRegistry(clusters.DefaultConfig(), e.clk.Now)
		dreg.SetClient(dc, e.kube, true)
		dryDrifted := e.oneDrifted(t, dc, 3, "dry")
		dsw := NewSweeper(testConfig(), e.s.Conn, dreg, testLog, e.clk.Now, nil)
		out, _ := dsw.Sweep(ctx, dc)
		if len(out.Actions) != 1 || out.Actions[0].Outcome != events.OutcomeDryRun || !out.Actions[0].DryRun || len(out.Events) != 0 {
			t.Fatalf("dry run: %v %v", out.Actions, out.Events)
		}
		if out, _ := dsw.Sweep(ctx, dc); len(out.Actions) != 0 {
			t.Fatalf("dry run repeated: %v", out.Actions)
		}
		if n := e.get(t, dryDrifted); hasTaint(n) != nil || n.Annotations[AnnotationState] != "" {
			t.Fatal("dry run changed the node")
		}
		// The drifted node deleted: its dry-run state is forgotten.
		dryNodes := func() int { dsw.mu.Lock(); defer dsw.mu.Unlock(); return len(dsw.dry[dc]) }
		if n := dryNodes(); n != 1 {
			t.Fatalf("%d nodes with dry-run state, want the drifted one", n)
		}
		if err := e.kube.CoreV1().Nodes().Delete(ctx, dryDrifted, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); dryNodes() != 0; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the deleted node's dry-run state is still kept after 5s of sweeps")
			}
			if _, err := dsw.Sweep(ctx, dc); err != nil { // lists at resourceVersion 0: the apiserver's cache
				t.Fatal(err)
			}
		}
	})

	// Notifications are level-triggered: a drift whose notice was queued
	// but not delivered when the role restarted is told by the next
	// process's first sweep; a return to conformance keeps the node's
	// state (Restoring, taint and label gone) until its notice is
	// delivered, across a restart too.
	t.Run("notices survive a restart", func(t *testing.T) {
		nc := uniq("nt")
		nreg := clusters.NewRegistry(clusters.DefaultConfig(), e.clk.Now)
		nreg.SetClient(nc, e.kube, false)
		drifted := e.oneDrifted(t, nc, 4, "nt")
		told := &recordingNotifier{}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		// A process whose notifier never ran (it stopped first), then the
		// next one, running.
		process := func(run bool) *Sweeper {
			cfg := testConfig()
			cfg.Notifier.Attempts = 1
			q := NewQueue(told, cfg.Notifier, testLog, func(Notification, int, error) {})
			if run {
				go q.Run(ctx)
			}
			return NewSweeper(cfg, e.s.Conn, nreg, testLog, e.clk.Now, q)
		}
		sweep := func(sw *Sweeper, want string) {
			t.Helper()
			out, err := sw.Sweep(ctx, nc)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, a := range out.Actions {
				got = append(got, a.Kind)
			}
			if strings.Join(got, ",") != want {
				t.Fatalf("actions %v, want %q", got, want)
			}
		}
		sweep(process(false), events.KindConformanceDrift)
		sw := process(true)
		sweep(sw, "") // nothing new to decide, the drift told again
		told.wait(t, drifted+" drifted")
		sweep(sw, "")
		e.clk.Add(time.Minute)
		store(t, e.h, record(t, nc, drifted, comps(""), e.clk.Now()))
		sweep(process(false), events.KindConformanceRestored)
		n := e.get(t, drifted)
		if hasTaint(n) != nil || n.Labels[LabelGroup] != "" || !strings.Contains(n.Annotations[AnnotationState], `"restoring":true`) {
			t.Fatalf("restored, not yet told: taints %v labels %v annotations %v", n.Spec.Taints, n.Labels, n.Annotations)
		}
		sw = process(true)
		sweep(sw, "")
		told.wait(t, drifted+" drifted", drifted+" restored")
		sweep(sw, "")
		if a := e.get(t, drifted).Annotations[AnnotationState]; a != "" {
			t.Fatalf("state kept after the return was told: %s", a)
		}
		// A notice whose every attempt failed is tried again 10 minutes
		// later, not at every sweep.
		told.mu.Lock()
		told.failNext = 1
		told.mu.Unlock()
		e.clk.Add(time.Minute)
		store(t, e.h, record(t, nc, drifted, comps("nt2"), e.clk.Now()))
		sweep(sw, events.KindConformanceDrift)
		told.wait(t, drifted+" drifted", drifted+" restored", "failed")
		sweep(sw, "")
		time.Sleep(200 * time.Millisecond) // a notice queued now would be delivered within it
		told.wait(t, drifted+" drifted", drifted+" restored", "failed")
		e.clk.Add(renotifyAfter)
		store(t, e.h, record(t, nc, drifted, comps("nt2"), e.clk.Now()))
		sweep(sw, "")
		told.wait(t, drifted+" drifted", drifted+" restored", "failed", drifted+" drifted")
	})

	t.Run("sensitive", func(t *testing.T) {
		sens := cluster + "-s1"
		labels := map[string]string{"faultline.io/node-pool": "h100", "faultline.io/sensitive": "true"}
		e.node(t, sens, labels)
		store(t, e.h, record(t, cluster, sens, comps("evil"), e.clk.Now()))
		out, _ := sw.Sweep(ctx, cluster)
		k := kinds(out.Actions)
		if len(k[events.KindConformanceDrift]) != 1 || len(k[events.KindConformanceDrain]) != 1 || len(out.Events) != 1 ||
			out.Events[0].CheckName != CheckDriftSensitive || !out.Events[0].IsFatal {
			t.Fatalf("sensitive drift: actions %v events %v", out.Actions, out.Events)
		}
		// 4h timeout.
		e.clk.Add(4 * time.Hour)
		for _, node := range []string{"n1", "n2", "n3", "n4"} {
			store(t, e.h, record(t, cluster, cluster+"-"+node, comps(""), e.clk.Now()))
		}
		store(t, e.h, record(t, cluster, sens, comps("evil"), e.clk.Now()))
		out, _ = sw.Sweep(ctx, cluster)
		if k := kinds(out.Actions); len(k[events.KindEscalate]) != 1 || out.Actions[0].Node != sens {
			t.Fatalf("sensitive timeout: %v", out.Actions)
		}
		// Re-verified but not approved: stays drained, says so once.
		e.clk.Add(time.Minute)
		store(t, e.h, record(t, cluster, sens, comps(""), e.clk.Now()))
		out, _ = sw.Sweep(ctx, cluster)
		if len(out.Actions) != 1 || out.Actions[0].Kind != events.KindConformanceUndrain || out.Actions[0].Outcome != events.OutcomeInProgress || len(out.Events) != 0 {
			t.Fatalf("conforming, unapproved: %v %v", out.Actions, out.Events)
		}
		if hasTaint(e.get(t, sens)) == nil {
			t.Fatal("taint lifted without approval")
		}
		if out, _ := sw.Sweep(ctx, cluster); len(out.Actions) != 0 {
			t.Fatalf("awaiting repeated: %v", out.Actions)
		}
		// An approval of another fingerprint does not count.
		n := e.get(t, sens)
		n.Annotations[AnnotationApproved] = agentconf.Fingerprint(comps("evil"))[:16]
		if _, err := e.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if out, _ := sw.Sweep(ctx, cluster); len(out.Actions) != 0 {
			t.Fatalf("wrong approval acted on: %v", out.Actions)
		}
		n = e.get(t, sens)
		n.Annotations[AnnotationApproved] = agentconf.Fingerprint(comps(""))[:16]
		if _, err := e.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		out, _ = sw.Sweep(ctx, cluster)
		k = kinds(out.Actions)
		if len(k[events.KindConformanceUndrain]) != 1 || len(k[events.KindConformanceRestored]) != 1 || len(out.Events) != 1 ||
			!out.Events[0].IsHealthy || out.Events[0].CheckName != CheckDriftSensitive {
			t.Fatalf("approved: %v %v", out.Actions, out.Events)
		}
		n = e.get(t, sens)
		if hasTaint(n) != nil || n.Annotations[AnnotationApproved] != "" {
			t.Fatalf("approved node keeps %v %v", n.Spec.Taints, n.Annotations)
		}
	})

	// With a sender (the role's), a node's derived events and actions are
	// produced before the state that says they were: a broker that
	// refuses them leaves the node for the next sweep, which sends them
	// and then writes the state (a kill after the write can no longer lose
	// them). The sweep asks the refusing broker once: its other nodes are
	// left for the next sweep at once.
	t.Run("events and actions sent before the state", func(t *testing.T) {
		sens := []string{cluster + "-s2", cluster + "-s3"}
		for _, name := range sens {
			e.node(t, name, map[string]string{"faultline.io/node-pool": "h100", "faultline.io/sensitive": "true"})
			store(t, e.h, record(t, cluster, name, comps("evil"), e.clk.Now()))
		}
		var (
			sent    Output
			refused int
		)
		refuse := true
		ssw := NewSweeper(testConfig(), e.s.Conn, reg, testLog, e.clk.Now, nil)
		ssw.SendWith(func(_ context.Context, o Output) error {
			if refuse {
				refused++
				return errors.New("broker down")
			}
			sent.Events = append(sent.Events, o.Events...)
			sent.Actions = append(sent.Actions, o.Actions...)
			return nil
		})
		if out, _ := ssw.Sweep(ctx, cluster); len(out.Events) != 0 || len(out.Actions) != 0 || refused != 1 {
			t.Fatalf("refused: %d sends; actions %v events %v", refused, out.Actions, out.Events)
		}
		for _, name := range sens {
			if n := e.get(t, name); hasTaint(n) != nil || n.Annotations[AnnotationState] != "" {
				t.Fatalf("state written though its event was not sent: %v %v", n.Spec.Taints, n.Annotations)
			}
		}
		refuse = false
		out, _ := ssw.Sweep(ctx, cluster)
		if len(sent.Events) != 2 || sent.Events[0].CheckName != CheckDriftSensitive || !sent.Events[0].IsFatal || len(out.Events) != 0 || len(out.Actions) != 0 ||
			len(kinds(sent.Actions)[events.KindConformanceDrain]) != 2 || len(kinds(sent.Actions)[events.KindConformanceDrift]) != 2 {
			t.Fatalf("sent %v %v; output actions %v events %v", sent.Events, sent.Actions, out.Actions, out.Events)
		}
		for _, name := range sens {
			if n := e.get(t, name); hasTaint(n) == nil || !strings.Contains(n.Annotations[AnnotationState], `"drained":true`) {
				t.Fatalf("drained node: %v %v", n.Spec.Taints, n.Annotations)
			}
		}
		// Conforming again and approved: the undrain and restored actions
		// and the recovery are sent before the state is cleared.
		sent = Output{}
		e.clk.Add(time.Minute) // the reports below are the newest
		for _, name := range sens {
			store(t, e.h, record(t, cluster, name, comps(""), e.clk.Now()))
			n := e.get(t, name)
			n.Annotations[AnnotationApproved] = agentconf.Fingerprint(comps(""))[:16]
			if _, err := e.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		refuse = true
		if out, _ := ssw.Sweep(ctx, cluster); len(out.Actions) != 0 {
			t.Fatalf("refused: output actions %v", out.Actions)
		}
		if n := e.get(t, sens[0]); hasTaint(n) == nil {
			t.Fatal("drift cleared though its actions were not sent")
		}
		refuse = false
		if out, _ := ssw.Sweep(ctx, cluster); len(out.Actions) != 0 || len(sent.Events) != 2 || !sent.Events[0].IsHealthy ||
			len(kinds(sent.Actions)[events.KindConformanceUndrain]) != 2 || len(kinds(sent.Actions)[events.KindConformanceRestored]) != 2 {
			t.Fatalf("approved: sent %v %v; output actions %v", sent.Events, sent.Actions, out.Actions)
		}
		if n := e.get(t, sens[0]); hasTaint(n) != nil {
			t.Fatalf("approved node keeps %v", n.Spec.Taints)
		}
	})
}

// TestNotifierRetries: the HTTP notifier against a local server that
// fails twice, then accepts: delivered on the third attempt, with the
// SMD body naming both hashes; Enqueue never blocks.
func TestNotifierRetries(t *testing.T) {
	var (
		calls atomic.Int32
		mu    sync.Mutex
		got   []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+" "+string(b))
		mu.Unlock()
		if n <= 2 {
			http.Error(w, "smd busy", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	cfg := DefaultConfig().Notifier
	cfg.URL = srv.URL + "/hsm/v2/State/Components/{xname}"
	cfg.MinBackoff, cfg.MaxBackoff, cfg.Queue = 10*time.Millisecond, 50*time.Millisecond, 1
	type result struct {
		attempts int
		err      error
	}
	done := make(chan result, 4)
	q := NewQueue(NewHTTPNotifier(cfg, nil), cfg, testLog, func(_ Notification, a int, err error) { done <- result{a, err} })
	n := Notification{Cluster: "c", Node: "node-1", Xname: "x1000c0s0b0n0", Drifted: true, Expected: "aaa", Actual: "bbb"}
	if !q.Enqueue(n) {
		t.Fatal("enqueue refused")
	}
	if q.Enqueue(n) {
		t.Fatal("a full queue accepted (queue = 1)")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go q.Run(ctx)
	select {
	case r := <-done:
		if r.err != nil || r.attempts != 3 {
			t.Fatalf("result %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("not delivered")
	}
	mu.Lock()
	defer mu.Unlock()
	var body map[string]string
	_, js, _ := strings.Cut(got[2], " {")
	if err := json.Unmarshal([]byte("{"+js), &body); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got[2], "PATCH /hsm/v2/State/Components/x1000c0s0b0n0 ") || body["Flag"] != "Warning" ||
		body["FlagMsg"] != "conformance_drift: expected=aaa, actual=bbb" {
		t.Fatalf("request %q", got[2])
	}

	t.Run("gives up after attempts", func(t *testing.T) {
		cfg := cfg
		cfg.URL, cfg.Attempts, cfg.Queue = "http://127.0.0.1:1/x/{node}", 2, 4
		q := NewQueue(NewHTTPNotifier(cfg, nil), cfg, testLog, func(_ Notification, a int, err error) { done <- result{a, err} })
		go q.Run(ctx)
		q.Enqueue(n)
		select {
		case r := <-done:
			if r.err == nil || r.attempts != 2 {
				t.Fatalf("result %+v", r)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no result")
		}
	})
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Staleness = 0 }, "conformance.staleness"},
		{func(c *Config) { c.DriftRemediationTimeout = -1 }, "conformance.drift_remediation_timeout"},
		{func(c *Config) { c.SensitiveLabel = "novalue" }, "conformance.sensitive_label"},
		// Label keys and values no node can carry: nothing would ever
		// match, and sensitive nodes would drift without being drained.
		{func(c *Config) { c.SensitiveLabel = "faultline.io/sensitive = true" }, `conformance.sensitive_label: key "faultline.io/sensitive "`},
		{func(c *Config) { c.SensitiveLabel = "faultline.io/sensitive=yes please" }, `conformance.sensitive_label: value "yes please"`},
		{func(c *Config) { c.PoolLabel = "node pool" }, `conformance.pool_label: "node pool"`},
		{func(c *Config) { c.HardwareLabels = []string{"gpu product"} }, `conformance.hardware_labels[0]: "gpu product" is not a label key`},
		{func(c *Config) { c.HardwareLabels = []string{"a/b", "a/b"} }, `conformance.hardware_labels[1]: "a/b" listed twice`},
		{func(c *Config) { c.HardwareLabels = []string{c.PoolLabel} }, `conformance.hardware_labels[0]: "faultline.io/node-pool" is pool_label`},
		{func(c *Config) { c.Baselines = []Baseline{{Fingerprint: strings.Repeat("a", 64)}} }, "conformance.baselines[0].cluster"},
		{func(c *Config) { c.Baselines = []Baseline{{Cluster: "c", Fingerprint: "abc"}} }, "conformance.baselines[0].fingerprint"},
		// A cluster no event names: the baseline would never apply.
		{func(c *Config) { c.Baselines = []Baseline{{Cluster: "Prod", Fingerprint: strings.Repeat("a", 64)}} }, `conformance.baselines[0].cluster: "Prod" is not a cluster name`},
		{func(c *Config) {
			c.Baselines = []Baseline{{Cluster: "c", Fingerprint: strings.Repeat("a", 64)}, {Cluster: "c", Fingerprint: strings.Repeat("b", 64)}}
		}, "conformance.baselines[1]"},
		// A pool without a pool label (or no label value) matches no node:
		// the group fell back to its majority without a word.
		{func(c *Config) {
			c.PoolLabel, c.Baselines = "", []Baseline{{Cluster: "c", Pool: "h100", Fingerprint: strings.Repeat("a", 64)}}
		}, `conformance.baselines[0].pool: "h100" set but conformance.pool_label is empty`},
		{func(c *Config) {
			c.Baselines = []Baseline{{Cluster: "c", Pool: "h100 pool", Fingerprint: strings.Repeat("a", 64)}}
		}, `conformance.baselines[0].pool: "h100 pool" is not a label value`},
		{func(c *Config) { c.Notifier.URL = "ftp://x" }, "conformance.notifier.url"},
		{func(c *Config) { c.Notifier.URL = "http://smd/hsm/v2/State/Components/{xnme}" }, `conformance.notifier.url: only {node} and {xname} are replaced, got "http://smd/hsm/v2/State/Components/{xnme}"`},
		{func(c *Config) { c.Notifier.URL = "http://smd/hsm/v2/State/Components" }, "conformance.notifier.url: must name the node with {node} or {xname}"},
		{func(c *Config) {
			c.Notifier.URL, c.Notifier.TokenFile = "http://smd/{xname}", "/nonexistent/token"
		}, "conformance.notifier.token_file: "},
		{func(c *Config) { c.Notifier.Attempts = 0 }, "conformance.notifier.attempts"},
		{func(c *Config) { c.Notifier.Queue = 0 }, "conformance.notifier.queue"},
	} {
		c := DefaultConfig()
		tc.mod(&c)
		if err := c.Validate("conformance."); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate = %v, want %q", err, tc.want)
		}
	}
}

// TestEscalationsMatchShippedQuarantineRules: the role's fatal events
// (sensitive drift, timeout) cordon and taint under the quarantine role's
// shipped rules, so "escalate to a fatal event" is the quarantine path;
// the recovery event never matches (it lifts).
func TestEscalationsMatchShippedQuarantineRules(t *testing.T) {
	rs, err := quarantine.ParseRules(quarantine.DefaultRules)
	if err != nil {
		t.Fatal(err)
	}
	p, err := quarantine.Compile(rs)
	if err != nil {
		t.Fatal(err)
	}
	sw := NewSweeper(testConfig(), nil, nil, testLog, time.Now, nil)
	st := State{Since: time.Now(), Group: "h100", Expected: "a", Actual: "b"}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	for _, ev := range []*datamodels.HealthEvent{
		sw.derived("c", "n1", CheckDriftTimeout, false, datamodels.RecommendedAction_CONTACT_SUPPORT, st, "timeout"),
		sw.derived("c", "n1", CheckDriftSensitive, false, datamodels.RecommendedAction_NONE, st, "sensitive"),
	} {
		d, errs := p.Evaluate(ev, node)
		if len(errs) > 0 || d == nil || !d.Cordon || d.Taint == nil {
			t.Errorf("%s: decision %+v errs %v", ev.CheckName, d, errs)
		}
	}
	rec := sw.derived("c", "n1", CheckDriftSensitive, true, datamodels.RecommendedAction_NONE, st, "approved")
	if d, _ := p.Evaluate(rec, node); d != nil {
		t.Errorf("recovery matched %+v", d)
	}
}

type flakyProducer struct {
	fail int
	got  []*kgo.Record
}

func (p *flakyProducer) ProduceSync(_ context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	var out kgo.ProduceResults
	for _, r := range rs {
		var err error
		if p.fail > 0 {
			err = fmt.Errorf("broker down")
		} else {
			p.got = append(p.got, r)
		}
		out = append(out, kgo.ProduceResult{Record: r, Err: err})
	}
	if p.fail > 0 {
		p.fail--
	}
	return out
}

// TestUnproducedOutputIsKept: a sweep's actions that Kafka refused are
// produced with the next sweep's output, not lost (the node already
// carries the step, so it is not decided again).
func TestUnproducedOutputIsKept(t *testing.T) {
	p := &flakyProducer{fail: 1}
	l := &sweepLoop{log: testLog, prod: p}
	a1 := &faultlinev1.Action{Id: "a1", Cluster: "c", Node: "n"}
	a2 := &faultlinev1.Action{Id: "a2", Cluster: "c", Node: "n"}
	l.produce(context.Background(), "c", Output{Actions: []*faultlinev1.Action{a1}})
	if len(p.got) != 0 || len(l.pending["c"].Actions) != 1 {
		t.Fatalf("after failure: produced %d, pending %v", len(p.got), l.pending)
	}
	l.produce(context.Background(), "c", Output{Actions: []*faultlinev1.Action{a2}})
	if len(p.got) != 2 || len(l.pending) != 0 {
		t.Fatalf("after recovery: produced %d, pending %v", len(p.got), l.pending)
	}
}

// TestNotifierActionIsKept: the Action recording a notifier's result
// (the audit of what SMD was told) that Kafka refused is produced with the
// cluster's next sweep, not lost — also when that sweep's own output is
// refused too.
func TestNotifierActionIsKept(t *testing.T) {
	n := Notification{Cluster: "c", Node: "n", Drifted: true, Expected: "e", Actual: "a", Key: "k"}
	for _, tt := range []struct {
		name string
		// notifyErr is the notifier's result; sweepsRefused, how many
		// sweeps' produces Kafka refuses after the action's.
		notifyErr     error
		sweepsRefused int
		want          []string
	}{
		{name: "notified", want: []string{events.KindConformanceNotify + "/" + events.OutcomeApplied}},
		{name: "not notified", notifyErr: errors.New("smd down"), want: []string{events.KindConformanceNotify + "/" + events.OutcomeFailed}},
		{name: "next sweep refused too", sweepsRefused: 1,
			want: []string{events.KindConformanceNotify + "/" + events.OutcomeApplied, events.KindConformanceDrift + "/" + events.OutcomeApplied}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := &flakyProducer{fail: 1 + tt.sweepsRefused}
			l := &sweepLoop{log: testLog, prod: p, sweeper: NewSweeper(testConfig(), nil, nil, testLog, nil, nil)}
			l.notified(n, 1, tt.notifyErr)
			for range tt.sweepsRefused {
				l.produce(context.Background(), "c", Output{Actions: []*faultlinev1.Action{
					{Id: "d", Cluster: "c", Node: "n", Kind: events.KindConformanceDrift, Outcome: events.OutcomeApplied}}})
			}
			l.produce(context.Background(), "c", Output{})
			var got []string
			for _, r := range p.got {
				a, err := events.UnmarshalAction(r.Value)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, a.Kind+"/"+a.Outcome)
			}
			if !slices.Equal(got, tt.want) || len(l.pending) != 0 {
				t.Fatalf("produced %v, want %v; still held %v", got, tt.want, l.pending)
			}
		})
	}
}

// roundTripFunc is an http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestSlowClusterStallsNoOther: rounds start every 100 ms, as the sweep
// loop's ticker does; one member cluster's API server answers, but each
// request takes 2 s (its sweep some 10 s). The other cluster is swept at
// every round meanwhile, not once per slow sweep, and the slow one is not
// swept again while its sweep runs.
func TestSlowClusterStallsNoOther(t *testing.T) {
	e := startKube(t)
	cfg := testConfig()
	reg := clusters.NewRegistry(clusters.DefaultConfig(), e.clk.Now)
	lists := map[string]*atomic.Int32{}
	var names []string
	for _, tt := range []struct {
		name  string
		delay time.Duration
	}{{"fast", 0}, {"slow", 2 * time.Second}} {
		c := uniq(tt.name)
		e.oneDrifted(t, c, 3, "28.41.1000")
		n := &atomic.Int32{}
		lists[tt.name] = n
		rc := rest.CopyConfig(e.rest)
		rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes" {
					n.Add(1) // a sweep's list of the cluster's nodes
				}
				select {
				case <-time.After(tt.delay):
				case <-r.Context().Done():
					return nil, r.Context().Err()
				}
				return rt.RoundTrip(r)
			})
		}
		kube, err := kubernetes.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		reg.SetClient(c, kube, false)
		names = append(names, c)
	}
	l := &sweepLoop{cfg: cfg, log: testLog, handler: e.h, prod: &flakyProducer{},
		sweeper: NewSweeper(cfg, e.s.Conn, reg, testLog, e.clk.Now, nil), configured: names}
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	for time.Since(start) < 3*time.Second {
		l.sweepAll(ctx)
		time.Sleep(100 * time.Millisecond)
	}
	took := time.Since(start)
	cancel()
	l.wg.Wait()
	if fast, slow := lists["fast"].Load(), lists["slow"].Load(); fast < 10 || slow != 1 {
		t.Fatalf("in %s of rounds every 100ms: the fast cluster swept %d times, want at least 10; the slow one %d, want 1",
			took.Round(100*time.Millisecond), fast, slow)
	}
}

// recordingNotifier records the notices delivered, "node drifted" or
// "node restored", and "failed" for each of the next failNext.
type recordingNotifier struct {
	mu       sync.Mutex
	told     []string
	failNext int
}

func (r *recordingNotifier) Notify(_ context.Context, n Notification) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failNext > 0 {
		r.failNext--
		r.told = append(r.told, "failed")
		return errors.New("smd down")
	}
	what := " restored"
	if n.Drifted {
		what = " drifted"
	}
	r.told = append(r.told, n.Node+what)
	return nil
}

// wait waits until exactly want were delivered.
func (r *recordingNotifier) wait(t *testing.T, want ...string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		r.mu.Lock()
		got := slices.Clone(r.told)
		r.mu.Unlock()
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("notices %v, want %v", got, want)
		}
	}
}

// TestQueueKeepsNodeOrder: while a node's drift notice is being delivered
// (SMD slow), its return waits behind it and another node's notice goes
// through.
func TestQueueKeepsNodeOrder(t *testing.T) {
	release := make(chan struct{})
	rec := &recordingNotifier{}
	slow := notifierFunc(func(ctx context.Context, n Notification) error {
		if n.Node == "a" && n.Drifted {
			<-release
		}
		return rec.Notify(ctx, n)
	})
	cfg := DefaultConfig().Notifier
	q := NewQueue(slow, cfg, testLog, func(Notification, int, error) {})
	for _, n := range []Notification{{Cluster: "c", Node: "a", Drifted: true}, {Cluster: "c", Node: "a"}, {Cluster: "c", Node: "b", Drifted: true}} {
		if !q.Enqueue(n) {
			t.Fatal("enqueue refused")
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go q.Run(ctx)
	rec.wait(t, "b drifted")
	time.Sleep(100 * time.Millisecond) // the return would be delivered by now
	rec.mu.Lock()
	told := slices.Clone(rec.told)
	rec.mu.Unlock()
	if !slices.Equal(told, []string{"b drifted"}) {
		t.Fatalf("delivered while a's drift was in flight: %v", told)
	}
	close(release)
	rec.wait(t, "b drifted", "a drifted", "a restored")
}

type notifierFunc func(ctx context.Context, n Notification) error

func (f notifierFunc) Notify(ctx context.Context, n Notification) error { return f(ctx, n) }

// TestHeldOutputProducedAfterARebalance: a sweep's output Kafka refused
// is produced at the next round also when the cluster has moved to
// another replica meanwhile (the events partitions revoked in a
// rebalance): it is not left for a sweep of the cluster by this replica,
// which may never come.
func TestHeldOutputProducedAfterARebalance(t *testing.T) {
	if testing.Short() {
		t.Skip("needs real ClickHouse")
	}
	s := chtest.Start(t)
	h := NewHandler(s.Conn, testLog, time.Now)
	cfg := testConfig()
	p := &flakyProducer{fail: 1}
	c := uniq("moved")
	l := &sweepLoop{cfg: cfg, log: testLog, handler: h, prod: p, configured: []string{c},
		sweeper: NewSweeper(cfg, s.Conn, clusters.NewRegistry(clusters.DefaultConfig(), nil), testLog, nil, nil)}
	l.produce(context.Background(), c, Output{Actions: []*faultlinev1.Action{{Id: "a1", Cluster: c, Node: "n"}}})
	if len(p.got) != 0 || len(l.pending[c].Actions) != 1 {
		t.Fatalf("after the refusal: produced %d, held %v", len(p.got), l.pending)
	}
	h.PartitionsAssigned(Topics[0], nil, 12) // none of the 12 is this replica's now
	if h.Owns(events.Key(c, "")) {
		t.Fatal("the cluster is still this replica's")
	}
	l.sweepAll(context.Background())
	l.wg.Wait()
	if len(p.got) != 1 || len(l.pending) != 0 {
		t.Fatalf("after the rebalance: produced %d, still held %v", len(p.got), l.pending)
	}
}
