package drain

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	ktesting "k8s.io/client-go/testing"

	"github.com/faultline/faultline/processors/requeue"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

func TestPollDelay(t *testing.T) {
	for _, tc := range []struct {
		age, poll, want time.Duration
	}{
		{0, 5 * time.Second, time.Second},                      // just started: kubectl's 1s
		{3 * time.Second, 5 * time.Second, time.Second},        // a quarter is under the floor
		{8 * time.Second, 5 * time.Second, 2 * time.Second},    // a quarter of its age
		{20 * time.Second, 5 * time.Second, 5 * time.Second},   // reaches poll_interval
		{10 * time.Minute, 5 * time.Second, 5 * time.Second},   // never beyond it
		{0, 500 * time.Millisecond, 500 * time.Millisecond},    // a poll_interval under 1s wins
		{-time.Second, 5 * time.Second, time.Second},           // a clock step back
		{40 * time.Second, 30 * time.Second, 10 * time.Second}, // a longer poll_interval
	} {
		if got := pollDelay(tc.age, tc.poll); got != tc.want {
			t.Errorf("pollDelay(%v, %v) = %v, want %v", tc.age, tc.poll, got, tc.want)
		}
	}
}

// TestLookedAtSoonAfterCalls: a step that evicts is looked at again a
// second later, as a young drain is, however old the drain: one whose
// evictions failed through an outage has its pods seen gone a second
// after they are evicted, not poll_interval later; a step without calls
// keeps the delay of the drain's age.
func TestLookedAtSoonAfterCalls(t *testing.T) {
	const node = "n1"
	k := quarantinedWithPod(node)
	down := true
	k.PrependReactor("create", "pods", func(a ktesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "eviction" && down {
			return true, nil, apierrors.NewServiceUnavailable("apiserver restarting")
		}
		return false, nil, nil
	})
	cfg := testConfig()
	cfg.PollInterval = 5 * time.Second
	clk := &clock{t: time.Now().Truncate(time.Millisecond)} // requeue keeps milliseconds
	h := newHandler(t, cfg, k, clk, false)
	_, rq := handle(t, h, quarantineAction(node, "e1", "RESTART_VM", nil))
	if len(rq) != 1 {
		t.Fatalf("the step in the outage: %d requeues", len(rq))
	}
	clk.Add(30 * time.Second)
	down = false
	time.Sleep(200 * time.Millisecond) // the cluster's backoff: at most 100ms (newHandler)
	for _, tc := range []struct {
		what string
		want time.Duration
	}{
		{"the step that evicts, 30s into the drain", time.Second},
		{"the next, without calls", 5 * time.Second}, // a quarter of 31s, capped at poll_interval
	} {
		acts, next := handle(t, h, rq...)
		if len(next) != 1 {
			t.Fatalf("%s: %s, %d requeues", tc.what, outcomes(acts), len(next))
		}
		if got := requeue.NotBefore(next[0]).Sub(clk.Now()); got != tc.want {
			t.Errorf("%s: looked at again after %v, want %v", tc.what, got, tc.want)
		}
		rq = next
		clk.Add(time.Second)
	}
}

// TestStartSaidAcrossAFailedStep: a step that puts a new drain on the node
// and fails says the start when its write was answered, and the retry
// says it (again: the same id) either way — the failed step's write may
// have been taken with its answer lost, the apiserver killed mid-request.
func TestStartSaidAcrossAFailedStep(t *testing.T) {
	for _, tc := range []struct {
		name string
		// failing is the node patch that fails; lost: after the
		// apiserver took it.
		failing int
		lost    bool
	}{
		{"a later write fails", 2, false},
		{"the start's answer lost", 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const node = "n1"
			k := quarantinedWithPod(node)
			apply := ktesting.ObjectReaction(k.Tracker())
			var patches int
			k.PrependReactor("patch", "nodes", func(a ktesting.Action) (bool, runtime.Object, error) {
				if patches++; patches != tc.failing {
					return false, nil, nil
				}
				if !tc.lost {
					return true, nil, apierrors.NewInternalError(errors.New("etcd leader changed"))
				}
				if _, _, err := apply(a); err != nil {
					t.Error(err)
				}
				return true, nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
			})
			// The cluster's backoff sets the retry's time by the wall clock.
			clk := &clock{t: time.Now()}
			h := newHandler(t, testConfig(), k, clk, false)
			acts, rq := handle(t, h, quarantineAction(node, "e1", "RESTART_VM", nil))
			first := find(acts, events.OutcomeInProgress)
			if (first == nil) != tc.lost || len(rq) != 1 || patches != tc.failing {
				t.Fatalf("the failed step: %s, %d requeues, %d patches", outcomes(acts), len(rq), patches)
			}
			clk.Add(5 * time.Second)
			time.Sleep(200 * time.Millisecond) // the cluster's backoff: at most 100ms (newHandler)
			again, _ := handle(t, h, rq[0])
			if retry := find(again, events.OutcomeInProgress); retry == nil || first != nil && retry.Id != first.Id {
				t.Fatalf("the retry: %s", outcomes(again))
			}
		})
	}
}

// TestJoinedFaultSaid: a second fault during a drain joins it (no second
// drain) with one in_progress action naming the widened scope; its
// redelivery (its batch may have died before producing the action) says
// that action again, with its id, and nothing new.
func TestJoinedFaultSaid(t *testing.T) {
	const node = "n1"
	k := quarantinedWithPod(node)
	h := newHandler(t, testConfig(), k, &clock{t: time.Now()}, false)
	first, _ := handle(t, h, quarantineAction(node, "e1", "RESTART_VM", nil))
	if find(first, events.OutcomeInProgress) == nil {
		t.Fatalf("first fault: %s", outcomes(first))
	}
	second := quarantineAction(node, "e2", "RESTART_VM", nil)
	acts, _ := handle(t, h, second)
	joined := find(acts, events.OutcomeInProgress)
	if len(acts) != 1 || joined == nil || joined.Reason != ReasonJoined+" (node)" || joined.Id == first[0].Id {
		t.Fatalf("second fault: %s", outcomes(acts))
	}
	again, _ := handle(t, h, second)
	saidAgain := false
	for _, a := range again {
		saidAgain = saidAgain || a.Id == joined.Id
		if a.Id != first[0].Id && a.Id != joined.Id { // the start may be said again too (unaudited)
			t.Fatalf("the second fault redelivered said: %s", outcomes(again))
		}
	}
	if !saidAgain {
		t.Fatalf("the second fault redelivered did not say it joined: %s", outcomes(again))
	}
	// The first fault's redelivery says the start, never a join.
	if again, _ := handle(t, h, quarantineAction(node, "e1", "RESTART_VM", nil)); len(again) != 1 || again[0].Id != first[0].Id {
		t.Fatalf("the first fault redelivered said: %s", outcomes(again))
	}
}

// TestPodRefusalCountsAgainstThePod: an eviction the apiserver refuses
// for that pod (more than one PDB selects it, an admission webhook or a
// ValidatingAdmissionPolicy denies it, its namespace is terminating, its
// PDB's 403s) is noted on the pod and tried again
// at the pod's pace, the step going on and the cluster not backed off,
// until the pod's deadline gives it up naming the refusal. Before, it
// failed the step and backed the cluster off like an outage, holding every
// drain there, and the pod's attempts and reason were never recorded. An
// outage still backs the cluster off, the pod untouched; so does a webhook
// that cannot be called ("failed calling webhook"): it may be cluster-wide
// (an eviction interceptor whose pods are down, or on the node drained),
// and taken for the pod's refusal it gave every pod up at its deadline.
func TestPodRefusalCountsAgainstThePod(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		pods bool // the pod's own
	}{
		{"more than one PDB", &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 500,
			Message: "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."}}, true},
		{"a webhook's denial", &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 403,
			Message: `admission webhook "freeze.example.com" denied the request: no evictions during the training freeze`}}, true},
		{"a webhook's denial with the reason Forbidden", apierrors.NewForbidden(corev1.Resource("pods"), "p",
			errors.New(`admission webhook "freeze.example.com" denied the request: frozen`)), true},
		{"a ValidatingAdmissionPolicy's denial", apierrors.NewForbidden(corev1.Resource("pods"), "p",
			errors.New("ValidatingAdmissionPolicy 'no-evict' with binding 'no-evict' denied request: training pods stay")), true},
		{"503", apierrors.NewServiceUnavailable("apiserver restarting"), false},
		{"another 500", apierrors.NewInternalError(errors.New("etcd leader changed")), false},
		{"a 500 naming no reason", &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 500, Message: "etcdserver: request timed out"}}, false},
		{"a webhook not reached", apierrors.NewInternalError(errors.New(`failed calling webhook "freeze.example.com": context deadline exceeded`)), false},
		{"its namespace terminating", namespaceTerminating(), true},
		{"its PDB's DisruptedPods too big", apierrors.NewForbidden(policyv1.Resource("poddisruptionbudget"), "guard",
			errors.New("DisruptedPods map too big - too many evictions not confirmed by PDB controller")), true},
		{"its PDB's disruptions negative", apierrors.NewForbidden(policyv1.Resource("poddisruptionbudget"), "guard",
			errors.New("pdb disruptions allowed is negative")), true},
		{"timeout", apierrors.NewTimeoutError("request did not complete", 0), false},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, false},
		{"RBAC", apierrors.NewForbidden(corev1.Resource("pods/eviction"), "p",
			errors.New(`User "system:serviceaccount:faultline:drain" cannot create resource "pods/eviction" in API group "" in the namespace "work"`)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const node = "n1"
			k := quarantinedWithPod(node)
			refuseEvictions(k, tc.err)
			clk := &clock{t: time.Now().Truncate(time.Millisecond)}
			h := newHandler(t, testConfig(), k, clk, false)
			acts, rq := handle(t, h, quarantineAction(node, "e1", "RESTART_VM", nil))
			if len(rq) != 1 || find(acts, events.OutcomeFailed) != nil {
				t.Fatalf("first step: %s, %d requeues", outcomes(acts), len(rq))
			}
			ps := drainState(t, k, node).Pods[keyOf("work", "p")]
			if ps == nil {
				t.Fatal("pod not in the drain's state")
			}
			if !tc.pods {
				if !requeue.AfterTrouble(rq[0]) || ps.Attempts != 0 || ps.Reason != "" {
					t.Fatalf("an outage: requeued for the cluster %v, pod %+v; want the cluster backed off, the pod untouched",
						requeue.AfterTrouble(rq[0]), *ps)
				}
				return
			}
			if requeue.AfterTrouble(rq[0]) {
				t.Fatal("the pod's refusal backed the cluster off")
			}
			if ps.Attempts != 1 || !strings.Contains(ps.Reason, tc.err.Error()) || !ps.NextTry.Equal(clk.Now().Add(time.Second)) {
				t.Fatalf("pod %+v: want one attempt, the refusal, tried again after pdb_backoff", *ps)
			}
			// At its pace: not before NextTry, then again.
			if _, rq = handle(t, h, rq...); drainState(t, k, node).Pods[keyOf("work", "p")].Attempts != 1 {
				t.Fatal("tried again before its backoff")
			}
			clk.Add(time.Second)
			if _, rq = handle(t, h, rq...); drainState(t, k, node).Pods[keyOf("work", "p")].Attempts != 2 {
				t.Fatal("not tried again after its backoff")
			}
			// Its deadline (eviction_timeout) gives it up, naming the refusal.
			clk.Add(10 * time.Minute)
			acts, rq = handle(t, h, rq...)
			res := find(acts, events.OutcomeGaveUp)
			if res == nil || len(rq) != 0 || !strings.Contains(res.Reason, "not evicted by the timeout: evict pod work/p: "+tc.err.Error()) {
				t.Fatalf("at the deadline: %s, %d requeues", outcomes(acts), len(rq))
			}
		})
	}
}

// namespaceTerminating is the NamespaceLifecycle admission plugin's 403 to
// a create in a namespace being deleted.
func namespaceTerminating() error {
	err := apierrors.NewForbidden(corev1.Resource("pods/eviction"), "p",
		errors.New("unable to create new content in namespace work because it is being terminated"))
	err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{
		Type: corev1.NamespaceTerminatingCause, Message: "namespace work is being terminated", Field: "metadata.namespace"})
	return err
}

// refuseEvictions makes k's Eviction API answer err.
func refuseEvictions(k *fake.Clientset, err error) {
	k.PrependReactor("create", "pods", func(a ktesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "eviction" {
			return true, nil, err
		}
		return false, nil, nil
	})
}

// quarantinedWithPod is client-go's fake with node quarantined and one
// running pod on it; an eviction is answered and the pod stays (the fake
// deletes nothing), so a drain of the node runs on.
func quarantinedWithPod(node string) *fake.Clientset {
	k := fake.NewSimpleClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{events.LabelQuarantined: "true"}}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "work", UID: "uid-p"}, Spec: corev1.PodSpec{NodeName: node},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}})
	k.PrependReactor("create", "pods", func(a ktesting.Action) (bool, runtime.Object, error) {
		return a.GetSubresource() == "eviction", nil, nil
	})
	return k
}

// joinedResult is the result of a drain of a node with one pod on every
// GPU that a second fault joined: quarantine actions asking for first and
// second, with those details.
func joinedResult(t *testing.T, first string, firstD map[string]string, second string, secondD map[string]string) *faultlinev1.Action {
	t.Helper()
	const node = "n1"
	k := fake.NewSimpleClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{events.LabelQuarantined: "true"}}},
		// On every GPU: in the scope of any GPU's drain.
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "work", UID: "uid-p", Annotations: map[string]string{DefaultGPUAnnotation: "all"}},
			Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: corev1.PodRunning}})
	k.PrependReactor("create", "pods", func(a ktesting.Action) (bool, runtime.Object, error) {
		return a.GetSubresource() == "eviction", nil, nil
	})
	clk := &clock{t: time.Now().Truncate(time.Millisecond)}
	h := newHandler(t, testConfig(), k, clk, false)
	_, rq := handle(t, h, quarantineAction(node, "e1", first, firstD))
	if acts, _ := handle(t, h, quarantineAction(node, "e2", second, secondD)); find(acts, events.OutcomeInProgress) == nil {
		t.Fatalf("the second fault did not join: %s", outcomes(acts))
	}
	if err := k.CoreV1().Pods("work").Delete(context.Background(), "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	clk.Add(10 * time.Second)
	acts, _ := handle(t, h, rq...)
	res := find(acts, events.OutcomeSucceeded)
	if res == nil {
		t.Fatalf("no result: %s", outcomes(acts))
	}
	return res
}

// TestJoinedFaultRemediated: the result of a drain that faults joined asks
// remediate for what every one of them needs — a second GPU's reset adds
// its GPU to the reset, a fault asking for no remediation does not take
// the place of one that asks for a reboot, and a GPU's reset joining a
// drain that asks for nothing becomes the drain's remediation. Before, a
// GPU fault never changed the trigger and a whole-node fault always
// replaced it, so remediate reset only the first GPU, or skipped the
// reboot ("recommendedAction NONE: nothing to remediate"): the joined
// fault was never remediated and its node stayed quarantined.
func TestJoinedFaultRemediated(t *testing.T) {
	reset := func(g string) map[string]string { return map[string]string{events.DetailEntities: "GPU=" + g} }
	for _, tc := range []struct {
		name             string
		first, second    string
		firstD, secondD  map[string]string
		action, entities string
	}{
		{"a second GPU's reset", "COMPONENT_RESET", "COMPONENT_RESET", reset("GPU-A"), reset("GPU-B"), "COMPONENT_RESET", "GPU=GPU-A,GPU=GPU-B"},
		{"a fault asking for nothing keeps the reboot", "RESTART_BM", "NONE", nil, nil, "RESTART_BM", ""},
		{"a GPU's reset joining a drain that asks for nothing", "NONE", "COMPONENT_RESET", nil, reset("GPU-B"), "COMPONENT_RESET", "GPU=GPU-B"},
		{"a reboot joining a GPU's reset takes its place", "COMPONENT_RESET", "RESTART_BM", reset("GPU-A"), nil, "RESTART_BM", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := joinedResult(t, tc.first, tc.firstD, tc.second, tc.secondD)
			if res.RecommendedAction != tc.action || res.Details[events.DetailEntities] != tc.entities {
				t.Fatalf("the drain's result asks remediate for %s on %q, want %s on %q (event ids %v)",
					res.RecommendedAction, res.Details[events.DetailEntities], tc.action, tc.entities, res.EventIds)
			}
		})
	}
}

// TestResultSaysNewestFaultTime: a drain's result says when the newest of
// the faults it served was generated (events.DetailGeneratedAt, from the
// quarantine's actions), also when the fault that joined did not change
// what it asks for; remediate answers a fault older than a reboot that
// succeeded with that reboot.
func TestResultSaysNewestFaultTime(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	gen := func(d time.Duration) map[string]string {
		return map[string]string{events.DetailGeneratedAt: t0.Add(d).Format(time.RFC3339Nano)}
	}
	for _, tc := range []struct {
		name            string
		second          string
		firstG, secondG map[string]string
		want            string
	}{
		{"a newer fault that asks for nothing", "NONE", gen(0), gen(time.Minute), t0.Add(time.Minute).Format(time.RFC3339Nano)},
		{"an older fault that replaces the trigger", "RESTART_BM", gen(time.Minute), gen(0), t0.Add(time.Minute).Format(time.RFC3339Nano)},
		{"none said", "RESTART_BM", nil, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := joinedResult(t, "RESTART_BM", tc.firstG, tc.second, tc.secondG)
			if got, ok := res.Details[events.DetailGeneratedAt]; got != tc.want || ok != (tc.want != "") {
				t.Fatalf("the drain's result says %s %q, want %q", events.DetailGeneratedAt, got, tc.want)
			}
		})
	}
}

// TestJoinedFaultsFollowTheirDrain: with more faults than the state
// remembers (maxSeen: a fabric outage, many NIC ports and GPUs of one
// node failing), a chain whose id dropped out was taken for a new fault:
// while the drain ran it joined again (another "joined" action, pushing
// another chain's id out), and once the drain succeeded it started a new
// drain of the node — for the first fault under the old drain's id, for
// another a second remediation. A chain follows the drain it was admitted
// to (HeaderDrain, kept across a requeue for the cluster's trouble): it
// resumes it, says its result as a replay does, and ends. The drain's
// chain is its first fault's; a fault that joins starts none
// (TestJoinedFaultsStartNoChain).
func TestJoinedFaultsFollowTheirDrain(t *testing.T) {
	const (
		node   = "n1"
		faults = 40
	)
	k := quarantinedWithPod(node)
	down := false
	k.PrependReactor("list", "pods", func(ktesting.Action) (bool, runtime.Object, error) {
		if down {
			return true, nil, apierrors.NewServiceUnavailable("apiserver restarting")
		}
		return false, nil, nil
	})
	clk := &clock{t: time.Now().Truncate(time.Millisecond)}
	h := newHandler(t, testConfig(), k, clk, false)
	acts, rq := handle(t, h, quarantineAction(node, "e0", "RESTART_VM", nil))
	if find(acts, events.OutcomeInProgress) == nil || len(rq) != 1 {
		t.Fatalf("first fault: %s, %d requeues", outcomes(acts), len(rq))
	}
	said := map[string]bool{acts[0].Id: true}
	for i := 1; i < faults; i++ {
		// A GPU's reset after the reboot: the drain's remediation stays
		// the reboot; a new drain for it would be a second remediation.
		id := fmt.Sprintf("e%d", i)
		acts, next := handle(t, h, quarantineAction(node, id, "COMPONENT_RESET",
			map[string]string{events.DetailEntities: fmt.Sprintf("GPU=GPU-%d", i)}))
		if len(acts) != 1 || !strings.HasPrefix(acts[0].Reason, ReasonJoined) || len(next) != 0 {
			t.Fatalf("fault %s: %s, %d requeues", id, outcomes(acts), len(next))
		}
		said[acts[0].Id] = true
		rq = append(rq, next...)
	}
	st := drainState(t, k, node)
	drainID, joined := st.ID, st.encode()
	// The drain's chain steps it: once, once meeting the cluster in
	// trouble, once after it (which says again what the state holds, the
	// same ids). It joins nothing again.
	for round, trouble := range []bool{false, true, false} {
		down = trouble
		clk.Add(time.Second)
		time.Sleep(200 * time.Millisecond) // the cluster's backoff: at most 100ms (newHandler)
		acts, next := handle(t, h, rq...)
		var again int
		for _, a := range acts {
			if a.Outcome != events.OutcomeInProgress || !said[a.Id] {
				t.Fatalf("round %d while the drain runs: %s", round, outcomes([]*faultlinev1.Action{a}))
			}
			again++
		}
		if !trouble && round > 0 && again == 0 {
			t.Errorf("round %d after the cluster's trouble said nothing again", round)
		}
		if len(next) != 1 {
			t.Fatalf("round %d: %d chains go on, want 1", round, len(next))
		}
		for _, r := range next {
			if drainOf(r) != drainID || requeue.AfterTrouble(r) != trouble {
				t.Fatalf("round %d: a chain's record names drain %q (after trouble %v), want %q (%v)",
					round, drainOf(r), requeue.AfterTrouble(r), drainID, trouble)
			}
		}
		if now := drainState(t, k, node).encode(); now != joined {
			t.Fatalf("round %d changed the drain's state:\n%s\nwas\n%s", round, now, joined)
		}
		rq = next
	}
	// The pod goes; the drain succeeds at the chain's step, which says
	// its result and ends: no drain again.
	if err := k.CoreV1().Pods("work").Delete(context.Background(), "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for round := 0; len(rq) > 0; round++ {
		if round == 3 {
			t.Fatalf("%d chains still going after the drain ended", len(rq))
		}
		clk.Add(time.Second)
		acts, next := handle(t, h, rq...)
		for _, a := range acts {
			if a.Outcome != events.OutcomeSucceeded || a.Details[events.DetailDrainID] != drainID {
				t.Fatalf("round %d after the drain: %s (drain %s)", round, outcomes([]*faultlinev1.Action{a}), a.Details[events.DetailDrainID])
			}
		}
		rq = next
	}
	if st := drainState(t, k, node); st.ID != drainID || st.Phase != PhaseSucceeded {
		t.Fatalf("the node's drain: %s %s, want %s %s", st.ID, st.Phase, drainID, PhaseSucceeded)
	}
}

// TestJoinedFaultsStartNoChain: a fault repeating during a drain (a
// fatal Xid while a PDB holds the drain) joined it once per repeat, and
// each join started a requeue chain of its own: 51 repeats, 51 pod lists
// per poll round, eating the cluster's client QPS. The drain's follow-up
// chain is its starting fault's; a fault that joins or resumes it steps
// once and ends — after a step that met the cluster's trouble it is
// requeued, to say what that step may have left unsaid. A redelivered
// trigger (its batch died after the step) resumes the same way: the
// starter's goes on, a joined fault's ends.
func TestJoinedFaultsStartNoChain(t *testing.T) {
	const node = "n1"
	k := quarantinedWithPod(node)
	var lists atomic.Int64
	down := false
	k.PrependReactor("list", "pods", func(ktesting.Action) (bool, runtime.Object, error) {
		lists.Add(1)
		if down {
			return true, nil, apierrors.NewServiceUnavailable("apiserver restarting")
		}
		return false, nil, nil
	})
	clk := &clock{t: time.Now().Truncate(time.Millisecond)}
	h := newHandler(t, testConfig(), k, clk, false)
	first := quarantineAction(node, "e0", "RESTART_VM", nil)
	acts, rq := handle(t, h, first)
	if find(acts, events.OutcomeInProgress) == nil || len(rq) != 1 {
		t.Fatalf("first fault: %s, %d requeues", outcomes(acts), len(rq))
	}
	var repeats []*kgo.Record
	for i := 1; i <= 50; i++ {
		r := quarantineAction(node, fmt.Sprintf("e%d", i), "RESTART_VM", map[string]string{events.DetailAlreadyQuarantined: "true"})
		repeats = append(repeats, r)
		acts, next := handle(t, h, r)
		if len(acts) != 1 || !strings.HasPrefix(acts[0].Reason, ReasonJoined) || len(next) != 0 {
			t.Fatalf("repeat %d: %s, %d requeues; want joined, none", i, outcomes(acts), len(next))
		}
	}
	// A poll round: one list, one chain.
	clk.Add(time.Second)
	lists.Store(0)
	acts, rq = handle(t, h, rq...)
	if len(rq) != 1 || lists.Load() != 1 || drainOf(rq[0]) != drainState(t, k, node).ID {
		t.Fatalf("poll round: %d chains, %d pod lists, %s; want 1, 1", len(rq), lists.Load(), outcomes(acts))
	}
	// Redelivered: the starter's trigger goes on, the repeats' end.
	if _, next := handle(t, h, first); len(next) != 1 {
		t.Fatalf("the starter's trigger redelivered: %d requeues, want 1", len(next))
	}
	if _, next := handle(t, h, repeats...); len(next) != 0 {
		t.Fatalf("the repeats redelivered: %d requeues, want none", len(next))
	}
	// A repeat whose step meets the cluster's trouble is requeued; once
	// the cluster answers it says its join and ends.
	down = true
	_, next := handle(t, h, quarantineAction(node, "e99", "RESTART_VM", map[string]string{events.DetailAlreadyQuarantined: "true"}))
	if len(next) != 1 || !requeue.AfterTrouble(next[0]) {
		t.Fatalf("a repeat meeting the cluster's trouble: %d requeues, want 1 after trouble", len(next))
	}
	down = false
	clk.Add(time.Second)
	time.Sleep(200 * time.Millisecond) // the cluster's backoff: at most 100ms (newHandler)
	acts, next = handle(t, h, next...)
	if len(next) != 0 || len(acts) != 1 || !strings.HasPrefix(acts[0].Reason, ReasonJoined) {
		t.Fatalf("after the trouble: %s, %d requeues; want its join said, none", outcomes(acts), len(next))
	}
}

// TestRefusedWriteKeepsTheDrain: a write of the drain's state that the
// apiserver refuses for good (a 422: the node's annotations too large, a
// webhook's denial) dropped the running drain's follow-up: the node stayed
// "running" with nothing stepping it until a new fault came. The drain is
// now looked at again after max_pdb_backoff, and its failed action, said
// at each such look, keeps one id.
func TestRefusedWriteKeepsTheDrain(t *testing.T) {
	const node = "n1"
	k := quarantinedWithPod(node)
	refuse := false
	k.PrependReactor("patch", "nodes", func(ktesting.Action) (bool, runtime.Object, error) {
		if refuse {
			return true, nil, apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Node").GroupKind(), node, nil)
		}
		return false, nil, nil
	})
	clk := &clock{t: time.Now().Truncate(time.Millisecond)}
	cfg := testConfig()
	h := newHandler(t, cfg, k, clk, false)
	acts, rq := handle(t, h, quarantineAction(node, "e0", "RESTART_VM", nil))
	if find(acts, events.OutcomeInProgress) == nil || len(rq) != 1 {
		t.Fatalf("start: %s, %d requeues", outcomes(acts), len(rq))
	}
	drainID := drainState(t, k, node).ID
	// The pod goes; the write that says so is refused.
	if err := k.CoreV1().Pods("work").Delete(context.Background(), "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	refuse = true
	var failed string
	for round := range 2 {
		clk.Add(cfg.MaxPDBBackoff)
		acts, rq = handle(t, h, rq...)
		f := find(acts, events.OutcomeFailed)
		if f == nil || len(rq) != 1 || drainOf(rq[0]) != drainID ||
			!requeue.NotBefore(rq[0]).Equal(clk.Now().Add(cfg.MaxPDBBackoff).Truncate(time.Millisecond)) {
			t.Fatalf("round %d, write refused: %s, %d requeues; want failed, the drain looked at again after max_pdb_backoff", round, outcomes(acts), len(rq))
		}
		if failed != "" && f.Id != failed {
			t.Fatalf("round %d: failed action %s, want the same id %s", round, f.Id, failed)
		}
		failed = f.Id
	}
	refuse = false
	clk.Add(cfg.MaxPDBBackoff)
	acts, rq = handle(t, h, rq...)
	if find(acts, events.OutcomeSucceeded) == nil || len(rq) != 0 {
		t.Fatalf("write taken again: %s, %d requeues; want succeeded", outcomes(acts), len(rq))
	}
}

// TestThrottlingIsNotAPDB: only a 429 carrying a DisruptionBudget cause
// (the Eviction API's refusal under a PDB) is a PDB's refusal — blocked,
// or in a forced drain answered with a delete of grace period 0. Any other
// 429 is the apiserver throttling (API Priority and Fairness,
// max-in-flight): the cluster's error, the pod left as it was and the
// cluster backed off. Before, every 429 was a PDB's, so a forced drain
// deleted the pod with grace 0 when the apiserver was only busy.
func TestThrottlingIsNotAPDB(t *testing.T) {
	pdbRefusal := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	pdbRefusal.ErrStatus.Details.Causes = append(pdbRefusal.ErrStatus.Details.Causes, metav1.StatusCause{
		Type: policyv1.DisruptionBudgetCause, Message: "The disruption budget guard needs 1 healthy pods and has 1 currently"})
	throttled := apierrors.NewTooManyRequests("too many requests, please try again later", 1)
	for _, tc := range []struct {
		name  string
		err   error
		force bool
		// pdb: a PDB's refusal (blocked, or forced: deleted); else the
		// cluster's error.
		pdb bool
	}{
		{"a PDB's refusal", pdbRefusal, false, true},
		{"a PDB's refusal, forced", pdbRefusal, true, true},
		{"throttled", throttled, false, false},
		{"throttled, forced", throttled, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const node = "n1"
			k := quarantinedWithPod(node)
			refuseEvictions(k, tc.err)
			var deletes int
			k.PrependReactor("delete", "pods", func(ktesting.Action) (bool, runtime.Object, error) {
				deletes++
				return false, nil, nil
			})
			details := map[string]string{}
			if tc.force {
				details[events.DetailDrainOverrides], details[events.DetailSubmitterRole] = "force", "operator"
			}
			clk := &clock{t: time.Now().Truncate(time.Millisecond)}
			h := newHandler(t, testConfig(), k, clk, false)
			acts, rq := handle(t, h, quarantineAction(node, "e1", "RESTART_VM", details))
			if len(rq) != 1 {
				t.Fatalf("%s, %d requeues", outcomes(acts), len(rq))
			}
			ps := drainState(t, k, node).Pods[keyOf("work", "p")]
			if ps == nil {
				t.Fatal("pod not in the drain's state")
			}
			switch {
			case !tc.pdb:
				if deletes != 0 || !requeue.AfterTrouble(rq[0]) || ps.BlockedBy != "" || ps.Attempts != 0 || find(acts, events.OutcomeBlocked) != nil {
					t.Fatalf("throttled: %d deletes, cluster backed off %v, pod %+v, %s; want no delete, the cluster backed off, the pod untouched",
						deletes, requeue.AfterTrouble(rq[0]), *ps, outcomes(acts))
				}
			case tc.force:
				if deletes != 1 || ps.DeletedAt.IsZero() || requeue.AfterTrouble(rq[0]) {
					t.Fatalf("forced PDB refusal: %d deletes, pod %+v; want it deleted", deletes, *ps)
				}
			default:
				b := find(acts, events.OutcomeBlocked)
				if deletes != 0 || b == nil || b.Reason != "blocked by PDB guard" || ps.BlockedBy != "guard" || requeue.AfterTrouble(rq[0]) {
					t.Fatalf("PDB refusal: %d deletes, pod %+v, %s; want blocked by PDB guard", deletes, *ps, outcomes(acts))
				}
			}
		})
	}
}

// TestRefusedDeleteGivenUp: a DeleteAfterTimeout pod whose delete an
// admission webhook denies is deleted again after its backoff, not at
// every step, and given up eviction_timeout after its deadline, naming the
// denial: the drain ends gave_up. Before, it was deleted about once a
// second forever and the drain never ended (no remediation).
func TestRefusedDeleteGivenUp(t *testing.T) {
	const node = "n1"
	k := fake.NewSimpleClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{events.LabelQuarantined: "true"}}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "stubborn", UID: "uid-s"}, Spec: corev1.PodSpec{NodeName: node},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}})
	k.PrependReactor("create", "pods", func(a ktesting.Action) (bool, runtime.Object, error) {
		return a.GetSubresource() == "eviction", nil, nil // accepted; the pod stays
	})
	clk := &clock{t: time.Now().Truncate(time.Millisecond)}
	var deletes []time.Time
	k.PrependReactor("delete", "pods", func(ktesting.Action) (bool, runtime.Object, error) {
		deletes = append(deletes, clk.Now())
		return true, nil, apierrors.NewForbidden(corev1.Resource("pods"), "s",
			errors.New(`admission webhook "keep.example.com" denied the request: stays`))
	})
	cfg := testConfig() // stubborn: DeleteAfterTimeout after 10m; pdb_backoff 1s doubling to 2s
	cfg.EvictionTimeout = 10 * time.Second
	h := newHandler(t, cfg, k, clk, false)
	_, rq := handle(t, h, quarantineAction(node, "e1", "RESTART_VM", nil))
	deadline := clk.Now().Add(10 * time.Minute)
	clk.Add(10 * time.Minute)
	var res *faultlinev1.Action
	for i := 0; i < 200 && res == nil; i++ {
		if len(rq) == 0 {
			t.Fatal("the drain ended without a result")
		}
		var acts []*faultlinev1.Action
		acts, rq = handle(t, h, rq...)
		res = find(acts, events.OutcomeGaveUp)
		if res == nil {
			clk.Add(250 * time.Millisecond)
		}
	}
	if res == nil {
		t.Fatalf("the drain did not give up by %v after the deadline; %d deletes", clk.Now().Sub(deadline), len(deletes))
	}
	if end := clk.Now().Sub(deadline); end < cfg.EvictionTimeout || end > cfg.EvictionTimeout+2*time.Second {
		t.Errorf("given up %v after the deadline, want eviction_timeout (%v)", end, cfg.EvictionTimeout)
	}
	if !strings.Contains(res.Reason, `not deleted eviction_timeout after its timeout: delete pod stubborn/s: pods "s" is forbidden: admission webhook "keep.example.com" denied the request`) {
		t.Errorf("reason %q", res.Reason)
	}
	if len(deletes) == 0 || !deletes[0].Equal(deadline) {
		t.Fatalf("deletes at %v, want the first at the deadline %v", deletes, deadline)
	}
	for i := 1; i < len(deletes); i++ {
		if gap, want := deletes[i].Sub(deletes[i-1]), cfg.backoff(i); gap < want {
			t.Errorf("delete %d came %v after the one before, want its backoff %v", i+1, gap, want)
		}
	}
	if len(deletes) > 6 { // at 0, 1s, 3s, 5s, 7s, 9s
		t.Errorf("%d deletes in eviction_timeout (%v)", len(deletes), cfg.EvictionTimeout)
	}
}

// TestResetAfterWholeNodeDrain: a GPU's COMPONENT_RESET on a node whose
// whole-node drain of the same quarantine finished (its RebootNode
// waiting in the janitor) drains the whole node again, so the node's
// drain state names no GPUs and the janitor still reboots it. Before, the
// state named the GPU and the janitor refused the reboot (a partial
// drain). The quarantine's start is read from the node: a node lifted and
// quarantined again since the drain has its GPU's pods drained alone.
func TestResetAfterWholeNodeDrain(t *testing.T) {
	const node = "n1"
	for _, tc := range []struct {
		name string
		// since is when the node's quarantine began, from the first drain's
		// end.
		since time.Duration
		want  []string
	}{
		{"quarantined before the drain", -10 * time.Minute, nil},
		{"quarantined again since the drain", 30 * time.Minute, []string{"GPU-A"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &clock{t: time.Now().Truncate(time.Second)}
			k := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node,
				Labels:      map[string]string{events.LabelQuarantined: "true"},
				Annotations: map[string]string{annotationQuarantinedAt: clk.Now().Add(-10 * time.Minute).UTC().Format(time.RFC3339)}}})
			h := newHandler(t, testConfig(), k, clk, false)
			if acts, _ := handle(t, h, quarantineAction(node, "e1", "RESTART_BM", nil)); find(acts, events.OutcomeSucceeded) == nil {
				t.Fatalf("whole-node drain: %s", outcomes(acts))
			}
			finished := drainState(t, k, node).FinishedAt
			n, err := k.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			n.Annotations[annotationQuarantinedAt] = finished.Add(tc.since).UTC().Format(time.RFC3339)
			if _, err := k.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			clk.Add(time.Hour)
			reset := quarantineAction(node, "e2", "COMPONENT_RESET",
				map[string]string{events.DetailAlreadyQuarantined: "true", events.DetailEntities: "GPU=GPU-A"})
			if acts, _ := handle(t, h, decidedAt(reset, clk.Now())); find(acts, events.OutcomeSucceeded) == nil {
				t.Fatalf("the reset's drain: %s", outcomes(acts))
			}
			st := drainState(t, k, node)
			if st.Trigger.RecommendedAction != "COMPONENT_RESET" || !reflect.DeepEqual(st.GPUs, tc.want) {
				t.Fatalf("drain state: %s over GPUs %v, want COMPONENT_RESET over %v", st.Trigger.RecommendedAction, st.GPUs, tc.want)
			}
		})
	}
}

// TestClusterErrorsNeverGiveUp: a pod whose evictions meet only the
// cluster's errors (a 503, throttling, an RBAC 403) past its
// eviction_timeout is not given up: once the cluster answers, the
// eviction is sent and judged by its answer — accepted, the drain
// succeeds when the pod goes. Before, the first step after the timeout
// gave it up without an eviction (gave_up: remediate rebooted the node
// under its workloads). A PDB refusing for eviction_timeout still gives
// the pod up, eviction_timeout after its first answer.
func TestClusterErrorsNeverGiveUp(t *testing.T) {
	pdbRefusal := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	pdbRefusal.ErrStatus.Details.Causes = append(pdbRefusal.ErrStatus.Details.Causes, metav1.StatusCause{
		Type: policyv1.DisruptionBudgetCause, Message: "The disruption budget guard needs 1 healthy pods and has 1 currently"})
	for _, tc := range []struct {
		name   string
		outage error
		// then answers the evictions once the cluster is back (nil:
		// accepted).
		then error
		// listDown: the outage, past the pod's unanswered cap, fails a
		// step at the pod list too (a full apiserver outage): no call
		// is made past the cap before the cluster is back.
		listDown bool
	}{
		{"503, then accepted", apierrors.NewServiceUnavailable("apiserver restarting"), nil, false},
		{"throttled, then accepted", apierrors.NewTooManyRequests("too many requests, please try again later", 1), nil, false},
		{"RBAC, then accepted", apierrors.NewForbidden(corev1.Resource("pods/eviction"), "p",
			errors.New(`User "system:serviceaccount:faultline:drain" cannot create resource "pods/eviction"`)), nil, false},
		{"503, then a PDB refusing", apierrors.NewServiceUnavailable("apiserver restarting"), pdbRefusal, false},
		{"an outage at the pod list past the cap, then accepted", apierrors.NewServiceUnavailable("apiserver restarting"), nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const node = "n1"
			k := quarantinedWithPod(node)
			var answer error = tc.outage
			var calls, accepted int
			listDown := false
			k.PrependReactor("list", "pods", func(ktesting.Action) (bool, runtime.Object, error) {
				if listDown {
					return true, nil, tc.outage
				}
				return false, nil, nil
			})
			k.PrependReactor("create", "pods", func(a ktesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() != "eviction" {
					return false, nil, nil
				}
				calls++
				if answer == nil {
					accepted++
				}
				return true, nil, answer
			})
			clk := &clock{t: time.Now().Truncate(time.Millisecond)}
			cfg := testConfig()
			h := newHandler(t, cfg, k, clk, false)
			acts, rq := handle(t, h, quarantineAction(node, "e1", "RESTART_VM", nil))
			if len(rq) != 1 || !requeue.AfterTrouble(rq[0]) {
				t.Fatalf("the step in the outage: %s, %d requeues", outcomes(acts), len(rq))
			}
			if ps := drainState(t, k, node).Pods[keyOf("work", "p")]; ps == nil || ps.EvictAt.IsZero() {
				t.Fatalf("pod %+v: want its eviction asked", ps)
			}
			away := cfg.EvictionTimeout + time.Minute
			if tc.listDown {
				// Past the cap (unansweredBound eviction_timeouts past the
				// pod's deadline), the steps failing at the pod list.
				away = (2+unansweredBound)*cfg.EvictionTimeout + time.Minute
				listDown = true
				clk.Add(away - time.Minute)
				time.Sleep(200 * time.Millisecond) // the cluster's backoff
				acts, rq = handle(t, h, rq...)
				if len(rq) != 1 || !requeue.AfterTrouble(rq[0]) || find(acts, events.OutcomeGaveUp) != nil {
					t.Fatalf("the step failing at the pod list: %s, %d requeues", outcomes(acts), len(rq))
				}
				listDown = false
				clk.Add(time.Minute)
			} else {
				clk.Add(away)
			}
			back := clk.Now()
			answer = tc.then
			time.Sleep(200 * time.Millisecond) // the cluster's backoff: at most 100ms (newHandler)
			acts, rq = handle(t, h, rq...)
			if res := find(acts, events.OutcomeGaveUp); res != nil {
				t.Fatalf("given up once the cluster was back: %q (%d eviction calls, %d accepted)", res.Reason, calls, accepted)
			}
			if len(rq) != 1 || calls != 2 {
				t.Fatalf("once the cluster was back: %s, %d requeues, %d eviction calls; want the eviction sent", outcomes(acts), len(rq), calls)
			}
			if tc.then == nil {
				if accepted != 1 {
					t.Fatalf("%d evictions accepted", accepted)
				}
				// The pod goes, as an accepted eviction makes it.
				if err := k.CoreV1().Pods("work").Delete(context.Background(), "p", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				clk.Add(time.Second)
				acts, rq = handle(t, h, rq...)
				if find(acts, events.OutcomeSucceeded) == nil || len(rq) != 0 {
					t.Fatalf("after the pod went: %s, %d requeues; want the drain succeeded", outcomes(acts), len(rq))
				}
				return
			}
			// The PDB refuses from the cluster's return: given up
			// eviction_timeout later, not before.
			var res *faultlinev1.Action
			for i := 0; i < 100 && res == nil && len(rq) > 0; i++ {
				clk.Add(15 * time.Second)
				acts, rq = handle(t, h, rq...)
				res = find(acts, events.OutcomeGaveUp)
			}
			if res == nil || res.Reason == "" || !strings.Contains(res.Reason, "blocked by PDB guard") {
				t.Fatalf("PDB refusing: %s; want gave_up blocked by PDB guard", outcomes(acts))
			}
			if end := clk.Now().Sub(back); end < cfg.EvictionTimeout || end > cfg.EvictionTimeout+15*time.Second {
				t.Errorf("given up %v after the PDB's first refusal, want eviction_timeout (%v)", end, cfg.EvictionTimeout)
			}
		})
	}
}

// TestEvictionChecksTheUID: the eviction carries the pod's UID as a
// precondition, so a pod recreated under the same name since the list (a
// StatefulSet's copy, elsewhere) is not evicted in its place: the
// apiserver's 409 is a refusal (not the pod gone, TestEvictionConflictIsNotGone),
// and the next step's list, the copy under another key, makes the entry
// meant gone. Before, the healthy copy was evicted.
func TestEvictionChecksTheUID(t *testing.T) {
	const node = "n1"
	k := quarantinedWithPod(node) // work/p, UID uid-p
	var evicted []string
	k.PrependReactor("create", "pods", func(a ktesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		// The apiserver's check of DeleteOptions.Preconditions.UID.
		ev := a.(ktesting.CreateAction).GetObject().(*policyv1.Eviction)
		if o := ev.DeleteOptions; o != nil && o.Preconditions != nil && o.Preconditions.UID != nil && *o.Preconditions.UID != "uid-p" {
			return true, nil, apierrors.NewConflict(corev1.Resource("pods"), ev.Name,
				fmt.Errorf("the UID in the precondition (%s) does not match the UID in record (uid-p)", *o.Preconditions.UID))
		}
		evicted = append(evicted, ev.Name)
		return true, nil, nil
	})
	h := newHandler(t, testConfig(), k, &clock{t: time.Now()}, false)
	cl, _ := h.reg.Get(cluster)
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "work", UID: "uid-old"}}
	r := h.call(context.Background(), cl, op{key: podKey(old), pod: old}, false)
	if len(evicted) != 0 || r.notFound || r.retriable || !apierrors.IsConflict(r.err) {
		t.Fatalf("the listed copy gone, another under its name: evicted %v, result %+v; want nothing evicted, a refusal", evicted, r)
	}
	// The drain's next step lists the copy (uid-p): the old entry is gone.
	cfg, now := machineConfig(t, nil), time.Now()
	st := &State{Pods: map[string]*PodState{podKey(old): {UID: "uid-old", Mode: ModeImmediate, Deadline: now.Add(time.Minute)}}}
	cfg.record(st, op{key: podKey(old), pod: old}, r, now)
	if ps := st.Pods[podKey(old)]; ps.Done != "" || ps.Attempts != 1 {
		t.Fatalf("after the 409: %+v; want a refusal, not done", ps)
	}
	cfg.advance(st, []corev1.Pod{runningPod("work", "p")}, now.Add(time.Second))
	if ps, ok := st.Pods[podKey(old)]; ok && ps.Done != "gone" {
		t.Fatalf("the old copy's entry: %+v; want it gone", ps)
	}
	cur := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "work", UID: "uid-p"}}
	if r := h.call(context.Background(), cl, op{key: podKey(cur), pod: cur}, false); r.err != nil || len(evicted) != 1 {
		t.Fatalf("the pod listed: evicted %v, result %+v; want it evicted", evicted, r)
	}
}

// TestEvictionConflictIsNotGone: a 409 to an eviction of the pod listed (a
// PDB's status update conflicting, many evictions against one PDB at once)
// is the pod's refusal, tried again after its backoff. Before, every 409
// counted as the pod gone: the drain succeeded "0 pods evicted" with the
// pod still running on the node, and remediate rebooted it.
func TestEvictionConflictIsNotGone(t *testing.T) {
	const node = "n1"
	k := quarantinedWithPod(node)
	calls := 0
	k.PrependReactor("create", "pods", func(a ktesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		calls++
		return true, nil, apierrors.NewConflict(policyv1.Resource("poddisruptionbudgets"), "guard",
			errors.New("the object has been modified; please apply your changes to the latest version and try again"))
	})
	clk := &clock{t: time.Now().Truncate(time.Millisecond)}
	cfg := testConfig()
	h := newHandler(t, cfg, k, clk, false)
	acts, rq := handle(t, h, quarantineAction(node, "e1", "RESTART_VM", nil))
	if find(acts, events.OutcomeSucceeded) != nil || len(rq) != 1 {
		t.Fatalf("every eviction 409: %s, %d requeues; want the drain running", outcomes(acts), len(rq))
	}
	ps := drainState(t, k, node).Pods[keyOf("work", "p")]
	if ps == nil || ps.Done != "" || ps.Attempts != 1 || !ps.Unanswered.IsZero() {
		t.Fatalf("pod %+v: want a refusal (1 attempt), not done", ps)
	}
	clk.Add(cfg.MaxPDBBackoff + time.Second)
	acts, rq = handle(t, h, rq...)
	if find(acts, events.OutcomeSucceeded) != nil || len(rq) != 1 || calls != 2 {
		t.Fatalf("after its backoff: %s, %d requeues, %d eviction calls; want it asked again", outcomes(acts), len(rq), calls)
	}
}

// TestLastingErrorsGiveUp: a pod whose every call meets a lasting error
// ends its drain. An error counted as the cluster's — a 503 for hours, a
// webhook that cannot be called (500 "failed calling webhook": its
// namespace's, or a cluster-wide one whose pods are down) — gives it up
// "unanswered" at its cap, unansweredBound eviction_timeouts past its
// deadline, after a call made then met it again; not before. Before,
// such a pod was never given up: the drain ran for ever, each step
// backing the whole cluster off.
func TestLastingErrorsGiveUp(t *testing.T) {
	cfg := testConfig()
	for _, tc := range []struct {
		name    string
		err     error
		trouble bool          // the step backs the cluster off
		at      time.Duration // its cap, this long after the drain started
		reason  string
	}{
		{"webhook 500", apierrors.NewInternalError(errors.New(`Internal error occurred: failed calling webhook "guard.example.com": ` +
			`failed to call webhook: Post "https://guard.work.svc:443/validate": dial tcp 10.0.0.9:443: connect: connection refused`)),
			true, (1 + unansweredBound) * cfg.EvictionTimeout, "unanswered: "},
		{"503 for 3h", apierrors.NewServiceUnavailable("apiserver restarting"),
			true, (1 + unansweredBound) * cfg.EvictionTimeout, "unanswered: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const node = "n1"
			k := quarantinedWithPod(node)
			k.PrependReactor("create", "pods", func(a ktesting.Action) (bool, runtime.Object, error) {
				return a.GetSubresource() == "eviction", nil, tc.err
			})
			clk := &clock{t: time.Now().Truncate(time.Millisecond)}
			start := clk.Now()
			h := newHandler(t, cfg, k, clk, false)
			acts, rq := handle(t, h, quarantineAction(node, "e1", "RESTART_VM", nil))
			if len(rq) != 1 || requeue.AfterTrouble(rq[0]) != tc.trouble {
				t.Fatalf("first step: %s, %d requeues; want the cluster backed off: %v", outcomes(acts), len(rq), tc.trouble)
			}
			const step = 150 * time.Second
			var res *faultlinev1.Action
			for res == nil && len(rq) > 0 && clk.Now().Sub(start) < 3*time.Hour {
				clk.Add(step)
				time.Sleep(150 * time.Millisecond) // the cluster's backoff: at most 100ms (newHandler)
				acts, rq = handle(t, h, rq...)
				res = find(acts, events.OutcomeGaveUp)
			}
			if res == nil || !strings.Contains(res.Reason, tc.reason) {
				t.Fatalf("after %v: %s; want gave_up %q", clk.Now().Sub(start), outcomes(acts), tc.reason)
			}
			// The step at the cap makes the call; the next, its error met
			// again, gives the pod up.
			if end := clk.Now().Sub(start); end < tc.at+step || end >= tc.at+2*step {
				t.Errorf("given up %v after the start, want the step after %v", end, tc.at)
			}
			if ps := drainState(t, k, node).Pods[keyOf("work", "p")]; ps == nil || !ps.Unanswered.IsZero() || ps.UnansweredErr != "" {
				t.Errorf("pod %+v: want it done, nothing unanswered", ps)
			}
		})
	}
}
