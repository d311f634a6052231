package drain

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func machineConfig(t *testing.T, mod func(*Config)) *Config {
	t.Helper()
	c := DefaultConfig()
	c.EvictionTimeout, c.CompletionTimeout, c.DeleteAfter = 10*time.Minute, time.Hour, 30*time.Minute
	c.PDBBackoff, c.MaxPDBBackoff = 5*time.Second, time.Minute
	c.Rules = []Rule{
		{Namespace: "batch", Mode: ModeAllowCompletion},
		{Namespace: "scratch", Mode: ModeDeleteAfterTimeout},
	}
	if mod != nil {
		mod(&c)
	}
	if err := c.Validate("drain."); err != nil {
		t.Fatal(err)
	}
	return &c
}

// runningPod is a running pod "ns/name" with uid "uid-name".
func runningPod(ns, name string, mod ...func(*corev1.Pod)) corev1.Pod {
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, m := range mod {
		m(&p)
	}
	return p
}

func terminating(p *corev1.Pod) { ts := metav1.NewTime(t0); p.DeletionTimestamp = &ts }

// terminatingAt sets the pod's DeletionTimestamp (the delete's time plus
// its grace period).
func terminatingAt(at time.Time) func(*corev1.Pod) {
	return func(p *corev1.Pod) { ts := metav1.NewTime(at); p.DeletionTimestamp = &ts }
}

func succeeded(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }
func daemonSet(p *corev1.Pod) {
	yes := true
	p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "ds", Controller: &yes}}
}

func running(pods map[string]*PodState) *State {
	if pods == nil {
		pods = map[string]*PodState{}
	}
	return &State{ID: "d1", Phase: PhaseRunning, StartedAt: t0, Pods: pods}
}

// keyOf is podKey of pod(ns, name).
func keyOf(ns, name string) string { p := runningPod(ns, name); return podKey(&p) }

func opKeys(ops []op) string {
	var out []string
	for _, o := range ops {
		s := o.key
		if o.delete {
			s = "delete " + s
		}
		out = append(out, s)
	}
	return strings.Join(out, ";")
}

// TestAdvance: given the drain's state, the pods on the node and the
// time, advance marks each pod and returns the calls to make.
func TestAdvance(t *testing.T) {
	web, job, tmp := keyOf("web", "a"), keyOf("batch", "j"), keyOf("scratch", "s")
	for _, tc := range []struct {
		name    string
		cfg     func(*Config)
		force   bool
		state   map[string]*PodState
		pods    []corev1.Pod
		now     time.Time
		ops     string
		want    map[string]PodState // the pods' states after (fields compared: Mode, Done, Reason, EvictAt, Deadline)
		skipped map[string]int
	}{
		{
			name: "first step: each pod classified by its rule, Immediate ones evicted, intent recorded",
			pods: []corev1.Pod{runningPod("web", "a"), runningPod("batch", "j"), runningPod("scratch", "s"), runningPod("kube-system", "dns"), runningPod("web", "ds", daemonSet)},
			now:  t0,
			ops:  web + ";" + tmp,
			want: map[string]PodState{
				web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0},
				job: {Mode: ModeAllowCompletion, Deadline: t0.Add(time.Hour)},
				tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), EvictAt: t0},
			},
			skipped: map[string]int{SkipSystem: 1, SkipDaemonSet: 1},
		},
		{
			name:  "force makes every pod Immediate",
			force: true,
			pods:  []corev1.Pod{runningPod("batch", "j")},
			now:   t0,
			ops:   job,
			want:  map[string]PodState{job: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0}},
		},
		{
			name:  "a force joined: the pods classified before it and not done are made Immediate, evicted now",
			force: true,
			state: map[string]*PodState{
				job:                    {Mode: ModeAllowCompletion, Deadline: t0.Add(time.Hour)},
				tmp:                    {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), BlockedBy: "pdb-s", NextTry: t0.Add(21 * time.Minute), EvictAt: t0},
				keyOf("batch", "done"): {Mode: ModeAllowCompletion, Deadline: t0.Add(time.Hour), Done: "completed"},
			},
			pods: []corev1.Pod{runningPod("batch", "j"), runningPod("scratch", "s"), runningPod("batch", "done", succeeded)},
			now:  t0.Add(20 * time.Minute),
			ops:  job + ";" + tmp,
			want: map[string]PodState{
				job:                    {Mode: ModeImmediate, Deadline: t0.Add(30 * time.Minute), EvictAt: t0.Add(20 * time.Minute)},
				tmp:                    {Mode: ModeImmediate, Deadline: t0.Add(30 * time.Minute), EvictAt: t0},
				keyOf("batch", "done"): {Mode: ModeAllowCompletion, Deadline: t0.Add(time.Hour), Done: "completed"},
			},
		},
		{
			name:  "a force joined: an AllowCompletion pod past its completion timeout is evicted, not given up",
			force: true,
			state: map[string]*PodState{job: {Mode: ModeAllowCompletion, Deadline: t0.Add(time.Hour)}},
			pods:  []corev1.Pod{runningPod("batch", "j")},
			now:   t0.Add(time.Hour),
			ops:   job,
			want:  map[string]PodState{job: {Mode: ModeImmediate, Deadline: t0.Add(time.Hour + 10*time.Minute), EvictAt: t0.Add(time.Hour)}},
		},
		{
			name:  "an evicted pod still terminating is waited for; the first eviction time is kept",
			state: map[string]*PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0, Evicted: true}},
			pods:  []corev1.Pod{runningPod("web", "a", terminating)},
			now:   t0.Add(time.Minute),
			want:  map[string]PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0}},
		},
		{
			name:  "a pod no longer on the node is gone",
			state: map[string]*PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), Evicted: true}},
			now:   t0.Add(time.Minute),
			want:  map[string]PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), Done: "gone"}},
		},
		{
			name:  "a pod that finished is completed",
			state: map[string]*PodState{job: {Mode: ModeAllowCompletion, Deadline: t0.Add(time.Hour)}},
			pods:  []corev1.Pod{runningPod("batch", "j", succeeded)},
			now:   t0.Add(time.Minute),
			want:  map[string]PodState{job: {Mode: ModeAllowCompletion, Deadline: t0.Add(time.Hour), Done: "completed"}},
		},
		{
			name:  "backing off after a PDB refusal: no call before NextTry",
			state: map[string]*PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), BlockedBy: "pdb-a", NextTry: t0.Add(10 * time.Second), EvictAt: t0}},
			pods:  []corev1.Pod{runningPod("web", "a")},
			now:   t0.Add(5 * time.Second),
			want:  map[string]PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0}},
		},
		{
			name:  "at NextTry the eviction is tried again",
			state: map[string]*PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), BlockedBy: "pdb-a", NextTry: t0.Add(10 * time.Second), EvictAt: t0}},
			pods:  []corev1.Pod{runningPod("web", "a")},
			now:   t0.Add(10 * time.Second),
			ops:   web,
			want:  map[string]PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0}},
		},
		{
			name:  "a pod still blocked at its deadline is given up, naming the PDB",
			state: map[string]*PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), BlockedBy: "pdb-a", EvictAt: t0}},
			pods:  []corev1.Pod{runningPod("web", "a")},
			now:   t0.Add(10 * time.Minute),
			want:  map[string]PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0, Done: "gave_up", Reason: "blocked by PDB pdb-a"}},
		},
		{
			name:  "unanswered at its deadline (the cluster's errors alone): asked again, not given up",
			state: map[string]*PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0, Unanswered: t0}},
			pods:  []corev1.Pod{runningPod("web", "a")},
			now:   t0.Add(11 * time.Minute),
			ops:   web,
			want:  map[string]PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0}},
		},
		{
			name: "a DeleteAfterTimeout pod unanswered eviction_timeout after its deadline: deleted again, not given up",
			state: map[string]*PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), EvictAt: t0,
				Unanswered: t0.Add(30 * time.Minute)}},
			pods: []corev1.Pod{runningPod("scratch", "s")},
			now:  t0.Add(41 * time.Minute),
			ops:  "delete " + tmp,
			want: map[string]PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), EvictAt: t0}},
		},
		{
			name: "unanswered just before its cap: asked again",
			state: map[string]*PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0, Unanswered: t0,
				UnansweredErr: "503"}},
			pods: []corev1.Pod{runningPod("web", "a")},
			now:  t0.Add(40*time.Minute - time.Second),
			ops:  web,
			want: map[string]PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0}},
		},
		{
			name: "past its cap, no call made since (an outage failed the steps at the pod list): asked again, not given up",
			state: map[string]*PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0, Unanswered: t0,
				UnansweredErr: "503", UnansweredCall: t0}},
			pods: []corev1.Pod{runningPod("web", "a")},
			now:  t0.Add(2 * time.Hour),
			ops:  web,
			want: map[string]PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0}},
		},
		{
			name: "a call made at its cap (unansweredBound eviction_timeouts past its deadline) met the cluster's error: given up with the error",
			state: map[string]*PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0, Unanswered: t0,
				UnansweredErr: "503", UnansweredCall: t0.Add(40 * time.Minute)}},
			pods: []corev1.Pod{runningPod("web", "a")},
			now:  t0.Add(40*time.Minute + 10*time.Second),
			want: map[string]PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0, Done: "gave_up",
				Reason: "unanswered: 503"}},
		},
		{
			name: "a DeleteAfterTimeout pod at its cap (eviction_timeout later), no call made since: deleted again",
			state: map[string]*PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), EvictAt: t0,
				Unanswered: t0.Add(30 * time.Minute)}},
			pods: []corev1.Pod{runningPod("scratch", "s")},
			now:  t0.Add(70 * time.Minute),
			ops:  "delete " + tmp,
			want: map[string]PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), EvictAt: t0}},
		},
		{
			name: "a DeleteAfterTimeout pod whose delete at its cap met the cluster's error: given up",
			state: map[string]*PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), EvictAt: t0,
				Unanswered: t0.Add(30 * time.Minute), UnansweredErr: "timeout", UnansweredCall: t0.Add(70 * time.Minute)}},
			pods: []corev1.Pod{runningPod("scratch", "s")},
			now:  t0.Add(71 * time.Minute),
			want: map[string]PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), EvictAt: t0, Done: "gave_up",
				Reason: "unanswered: timeout"}},
		},
		{
			name:  "refused at every try (a webhook's denial) until its deadline: given up with the refusal",
			state: map[string]*PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0, Attempts: 7, Reason: "denied", NextTry: t0.Add(10 * time.Minute)}},
			pods:  []corev1.Pod{runningPod("web", "a")},
			now:   t0.Add(10 * time.Minute),
			want:  map[string]PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0, Done: "gave_up", Reason: "not evicted by the timeout: denied"}},
		},
		{
			name:  "AllowCompletion still running at its deadline is given up",
			state: map[string]*PodState{job: {Mode: ModeAllowCompletion, Deadline: t0.Add(time.Hour)}},
			pods:  []corev1.Pod{runningPod("batch", "j")},
			now:   t0.Add(time.Hour),
			want:  map[string]PodState{job: {Mode: ModeAllowCompletion, Deadline: t0.Add(time.Hour), Done: "gave_up", Reason: "still running at the completion timeout"}},
		},
		{
			name:  "a terminating pod at its deadline is given up as such (its 8m grace period ran out 3m ago)",
			state: map[string]*PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), Evicted: true, EvictAt: t0}},
			pods:  []corev1.Pod{runningPod("web", "a", terminatingAt(t0.Add(8*time.Minute)))},
			now:   t0.Add(11 * time.Minute),
			want:  map[string]PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0, Done: "gave_up", Reason: "still terminating at the timeout"}},
		},
		{
			name:  "DeleteAfterTimeout past its deadline is deleted, once",
			state: map[string]*PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), BlockedBy: "pdb-s", EvictAt: t0}},
			pods:  []corev1.Pod{runningPod("scratch", "s")},
			now:   t0.Add(30 * time.Minute),
			ops:   "delete " + tmp,
			want:  map[string]PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), EvictAt: t0}},
		},
		{
			name:  "a deleted DeleteAfterTimeout pod still terminating is not deleted again",
			state: map[string]*PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), DeletedAt: t0.Add(30 * time.Minute)}},
			pods:  []corev1.Pod{runningPod("scratch", "s", terminatingAt(t0.Add(30*time.Minute)))},
			now:   t0.Add(31 * time.Minute),
			want:  map[string]PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute)}},
		},
		{
			name: "a DeleteAfterTimeout pod whose delete was refused is not deleted again before its backoff",
			state: map[string]*PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), Attempts: 1,
				NextTry: t0.Add(31 * time.Minute), Reason: "denied"}},
			pods: []corev1.Pod{runningPod("scratch", "s")},
			now:  t0.Add(30*time.Minute + 30*time.Second),
			want: map[string]PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), Reason: "denied"}},
		},
		{
			name: "a DeleteAfterTimeout pod whose delete was refused is deleted again after its backoff",
			state: map[string]*PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), Attempts: 1,
				NextTry: t0.Add(31 * time.Minute), Reason: "denied"}},
			pods: []corev1.Pod{runningPod("scratch", "s")},
			now:  t0.Add(31 * time.Minute),
			ops:  "delete " + tmp,
			want: map[string]PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), Reason: "denied"}},
		},
		{
			name: "a DeleteAfterTimeout pod still not deleted eviction_timeout after its deadline is given up, naming the refusal",
			state: map[string]*PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), Attempts: 4,
				NextTry: t0.Add(39 * time.Minute), Reason: "denied", BlockedBy: "pdb-s"}},
			pods: []corev1.Pod{runningPod("scratch", "s")},
			now:  t0.Add(40 * time.Minute),
			want: map[string]PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), Done: "gave_up",
				Reason: "not deleted eviction_timeout after its timeout: denied"}},
		},
		{
			name:  "a deleted DeleteAfterTimeout pod a finalizer holds, skip_wait_for_delete_timeout 0: given up eviction_timeout after its deadline",
			cfg:   func(c *Config) { c.SkipWaitForDeleteTimeout = 0 },
			state: map[string]*PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), DeletedAt: t0.Add(30 * time.Minute)}},
			pods:  []corev1.Pod{runningPod("scratch", "s", terminatingAt(t0.Add(30*time.Minute)))},
			now:   t0.Add(40 * time.Minute),
			want: map[string]PodState{tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(30 * time.Minute), Done: "gave_up",
				Reason: "deleted, still terminating eviction_timeout after its timeout"}},
		},
		{
			name:  "terminating more than skip_wait_for_delete_timeout past its DeletionTimestamp: no longer waited for",
			state: map[string]*PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), Evicted: true, EvictAt: t0}},
			pods:  []corev1.Pod{runningPod("web", "a", terminating)},
			now:   t0.Add(5*time.Minute + time.Second),
			want: map[string]PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0,
				Done: "skipped", Reason: "terminating since 2026-11-22T12:00:00Z, more than skip_wait_for_delete_timeout 5m0s ago"}},
		},
		{
			name:  "stuck terminating at the deadline: skipped, not given up",
			state: map[string]*PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), Evicted: true, EvictAt: t0}},
			pods:  []corev1.Pod{runningPod("web", "a", terminating)},
			now:   t0.Add(11 * time.Minute),
			want: map[string]PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0,
				Done: "skipped", Reason: "terminating since 2026-11-22T12:00:00Z, more than skip_wait_for_delete_timeout 5m0s ago"}},
		},
		{
			name:  "AllowCompletion: a pod deleted by its owner and stuck terminating is skipped too",
			state: map[string]*PodState{job: {Mode: ModeAllowCompletion, Deadline: t0.Add(time.Hour)}},
			pods:  []corev1.Pod{runningPod("batch", "j", terminating)},
			now:   t0.Add(6 * time.Minute),
			want: map[string]PodState{job: {Mode: ModeAllowCompletion, Deadline: t0.Add(time.Hour),
				Done: "skipped", Reason: "terminating since 2026-11-22T12:00:00Z, more than skip_wait_for_delete_timeout 5m0s ago"}},
		},
		{
			name: "a pod first seen already stuck terminating is classified and skipped, never evicted",
			pods: []corev1.Pod{runningPod("web", "a", terminatingAt(t0.Add(-time.Hour)))},
			now:  t0,
			want: map[string]PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute),
				Done: "skipped", Reason: "terminating since 2026-11-22T11:00:00Z, more than skip_wait_for_delete_timeout 5m0s ago"}},
		},
		{
			name:  "skip_wait_for_delete_timeout 0: a stuck pod is waited for until the deadline",
			cfg:   func(c *Config) { c.SkipWaitForDeleteTimeout = 0 },
			state: map[string]*PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), Evicted: true, EvictAt: t0}},
			pods:  []corev1.Pod{runningPod("web", "a", terminating)},
			now:   t0.Add(9 * time.Minute),
			want:  map[string]PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), EvictAt: t0}},
		},
		{
			name: "a pod first seen in a later step: its timeouts count from then, its eviction tried",
			pods: []corev1.Pod{runningPod("web", "a"), runningPod("scratch", "s"), runningPod("batch", "j")},
			now:  t0.Add(2 * time.Hour),
			ops:  web + ";" + tmp,
			want: map[string]PodState{
				web: {Mode: ModeImmediate, Deadline: t0.Add(2*time.Hour + 10*time.Minute), EvictAt: t0.Add(2 * time.Hour)},
				tmp: {Mode: ModeDeleteAfterTimeout, Deadline: t0.Add(2*time.Hour + 30*time.Minute), EvictAt: t0.Add(2 * time.Hour)},
				job: {Mode: ModeAllowCompletion, Deadline: t0.Add(3 * time.Hour)},
			},
		},
		{
			name:  "pods already done stay as they were",
			state: map[string]*PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), Done: "gave_up", Reason: "x"}},
			pods:  []corev1.Pod{runningPod("web", "a")},
			now:   t0.Add(time.Hour),
			want:  map[string]PodState{web: {Mode: ModeImmediate, Deadline: t0.Add(10 * time.Minute), Done: "gave_up", Reason: "x"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := machineConfig(t, tc.cfg)
			st := running(tc.state)
			st.Force = tc.force
			ops := c.advance(st, tc.pods, tc.now)
			if got := opKeys(ops); got != tc.ops {
				t.Errorf("ops %q, want %q", got, tc.ops)
			}
			got := map[string]PodState{}
			for k, p := range st.Pods {
				got[k] = PodState{Mode: p.Mode, Done: p.Done, Reason: p.Reason, EvictAt: p.EvictAt, Deadline: p.Deadline}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("pods\n got %+v\nwant %+v", got, tc.want)
			}
			if len(tc.skipped) > 0 || len(st.Skipped) > 0 {
				if !reflect.DeepEqual(st.Skipped, tc.skipped) {
					t.Errorf("skipped %v, want %v", st.Skipped, tc.skipped)
				}
			}
		})
	}
}

// TestDeadlineFromFirstSeen: a GPU drain widened to the whole node by a
// joining fault takes in a pod it skipped until then; that pod's deadline
// counts from the step that first saw it, and is kept in the state (read
// back, a later step neither resets it nor gives the pod up early).
func TestDeadlineFromFirstSeen(t *testing.T) {
	c := machineConfig(t, nil)
	gpu, cpu := keyOf("ml", "g"), keyOf("web", "a")
	usesGPU := func(p *corev1.Pod) { p.Annotations = map[string]string{DefaultGPUAnnotation: gpuA} }
	pods := []corev1.Pod{runningPod("ml", "g", usesGPU), runningPod("web", "a")}
	st := running(nil)
	st.Scope = Scope{GPUs: []string{gpuA}}
	// Each eviction is answered by a PDB's refusal (an unanswered one is
	// asked again past its deadline, never given up).
	step := func(st *State, now time.Time) string {
		ops := c.advance(st, pods, now)
		for _, o := range ops {
			c.record(st, o, callResult{blockedBy: "pdb"}, now)
		}
		return opKeys(ops)
	}
	if got := step(st, t0); got != gpu {
		t.Fatalf("first step: ops %q, want %q", got, gpu)
	}
	// A whole-node fault joins 20 minutes in, past eviction_timeout (10m).
	joined := t0.Add(20 * time.Minute)
	st.Scope, st.ScopeAt = st.Scope.widen(Scope{}), joined
	if got := step(st, joined); got != cpu {
		t.Fatalf("widened: ops %q, want the eviction of %q", got, cpu)
	}
	if ps := st.Pods[cpu]; ps.Done != "" || !ps.Deadline.Equal(joined.Add(10*time.Minute)) {
		t.Fatalf("widened: pod %+v, want not done, deadline %v", *ps, joined.Add(10*time.Minute))
	}
	back, err := ReadState(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationState: st.encode()}}})
	if err != nil {
		t.Fatal(err)
	}
	step(back, joined.Add(9*time.Minute))
	if ps := back.Pods[cpu]; ps.Done != "" || !ps.Deadline.Equal(joined.Add(10*time.Minute)) {
		t.Fatalf("read back, 9m later: pod %+v, want not done, the same deadline", *ps)
	}
	step(back, joined.Add(10*time.Minute))
	if ps := back.Pods[cpu]; ps.Done != "gave_up" {
		t.Fatalf("at its deadline: pod %+v, want gave_up", *ps)
	}
}

// TestRecreatedPods: a controller recreating its pod on the cordoned node
// under the same name (a StatefulSet pinned by a local volume, a pod with
// spec.nodeName) gave each copy a fresh deadline, so the drain never ended,
// and its entries piled up until the node's annotations overflowed (2000
// copies: 334 KB of state). A copy now keeps the first one's deadline and
// the earlier copies are folded into counts; gone pods past maxGonePods
// are folded too.
func TestRecreatedPods(t *testing.T) {
	c := machineConfig(t, nil)
	copyOf := func(name string, i int) []corev1.Pod {
		return []corev1.Pod{runningPod("db", name, func(p *corev1.Pod) { p.UID = types.UID(fmt.Sprintf("%08d-copy", i)) })}
	}
	t.Run("same name: gave up at the first copy's deadline", func(t *testing.T) {
		st := running(nil)
		for i := range 2000 {
			now := t0.Add(time.Duration(i) * 30 * time.Second)
			c.advance(st, copyOf("db-0", i), now)
			if settle(st, now) {
				break
			}
		}
		want := Counts{InScope: 21, Evicted: 0, Gone: 20, GaveUp: 1}
		if st.Phase != PhaseGaveUp || !st.FinishedAt.Equal(t0.Add(10*time.Minute)) || st.Count() != want || len(st.Pods) != 1 {
			t.Fatalf("phase %s at %v, counts %+v, %d entries; want gave_up at %v, %+v, 1 entry",
				st.Phase, st.FinishedAt, st.Count(), len(st.Pods), t0.Add(10*time.Minute), want)
		}
		back, err := ReadState(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationState: st.encode()}}})
		if err != nil || back.Count() != want {
			t.Fatalf("read back: counts %+v (%v), want %+v", back.Count(), err, want)
		}
	})
	t.Run("new names: gone entries bounded", func(t *testing.T) {
		st := running(nil)
		for i := range 2000 {
			c.advance(st, copyOf(fmt.Sprintf("p-%d", i), i), t0.Add(time.Duration(i)*250*time.Millisecond))
		}
		if got := st.Count(); got.InScope != 2000 || got.Gone != 1999 || got.Remaining != 1 || len(st.Pods) != maxGonePods+1 {
			t.Fatalf("counts %+v, %d entries; want 2000 in scope, 1999 gone, 1 remaining, %d entries", got, len(st.Pods), maxGonePods+1)
		}
		if _, ok := st.Pods[podKey(&copyOf("p-1999", 1999)[0])]; !ok {
			t.Fatal("the pod on the node was folded")
		}
	})
}

// TestReplacementPods: a controller whose replacement lands on the
// cordoned node under a new name (a Deployment tolerating every taint, a
// controller setting spec.nodeName) gave each replacement a fresh
// eviction_timeout: the drain evicted one every poll for ever, never
// ended, and the node was never remediated. A pod first seen after the
// drain's scope last changed now has its deadline no later than that
// time plus its timeout plus eviction_timeout, so the drain ends gave_up;
// a pod a joining fault brings in still gets its whole timeout.
func TestReplacementPods(t *testing.T) {
	c := machineConfig(t, nil)
	web := func(i int) corev1.Pod { return runningPod("web", fmt.Sprintf("web-%d", i)) }
	t.Run("new names: ends gave_up", func(t *testing.T) {
		st, _ := admit(nil, "e1", opts{}, true, t0, "d1", "me")
		pods, n, evictions := []corev1.Pod{web(0)}, 0, 0
		end := t0.Add(3 * time.Hour)
		for now := t0; now.Before(end); now = now.Add(5 * time.Second) {
			ops := c.advance(st, pods, now)
			for _, o := range ops {
				// The eviction is taken; the replacement lands at once.
				c.record(st, o, callResult{}, now)
				evictions++
				n++
				pods = []corev1.Pod{web(n)}
			}
			if settle(st, now) {
				break
			}
		}
		bound := t0.Add(c.EvictionTimeout + c.EvictionTimeout)
		if st.Phase != PhaseGaveUp || st.FinishedAt.After(bound.Add(5*time.Second)) {
			t.Fatalf("phase %s at %v after %d evictions; want gave_up by %v", st.Phase, st.FinishedAt, evictions, bound)
		}
	})
	t.Run("new names past the bound, the drain held: entries bounded", func(t *testing.T) {
		// An AllowCompletion pod holds the drain for its hour; a pod
		// under a new name lands every 5s, is past its deadline when
		// first seen and leaves again.
		st, _ := admit(nil, "e1", opts{}, true, t0, "d1", "me")
		batch := runningPod("batch", "train")
		for i := range 720 {
			now := t0.Add(time.Duration(i) * 5 * time.Second)
			c.advance(st, []corev1.Pod{batch, web(i)}, now)
		}
		if got := st.Count(); got.InScope != 721 || got.Remaining != 1 || len(st.Pods) > maxGonePods+2 {
			t.Fatalf("counts %+v, %d entries; want 721 in scope, 1 remaining, at most %d entries", got, len(st.Pods), maxGonePods+2)
		}
	})
	t.Run("a joining fault's pods: whole timeout", func(t *testing.T) {
		usesGPU := func(p *corev1.Pod) { p.Annotations = map[string]string{DefaultGPUAnnotation: gpuA} }
		st, _ := admit(nil, "e1", opts{scope: Scope{GPUs: []string{gpuA}}}, true, t0, "d1", "me")
		pods := []corev1.Pod{runningPod("ml", "g", usesGPU), runningPod("web", "a")}
		c.advance(st, pods, t0)
		// A whole-node fault joins an hour in: web/a is first seen then.
		joined := t0.Add(time.Hour)
		if _, adm := admit(st, "e2", opts{}, true, joined, "d2", "me"); adm != admitWiden {
			t.Fatalf("admission %v, want widen", adm)
		}
		c.advance(st, pods, joined)
		if ps := st.Pods[keyOf("web", "a")]; ps == nil || !ps.Deadline.Equal(joined.Add(c.EvictionTimeout)) {
			t.Fatalf("joined pod %+v, want deadline %v", ps, joined.Add(c.EvictionTimeout))
		}
	})
}

// TestSkipWait: kubectl drain's --skip-wait-for-delete-timeout: a pod
// whose DeletionTimestamp is more than the timeout in the past is no longer
// waited for.
func TestSkipWait(t *testing.T) {
	now := t0.Add(time.Hour)
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		pod     corev1.Pod
		want    bool
	}{
		{"not being deleted", 5 * time.Minute, runningPod("web", "a"), false},
		{"DeletionTimestamp in the future (grace period running)", 5 * time.Minute, runningPod("web", "a", terminatingAt(now.Add(time.Minute))), false},
		{"past by less than the timeout", 5 * time.Minute, runningPod("web", "a", terminatingAt(now.Add(-4*time.Minute))), false},
		{"past by exactly the timeout", 5 * time.Minute, runningPod("web", "a", terminatingAt(now.Add(-5*time.Minute))), false},
		{"past by more than the timeout", 5 * time.Minute, runningPod("web", "a", terminatingAt(now.Add(-5*time.Minute-time.Second))), true},
		{"timeout 0: never", 0, runningPod("web", "a", terminatingAt(now.Add(-24*time.Hour))), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := machineConfig(t, func(c *Config) { c.SkipWaitForDeleteTimeout = tc.timeout })
			if got := c.skipWait(&tc.pod, now); got != tc.want {
				t.Fatalf("skipWait = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRecord: each call's result lands on its pod.
func TestRecord(t *testing.T) {
	key := keyOf("web", "a")
	now := t0.Add(time.Minute)
	for _, tc := range []struct {
		name    string
		before  PodState
		res     callResult
		metric  string
		want    PodState
		compare func(PodState) PodState
	}{
		{"evicted", PodState{BlockedBy: "old", BlockedAt: t0}, callResult{}, "evicted", PodState{Evicted: true}, nil},
		{"deleted", PodState{}, callResult{deleted: true}, "deleted", PodState{DeletedAt: now}, nil},
		{"first refusal backs off PDBBackoff", PodState{}, callResult{blockedBy: "pdb-a"}, "blocked",
			PodState{Attempts: 1, BlockedBy: "pdb-a", BlockedAt: now, NextTry: now.Add(5 * time.Second)}, nil},
		{"another PDB: a new blocker", PodState{Attempts: 1, BlockedBy: "pdb-a", BlockedAt: t0}, callResult{blockedBy: "pdb-b"}, "blocked",
			PodState{Attempts: 2, BlockedBy: "pdb-b", BlockedAt: now, NextTry: now.Add(10 * time.Second)}, nil},
		{"third refusal backs off 4×, the blocker not new", PodState{Attempts: 2, BlockedBy: "pdb-a", BlockedAt: t0}, callResult{blockedBy: "pdb-a"}, "blocked",
			PodState{Attempts: 3, BlockedBy: "pdb-a", BlockedAt: t0, NextTry: now.Add(20 * time.Second)}, nil},
		{"refusals back off at most MaxPDBBackoff", PodState{Attempts: 30}, callResult{blockedBy: "pdb-a"}, "blocked",
			PodState{Attempts: 31, BlockedBy: "pdb-a", BlockedAt: now, NextTry: now.Add(time.Minute)}, nil},
		{"not found: gone", PodState{}, callResult{err: errors.New("404"), notFound: true}, "", PodState{Done: "gone"}, nil},
		{"not found while unanswered: gone, nothing unanswered", PodState{Unanswered: t0, UnansweredErr: "503", UnansweredCall: t0},
			callResult{err: errors.New("404"), notFound: true}, "", PodState{Done: "gone"}, nil},
		{"the cluster's error: left for the retry", PodState{Attempts: 1}, callResult{err: errors.New("503"), retriable: true}, "", PodState{Attempts: 1, UnansweredErr: "503", UnansweredCall: now}, nil},
		{"the cluster's error: still unanswered", PodState{Deadline: now, Unanswered: now.Add(-time.Hour)}, callResult{err: errors.New("503"), retriable: true}, "",
			PodState{Deadline: now, Unanswered: now.Add(-time.Hour), UnansweredErr: "503", UnansweredCall: now}, nil},
		{"answered after an hour unanswered: the deadline moves out by it", PodState{Mode: ModeImmediate, Deadline: now, Unanswered: now.Add(-time.Hour),
			UnansweredErr: "503", UnansweredCall: t0}, callResult{}, "evicted",
			PodState{Mode: ModeImmediate, Deadline: now.Add(time.Hour), Evicted: true}, nil},
		{"a PDB's refusal after an hour unanswered: the deadline moves out by it", PodState{Mode: ModeImmediate, Deadline: now, Unanswered: now.Add(-time.Hour)},
			callResult{blockedBy: "pdb-a"}, "blocked",
			PodState{Mode: ModeImmediate, Deadline: now.Add(time.Hour), Attempts: 1, BlockedBy: "pdb-a", BlockedAt: now, NextTry: now.Add(5 * time.Second)}, nil},
		{"a DeleteAfterTimeout pod's delete answered: its deadline stays", PodState{Mode: ModeDeleteAfterTimeout, Deadline: now, Unanswered: now.Add(-time.Hour)},
			callResult{deleted: true}, "deleted", PodState{Mode: ModeDeleteAfterTimeout, Deadline: now, DeletedAt: now}, nil},
		{"the pod's error: noted and backed off", PodState{}, callResult{err: errors.New("invalid")}, "refused",
			PodState{Attempts: 1, Reason: "invalid", NextTry: now.Add(5 * time.Second)}, nil},
		{"the pod's error: bounded", PodState{}, callResult{err: errors.New(strings.Repeat("x", 2000))}, "refused",
			PodState{Attempts: 1, Reason: strings.Repeat("x", maxPodReason-3) + "...", NextTry: now.Add(5 * time.Second)}, nil},
		{"evicted after a refusal: its reason cleared", PodState{Attempts: 1, Reason: "denied"}, callResult{}, "evicted",
			PodState{Attempts: 1, Evicted: true}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := machineConfig(t, nil)
			ps := tc.before
			st := running(map[string]*PodState{key: &ps})
			if m := c.record(st, op{key: key}, tc.res, now); m != tc.metric {
				t.Errorf("metric %q, want %q", m, tc.metric)
			}
			if !reflect.DeepEqual(*st.Pods[key], tc.want) {
				t.Errorf("got %+v\nwant %+v", *st.Pods[key], tc.want)
			}
		})
	}
}

// TestRetryAt: a refused call is tried again after the pod's backoff; a
// DeleteAfterTimeout pod's eviction no later than its deadline (its
// delete is due then), its refused delete after the backoff.
func TestRetryAt(t *testing.T) {
	c := machineConfig(t, nil) // pdb_backoff 5s
	now := t0.Add(time.Minute)
	for _, tc := range []struct {
		name string
		ps   PodState
		del  bool
		want time.Time
	}{
		{"Immediate", PodState{Mode: ModeImmediate, Attempts: 1, Deadline: now.Add(time.Second)}, false, now.Add(5 * time.Second)},
		{"DeleteAfterTimeout, eviction far from its deadline", PodState{Mode: ModeDeleteAfterTimeout, Attempts: 1, Deadline: now.Add(time.Hour)}, false, now.Add(5 * time.Second)},
		{"DeleteAfterTimeout, eviction near its deadline", PodState{Mode: ModeDeleteAfterTimeout, Attempts: 1, Deadline: now.Add(time.Second)}, false, now.Add(time.Second)},
		{"DeleteAfterTimeout, delete", PodState{Mode: ModeDeleteAfterTimeout, Attempts: 1, Deadline: t0}, true, now.Add(5 * time.Second)},
	} {
		if got := c.retryAt(&tc.ps, op{delete: tc.del}, now); !got.Equal(tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestSettle: the drain ends once no pod remains.
func TestSettle(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pods  []string // Done of each pod
		phase string
		ended bool
	}{
		{"no pods", nil, PhaseSucceeded, true},
		{"all gone or completed", []string{"gone", "completed"}, PhaseSucceeded, true},
		{"one given up", []string{"gone", "gave_up"}, PhaseGaveUp, true},
		{"one stuck terminating, no longer waited for", []string{"gone", "skipped"}, PhaseSucceeded, true},
		{"one remaining", []string{"gone", ""}, PhaseRunning, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := running(nil)
			for i, d := range tc.pods {
				st.Pods[fmt.Sprint(i)] = &PodState{Done: d}
			}
			now := t0.Add(time.Minute)
			if ended := settle(st, now); ended != tc.ended || st.Phase != tc.phase {
				t.Fatalf("ended %v phase %s, want %v %s", ended, st.Phase, tc.ended, tc.phase)
			}
			if tc.ended && !st.FinishedAt.Equal(now) {
				t.Fatalf("finished at %v", st.FinishedAt)
			}
		})
	}
}

// TestBlockedAt names each PDB that newly blocked a pod in a step once,
// with those pods, not the pods blocked in another step nor those done;
// blockTimes lists the steps whose blockers still block.
func TestBlockedAt(t *testing.T) {
	t1, t2 := t0.Add(time.Minute), t0.Add(2*time.Minute)
	st := running(map[string]*PodState{
		"a": {BlockedBy: "pdb-2", BlockedAt: t2},
		"b": {BlockedBy: "pdb-1", BlockedAt: t2},
		"c": {BlockedBy: "pdb-1", BlockedAt: t2},
		"d": {BlockedBy: "pdb-3", BlockedAt: t1},               // blocked in an earlier step
		"e": {BlockedBy: "pdb-4", BlockedAt: t2, Done: "gone"}, // done
		"f": {BlockedBy: "pdb-5", BlockedAt: t0, Done: "gone"}, // done
		"g": {Evicted: true},
	})
	pdbs, pods := blockedAt(st, t2)
	if want := []string{"pdb-1", "pdb-2"}; !reflect.DeepEqual(pdbs, want) {
		t.Fatalf("got %v, want %v", pdbs, want)
	}
	if want := []string{"a=pdb-2", "b=pdb-1", "c=pdb-1"}; !reflect.DeepEqual(pods, want) {
		t.Fatalf("pods %v, want %v", pods, want)
	}
	if r := blockedReason(pdbs); r != "blocked by PDB pdb-1, PDB pdb-2" {
		t.Fatalf("reason %q", r)
	}
	if got, _ := blockedAt(st, t2.Add(time.Second)); len(got) != 0 {
		t.Fatalf("another step blocked nothing, got %v", got)
	}
	// The state as read back (JSON) says the same.
	back, err := ReadState(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationState: st.encode()}}})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := blockedAt(back, t2); !reflect.DeepEqual(got, pdbs) {
		t.Fatalf("read back: %v", got)
	}
	if got := blockTimes(back); !reflect.DeepEqual(got, []time.Time{t1, t2}) {
		t.Fatalf("block times %v", got)
	}
}

// TestAdmit: what a trigger does to the node's drain.
func TestAdmit(t *testing.T) {
	whole := opts{trig: Trigger{CheckName: "XID_ERROR_79", RecommendedAction: "RESTART_VM"}}
	gpu := func(g string) opts {
		return opts{trig: Trigger{CheckName: "XID_ERROR_48", RecommendedAction: "COMPONENT_RESET", Entities: "GPU=" + g},
			scope: Scope{GPUs: []string{g}}}
	}
	finished := func() *State {
		return &State{ID: "old", Phase: PhaseSucceeded, Seen: []string{"e1"}, Pods: map[string]*PodState{}}
	}
	// drained finished (succeeded) at t0 over scope, for a RESTART_VM.
	drained := func(sc Scope) *State {
		return &State{ID: "old", Phase: PhaseSucceeded, FinishedAt: t0, Scope: sc, Trigger: Trigger{RecommendedAction: "RESTART_VM"},
			Seen: []string{"e1"}, Pods: map[string]*PodState{}}
	}
	// gpuRestart is a GPU's fault that asks for RESTART_VM.
	gpuRestart := func(g string) opts {
		o := gpu(g)
		o.trig.RecommendedAction = "RESTART_VM"
		return o
	}
	// repeat is o decided at t0+d on a node already quarantined.
	repeat := func(o opts, d time.Duration) opts {
		o.already, o.decidedAt = true, t0.Add(d)
		return o
	}
	// late is o generated at t0+d, decided on a node already quarantined
	// ten minutes after the drain finished.
	late := func(o opts, d time.Duration) opts {
		o = repeat(o, 10*time.Minute)
		o.trig.GeneratedAt = t0.Add(d)
		return o
	}
	inProgress := func(o opts) *State {
		return &State{ID: "d1", Phase: PhaseRunning, StartedAt: t0, Scope: o.scope, Trigger: Trigger{EventIDs: []string{"e1"}},
			Seen: []string{"e1"}, Pods: map[string]*PodState{}}
	}
	for _, tc := range []struct {
		name        string
		st          *State
		event       string
		o           opts
		quarantined bool
		want        admission
		check       func(t *testing.T, st *State)
	}{
		{"replay of a finished drain", finished(), "e1", whole, true, admitReplay, func(t *testing.T, st *State) {
			if st.ID != "old" || st.Phase != PhaseSucceeded {
				t.Fatalf("state changed: %+v", st)
			}
		}},
		{"resume", inProgress(whole), "e1", whole, true, admitResume, nil},
		{"resume even when no longer quarantined (the step cancels it)", inProgress(whole), "e1", whole, false, admitResume, nil},
		{"skip", nil, "e1", opts{skip: true}, true, admitSkip, nil},
		{"not quarantined", nil, "e1", whole, false, admitUnquarantined, nil},
		{"start", nil, "e1", whole, true, admitStart, func(t *testing.T, st *State) {
			if st.ID != "new" || st.Phase != PhaseRunning || !st.StartedAt.Equal(t0) || st.By != "me" ||
				!reflect.DeepEqual(st.Seen, []string{"e1"}) || st.Trigger.CheckName != "XID_ERROR_79" || len(st.GPUs) != 0 {
				t.Fatalf("%+v", st)
			}
		}},
		{"start after a finished drain keeps what was seen", finished(), "e2", whole, true, admitStart, func(t *testing.T, st *State) {
			if st.ID != "new" || !reflect.DeepEqual(st.Seen, []string{"e1", "e2"}) {
				t.Fatalf("%+v", st)
			}
		}},
		{"a second GPU widens a GPU drain", inProgress(gpu(gpuA)), "e2", gpu(gpuB), true, admitWiden, func(t *testing.T, st *State) {
			if !reflect.DeepEqual(st.GPUs, []string{gpuA, gpuB}) || !reflect.DeepEqual(st.Trigger.EventIDs, []string{"e1", "e2"}) ||
				!reflect.DeepEqual(st.Seen, []string{"e1", "e2"}) {
				t.Fatalf("%+v", st)
			}
		}},
		{"a whole-node fault widens a GPU drain to the node and takes its trigger", inProgress(gpu(gpuA)), "e2", whole, true, admitWiden, func(t *testing.T, st *State) {
			if len(st.GPUs) != 0 || st.Trigger.RecommendedAction != "RESTART_VM" || !reflect.DeepEqual(st.Trigger.EventIDs, []string{"e1", "e2"}) {
				t.Fatalf("%+v", st)
			}
		}},
		{"force during a drain forces it, a pod backing off tried at once", func() *State {
			st := inProgress(whole)
			st.Pods["web/a@1"] = &PodState{Mode: ModeImmediate, BlockedBy: "pdb-a", NextTry: t0.Add(time.Minute)}
			st.Pods["web/b@2"] = &PodState{Mode: ModeImmediate, Done: "gave_up", NextTry: t0.Add(time.Minute)}
			return st
		}(), "e2", opts{trig: whole.trig, force: true}, true, admitWiden, func(t *testing.T, st *State) {
			if !st.Force {
				t.Fatal("not forced")
			}
			if nt := st.Pods["web/a@1"].NextTry; !nt.IsZero() {
				t.Fatalf("pod backing off: NextTry %v, want none", nt)
			}
			if nt := st.Pods["web/b@2"].NextTry; !nt.Equal(t0.Add(time.Minute)) {
				t.Fatalf("pod done changed: NextTry %v", nt)
			}
		}},
		{"a repeat decided before the drain succeeded is covered", drained(Scope{}), "e2", repeat(whole, -time.Second), true, admitCovered, func(t *testing.T, st *State) {
			if st.ID != "old" || !reflect.DeepEqual(st.Seen, []string{"e1"}) {
				t.Fatalf("state changed: %+v", st)
			}
		}},
		{"decided as the drain finished: covered", drained(Scope{}), "e2", repeat(whole, 0), true, admitCovered, nil},
		{"a GPU fault under a whole-node drain: covered", drained(Scope{}), "e2", repeat(gpuRestart(gpuA), -time.Second), true, admitCovered, nil},
		{"the same GPU under a GPU drain: covered", drained(Scope{GPUs: []string{gpuA}}), "e2", repeat(gpuRestart(gpuA), -time.Second), true, admitCovered, nil},
		{"decided after the drain finished: a new drain", drained(Scope{}), "e2", repeat(whole, time.Second), true, admitStart, nil},
		{"a node newly quarantined: a new drain", drained(Scope{}), "e2", func() opts { o := repeat(whole, -time.Second); o.already = false; return o }(), true, admitStart, nil},
		{"no decision time: a new drain", drained(Scope{}), "e2", func() opts { o := repeat(whole, 0); o.decidedAt = time.Time{}; return o }(), true, admitStart, nil},
		{"another GPU: a new drain", drained(Scope{GPUs: []string{gpuA}}), "e2", repeat(gpuRestart(gpuB), -time.Second), true, admitStart, nil},
		{"a whole-node fault after a GPU drain: a new drain", drained(Scope{GPUs: []string{gpuA}}), "e2", repeat(whole, -time.Second), true, admitStart, nil},
		{"a GPU's reset under the drain's reboot: covered", drained(Scope{}), "e2", repeat(gpu(gpuA), -time.Second), true, admitCovered, nil},
		{"more remediation asked for: a new drain", drained(Scope{}), "e2", func() opts { o := repeat(whole, -time.Second); o.trig.RecommendedAction = "REPLACE_VM"; return o }(), true, admitStart, nil},
		{"another custom remediation: a new drain", drained(Scope{}), "e2", func() opts { o := repeat(whole, -time.Second); o.trig.CustomAction = "FLASH"; return o }(), true, admitStart, nil},
		{"forced where the drain was not: a new drain", drained(Scope{}), "e2", func() opts { o := repeat(whole, -time.Second); o.force = true; return o }(), true, admitStart, nil},
		{"a drain that gave up covers nothing", func() *State { st := drained(Scope{}); st.Phase = PhaseGaveUp; return st }(), "e2", repeat(whole, -time.Second), true, admitStart, nil},
		{"no longer quarantined: no drain", drained(Scope{}), "e2", repeat(whole, -time.Second), false, admitUnquarantined, nil},
		// An Xid flood's repeats generated before the remediation's reboot
		// (which follows the drain's end), sent from the agent's spool once
		// the node is back: decided long after the drain finished.
		{"generated before the drain finished, decided after it: covered", drained(Scope{}), "e2", late(whole, -time.Second), true, admitCovered, nil},
		{"generated as the drain finished: covered", drained(Scope{}), "e2", late(whole, 0), true, admitCovered, nil},
		{"a GPU's late repeat under a GPU drain: covered", drained(Scope{GPUs: []string{gpuA}}), "e2", late(gpuRestart(gpuA), -time.Second), true, admitCovered, nil},
		{"generated after the drain finished: a new drain", drained(Scope{}), "e2", late(whole, time.Second), true, admitStart, nil},
		// A person uncordoned the node since the drain (its faults
		// acknowledged, kept: already); a late fault generated before the
		// drain finished begins a new quarantine after it: the drain of
		// before the uncordon is not of it.
		{"generated before the drain, quarantined again after it: a new drain", drained(Scope{}), "e2",
			func() opts { o := late(whole, -time.Second); o.since = o.decidedAt; return o }(), true, admitStart, nil},
		{"generated before the drain, of its quarantine: covered", drained(Scope{}), "e2",
			func() opts { o := late(whole, -time.Second); o.since = t0.Add(-time.Hour); return o }(), true, admitCovered, nil},
		{"generated before, another GPU: a new drain", drained(Scope{GPUs: []string{gpuA}}), "e2", late(gpuRestart(gpuB), -time.Second), true, admitStart, nil},
		{"generated before, newly quarantined: a new drain", drained(Scope{}), "e2", func() opts { o := late(whole, -time.Second); o.already = false; return o }(), true, admitStart, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, adm := admit(tc.st, tc.event, tc.o, tc.quarantined, t0, "new", "me")
			if adm != tc.want {
				t.Fatalf("admission %d, want %d", adm, tc.want)
			}
			if tc.check != nil {
				tc.check(t, st)
			}
		})
	}
}

// TestAdmitKeepsTheWholeNode: a GPU's COMPONENT_RESET that starts a new
// drain after the node's whole-node drain of the same quarantine (one
// that succeeded or gave up) drains the whole node, so the node's drain
// state stays whole-node and the janitor still reboots it (its
// partialDrain refuses a reboot after a GPU-scoped drain). Before, the
// new drain's state named the GPU: a RebootNode waiting for its slot or
// cooldown was refused NotDrained and the node escalated to a human.
// After a lift (the node newly quarantined, or its quarantine begun after
// the drain finished) the fault drains only its GPU's pods, as before.
func TestAdmitKeepsTheWholeNode(t *testing.T) {
	reset := opts{trig: Trigger{CheckName: "XID_ERROR_48", RecommendedAction: "COMPONENT_RESET", Entities: "GPU=" + gpuA},
		scope: Scope{GPUs: []string{gpuA}}, already: true, decidedAt: t0.Add(2 * time.Hour)}
	// prev finished at t0 in phase over scope, for a RESTART_BM.
	prev := func(phase string, sc Scope) *State {
		return &State{ID: "old", Phase: phase, FinishedAt: t0, Scope: sc, Trigger: Trigger{RecommendedAction: "RESTART_BM"},
			Seen: []string{"e1"}, Pods: map[string]*PodState{}}
	}
	with := func(f func(o *opts)) opts {
		o := reset
		f(&o)
		return o
	}
	for _, tc := range []struct {
		name string
		st   *State
		o    opts
		want []string // the new drain's GPUs; nil: the whole node
	}{
		{"after a whole-node drain of the quarantine", prev(PhaseSucceeded, Scope{}), reset, nil},
		{"quarantined before the drain finished", prev(PhaseSucceeded, Scope{}), with(func(o *opts) { o.since = t0.Add(-10 * time.Minute) }), nil},
		{"quarantined within the clocks' slack of the finish", prev(PhaseSucceeded, Scope{}), with(func(o *opts) { o.since = t0.Add(30 * time.Second) }), nil},
		{"after a whole-node drain that gave up", prev(PhaseGaveUp, Scope{}), reset, nil},
		{"newly quarantined", prev(PhaseSucceeded, Scope{}), with(func(o *opts) { o.already = false }), []string{gpuA}},
		{"lifted and quarantined again since the drain", prev(PhaseSucceeded, Scope{}), with(func(o *opts) { o.since = t0.Add(time.Hour) }), []string{gpuA}},
		{"after a cancelled drain", prev(PhaseCancelled, Scope{}), reset, []string{gpuA}},
		{"after another GPU's drain", prev(PhaseSucceeded, Scope{GPUs: []string{gpuB}}), reset, []string{gpuA}},
		{"no drain before", nil, reset, []string{gpuA}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, adm := admit(tc.st, "e2", tc.o, true, t0.Add(2*time.Hour), "new", "me")
			if adm != admitStart {
				t.Fatalf("admission %d, want a new drain (%d)", adm, admitStart)
			}
			if !reflect.DeepEqual(st.GPUs, tc.want) {
				t.Fatalf("new drain's GPUs %v, want %v", st.GPUs, tc.want)
			}
			if st.Trigger.RecommendedAction != "COMPONENT_RESET" {
				t.Fatalf("trigger %+v, want the GPU's COMPONENT_RESET", st.Trigger)
			}
		})
	}
}

// TestAdmitFollowsItsDrain: a record that names the drain it was admitted
// to (HeaderDrain) follows that drain whatever Seen still holds: it
// resumes it while it runs, says its result once it finished, and ends
// when a newer drain holds the node. Before, with more than maxSeen faults
// joined, the first fault's follow-up joined the drain again and, once it
// succeeded, started a new drain under its id.
func TestAdmitFollowsItsDrain(t *testing.T) {
	whole := opts{trig: Trigger{CheckName: "XID_ERROR_79", RecommendedAction: "RESTART_VM"}}
	following := func(d string) opts { o := whole; o.drain = d; return o }
	// joined is drain d1, started by e0, that e1…e32 joined: e0 dropped
	// out of Seen.
	joined := func(phase string) *State {
		st, adm := admit(nil, "e0", whole, true, t0, "d1", "me")
		if adm != admitStart {
			t.Fatalf("e0: admission %d", adm)
		}
		for i := 1; i <= maxSeen; i++ {
			if st, adm = admit(st, fmt.Sprintf("e%d", i), whole, true, t0, "d-e", "me"); adm != admitWiden {
				t.Fatalf("e%d: admission %d", i, adm)
			}
		}
		if st.seen("e0") {
			t.Fatal("e0 still in Seen")
		}
		st.Phase = phase
		return st
	}
	newer := func(phase string) *State {
		st := joined(PhaseSucceeded)
		st.ID, st.Phase = "d2", phase
		st.Seen = append(st.Seen[1:], "e0") // e0 seen again: followed all the same
		return st
	}
	for _, tc := range []struct {
		name        string
		st          *State
		o           opts
		quarantined bool
		want        admission
	}{
		{"without its drain, as before: joins again", joined(PhaseRunning), whole, true, admitWiden},
		{"without its drain, as before: a new drain", joined(PhaseSucceeded), whole, true, admitStart},
		{"its drain running: resumed", joined(PhaseRunning), following("d1"), true, admitResume},
		{"its drain running, no longer quarantined: resumed (the step cancels it)", joined(PhaseRunning), following("d1"), false, admitResume},
		{"its drain succeeded: its result again", joined(PhaseSucceeded), following("d1"), true, admitReplay},
		{"its drain gave up: its result again", joined(PhaseGaveUp), following("d1"), true, admitReplay},
		{"its drain cancelled: its result again", joined(PhaseCancelled), following("d1"), false, admitReplay},
		{"a newer drain running: ends", newer(PhaseRunning), following("d1"), true, admitEnded},
		{"a newer drain finished: ends", newer(PhaseSucceeded), following("d1"), true, admitEnded},
		{"no drain state left: judged anew", nil, following("d1"), true, admitStart},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before string
			if tc.st != nil {
				before = tc.st.encode()
			}
			st, adm := admit(tc.st, "e0", tc.o, tc.quarantined, t0, "d-new", "me")
			if adm != tc.want {
				t.Fatalf("admission %d, want %d", adm, tc.want)
			}
			if tc.o.drain != "" && tc.st != nil && st.encode() != before {
				t.Fatalf("state changed: %s, was %s", st.encode(), before)
			}
		})
	}
}

// TestReadStateDropsNullPods: a null pod in the annotation (edited by
// hand) is no pod — every walk of the pods dereferenced it, a panic at
// each redelivery of the node's drain.
func TestReadStateDropsNullPods(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{
		AnnotationState: `{"phase":"running","pods":{"ns/a@1":null,"ns/b@2":{"evicted":true}}}`}}}
	st, err := ReadState(n)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := st.Pods["ns/a@1"]; ok || st.Pods["ns/b@2"] == nil {
		t.Fatalf("pods %v: want the null one dropped", st.Pods)
	}
	if c := st.Count(); c.InScope != 1 {
		t.Fatalf("counts %+v, want one pod", c)
	}
}
