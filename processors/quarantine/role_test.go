package quarantine

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/role"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// TestRoleThroughKafka runs the role as `faultline process` does (Open,
// then role.Role.Run: the events consumer, the retry consumer and the
// uncordon loop) over a real Kafka broker: events from the events topic,
// the cluster reached through its kubeconfig file, decisions on the
// actions topic. With the apiserver stopped, the record is deferred to the
// retry topic (the test reads it there), and the retry consumer applies
// it once the apiserver is back.
func TestRoleThroughKafka(t *testing.T) {
	t.Parallel() // its own servers; mostly waiting
	e := startRoleEnv(t, "role", "role-1", "role-2")
	kube := e.kube
	stop := e.start(e.deps, 0, 1)
	tap := newTap(e.ctx, t, e.kafka)
	produce, waitFor, applied := tap.produce, tap.waitFor, tap.applied

	produce(record("prod", fatal("role-1", "XID_ERROR_48", "GPU-1")))
	waitFor("quarantine/applied action for role-1", 60*time.Second, applied("role-1", events.KindQuarantine))
	if !getNode(t, kube.Client(), "role-1").Spec.Unschedulable {
		t.Fatal("role-1 not cordoned")
	}
	tap.mu.Lock()
	if n := len(tap.retried); n != 0 {
		t.Fatalf("%d records deferred while the cluster was up", n)
	}
	tap.mu.Unlock()

	kube.Stop()
	produce(record("prod", fatal("role-2", "XID_ERROR_48", "GPU-1")))
	// The record goes to the retry topic, with its key and an attempt
	// count; nothing is decided while the apiserver is down.
	waitFor("record for role-2 on the retry topic", 60*time.Second, func() bool { return tap.deferred("prod/role-2") == 1 })
	tap.mu.Lock()
	for _, r := range tap.retried {
		if got := header(r, HeaderRetryAttempt); got != "1" {
			t.Errorf("retry record %s: attempt header %q, want 1", r.Key, got)
		}
	}
	if applied("role-2", events.KindQuarantine)() {
		t.Fatal("role-2 decided while its apiserver was down")
	}
	tap.mu.Unlock()
	kube.Start()
	waitFor("quarantine/applied action for role-2 after the outage", 90*time.Second, applied("role-2", events.KindQuarantine))
	if !getNode(t, kube.Client(), "role-2").Spec.Unschedulable {
		t.Fatal("role-2 not cordoned after the outage")
	}
	stop()
}

// TestRoleFirstStartSkipsOldRecords: the role's first start (no committed
// offset) on a topic holding days of events reads it from
// quarantine.max_event_age back (real Kafka: the broker's timestamp index),
// not from its start: a fault received 3 days ago is not even read (no
// action), the node's fresh fault behind it (same partition, its actions
// after the old one's would be) cordons.
func TestRoleFirstStartSkipsOldRecords(t *testing.T) {
	t.Parallel() // its own servers; mostly waiting
	e := startRoleEnv(t, "firststart", "firststart-1")
	tap := newTap(e.ctx, t, e.kafka)
	old := time.Now().Add(-72 * time.Hour)
	ev := fatal("firststart-1", "XID_ERROR_48", "GPU-1")
	ev.GeneratedTimestamp, ev.ReceivedTimestamp = timestamppb.New(old), timestamppb.New(old)
	r := record("prod", ev)
	r.Timestamp = old // as the gateway produced it then
	tap.produce(r)
	tap.produce(record("prod", fatal("firststart-1", "XID_ERROR_79", "GPU-2")))
	stop := e.start(e.deps, 0)
	tap.waitFor("quarantine/applied action for firststart-1", 60*time.Second, tap.applied("firststart-1", events.KindQuarantine))
	stop()
	tap.mu.Lock()
	defer tap.mu.Unlock()
	for _, a := range tap.actions {
		if slices.Contains(a.GetEventIds(), ev.GetId()) {
			t.Errorf("the fault received 3 days ago was read: action %s/%s %q, want none", a.Kind, a.Outcome, a.Reason)
		}
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// TestRestartKeepsNodeOrderBehindRetries: a fault deferred to the retry
// topic during an outage by a replica that then stopped, and the node's
// recovery sent after it. The replica started next must not apply the
// recovery before the retry consumer applied the fault (the fault would
// then cordon a healthy node): it defers the recovery behind it, while
// another node of the same cluster is decided at once. Once the retry
// topic is consumed, the node's records are decided at once again.
func TestRestartKeepsNodeOrderBehindRetries(t *testing.T) {
	t.Parallel() // its own servers; mostly waiting
	e := startRoleEnv(t, "order", "order-1", "order-2")
	ctx, kube, k, deps, start := e.ctx, e.kube, e.kafka, e.deps, e.start
	// Replica A reaches the cluster through a dead address (the cluster
	// down for it, quicker than stopping the apiserver).
	down := deps
	down.Kube.Clusters = []clusters.Cluster{{Name: "prod", Kubeconfig: deadKubeconfig(t, kube)}}
	tap := newTap(ctx, t, k)

	stopA := start(down, 0, 1)
	tap.produce(record("prod", fatal("order-1", "XID_ERROR_48", "GPU-1")))
	tap.waitFor("the fault of order-1 on the retry topic", 60*time.Second, func() bool { return tap.deferred("prod/order-1") == 1 })
	stopA()

	// The next replica's events consumer runs alone: the fault waits.
	tap.produce(record("prod", healthy("order-1", "XID_ERROR_48", "GPU-1")))
	tap.produce(record("prod", fatal("order-2", "XID_ERROR_48", "GPU-1")))
	stopB := start(deps, 0)
	defer stopB()
	tap.waitFor("order-2 quarantined", 60*time.Second, tap.applied("order-2", events.KindQuarantine))
	tap.waitFor("the recovery of order-1 deferred behind its fault", 30*time.Second, func() bool { return tap.deferred("prod/order-1") == 2 })

	stopC := start(deps, 1)
	defer stopC()
	tap.waitFor("order-1 quarantined, then lifted", 90*time.Second, tap.applied("order-1", events.KindUnquarantine))
	if getNode(t, kube.Client(), "order-1").Spec.Unschedulable {
		t.Fatal("order-1 cordoned after its recovery")
	}
	tap.mu.Lock()
	var kinds []string
	for _, a := range tap.actions {
		if a.Node == "order-1" {
			kinds = append(kinds, a.Kind+"/"+a.Outcome)
		}
	}
	tap.mu.Unlock()
	if want := []string{"quarantine/applied", "unquarantine/applied"}; !slices.Equal(kinds, want) {
		t.Fatalf("order-1's actions %v, want %v", kinds, want)
	}

	// Consumed (and the replica's follower saw the group commit, within
	// its second): order-1's next fault is decided at once.
	adm := k.Admin(t)
	tap.waitFor("the retry group's commit", 30*time.Second, func() bool {
		lags, err := adm.Lag(ctx, retryGroup)
		if err != nil {
			return false
		}
		l := lags[retryGroup]
		return l.Error() == nil && l.Lag.Total() == 0 && len(l.Lag) > 0
	})
	time.Sleep(5 * time.Second)
	tap.produce(record("prod", fatal("order-1", "XID_ERROR_48", "GPU-2")))
	tap.waitFor("order-1 quarantined again", 60*time.Second, func() bool {
		n := 0
		for _, a := range tap.actions {
			if a.Node == "order-1" && a.Kind == events.KindQuarantine && a.Outcome == events.OutcomeApplied {
				n++
			}
		}
		return n == 2
	})
	tap.mu.Lock()
	defer tap.mu.Unlock()
	if n := tap.deferred("prod/order-1"); n != 2 {
		t.Fatalf("order-1's fault after the retry topic was consumed deferred (%d records of it there)", n)
	}
}

// TestFaultsHeldThroughALongOutageAct: a fault deferred while its
// cluster is down for longer than max_event_age (here 3s), the replica
// that deferred it stopped meanwhile, is cordoned by the next replica's
// retry consumer once the cluster answers: it was fresh when read and
// held since, not replayed. (Judged stale there, it was recorded as not
// acted on and its node, whose GPU reports such a fault once, stayed in
// service.) The retry group, started by the first replica, committed its
// start, so the second does not start it max_event_age back from its own
// time either.
func TestFaultsHeldThroughALongOutageAct(t *testing.T) {
	t.Parallel() // its own servers; mostly waiting
	e := startRoleEnv(t, "aged", "aged-1")
	e.cfg.MaxEventAge = 3 * time.Second
	tap := newTap(e.ctx, t, e.kafka)
	down := e.deps
	down.Kube.Clusters = []clusters.Cluster{{Name: "prod", Kubeconfig: deadKubeconfig(t, e.kube)}}
	stopA := e.start(down, 0, 1)
	// The events group's first assignment starts each partition
	// max_event_age (3s) back from its own time, so a fault produced more
	// than 3s before a slow join (CI saw it under load) is before its start
	// and never read: produced once the group committed its starts.
	adm := kadm.NewClient(tap.cl)
	tap.waitFor("the events group's starts committed", 60*time.Second, func() bool {
		offs, err := adm.FetchOffsets(e.ctx, pipeline.DefaultGroup(Role))
		return err == nil && len(offs[Topics[0]]) > 0
	})
	ev := fatal("aged-1", "XID_ERROR_48", "GPU-1")
	ev.ReceivedTimestamp = timestamppb.Now()
	tap.produce(record("prod", ev))
	tap.waitFor("the fault on the retry topic", 60*time.Second, func() bool { return tap.deferred("prod/aged-1") == 1 })
	time.Sleep(time.Until(ev.GetReceivedTimestamp().AsTime().Add(e.cfg.MaxEventAge + time.Second)))
	stopA()

	stopB := e.start(e.deps, 1)
	defer stopB()
	tap.waitFor("the held fault applied", 60*time.Second, func() bool {
		return slices.ContainsFunc(tap.actions, func(a *faultlinev1.Action) bool {
			return a.Node == "aged-1" && a.Kind == events.KindQuarantine && a.Outcome != events.OutcomeFailed
		})
	})
	tap.mu.Lock()
	defer tap.mu.Unlock()
	for _, a := range tap.actions {
		if a.Node == "aged-1" && a.Kind == events.KindQuarantine && a.Outcome != events.OutcomeApplied {
			t.Fatalf("the held fault decided %s: %s", a.Outcome, a.Reason)
		}
	}
	if !getNode(t, e.kube.Client(), "aged-1").Spec.Unschedulable {
		t.Fatal("aged-1 not cordoned")
	}
}

// TestDownClusterHoldsOnlyItsOwnRetries: cluster "down" is down for the
// whole test, its record waiting on its retry topic, the retry consumer
// failing on it; cluster "prod" blinks (for replica A), and its record
// deferred meanwhile is applied by the retry consumer while "down" stays
// down. (With one retry topic for every cluster, and the retry consumer
// retrying a failed batch before it polled again, prod's record waited
// for "down" to come back.) The retry topic of a cluster no longer
// configured is read too: its record decided as an unknown cluster's.
func TestDownClusterHoldsOnlyItsOwnRetries(t *testing.T) {
	e := startRoleEnv(t, "hol", "hol-1")
	dead := deadKubeconfig(t, e.kube)
	tap := newTap(e.ctx, t, e.kafka)
	blinking := e.deps
	blinking.Kube.Clusters = []clusters.Cluster{{Name: "prod", Kubeconfig: dead}, {Name: "down", Kubeconfig: dead}}
	stopA := e.start(blinking, 0)
	defer stopA()
	tap.produce(record("down", fatal("hol-1", "XID_ERROR_48", "GPU-1")))
	tap.waitFor("down's record on its retry topic", 60*time.Second, func() bool { return tap.deferred("down/hol-1") == 1 })

	// A cluster since removed from the configuration left a record on
	// its retry topic: read, and decided as an unknown cluster's.
	if err := kafka.CreateTopics(e.ctx, e.deps.Kafka, testLog, RetryTopic("gone")); err != nil {
		t.Fatal(err)
	}
	left := record("gone", fatal("hol-1", "XID_ERROR_48", "GPU-1"))
	left.Topic = RetryTopic("gone")
	tap.produce(left)

	back := e.deps
	back.Kube.Clusters = []clusters.Cluster{{Name: "prod", Kubeconfig: e.kube.Kubeconfig()}, {Name: "down", Kubeconfig: dead}}
	stopB := e.start(back, 1)
	defer stopB()
	time.Sleep(2 * time.Second) // B's retry consumer fails on down's record, again and again
	tap.produce(record("prod", fatal("hol-1", "XID_ERROR_48", "GPU-1")))
	tap.waitFor("prod's record on its retry topic", 60*time.Second, func() bool { return tap.deferred("prod/hol-1") == 1 })
	tap.waitFor("prod's deferred record applied while down stays down", 60*time.Second, tap.applied("hol-1", events.KindQuarantine))
	if !getNode(t, e.kube.Client(), "hol-1").Spec.Unschedulable {
		t.Fatal("prod's hol-1 not cordoned")
	}
	tap.waitFor("the removed cluster's record decided", 30*time.Second, func() bool {
		return slices.ContainsFunc(tap.actions, func(a *faultlinev1.Action) bool { return a.Cluster == "gone" })
	})
	tap.mu.Lock()
	defer tap.mu.Unlock()
	for _, a := range tap.actions {
		if a.Cluster == "down" {
			t.Fatalf("decided for the cluster that is down: %v", a)
		}
		if a.Cluster == "gone" && (!a.DryRun || a.Outcome != events.OutcomeDryRun) {
			t.Fatalf("the removed cluster's record decided as %s/%s, dry-run %v", a.Kind, a.Outcome, a.DryRun)
		}
	}
	for _, r := range tap.retried {
		if c, _, _ := pipeline.EventKey(r); r.Topic != RetryTopic(c) {
			t.Errorf("%s's record deferred to %s", c, r.Topic)
		}
	}
}

// deadKubeconfig is kube's kubeconfig with a dead server address: the
// cluster down for whoever uses it, quicker than stopping the apiserver.
func deadKubeconfig(t *testing.T, kube *testenv.Kube) string {
	kc, err := os.ReadFile(kube.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	server := regexp.MustCompile(`server: \S+`)
	dead := filepath.Join(t.TempDir(), "dead.kubeconfig")
	if err := os.WriteFile(dead, server.ReplaceAll(kc, []byte("server: https://127.0.0.1:1")), 0o600); err != nil {
		t.Fatal(err)
	}
	return dead
}

// roleEnv is a real apiserver (cluster "prod", nodes of a group) and a
// real broker with the pipeline's topics, for the role as `faultline
// process` runs it.
type roleEnv struct {
	t     *testing.T
	ctx   context.Context
	kube  *testenv.Kube
	kafka *testenv.Kafka
	cfg   Config
	deps  role.Deps
}

func startRoleEnv(t *testing.T, group string, nodes ...string) *roleEnv {
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	k := testenv.StartKafka(t)
	createNodes(t, kube.Client(), group, nodes...)
	kcfg := kafka.DefaultConfig()
	kcfg.Brokers, kcfg.Partitions, kcfg.ReplicationFactor = k.Addr(), 3, 1
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := kafka.CreatePipelineTopics(ctx, kcfg, testLog); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(group)
	cfg.ClusterWait = 300 * time.Millisecond
	deps := role.Deps{Log: testLog, Kafka: kcfg, Kube: clusters.DefaultConfig()}
	deps.Kube.Clusters = []clusters.Cluster{{Name: "prod", Kubeconfig: kube.Kubeconfig()}}
	return &roleEnv{t: t, ctx: ctx, kube: kube, kafka: k, cfg: cfg, deps: deps}
}

// start runs a replica (Open, Run) with deps and the chosen consumers (0:
// events, 1: retry) until stop.
func (e *roleEnv) start(deps role.Deps, consumers ...int) (stop func()) {
	e.t.Helper()
	r, err := Open(e.ctx, e.cfg, deps)
	if err != nil {
		e.t.Fatal(err)
	}
	var cs []role.Consumer
	for _, i := range consumers {
		c := r.Consumers[i]
		c.Pipeline.MaxBackoff = 500 * time.Millisecond
		cs = append(cs, c)
	}
	r.Consumers = cs
	rctx, rcancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx, deps) }()
	return func() {
		rcancel()
		if err := <-done; err != nil {
			e.t.Fatal(err)
		}
	}
}

// tap reads the actions and retry topics of a test broker as they come.
type tap struct {
	t   *testing.T
	ctx context.Context
	cl  *kgo.Client

	mu      sync.Mutex
	actions []*faultlinev1.Action
	retried []*kgo.Record
}

func newTap(ctx context.Context, t *testing.T, k *testenv.Kafka) *tap {
	// The retry topics of the tests' clusters, created here so the tap
	// reads them from their start whoever creates them.
	retryTopics := RetryTopics([]string{"prod", "down"})
	if err := kafka.CreateTopics(ctx, kafka.Config{Brokers: k.Addr(), Partitions: 3, ReplicationFactor: 1}, testLog, retryTopics...); err != nil {
		t.Fatal(err)
	}
	tp := &tap{t: t, ctx: ctx, cl: k.Client(t, kgo.ConsumeTopics(append(retryTopics, events.TopicActions)...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))}
	go func() {
		for ctx.Err() == nil {
			fs := tp.cl.PollFetches(ctx)
			tp.mu.Lock()
			fs.EachRecord(func(r *kgo.Record) {
				if strings.HasPrefix(r.Topic, TopicRetry) {
					tp.retried = append(tp.retried, r)
					return
				}
				if a, err := events.UnmarshalAction(r.Value); err == nil {
					tp.actions = append(tp.actions, a)
				}
			})
			tp.mu.Unlock()
		}
	}()
	return tp
}

func (tp *tap) produce(r *kgo.Record) {
	tp.t.Helper()
	r.Offset = 0
	pctx, pcancel := context.WithTimeout(tp.ctx, 10*time.Second)
	defer pcancel()
	if err := tp.cl.ProduceSync(pctx, r).FirstErr(); err != nil {
		tp.t.Fatal(err)
	}
}

// waitFor waits until ok (called with mu held) holds.
func (tp *tap) waitFor(what string, within time.Duration, ok func() bool) {
	tp.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		tp.mu.Lock()
		done := ok()
		tp.mu.Unlock()
		if done {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	tp.t.Fatalf("no %s within %v", what, within)
}

// applied returns whether an applied action of kind for node of cluster
// prod was read (call with mu held).
func (tp *tap) applied(node, kind string) func() bool {
	return func() bool {
		for _, a := range tp.actions {
			if a.Node == node && a.Cluster == "prod" && a.Kind == kind && a.Outcome == events.OutcomeApplied {
				return true
			}
		}
		return false
	}
}

// deferred counts the retry topic's records keyed key (call with mu held).
func (tp *tap) deferred(key string) int {
	n := 0
	for _, r := range tp.retried {
		if string(r.Key) == key {
			n++
		}
	}
	return n
}
