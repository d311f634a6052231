package janitor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/internal/warnlimit"
)

// TestLeaderElection: two janitors serve one cluster (a standby, a
// rollout); only the holder of the cluster's Lease works it, so the
// concurrency limits are counted once.
//   - The one that leads (faultline_janitor_leader 1, the Lease's holder)
//     sends the signal of a reboot; the other sends nothing.
//   - Stopped, it releases the Lease and the other works the next reboot
//     within a renewal period, not a lease_duration.
//   - A leader whose API server stops answering its renewals stops working
//     the cluster within two thirds of lease_duration; another takes the
//     Lease once lease_duration has passed, and works the next reboot.
func TestLeaderElection(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	cfg := e.config()
	// The holder gives the cluster up within a retry period and the renew
	// deadline of its last renewal (4/5 of lease_duration), a fifth of it
	// before another may take it: 1 s here, room for a loaded machine.
	cfg.LeaseDuration = 5 * time.Second
	type replica struct {
		j     *Janitor
		sig   *signals
		stop  func()
		delay *atomic.Int64 // of its requests to the API server
	}
	start := func(identity string) *replica {
		r := &replica{delay: new(atomic.Int64)}
		c := cfg
		c.Identity = identity
		kc, err := kubernetes.NewForConfig(testenv.Delayed(e.kc.RESTConfig(), r.delay))
		if err != nil {
			t.Fatal(err)
		}
		prov := e.providers(c)
		r.sig = &signals{Provider: prov[ProviderRedfish], n: map[string]int{}}
		prov[ProviderRedfish] = r.sig
		r.j = e.janitorOn(kc, e.dyn, &recorder{}, c, false, prov) // its own client, delayed at will
		r.stop = run(t, r.j)
		return r
	}
	leads := func(r *replica) bool { return testutil.ToFloat64(r.j.m.leader.WithLabelValues(cluster)) == 1 }
	holder := func() string {
		l, err := e.kube.CoordinationV1().Leases(cfg.LeaseNamespace).Get(context.Background(), LeaseName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	// leader waits until exactly one of rs works the cluster and holds the
	// Lease, and returns it.
	leader := func(within time.Duration, rs ...*replica) *replica {
		t.Helper()
		for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
			var led []*replica
			for _, r := range rs {
				if leads(r) {
					led = append(led, r)
				}
			}
			if len(led) == 1 && holder() == led[0].j.leaseID {
				return led[0]
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %v: %d janitors work the cluster, the Lease's holder is %q", within, len(led), holder())
			}
		}
	}
	reboot := func(node string, sys int) {
		t.Helper()
		e.node(node, sysID(sys), true, nil)
		e.create(kindReboot, node, node, false)
		if o := e.wait(kindReboot, node, 60*time.Second); condOf(o, CondNodeReady) != "True/Succeeded" {
			t.Fatalf("%s: NodeReady %s (status %v)", node, condOf(o, CondNodeReady), o.Object["status"])
		}
	}
	signalled := func(r *replica) int { return r.sig.count()["reboot/graceful"] }

	a, b := start("janitor-a"), start("janitor-b")
	first := leader(10*time.Second, a, b)
	for _, r := range []*replica{a, b} {
		if got := testutil.ToFloat64(r.j.m.watchable.WithLabelValues(cluster)); got != 1 {
			t.Errorf("faultline_janitor_cluster_watchable of a cluster with a client = %v, want 1", got)
		}
	}
	other := map[*replica]*replica{a: b, b: a}[first]
	reboot("leader-1", 0)
	if signalled(first) != 1 || len(other.sig.count()) != 0 {
		t.Fatalf("the leader sent %v, the other %v; want one reboot by the leader alone", first.sig.count(), other.sig.count())
	}

	// Stopped: the Lease is released, and the other leads at once.
	stopped := time.Now()
	first.stop()
	if leads(first) {
		t.Fatal("a stopped janitor still says it works the cluster")
	}
	if next := leader(cfg.LeaseDuration, other); next != other {
		t.Fatal("unreachable")
	}
	t.Logf("the other janitor led %v after the leader stopped (lease_duration %v)", time.Since(stopped).Round(time.Millisecond), cfg.LeaseDuration)
	reboot("leader-2", 1)
	if signalled(other) != 1 {
		t.Fatalf("the new leader sent %v, want the reboot", other.sig.count())
	}

	// A third janitor joins; the leader's API server stops answering.
	c := start("janitor-c")
	time.Sleep(cfg.LeaseDuration / 2)
	if leads(c) {
		t.Fatal("a joining janitor works the cluster beside its leader")
	}
	// lastRenewal is the newest renewal of the cut-off leader the API server
	// accepted (its renewTime, stamped by the leader before sending): another
	// may take the Lease only lease_duration after it. It can precede the cut
	// by a retry period plus a renewal's round trip (slow on a loaded machine).
	var lastRenewal time.Time
	sawRenewal := func() {
		l, err := e.kube.CoordinationV1().Leases(cfg.LeaseNamespace).Get(context.Background(), LeaseName, metav1.GetOptions{})
		if err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == other.j.leaseID && l.Spec.RenewTime != nil && l.Spec.RenewTime.After(lastRenewal) {
			lastRenewal = l.Spec.RenewTime.Time
		}
	}
	cut := time.Now()
	other.delay.Store(int64(time.Hour))
	for !time.Now().After(cut.Add(cfg.LeaseDuration)) && leads(other) {
		sawRenewal()
		time.Sleep(20 * time.Millisecond)
	}
	sawRenewal()
	if leads(other) {
		t.Fatalf("the leader still works the cluster %v after its renewals stopped (renew deadline %v)", time.Since(cut).Round(time.Millisecond), cfg.LeaseDuration*2/3)
	}
	t.Logf("the leader stopped working the cluster %v after its API server stopped answering", time.Since(cut).Round(time.Millisecond))
	if next := leader(3*cfg.LeaseDuration, c); next != c {
		t.Fatal("unreachable")
	}
	if lastRenewal.IsZero() {
		t.Fatal("no renewal of the cut-off leader seen on the Lease")
	}
	if took := time.Since(lastRenewal); took < cfg.LeaseDuration {
		t.Fatalf("the Lease was taken %v after the cut-off leader's last renewal (%v after the cut), before its lease_duration (%v) could pass", took, time.Since(cut), cfg.LeaseDuration)
	}
	t.Logf("the third janitor took the Lease %v after the cut-off leader's last renewal, %v after the cut", time.Since(lastRenewal).Round(time.Millisecond), time.Since(cut).Round(time.Millisecond))
	reboot("leader-3", 2)
	if signalled(c) != 1 || signalled(other) != 1 {
		t.Fatalf("the third janitor sent %v, the cut-off one %v; want the reboot by the third alone", c.sig.count(), other.sig.count())
	}
	other.delay.Store(0)
}

// TestMaintenanceFollowsTheLease: two janitors serve the maintenance
// cluster; only the holder of its Lease reports its nodes' EC2 maintenance
// events, and what it reported is kept in the cluster (the ConfigMap
// MaintenanceStateName), so that the next holder goes on from it (a real
// kube-apiserver, its Lease and node cache; EC2's answers made up: moto
// has no scheduled events).
//   - Stopped, the holder reports nothing more, no recovery of what it
//     reported.
//   - The next holder reports the end of a maintenance that ended during
//     the handover, and not again the one that still stands; a restarted
//     monitor neither, and then its end.
//
// Before the state was kept, the next holder knew nothing of what the
// first reported: it reported the standing event again (a second row) and
// never the end of the one that ended meanwhile.
func TestMaintenanceFollowsTheLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	cfg := e.config()
	cfg.LeaseDuration = 5 * time.Second
	cfg.AWS.MaintenanceRegions, cfg.AWS.MaintenanceCluster = []string{"us-east-1"}, cluster
	for i, id := range []string{"i-0maint1", "i-0maint2"} {
		if _, err := e.kube.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("maint-%d", i+1)},
			Spec: corev1.NodeSpec{ProviderID: "aws:///us-east-1a/" + id}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w := &withEvents{EC2API: instancesOnly{"i-0maint1", "i-0maint2", "i-0other"}, events: map[string][]ec2types.InstanceStatusEvent{}}
	now := time.Now()
	for i, id := range []string{"i-0maint1", "i-0maint2", "i-0other"} { // i-0other: no node of the cluster
		w.set(id, ec2types.InstanceStatusEvent{Code: ec2types.EventCodeSystemReboot, InstanceEventId: aws.String(fmt.Sprintf("instance-event-%d", i)),
			NotBefore: aws.Time(now.Add(time.Hour)), NotAfter: aws.Time(now.Add(2 * time.Hour))})
	}
	type replica struct {
		j    *Janitor
		stop func()
		mon  *MaintenanceMonitor
		p    *flakyProducer
	}
	monitor := func(j *Janitor) *MaintenanceMonitor {
		mon, err := j.MaintenanceMonitor(cfg.AWS)
		if err != nil {
			t.Fatal(err)
		}
		mon.build = func(string) (EC2API, error) { return w, nil }
		return mon
	}
	start := func(identity string) *replica {
		c := cfg
		c.Identity = identity
		r := &replica{j: e.janitorTo(&recorder{}, c, false, nil), p: &flakyProducer{}}
		r.stop = run(t, r.j)
		r.mon = monitor(r.j)
		return r
	}
	report := func(r *replica) []string { return reportedBy(t, r.mon, r.p) }
	works := func(r *replica) bool { _, ok := r.j.InstanceNodes(cluster)(); return ok }
	a, b := start("janitor-a"), start("janitor-b")
	var first, other *replica
	for deadline := time.Now().Add(15 * time.Second); first == nil; time.Sleep(100 * time.Millisecond) {
		for _, r := range []*replica{a, b} {
			if works(r) {
				first, other = r, map[*replica]*replica{a: b, b: a}[r]
			}
		}
		if first == nil && time.Now().After(deadline) {
			t.Fatal("no janitor works the cluster after 15 s")
		}
	}
	if got := report(first); !slices.Equal(got, []string{"maint-1 healthy=false", "maint-2 healthy=false"}) {
		t.Fatalf("the Lease's holder reported %q, want the maintenances of maint-1 and maint-2", got)
	}
	if got := report(other); len(got) != 0 {
		t.Fatalf("the standby reported %q", got)
	}
	polls := func(r *replica, outcome string) float64 {
		return testutil.ToFloat64(r.j.m.maintenancePolls.WithLabelValues(outcome))
	}
	if ok, failed := polls(other, "ok"), polls(other, "failed"); ok != 0 || failed != 0 {
		t.Fatalf("the standby counted %v polls ok and %v failed, want none", ok, failed)
	}
	first.stop()
	if got := report(first); len(got) != 0 {
		t.Fatalf("a janitor that stopped working the cluster reported %q", got)
	}
	w.set("i-0maint1") // done during the handover, gone from EC2's answer
	for deadline := time.Now().Add(3 * cfg.LeaseDuration); !works(other); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the other janitor does not work the cluster %v after the holder stopped", 3*cfg.LeaseDuration)
		}
	}
	if got := report(other); !slices.Equal(got, []string{"maint-1 healthy=true"}) {
		t.Fatalf("the new holder reported %q, want the end of maint-1's maintenance alone (maint-2's was reported)", got)
	}
	cm, err := e.kube.CoreV1().ConfigMaps(cfg.LeaseNamespace).Get(context.Background(), MaintenanceStateName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if kept := cm.Data[maintenanceStateKey]; !strings.Contains(kept, `"node":"maint-2"`) || strings.Contains(kept, "maint-1") {
		t.Fatalf("the state kept %s, want maint-2's maintenance alone", kept)
	}
	other.mon = monitor(other.j) // restarted
	if got := report(other); len(got) != 0 {
		t.Fatalf("a restarted monitor reported %q, what was reported before", got)
	}
	w.set("i-0maint2")
	if got := report(other); !slices.Equal(got, []string{"maint-2 healthy=true"}) {
		t.Fatalf("the restarted monitor reported %q at the maintenance's end, want its recovery", got)
	}
	if got := report(first); len(got) != 0 {
		t.Fatalf("the stopped janitor reported %q", got)
	}
	if ok, failed := polls(first, "ok"), polls(first, "failed"); ok != 1 || failed != 0 {
		t.Fatalf("the first holder counted %v polls ok and %v failed, want its one poll as the holder", ok, failed)
	}
	if ok, failed := polls(other, "ok"), polls(other, "failed"); ok != 3 || failed != 0 {
		t.Fatalf("the new holder counted %v polls ok and %v failed, want 3 ok", ok, failed)
	}
}

// TestWarnedLockOnceAMinute: the errors that keep a janitor from its
// Lease are warned of once a minute, not at every try of the elector; a
// missing Lease (created next) is not warned of.
func TestWarnedLockOnceAMinute(t *testing.T) {
	t.Parallel()
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, LeaseName, errors.New("no RBAC"))
	failing := &failingLock{err: forbidden}
	warned := 0
	l := &warnedLock{Interface: failing, spaced: warnlimit.New(time.Minute, 1), warn: func(error) { warned++ }}
	for range 3 {
		if _, _, err := l.Get(context.Background()); !apierrors.IsForbidden(err) {
			t.Fatalf("Get: %v, want the lock's error", err)
		}
		if err := l.Update(context.Background(), resourcelock.LeaderElectionRecord{}); !apierrors.IsForbidden(err) {
			t.Fatalf("Update: %v, want the lock's error", err)
		}
	}
	if warned != 1 {
		t.Fatalf("warned %d times in six failed tries, want once", warned)
	}
	failing.err = apierrors.NewNotFound(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, LeaseName)
	l.spaced = warnlimit.New(time.Minute, 1)
	if _, _, err := l.Get(context.Background()); !apierrors.IsNotFound(err) || warned != 1 {
		t.Fatalf("a missing Lease: %v, warned %d times, want NotFound and no warning", err, warned)
	}
}

// failingLock is a Lease lock whose every call fails with err.
type failingLock struct {
	resourcelock.Interface
	err error
}

func (f *failingLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	return nil, nil, f.err
}

func (f *failingLock) Update(context.Context, resourcelock.LeaderElectionRecord) error { return f.err }
