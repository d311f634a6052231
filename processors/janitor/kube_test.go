package janitor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/remediate"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

const cluster = "c1"

// recorder is the actions topic of a test: every produced action.
type recorder struct {
	mu   sync.Mutex
	acts []*faultlinev1.Action
}

func (r *recorder) ProduceSync(_ context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out kgo.ProduceResults
	for _, rec := range rs {
		a, err := events.UnmarshalAction(rec.Value)
		if err == nil && rec.Topic == events.TopicActions {
			r.acts = append(r.acts, a)
		}
		out = append(out, kgo.ProduceResult{Record: rec, Err: err})
	}
	return out
}

// of lists "kind/outcome" of node's actions.
func (r *recorder) of(node string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, a := range r.acts {
		if a.Node == node {
			out = append(out, a.Kind+"/"+a.Outcome)
		}
	}
	return out
}

// expect waits (up to 10 s: an action is produced just after the status
// it reports) until node's actions are want.
func (r *recorder) expect(t *testing.T, node string, want []string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := r.of(node)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) || len(got) > len(want) {
			t.Fatalf("actions of %s: %v, want %v", node, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// machine stands in for the real machines behind the emulated BMC: it
// polls each system's PowerState, and when a system powers off it marks
// its node NotReady; when it is On again it gives the node a new boot ID
// and marks it Ready — what a real node's kubelet reports after a reboot.
// The fake driver may turn a restarted system On again within
// milliseconds (its delay is whole seconds from a truncated clock), too
// fast for a poll to see it Off: resets sent through observe count too,
// so a cycle the poll missed is still reported.
type machine struct {
	t      *testing.T
	bmc    *testenv.Sushy
	kube   kubernetes.Interface
	mu     sync.Mutex
	nodes  map[string]string // system UUID → node
	cycles map[string]int    // node → power cycles seen
	resets map[string]int    // node → resets sent through observe
	boots  map[string]string // node → the boot ID it last came back with
	held   map[string]bool   // nodes kept down after their power cycle until let go
}

// observe wraps the emulator's provider so that every reset it sends
// reaches m.
func (m *machine) observe(p Provider) Provider { return observed{Provider: p, m: m} }

type observed struct {
	Provider
	m *machine
}

func (o observed) Reboot(ctx context.Context, t Target, mode RebootMode) error {
	err := o.Provider.Reboot(ctx, t, mode)
	if err == nil {
		o.m.mu.Lock()
		o.m.resets[t.Node.Name]++
		o.m.mu.Unlock()
	}
	return err
}

func (m *machine) add(uuid, node string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nodes[uuid] = node
}

func (m *machine) bootOf(node string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.boots[node]
}

// hold keeps node down (NotReady) after its next power cycle until
// hold(node, false): an operation provably in progress.
func (m *machine) hold(node string, on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.held[node] = on
}

func (m *machine) cyclesOf(node string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cycles[node]
}

func (m *machine) run(ctx context.Context) {
	off := map[string]bool{}
	for ctx.Err() == nil {
		m.mu.Lock()
		nodes := maps.Clone(m.nodes)
		m.mu.Unlock()
		for sys, node := range nodes {
			// The resets sent before the power state is read: one sent
			// after it cannot explain an "On" read before it (counted as a
			// missed cycle, it made the real cycle that followed a second).
			m.mu.Lock()
			resets := m.resets[node]
			m.mu.Unlock()
			ps, err := m.bmc.PowerState(ctx, sys)
			if err != nil {
				continue
			}
			m.mu.Lock()
			missed := ps == "On" && !off[sys] && m.cycles[node] < resets
			held := m.held[node]
			m.mu.Unlock()
			if (ps == "Off" || missed) && !off[sys] {
				off[sys] = true
				m.setNode(ctx, node, corev1.ConditionFalse, "")
			}
			if ps == "On" && off[sys] && !held {
				off[sys] = false
				boot := uuid.NewString()
				m.mu.Lock()
				m.cycles[node]++
				m.boots[node] = boot
				m.mu.Unlock()
				m.setNode(ctx, node, corev1.ConditionTrue, boot)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (m *machine) setNode(ctx context.Context, name string, ready corev1.ConditionStatus, bootID string) {
	for try := 0; try < 5; try++ {
		n, err := m.kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return
		}
		setReady(n, ready)
		if bootID != "" {
			n.Status.NodeInfo.BootID = bootID
		}
		if _, err := m.kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
			return
		}
	}
}

// booted gives n, before its creation, the status a kubelet reports first:
// Ready with a boot ID (the apiserver takes a Node's status on create). Set
// after the create, a janitor whose watch copy predates it sees no boot ID
// and holds the reboot; with KWOK, its node-initialize stage (fired by a
// node not Ready) renders the status it saw and may write an empty boot ID
// back over the test's.
func booted(n *corev1.Node) *corev1.Node {
	setReady(n, corev1.ConditionTrue)
	n.Status.NodeInfo.BootID = "boot-0-" + n.Name
	return n
}

func setReady(n *corev1.Node, st corev1.ConditionStatus) {
	now := metav1.Now()
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i].Status, n.Status.Conditions[i].LastHeartbeatTime, n.Status.Conditions[i].LastTransitionTime = st, now, now
			return
		}
	}
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: st, Reason: "Test",
		LastHeartbeatTime: now, LastTransitionTime: now})
}

// env is one test's cluster, BMC, machines and janitor wiring.
type env struct {
	t    *testing.T
	kc   *testenv.Kube
	kube kubernetes.Interface
	dyn  dynamic.Interface
	bmc  *testenv.Sushy
	ca   *testenv.CA
	m    *machine
}

// node creates a node behind system sys of the BMC, Ready with a boot ID,
// labelled as quarantine and drain leave it when drained is true.
func (e *env) node(name, sys string, drained bool, ann map[string]string) {
	e.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{AnnotationProvider: ProviderRedfish, "faultline.io/rack": "r-" + name},
		Annotations: map[string]string{AnnotationBMC: e.bmc.URL + e.bmc.SystemPath(sys)}}}
	if drained {
		n.Labels[events.LabelQuarantined], n.Labels[labelDrain] = "true", "succeeded"
	}
	for k, v := range ann {
		n.Annotations[k] = v
	}
	if _, err := e.kube.CoreV1().Nodes().Create(context.Background(), booted(n), metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.m.add(sys, name)
}

func (e *env) janitor(cfg Config, dryRun bool, prov map[string]Provider) (*Janitor, *recorder) {
	e.t.Helper()
	rec := &recorder{}
	return e.janitorTo(rec, cfg, dryRun, prov), rec
}

// janitorTo is a janitor whose actions go to prod.
func (e *env) janitorTo(prod pipeline.Producer, cfg Config, dryRun bool, prov map[string]Provider) *Janitor {
	e.t.Helper()
	return e.janitorOn(e.kube, e.dyn, prod, cfg, dryRun, prov)
}

// janitorOn is janitorTo with kc and dyn as the janitor's clients of the
// cluster (a ServiceAccount's, a delayed one).
func (e *env) janitorOn(kc kubernetes.Interface, dyn dynamic.Interface, prod pipeline.Producer, cfg Config, dryRun bool, prov map[string]Provider) *Janitor {
	e.t.Helper()
	reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	reg.SetClient(cluster, kc, dryRun)
	if prov == nil {
		prov = e.providers(cfg)
	}
	j, err := New(cfg, clusters.Config{}, reg, Options{Log: testLog, Providers: prov, Producer: prod})
	if err != nil {
		e.t.Fatal(err)
	}
	reg.SetDynamic(cluster, dyn)
	return j
}

// providers builds cfg's providers, the emulator's observed by the
// machine stand-in.
func (e *env) providers(cfg Config) map[string]Provider {
	e.t.Helper()
	prov, err := BuildProviders(cfg, testLog)
	if err != nil {
		e.t.Fatal(err)
	}
	prov[ProviderRedfish] = e.m.observe(prov[ProviderRedfish])
	return prov
}

func (e *env) config() Config {
	c := DefaultConfig()
	c.Redfish.CAFile = e.ca.File
	// The emulated BMCs and the agents listen on loopback; "wrong" is
	// TestJanitorKube's node with wrong credentials.
	c.Redfish.AllowedNetworks, c.Redfish.AllowedSecrets = []string{"127.0.0.0/8"}, []string{"wrong"}
	c.Local.AllowedNetworks = []string{"127.0.0.0/8"}
	c.PollInterval = 200 * time.Millisecond
	c.Cooldown = 0
	return c
}

// run runs j until the returned stop is called (or the test ends).
func run(t *testing.T, j *Janitor) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = j.Run(ctx, []string{cluster}) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

func (e *env) create(k kind, name, node string, force bool) {
	e.t.Helper()
	o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": Group + "/v1alpha1", "kind": k.Name,
		"metadata": map[string]any{"name": name}, "spec": map[string]any{"nodeName": node, "force": force}}}
	if _, err := e.dyn.Resource(k.GVR).Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// wait polls the resource until it has completionTime, and returns it.
func (e *env) wait(k kind, name string, within time.Duration) *unstructured.Unstructured {
	e.t.Helper()
	deadline := time.Now().Add(within)
	var o *unstructured.Unstructured
	var err error
	for time.Now().Before(deadline) {
		o, err = e.dyn.Resource(k.GVR).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && finished(o) {
			return o
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.t.Fatalf("%s %s not finished within %v: %v %v", k.Name, name, within, err, o)
	return nil
}

// keptActions decodes the actions kept on o (AnnotationUnsaid), oldest first.
func keptActions(t testing.TB, o *unstructured.Unstructured) []*faultlinev1.Action {
	t.Helper()
	var out []*faultlinev1.Action
	for _, raw := range unsaidOf(o) {
		a := &faultlinev1.Action{}
		if err := protojson.Unmarshal(raw, a); err != nil {
			t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

// waitUnsaidCleared polls the resource until it keeps no actions.
func (e *env) waitUnsaidCleared(k kind, name string, within time.Duration) {
	e.t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		o, err := e.dyn.Resource(k.GVR).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		if _, ok := o.GetAnnotations()[AnnotationUnsaid]; !ok {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("produced actions left on the resource: %s", o.GetAnnotations()[AnnotationUnsaid])
		}
	}
}

func condOf(o *unstructured.Unstructured, typ string) string {
	c := condition(o, typ)
	if c == nil {
		return "none"
	}
	return fmt.Sprint(c["status"], "/", c["reason"])
}

// newEnv starts the apiserver (with kwok simulating the nodes' kubelets
// when kwok is set) and, for systems > 0, the Redfish emulator with that
// many systems.
func newEnv(t *testing.T, systems int, kwok ...bool) *env {
	return newEnvWith(t, systems, testenv.KubeOptions{KWOK: len(kwok) > 0 && kwok[0]})
}

// newEnvWith is newEnv with the control plane's options.
func newEnvWith(t *testing.T, systems int, opts testenv.KubeOptions) *env {
	kube := testenv.StartKube(t, opts)
	kube.ApplyCRDs(t, "../../deploy/crds/*.yaml")
	dyn, err := dynamic.NewForConfig(kube.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ca := testenv.NewCA(t, "", "bmc")
	var sys []testenv.SushySystem
	for i := range systems {
		sys = append(sys, testenv.SushySystem{UUID: fmt.Sprintf("22222222-0000-4000-8000-%012d", i), Name: fmt.Sprintf("sys-%d", i)})
	}
	var bmc *testenv.Sushy
	if systems > 0 {
		bmc = testenv.StartSushy(t, testenv.SushyOptions{Systems: sys, Username: "admin", Password: "s3cret", TLS: ca})
	}
	k := kube.Client()
	ctx := context.Background()
	if _, err := k.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "faultline"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*corev1.Secret{bmcSecret("faultline", "bmc-credentials", "admin", "s3cret"), bmcSecret("faultline", "wrong", "admin", "nope")} {
		if _, err := k.CoreV1().Secrets("faultline").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	m := &machine{t: t, bmc: bmc, kube: k, nodes: map[string]string{}, cycles: map[string]int{}, resets: map[string]int{}, boots: map[string]string{}, held: map[string]bool{}}
	mctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	if bmc != nil {
		go m.run(mctx)
	}
	return &env{t: t, kc: kube, kube: k, dyn: dyn, bmc: bmc, ca: ca, m: m}
}

func sysID(i int) string { return fmt.Sprintf("22222222-0000-4000-8000-%012d", i) }

// drainedRecord is the drain role's result for node, as the remediate
// role consumes it.
func drainedRecord(node, drainID string) *kgo.Record {
	a := &faultlinev1.Action{
		Id: "d-" + drainID, Cluster: cluster, Node: node, Role: events.RoleDrain, Kind: events.KindDrain,
		Outcome: events.OutcomeSucceeded, EventIds: []string{"ev-" + drainID}, CheckName: "XID_ERROR_79",
		RecommendedAction: "RESTART_BM", Details: map[string]string{events.DetailDrainID: drainID},
	}
	b, _ := events.MarshalAction(a)
	return &kgo.Record{Topic: events.TopicActions, Key: events.Key(cluster, node), Value: b}
}

// remediateStep runs the remediate role's handler on recs and returns its
// actions ("kind/outcome") and requeue records.
func remediateStep(t *testing.T, h *remediate.Handler, recs ...*kgo.Record) ([]string, []*kgo.Record) {
	t.Helper()
	res, err := h.Handle(context.Background(), recs)
	if err != nil {
		t.Fatal(err)
	}
	var acts []string
	var rq []*kgo.Record
	for _, r := range res.Out {
		if r.Topic == remediate.TopicRequeue {
			rq = append(rq, r)
			continue
		}
		a, err := events.UnmarshalAction(r.Value)
		if err != nil {
			t.Fatal(err)
		}
		acts = append(acts, a.Kind+"/"+a.Outcome)
	}
	return acts, rq
}

// TestJanitorKube is the janitor end to end on a real kube-apiserver with
// KWOK simulating the nodes' kubelets (it keeps them Ready, and makes a node
// the test marks NotReady Ready again: only a new boot ID ends a reboot), with
// sushy-tools' Redfish emulator (TLS with a test CA, basic auth) as the
// BMC of every node and the test standing in for the machines: the
// remediate role creates a RebootNode, the janitor resets the emulated
// system (its PowerState really goes Off and On), the node comes back with
// a new boot ID, the resource completes and the remediate role reads it
// as succeeded; failures end with their reason and the remediate role
// escalates them; a janitor stopped mid-reboot is resumed by another
// without a second reset.
func TestJanitorKube(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 8, true) // KWOK nodes
	clk := time.Now()
	var clkMu sync.Mutex
	now := func() time.Time { clkMu.Lock(); defer clkMu.Unlock(); return clk }
	advance := func(d time.Duration) { clkMu.Lock(); clk = clk.Add(d); clkMu.Unlock() }
	reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	reg.SetClient(cluster, e.kube, false)
	rem, err := remediate.New(remediate.DefaultConfig(), reg, remediate.Options{Log: testLog, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	reg.SetDynamic(cluster, e.dyn)
	t.Cleanup(rem.Close)
	j, rec := e.janitor(e.config(), false, nil)
	stopJ := run(t, j)

	// remediated runs the remediate role for node's drain until its
	// remediation ends, returning its actions.
	remediated := func(node, drainID string) []string {
		t.Helper()
		acts, rq := remediateStep(t, rem, drainedRecord(node, drainID))
		// 2 minutes: a reboot through the BMC emulator took over 60 s on
		// the 2-core machine at load 11-15.
		deadline := time.Now().Add(2 * time.Minute)
		for len(rq) > 0 && time.Now().Before(deadline) {
			time.Sleep(300 * time.Millisecond)
			advance(remediate.DefaultConfig().PollInterval)
			var more []string
			more, rq = remediateStep(t, rem, rq...)
			acts = append(acts, more...)
		}
		return acts
	}
	resourceOf := func(node string) *unstructured.Unstructured {
		l, err := e.dyn.Resource(kindReboot.GVR).List(context.Background(), metav1.ListOptions{LabelSelector: remediate.LabelNode + "=" + node})
		if err != nil || len(l.Items) != 1 {
			t.Fatalf("RebootNodes of %s: %v %v", node, err, l)
		}
		return &l.Items[0]
	}

	t.Run("RebootThroughRedfish", func(t *testing.T) {
		e.node("gpu-a", sysID(0), true, nil)
		acts := remediated("gpu-a", "drain-a")
		if !slices.Contains(acts, "remediate/succeeded") {
			t.Fatalf("remediate actions %v, want remediate/succeeded", acts)
		}
		o := resourceOf("gpu-a")
		if condOf(o, CondSignalSent) != "True/Succeeded" || condOf(o, CondNodeReady) != "True/Succeeded" || !finished(o) {
			t.Fatalf("status %v", o.Object["status"])
		}
		// The reboot ended on the boot ID the machine came back with. (Not
		// read from the node afterwards: kwok's node-initialize stage,
		// triggered by the NotReady, may render the status it saw then and
		// write the old boot ID back after the machine's update.)
		if boot, msg := e.m.bootOf("gpu-a"), fmt.Sprint(condition(o, CondNodeReady)["message"]); boot == "" || !strings.Contains(msg, "new boot ID "+boot) {
			t.Fatalf("NodeReady message %q, want the machine's new boot ID %q", msg, boot)
		}
		if n := e.m.cyclesOf("gpu-a"); n != 1 {
			t.Fatalf("%d power cycles of gpu-a's system, want 1", n)
		}
		rec.expect(t, "gpu-a", []string{"reboot/applied", "reboot/succeeded"})

		// Deleted (the remediate role prunes finished ones): the janitor
		// forgets what it kept of it.
		remembers := func(uid types.UID) bool {
			j.mu.Lock()
			defer j.mu.Unlock()
			_, ok := j.mem[uid]
			return ok
		}
		uid := o.GetUID()
		if !remembers(uid) {
			t.Fatal("the janitor keeps nothing of the reboot it sent")
		}
		if err := e.dyn.Resource(kindReboot.GVR).Delete(context.Background(), o.GetName(), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); remembers(uid); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the janitor still keeps the deleted RebootNode's state after 5s")
			}
		}
	})

	t.Run("FailuresEscalate", func(t *testing.T) {
		for _, tc := range []struct {
			node, sys string
			ann       map[string]string
			reason    string
		}{
			{"gpu-b", sysID(1), map[string]string{AnnotationBMCSecret: "wrong"}, ReasonBMCAuthFailed},
			{"gpu-c", sysID(2), map[string]string{AnnotationBMC: "https://127.0.0.1:1"}, ReasonBMCUnreachable},
		} {
			e.node(tc.node, tc.sys, true, tc.ann)
			acts := remediated(tc.node, "drain-"+tc.node)
			if !slices.Contains(acts, "remediate/failed") || !slices.Contains(acts, "escalate/applied") {
				t.Fatalf("%s: remediate actions %v, want failed and escalate", tc.node, acts)
			}
			o := resourceOf(tc.node)
			if got := condOf(o, CondSignalSent); got != "False/"+tc.reason || !finished(o) {
				t.Fatalf("%s: SignalSent %s, want False/%s; status %v", tc.node, got, tc.reason, o.Object["status"])
			}
			rec.expect(t, tc.node, []string{"reboot/failed"})
			if n := e.m.cyclesOf(tc.node); n != 0 {
				t.Fatalf("%s: power cycled", tc.node)
			}
		}
	})

	t.Run("NotDrainedUnlessForce", func(t *testing.T) {
		e.node("gpu-d", sysID(3), false, nil)
		e.create(kindReboot, "manual-d", "gpu-d", false)
		o := e.wait(kindReboot, "manual-d", 20*time.Second)
		if got := condOf(o, CondSignalSent); got != "False/"+ReasonNotDrained {
			t.Fatalf("SignalSent %s", got)
		}
		rec.expect(t, "gpu-d", []string{"reboot/refused"})
		e.create(kindReboot, "manual-d-force", "gpu-d", true)
		o = e.wait(kindReboot, "manual-d-force", 40*time.Second)
		if got := condOf(o, CondNodeReady); got != "True/Succeeded" {
			t.Fatalf("forced: NodeReady %s; status %v", got, o.Object["status"])
		}
		if n := e.m.cyclesOf("gpu-d"); n != 1 {
			t.Fatalf("%d power cycles", n)
		}
	})

	// The drain label stays after a lift: a node lifted and quarantined
	// again (another fault, its new drain not started yet) still reads
	// "drained". A resource held meanwhile must not reboot it with the pods
	// scheduled since the lift: refused NotDrained unless the drain finished
	// after the quarantine began.
	t.Run("DrainOfAnEarlierQuarantineRefused", func(t *testing.T) {
		now := time.Now().UTC()
		for _, tc := range []struct {
			name, node, sys  string
			finished, qBegan time.Duration
			refused          bool
		}{
			{"drained for an earlier quarantine, lifted and quarantined again", "gpu-h", sysID(6), -30 * time.Minute, -5 * time.Minute, true},
			{"drained for the current quarantine", "gpu-i", sysID(7), -time.Minute, -3 * time.Minute, false},
		} {
			e.node(tc.node, tc.sys, true, map[string]string{
				annotationDrainState:    fmt.Sprintf(`{"id":"d-%s","phase":"succeeded","finishedAt":%q}`, tc.node, now.Add(tc.finished).Format(time.RFC3339Nano)),
				annotationQuarantinedAt: now.Add(tc.qBegan).Format(time.RFC3339),
			})
			e.create(kindReboot, "held-"+tc.node, tc.node, false)
			o := e.wait(kindReboot, "held-"+tc.node, 40*time.Second)
			cycles := e.m.cyclesOf(tc.node)
			if tc.refused && (condOf(o, CondSignalSent) != "False/"+ReasonNotDrained || cycles != 0) {
				t.Errorf("%s: SignalSent %s, %d power cycles: rebooted with pods never drained", tc.name, condOf(o, CondSignalSent), cycles)
			}
			if !tc.refused && (condOf(o, CondNodeReady) != "True/Succeeded" || cycles != 1) {
				t.Errorf("%s: NodeReady %s, %d power cycles; status %v", tc.name, condOf(o, CondNodeReady), cycles, o.Object["status"])
			}
		}
	})

	t.Run("LiftedBeforeRebootCancelledNotEscalated", func(t *testing.T) {
		// The fault recovered and the quarantine lifted the node before
		// the janitor came to its RebootNode: refused NotDrained, which
		// the remediate role reads as cancelled — no escalation, and the
		// node's next fault, drained, is rebooted.
		e.node("gpu-f", sysID(5), false, nil)
		acts := remediated("gpu-f", "drain-f1")
		if !slices.Contains(acts, "remediate/cancelled") || slices.Contains(acts, "escalate/applied") {
			t.Fatalf("remediate actions %v, want cancelled and no escalation", acts)
		}
		if got := condOf(resourceOf("gpu-f"), CondSignalSent); got != "False/"+ReasonNotDrained {
			t.Fatalf("SignalSent %s", got)
		}
		rec.expect(t, "gpu-f", []string{"reboot/refused"})
		// Quarantined and drained again for a new fault.
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true",%q:"succeeded"}}}`, events.LabelQuarantined, labelDrain)
		if _, err := e.kube.CoreV1().Nodes().Patch(context.Background(), "gpu-f", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		acts = remediated("gpu-f", "drain-f2")
		if !slices.Contains(acts, "remediate/succeeded") || slices.Contains(acts, "escalate/applied") {
			t.Fatalf("next fault: remediate actions %v, want succeeded", acts)
		}
		if n := e.m.cyclesOf("gpu-f"); n != 1 {
			t.Fatalf("%d power cycles of gpu-f's system, want 1", n)
		}
	})

	t.Run("StoppedMidRebootResumesWithoutSecondReset", func(t *testing.T) {
		e.node("gpu-e", sysID(4), true, nil)
		// Janitor A sends the reset, then stops before it writes
		// SignalSent (its provider blocks until A is stopped).
		real := j.providers[ProviderRedfish]
		var sentA atomic.Int32
		sent := make(chan struct{})
		a, _ := e.janitor(e.config(), false, map[string]Provider{ProviderRedfish: &blockAfter{Provider: real, sent: sent, n: &sentA}})
		// The shared janitor j must not take it: stop it first.
		stopJ()
		stopA := run(t, a)
		e.create(kindReboot, "resume-e", "gpu-e", false)
		select {
		case <-sent:
		case <-time.After(30 * time.Second):
			t.Fatal("janitor A sent no reset")
		}
		stopA()
		o, _ := e.dyn.Resource(kindReboot.GVR).Get(context.Background(), "resume-e", metav1.GetOptions{})
		if stateOf(o) == nil || condIs(o, CondSignalSent, "True") {
			t.Fatalf("after A stopped: state %v, status %v", o.GetAnnotations(), o.Object["status"])
		}
		// Janitor B (a restart) resumes it: no second reset.
		var sentB atomic.Int32
		b, recB := e.janitor(e.config(), false, map[string]Provider{ProviderRedfish: &counting{Provider: real, n: &sentB}})
		run(t, b)
		o = e.wait(kindReboot, "resume-e", 40*time.Second)
		if condOf(o, CondSignalSent) != "True/"+ReasonRecorded || condOf(o, CondNodeReady) != "True/Succeeded" {
			t.Fatalf("status %v", o.Object["status"])
		}
		if sentA.Load() != 1 || sentB.Load() != 0 {
			t.Fatalf("resets sent: A %d, B %d; want 1, 0", sentA.Load(), sentB.Load())
		}
		time.Sleep(12 * time.Second) // a second reset would show within the emulator's 1-11 s
		if n := e.m.cyclesOf("gpu-e"); n != 1 {
			t.Fatalf("%d power cycles, want 1", n)
		}
		recB.expect(t, "gpu-e", []string{"reboot/in_progress", "reboot/succeeded"})
	})
}

// blockAfter sends the real signal, then blocks until its context ends:
// a janitor that dies between sending the signal and recording it sent.
type blockAfter struct {
	Provider
	sent chan struct{}
	n    *atomic.Int32
}

func (b *blockAfter) Reboot(ctx context.Context, t Target, mode RebootMode) error {
	if err := b.Provider.Reboot(ctx, t, mode); err != nil {
		return err
	}
	b.n.Add(1)
	close(b.sent)
	<-ctx.Done()
	return ctx.Err()
}

// counting counts the signals it passes on.
type counting struct {
	Provider
	n *atomic.Int32
}

func (c *counting) Reboot(ctx context.Context, t Target, mode RebootMode) error {
	c.n.Add(1)
	return c.Provider.Reboot(ctx, t, mode)
}

// TestReadsANodeTheWatchHasNotSeen: a resource whose node is not in the
// watch's copy yet (created just before it; seen in CI as a TerminateNode
// failed "node not found" for a node that existed) reads the node before
// failing: here it is found and judged (not drained: refused; drained, in
// a rack whose one slot is taken: waits for it), and only a node the API
// server does not have fails NodeNotFound. Followed, a terminate deletes
// the node and a reboot completes on the node read. A node the watch has
// behind the API server is judged on the API server's copy, when its
// reboot starts and before the reboot is forced.
func TestReadsANodeTheWatchHasNotSeen(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := context.Background()
	cfg := e.config()
	cfg.MaxConcurrentPerRack = 1
	j, rec := e.janitor(cfg, false, nil)
	cl, err := j.reg.Get(cluster)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "fresh"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "fresh-r1", Labels: map[string]string{AnnotationProvider: ProviderRedfish, cfg.RackLabel: "r1",
			events.LabelQuarantined: "true", labelDrain: "succeeded"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "fresh-t"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "fresh-b"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "fresh-f"}},
	} {
		if _, err := e.kube.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if lim := j.lim.acquire("another-reboot", cluster, "r1", ProviderRedfish, true); lim != "" {
		t.Fatalf("taking rack r1's slot: %s", lim)
	}
	// unwatched creates a resource of node and returns its operation with
	// a watch that has seen no node.
	unwatched := func(kd kind, name, node string) *operation {
		t.Helper()
		e.create(kd, name, node, false)
		u, err := e.dyn.Resource(kd.GVR).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return &operation{j: j, cr: &clusterRun{name: cluster, cl: cl, nodes: cache.NewIndexer(cache.MetaNamespaceKeyFunc, nil)}, kd: kd, u: u, nodeName: node, key: name}
	}
	for _, tc := range []struct{ resource, node, want, action string }{
		{"reboot-fresh", "fresh", "False/" + ReasonNotDrained, "reboot/refused"},
		{"reboot-fresh-r1", "fresh-r1", "none", "reboot/deferred"}, // its rack read from the node, not "node:fresh-r1"
		{"reboot-absent", "absent", "False/" + ReasonNodeNotFound, "reboot/failed"},
	} {
		if _, err := unwatched(kindReboot, tc.resource, tc.node).start(ctx); err != nil {
			t.Fatalf("%s: %v", tc.resource, err)
		}
		o, err := e.dyn.Resource(kindReboot.GVR).Get(ctx, tc.resource, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := condOf(o, CondSignalSent); got != tc.want {
			t.Fatalf("%s: SignalSent %s, want %s; status %v", tc.resource, got, tc.want, o.Object["status"])
		}
		rec.expect(t, tc.node, []string{tc.action})
	}

	// A node whose watch copy is behind the API server's (from before the
	// drain role's label and the kubelet's boot ID): judged on the API
	// server's copy, not refused NotDrained nor waiting for a boot ID; in
	// rack r1, it waits for the slot.
	old := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "behind", Labels: map[string]string{AnnotationProvider: ProviderRedfish, cfg.RackLabel: "r1"}}}
	now := old.DeepCopy()
	now.Labels[events.LabelQuarantined], now.Labels[labelDrain] = "true", "succeeded"
	if _, err := e.kube.CoreV1().Nodes().Create(ctx, booted(now), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	op := unwatched(kindReboot, "reboot-behind", "behind")
	if err := op.cr.nodes.Add(old); err != nil {
		t.Fatal(err)
	}
	if _, err := op.start(ctx); err != nil {
		t.Fatal(err)
	}
	if o, err := e.dyn.Resource(kindReboot.GVR).Get(ctx, "reboot-behind", metav1.GetOptions{}); err != nil || condOf(o, CondSignalSent) != "none" {
		t.Fatalf("a node the watch has behind: SignalSent %s (%v), want none (waiting for rack r1's slot)", condOf(o, CondSignalSent), err)
	}
	rec.expect(t, "behind", []string{"reboot/deferred"})
	rec.mu.Lock()
	why := rec.acts[len(rec.acts)-1].Reason
	rec.mu.Unlock()
	if !strings.Contains(why, "waiting for a slot") {
		t.Fatalf("deferred for %q, want rack r1's slot", why)
	}

	// A terminate signalled for a node the watch has not seen: the node is
	// not taken for gone (before: success said, the Node left in place); it
	// is deleted, then the terminate succeeds.
	// signalled is an operation whose signal was sent at boot ID boot-0.
	signalled := func(kd kind, name, node string) *operation {
		t.Helper()
		op := unwatched(kd, name, node)
		op.st = &opState{Step: "signal", At: time.Now(), BootID: "boot-0", Provider: ProviderRedfish}
		sent := map[string]any{"type": CondSignalSent, "status": "True", "reason": ReasonSucceeded, "message": "sent", "lastTransitionTime": time.Now().UTC().Format(time.RFC3339)}
		if err := unstructured.SetNestedSlice(op.u.Object, []any{sent}, "status", "conditions"); err != nil {
			t.Fatal(err)
		}
		return op
	}
	if _, err := signalled(kindTerminate, "terminate-fresh-t", "fresh-t").follow(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.kube.CoreV1().Nodes().Get(ctx, "fresh-t", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the terminated node's Node object is still there (%v): taken for gone from the watch's copy", err)
	}
	rec.expect(t, "fresh-t", []string{"terminate/succeeded"})

	// A reboot followed for a node the watch lacks, back Ready with a new
	// boot ID: it completes (before: it waited, until reboot_timeout if the
	// watch never showed the node).
	e.m.setNode(ctx, "fresh-b", corev1.ConditionTrue, "boot-1")
	if wait, err := signalled(kindReboot, "reboot-fresh-b", "fresh-b").follow(ctx); err != nil || wait != 0 {
		t.Fatalf("following the reboot of a node back with a new boot ID: look again in %v, %v; want done", wait, err)
	}
	rec.expect(t, "fresh-b", []string{"reboot/succeeded"})

	// A reboot past force_after whose node the watch still has Ready with
	// the old boot ID, while the apiserver has it back with a new one: it
	// completes, where the watch's copy would have it forced (a reset of
	// the machine that just came back).
	e.m.setNode(ctx, "fresh-f", corev1.ConditionTrue, "boot-0")
	behindF, err := e.kube.CoreV1().Nodes().Get(ctx, "fresh-f", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.m.setNode(ctx, "fresh-f", corev1.ConditionTrue, "boot-1")
	op = signalled(kindReboot, "reboot-fresh-f", "fresh-f")
	op.st.At = time.Now().Add(-cfg.ForceAfter - time.Minute)
	if err := op.cr.nodes.Add(behindF); err != nil {
		t.Fatal(err)
	}
	if wait, err := op.follow(ctx); err != nil || wait != 0 {
		t.Fatalf("following a reboot past force_after whose node is back (the watch behind): look again in %v, %v; want done", wait, err)
	}
	rec.expect(t, "fresh-f", []string{"reboot/succeeded"})
}

// panicky is a provider whose first reboot panics (a bug of its own).
type panicky struct{ calls atomic.Int32 }

func (p *panicky) Reboot(context.Context, Target, RebootMode) error {
	if p.calls.Add(1) == 1 {
		var n *corev1.Node
		_ = n.Name // a nil dereference: a runtime panic
	}
	return nil
}
func (p *panicky) Terminate(context.Context, Target) error { return ErrUnsupported }
func (p *panicky) ResetGPUs(context.Context, Target, []string) error {
	return ErrUnsupported
}

// TestPanicIsAFailedStep: a step that panics is that resource's failed
// step, retried — the janitor goes on with it and with the others (a
// worker's panic ended the process, every cluster's janitor with it).
// The signal whose sending panicked was recorded first, so it is resumed,
// not sent again.
func TestPanicIsAFailedStep(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := context.Background()
	prov := &panicky{}
	j, _ := e.janitor(e.config(), false, map[string]Provider{ProviderRedfish: prov})
	run(t, j)
	for _, name := range []string{"p1", "p2"} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{AnnotationProvider: ProviderRedfish,
			events.LabelQuarantined: "true", labelDrain: "succeeded"}}}
		if _, err := e.kube.CoreV1().Nodes().Create(ctx, booted(n), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	signalSent := func(name, want string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			o, err := e.dyn.Resource(kindReboot.GVR).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := condOf(o, CondSignalSent); got == want {
				return
			} else if time.Now().After(deadline) {
				t.Fatalf("%s: SignalSent %s, want %s", name, got, want)
			}
		}
	}
	e.create(kindReboot, "reboot-p1", "p1", false)
	signalSent("reboot-p1", "True/"+ReasonRecorded)
	e.create(kindReboot, "reboot-p2", "p2", false)
	signalSent("reboot-p2", "True/"+ReasonSucceeded)
	if n := prov.calls.Load(); n != 2 {
		t.Fatalf("%d reboots sent, want 2 (the one that panicked not sent again)", n)
	}
}

// bmcRefuses is a provider whose BMC refuses every signal.
type bmcRefuses struct{ calls atomic.Int32 }

func (r *bmcRefuses) Reboot(context.Context, Target, RebootMode) error {
	r.calls.Add(1)
	return perr(ReasonBMCAuthFailed, "BMC refused the credentials (401)")
}
func (r *bmcRefuses) Terminate(context.Context, Target) error { return ErrUnsupported }
func (r *bmcRefuses) ResetGPUs(context.Context, Target, []string) error {
	return ErrUnsupported
}

// statusRefusedOnce is a dynamic client whose first status write fails
// (an apiserver that answers 500 once: etcd changing leaders).
type statusRefusedOnce struct {
	dynamic.Interface
	left *atomic.Int32
}

func (s statusRefusedOnce) Resource(gvr schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	return statusRefusedOnceRes{s.Interface.Resource(gvr), s.left}
}

type statusRefusedOnceRes struct {
	dynamic.NamespaceableResourceInterface
	left *atomic.Int32
}

func (r statusRefusedOnceRes) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) (*unstructured.Unstructured, error) {
	if len(sub) == 1 && sub[0] == "status" && r.left.Add(-1) >= 0 {
		return nil, apierrors.NewInternalError(errors.New("etcdserver: leader changed"))
	}
	return r.NamespaceableResourceInterface.Patch(ctx, name, pt, data, opts, sub...)
}

// TestFailedSignalIsNotResumed: a signal the provider refused, whose
// failure could not be written at once, is written failed when the step
// is retried — not taken for a signal recorded by a janitor that stopped
// (SignalSent=True/Recorded: "may have been sent", while this janitor knew
// the BMC had refused it), which held its slot and left the remediate role
// waiting reboot_timeout for a Timeout instead of the provider's reason.
func TestFailedSignalIsNotResumed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := context.Background()
	prov := &bmcRefuses{}
	left := &atomic.Int32{}
	left.Store(1)
	j, rec := e.janitor(e.config(), false, map[string]Provider{ProviderRedfish: prov})
	reg := j.reg
	reg.SetDynamic(cluster, statusRefusedOnce{e.dyn, left})
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "f1", Labels: map[string]string{AnnotationProvider: ProviderRedfish,
		events.LabelQuarantined: "true", labelDrain: "succeeded"}}}
	if _, err := e.kube.CoreV1().Nodes().Create(ctx, booted(n), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	run(t, j)
	e.create(kindReboot, "reboot-f1", "f1", false)
	o := e.wait(kindReboot, "reboot-f1", 10*time.Second)
	if got := condOf(o, CondSignalSent); got != "False/"+ReasonBMCAuthFailed {
		t.Fatalf("SignalSent %s, want False/%s; status %v", got, ReasonBMCAuthFailed, o.Object["status"])
	}
	if got := condOf(o, CondNodeReady); got != "False/"+ReasonBMCAuthFailed {
		t.Fatalf("NodeReady %s, want False/%s", got, ReasonBMCAuthFailed)
	}
	if n := prov.calls.Load(); n != 1 {
		t.Fatalf("%d signals sent, want 1", n)
	}
	rec.expect(t, "f1", []string{"reboot/failed", "reboot/failed"}) // the same action (id) again with the retried step
	if held := j.lim.inProgress(cluster); held != 0 {
		t.Fatalf("%d slots held after the failure", held)
	}
}
