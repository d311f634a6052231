package coordination

import (
	"context"
	"log/slog"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/faultline/faultline/agents/preflight/gang"
)

// TestRunStoppedBeforeSync: a controller stopped while its pod cache has not
// synced yet (the API server slow or unreachable) stops cleanly, without an
// error: a shutdown is not a failure.
func TestRunStoppedBeforeSync(t *testing.T) {
	kc, err := kubernetes.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c := New(kc, nil, slog.New(slog.DiscardHandler), Options{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after a stop before the sync: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the stop")
	}
}

// TestGangSizeForgottenWithItsPods: the size learned for a gang is kept
// while it has pods and dropped once they are gone, so a long-running
// webhook's memory follows the gangs that exist, not every job it saw.
// (A fake clientset: the bookkeeping only; the ConfigMaps are tested on a
// real apiserver in the webhook package.)
func TestGangSizeForgottenWithItsPods(t *testing.T) {
	const ns, id = "team-a", "lbl-job1"
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels:      map[string]string{gang.LabelGang: id, "job": "job1", "job-size": "2"},
			Annotations: map[string]string{gang.AnnotationMethod: "labels", gang.AnnotationName: "job1"}}}
	}
	kc := fake.NewClientset(pod("a"), pod("b"))
	c := New(kc, gang.NewDiscovery(gang.LabelsMethod{IDLabel: "job", SizeLabel: "job-size"}), slog.New(slog.DiscardHandler), Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.factory.Start(ctx.Done())
	c.factory.WaitForCacheSync(ctx.Done())
	known := func() (int, bool) {
		c.mu.Lock()
		defer c.mu.Unlock()
		n, ok := c.size[ns+"/"+id]
		return n, ok
	}
	if _, err := c.Reconcile(ctx, ns, id); err != nil {
		t.Fatal(err)
	}
	if n, ok := known(); !ok || n != 2 {
		t.Fatalf("size known %v (%d), want 2", ok, n)
	}
	for _, name := range []string{"a", "b"} {
		if err := kc.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if pods, _ := c.GangPods(ns, id); len(pods) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the informer still shows the gang's pods after 5s")
		}
	}
	if _, err := c.Reconcile(ctx, ns, id); err != nil {
		t.Fatal(err)
	}
	if n, ok := known(); ok {
		t.Fatalf("the ended gang's size (%d) is still kept", n)
	}
}

// TestExcludedPodsNotAwaited: a gang's pods that run no gang-wide check
// (the webhook marked them gang.LabelExcluded: a launcher without GPUs, a
// pod without network devices) are counted by the scheduler's size but
// never register; the ConfigMap's expected_count leaves them out and lists
// them, so the peers do not wait for them until PREFLIGHT_GANG_TIMEOUT.
func TestExcludedPodsNotAwaited(t *testing.T) {
	const ns, id = "team-a", "lbl-job1"
	pod := func(name string, labels map[string]string, reason string) *corev1.Pod {
		labels["job"], labels["job-size"] = "job1", "3"
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels,
			Annotations: map[string]string{gang.AnnotationMethod: "labels", gang.AnnotationName: "job1", gang.AnnotationExcluded: reason}},
			Status: corev1.PodStatus{PodIP: "10.0.0." + name[len(name)-1:], InitContainerStatuses: []corev1.ContainerStatus{running}}}
	}
	kc := fake.NewClientset(pod("w1", map[string]string{gang.LabelGang: id}, ""), pod("w2", map[string]string{gang.LabelGang: id}, ""),
		pod("launcher", map[string]string{gang.LabelExcluded: id}, "no GPUs"))
	c := New(kc, gang.NewDiscovery(gang.LabelsMethod{IDLabel: "job", SizeLabel: "job-size"}), slog.New(slog.DiscardHandler), Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.factory.Start(ctx.Done())
	c.exFactory.Start(ctx.Done())
	c.factory.WaitForCacheSync(ctx.Done())
	c.exFactory.WaitForCacheSync(ctx.Done())
	if _, err := c.Reconcile(ctx, ns, id); err != nil {
		t.Fatal(err)
	}
	cm, err := kc.CoreV1().ConfigMaps(ns).Get(ctx, gang.ConfigMapPrefix+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data[KeyExpected] != "2" || cm.Data[KeyPeers] != "w1:10.0.0.1\nw2:10.0.0.2\n" || cm.Data[KeyExcluded] != "launcher: no GPUs\n" {
		t.Fatalf("ConfigMap data %q, want expected_count 2 (3 less the launcher), peers w1 and w2, the launcher excluded", cm.Data)
	}
}

// TestMergePatchDeletesKeys: once no pod is excluded, the patch deletes
// the ConfigMap's excluded key (a null); before, a merge patch left it,
// the ConfigMap never equalled the desired one, and every pod event and
// resync patched it again.
func TestMergePatchDeletesKeys(t *testing.T) {
	ctx := context.Background()
	kc := fake.NewClientset(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: gang.ConfigMapPrefix + "g", Namespace: "ns"},
		Data: map[string]string{KeyGangID: "g", KeyExcluded: "w3: no GPUs\n"}})
	cms := kc.CoreV1().ConfigMaps("ns")
	cur, err := cms.Get(ctx, gang.ConfigMapPrefix+"g", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w1 := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "w1", Namespace: "ns", UID: "uid-w1"},
		Status: corev1.PodStatus{PodIP: "10.0.0.1", InitContainerStatuses: []corev1.ContainerStatus{running}}}
	want := Desired("ns", "g", []*corev1.Pod{w1}, nil, 1)
	patch, err := mergePatch(cur.ResourceVersion, cur.Data, want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := cms.Patch(ctx, want.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got.Data, want.Data) {
		t.Fatalf("patched data %q, want %q", got.Data, want.Data)
	}
}

// running is the status of a gang-wide check's container that runs.
var running = corev1.ContainerStatus{Name: gang.AllreduceContainer,
	State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Unix(200, 0)}}}

// TestPeers: a gang pod is a peer once its gang-wide check's init
// container runs, or ended successfully in the pod's current attempt
// (then also listed as finished). Before, every pod with an IP was one:
// a pod has its IP before its init containers run, so a peer still
// pulling the check's image or running dcgm-diag was listed at once, the
// others' gang wait ended and their torchrun timed out waiting for it.
func TestPeers(t *testing.T) {
	at := func(s int64) metav1.Time { return metav1.Unix(s, 0) }
	term := func(name string, code int32, started, finished int64) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: code, StartedAt: at(started), FinishedAt: at(finished)}}}
	}
	run := func(name string, started int64) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: at(started)}}}
	}
	wait := func(name, reason string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}}
	}
	const dcgm = "preflight-dcgm-diag"
	always := corev1.ContainerRestartPolicyAlways
	spec := corev1.PodSpec{InitContainers: []corev1.Container{{Name: "mesh-proxy", RestartPolicy: &always}, {Name: dcgm}, {Name: gang.AllreduceContainer}}}
	restarted := wait(gang.AllreduceContainer, "CrashLoopBackOff")
	restarted.RestartCount, restarted.LastTerminationState = 1, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}
	for _, tc := range []struct {
		name           string
		ip             string
		statuses       []corev1.ContainerStatus
		peer, finished bool
		// rerun: the check failed in this pod and runs again (a
		// finished peer must not pass it).
		rerun bool
	}{
		{"an IP, no container status yet", "10.0.0.1", nil, false, false, false},
		{"an IP, the check's image being pulled", "10.0.0.1",
			[]corev1.ContainerStatus{run("mesh-proxy", 10), term(dcgm, 0, 10, 100), wait(gang.AllreduceContainer, "PodInitializing")}, false, false, false},
		{"an IP, dcgm-diag running", "10.0.0.1",
			[]corev1.ContainerStatus{run("mesh-proxy", 10), run(dcgm, 10), wait(gang.AllreduceContainer, "PodInitializing")}, false, false, false},
		{"running", "10.0.0.1", []corev1.ContainerStatus{run("mesh-proxy", 10), term(dcgm, 0, 10, 100), run(gang.AllreduceContainer, 101)}, true, false, false},
		{"running, no IP", "", []corev1.ContainerStatus{run(gang.AllreduceContainer, 101)}, false, false, false},
		{"passed: finished", "10.0.0.1",
			[]corev1.ContainerStatus{run("mesh-proxy", 10), term(dcgm, 0, 10, 100), term(gang.AllreduceContainer, 0, 101, 200)}, true, true, false},
		{"failed: runs again or the pod fails", "10.0.0.1",
			[]corev1.ContainerStatus{term(dcgm, 0, 10, 100), term(gang.AllreduceContainer, 1, 101, 200)}, false, false, true},
		{"waiting to run again after a failure", "10.0.0.1", []corev1.ContainerStatus{term(dcgm, 0, 10, 100), restarted}, false, false, true},
		{"running again after a failure", "10.0.0.1", []corev1.ContainerStatus{term(dcgm, 0, 10, 100), func() corev1.ContainerStatus {
			s := run(gang.AllreduceContainer, 300)
			s.RestartCount = 1
			s.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}
			return s
		}()}, true, false, true},
		// Passed, then the sandbox was recreated: its last exit is 0, so
		// a finished peer still ends its wait.
		{"running again after a pass", "10.0.0.1", []corev1.ContainerStatus{run(dcgm, 500), func() corev1.ContainerStatus {
			s := run(gang.AllreduceContainer, 600)
			s.RestartCount = 1
			s.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}
			return s
		}()}, true, false, false},
		// The sandbox recreated: the init containers run again, the
		// check's status is still the previous attempt's.
		{"passed, dcgm-diag running again", "10.0.0.1",
			[]corev1.ContainerStatus{run(dcgm, 500), term(gang.AllreduceContainer, 0, 101, 200)}, false, false, false},
		{"passed, dcgm-diag ran again since", "10.0.0.1",
			[]corev1.ContainerStatus{term(dcgm, 0, 500, 600), term(gang.AllreduceContainer, 0, 101, 200)}, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "w0", UID: "uid-w0"}, Spec: spec,
				Status: corev1.PodStatus{PodIP: tc.ip, InitContainerStatuses: tc.statuses}}
			if peer, finished := peerState(p); peer != tc.peer || finished != tc.finished {
				t.Errorf("peer %v finished %v, want %v %v", peer, finished, tc.peer, tc.finished)
			}
			cm := Desired("ns", "g", []*corev1.Pod{p}, nil, 1)
			wantPeers, wantFinished, wantRerun := "", "", ""
			if tc.rerun {
				wantRerun = "w0\n"
			}
			if tc.peer {
				wantPeers = "w0:" + tc.ip + "\n"
			}
			if tc.finished {
				wantFinished = "w0\n"
			}
			if cm.Data[KeyPeers] != wantPeers || cm.Data[KeyFinished] != wantFinished || cm.Data[KeyRerun] != wantRerun || len(cm.OwnerReferences) != 1 {
				t.Errorf("ConfigMap data %q owners %d, want peers %q finished %q rerun %q", cm.Data, len(cm.OwnerReferences), wantPeers, wantFinished, wantRerun)
			}
		})
	}
}

// TestPeersMaster: the master is the first peer by name among the pods
// running the check or done with it, not among the pods with an IP: a
// pod still in dcgm-diag is neither listed nor the master.
func TestPeersMaster(t *testing.T) {
	pod := func(name, ip string, st corev1.ContainerStatus) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
			Status: corev1.PodStatus{PodIP: ip, InitContainerStatuses: []corev1.ContainerStatus{st}}}
	}
	pulling := corev1.ContainerStatus{Name: gang.AllreduceContainer, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}}
	done := corev1.ContainerStatus{Name: gang.AllreduceContainer, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}}
	cm := Desired("ns", "g", []*corev1.Pod{pod("w2", "10.0.0.3", done), pod("w0", "10.0.0.1", pulling), pod("w1", "10.0.0.2", running)}, nil, 3)
	want := map[string]string{KeyGangID: "g", KeyExpected: "3", KeyMaster: "10.0.0.2", KeyPeers: "w1:10.0.0.2\nw2:10.0.0.3\n", KeyFinished: "w2\n"}
	if !maps.Equal(cm.Data, want) || len(cm.OwnerReferences) != 3 {
		t.Fatalf("ConfigMap data %q owners %d, want %q and 3 owners", cm.Data, len(cm.OwnerReferences), want)
	}
}
