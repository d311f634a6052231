package janitor

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// nodeEvents waits (up to 10s) for the janitor's Events on node to be
// want ("Type/Reason", any order) and fails the test with what there is
// otherwise; it returns their messages.
func nodeEvents(t *testing.T, kube kubernetes.Interface, node string, want ...string) []string {
	t.Helper()
	slices.Sort(want)
	var got, msgs []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		l, err := kube.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + node})
		if err != nil {
			t.Fatal(err)
		}
		got, msgs = nil, nil
		for _, ev := range l.Items {
			if ev.Source.Component == "faultline-janitor" {
				got, msgs = append(got, ev.Type+"/"+ev.Reason), append(msgs, ev.Message)
			}
		}
		slices.Sort(got)
		if slices.Equal(got, want) {
			return msgs
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s Events %q, want %q:\n%s", node, got, want, strings.Join(msgs, "\n"))
		}
	}
}
