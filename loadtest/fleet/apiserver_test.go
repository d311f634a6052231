package fleet

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestKubeletHeld: the faults' pods terminating at the first list are
// followed until gone, per node; a pod evicted later and another node's
// terminating pod are not.
func TestKubeletHeld(t *testing.T) {
	deleting := metav1.NewTime(time.Now())
	pod := func(name, node string, terminating bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: drainNamespace}, Spec: corev1.PodSpec{NodeName: node}}
		if terminating {
			p.DeletionTimestamp = &deleting
		}
		return p
	}
	kc := fake.NewSimpleClientset(
		pod("a-0", "a", true), pod("a-1", "a", true), // held: gone when both are
		pod("b-0", "b", false), // running: the drain's to evict
		pod("x-0", "x", true),  // not a fault's node
	)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	held := kubeletHeld(ctx, kc, []string{"a", "b"})
	time.Sleep(300 * time.Millisecond)
	pods := kc.CoreV1().Pods(drainNamespace)
	if err := pods.Delete(ctx, "a-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// b's pod evicted after the first list, and never finished: not
	// waited for.
	if _, err := pods.Update(ctx, pod("b-0", "b", true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	lastGone := time.Now()
	if err := pods.Delete(ctx, "a-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	gone := <-held
	if len(gone) != 1 || gone["a"].Before(lastGone) || time.Since(lastGone) > 2*time.Second {
		t.Fatalf("gone %v %v after the start, want node a only, %v after it, sent at once", gone, time.Since(start), lastGone.Sub(start))
	}
}
