package clusters

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/faultline/faultline/internal/testenv"
)

// TestWatchClientsOutliveTimeout: on a real apiserver with kube.timeout
// 1s, a watch through the request clients is cut at the timeout (client-go
// makes it the http.Client's), while the same watch through the watch
// clients, which the roles' informers use, stays open.
func TestWatchClientsOutliveTimeout(t *testing.T) {
	k := testenv.StartKube(t, testenv.KubeOptions{})
	cfg := DefaultConfig()
	cfg.Timeout = time.Second
	cfg.Clusters = []Cluster{{Name: "c", Kubeconfig: k.Kubeconfig()}}
	cl, err := NewRegistry(cfg, nil).Get("c")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	type watchFunc func(context.Context, metav1.ListOptions) (watch.Interface, error)
	watches := []struct {
		name  string
		cut   bool // at kube.timeout
		watch watchFunc
	}{
		{"Kube", true, cl.Kube.CoreV1().Namespaces().Watch},
		{"Dynamic", true, cl.Dynamic.Resource(ns).Watch},
		{"WatchKube", false, cl.WatchKube.CoreV1().Namespaces().Watch},
		{"WatchDynamic", false, cl.WatchDynamic.Resource(ns).Watch},
	}
	start := time.Now()
	ended := make([]chan time.Duration, len(watches))
	for i, w := range watches {
		wi, err := w.watch(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("%s: watch: %v", w.name, err)
		}
		defer wi.Stop()
		ended[i] = make(chan time.Duration, 1)
		go func() {
			for range wi.ResultChan() { // the namespaces there, then nothing
			}
			ended[i] <- time.Since(start)
		}()
	}
	time.Sleep(4 * time.Second)
	for i, w := range watches {
		select {
		case after := <-ended[i]:
			if !w.cut {
				t.Errorf("%s: watch ended after %v; want it open past kube.timeout", w.name, after.Round(time.Millisecond))
			}
		default:
			if w.cut {
				t.Errorf("%s: watch still open after 4s with kube.timeout 1s; this test no longer shows why the watch clients exist", w.name)
			}
		}
	}
}
