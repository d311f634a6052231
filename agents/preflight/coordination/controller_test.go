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
			Status: corev1.PodStatus{PodIP: "10.0.0." + name[len(name)-1:]}}
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
	w1 := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "w1", Namespace: "ns", UID: "uid-w1"}, Status: corev1.PodStatus{PodIP: "10.0.0.1"}}
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
