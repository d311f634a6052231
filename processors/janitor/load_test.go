package janitor

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
)

// noop is a provider that accepts every signal at once: the janitor's own
// ceiling, with no provider latency.
type noop struct{}

func (noop) Reboot(context.Context, Target, RebootMode) error  { return nil }
func (noop) Terminate(context.Context, Target) error           { return nil }
func (noop) ResetGPUs(context.Context, Target, []string) error { return nil }

// TestLoadRebootStarts measures, against a real kube-apiserver, how fast
// one janitor starts reboots with the concurrency limits off, and the time
// from a RebootNode's create request being sent to its SignalSent=True
// arriving on a watch. Providers: "noop" (no provider latency: the
// janitor's own ceiling) and "redfish" (sushy-tools' emulator, one BMC
// for every node). The clients run at the default QPS/burst
// (clusters.DefaultQPS/DefaultBurst). It runs only with
// FAULTLINE_JANITOR_LOAD=1 (README.md has the numbers):
//
//	FAULTLINE_JANITOR_LOAD=1 go test ./processors/janitor -run TestLoad -v
//
// FAULTLINE_JANITOR_LOAD_NODES (default 300) changes the count.
func TestLoadRebootStarts(t *testing.T) {
	t.Parallel()
	if os.Getenv("FAULTLINE_JANITOR_LOAD") != "1" {
		t.Skip("set FAULTLINE_JANITOR_LOAD=1 to run the load measurement")
	}
	n := 300
	if v := os.Getenv("FAULTLINE_JANITOR_LOAD_NODES"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	kube.ApplyCRDs(t, "../../deploy/crds/*.yaml")
	rc := kube.RESTConfig()
	rc.QPS, rc.Burst = clusters.DefaultQPS, clusters.DefaultBurst
	k, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	// The test's own clients (creates, watch) are not the janitor's.
	trc := kube.RESTConfig()
	trc.QPS, trc.Burst = 5000, 10000
	tdyn, _ := dynamic.NewForConfig(trc)
	tk, _ := kubernetes.NewForConfig(trc)
	var sys []testenv.SushySystem
	for i := range n {
		sys = append(sys, testenv.SushySystem{UUID: fmt.Sprintf("33333333-0000-4000-8000-%012d", i), Name: fmt.Sprintf("s%d", i)})
	}
	bmc := testenv.StartSushy(t, testenv.SushyOptions{Systems: sys})
	ctx := context.Background()
	if _, err := tk.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "faultline"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := tk.CoreV1().Secrets("faultline").Create(ctx, bmcSecret("faultline", "bmc-credentials", "admin", "x"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	for _, mode := range []string{"noop", "redfish"} {
		t.Run(mode, func(t *testing.T) {
			names := make([]string, n)
			for i := range n {
				node := fmt.Sprintf("%s-node-%d", mode, i)
				names[i] = "load-" + node
				nd := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node,
					Labels:      map[string]string{events.LabelQuarantined: "true", labelDrain: "succeeded", AnnotationProvider: mode},
					Annotations: map[string]string{AnnotationBMC: bmc.URL + bmc.SystemPath(sys[i].UUID)}}}
				if mode == "noop" {
					nd.Labels[AnnotationProvider] = "noop"
				}
				if _, err := tk.CoreV1().Nodes().Create(ctx, booted(nd), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			cfg := DefaultConfig()
			cfg.MaxConcurrent, cfg.MaxConcurrentPerRack, cfg.MaxConcurrentPerProvider, cfg.Cooldown = 0, 0, 0, 0
			cfg.PollInterval = time.Minute // only the start is measured
			cfg.Redfish.AllowedNetworks = []string{"127.0.0.0/8"}
			cfg.Redfish.AllowHTTP = true // the emulator serves http here
			provs, err := BuildProviders(cfg, testLog)
			if err != nil {
				t.Fatal(err)
			}
			provs["noop"] = noop{}
			if mode == "redfish" {
				// The provider's own ceiling in this run: the same 16-way
				// concurrency calling the Redfish provider directly.
				began := time.Now()
				next := make(chan int)
				var wg sync.WaitGroup
				for range 16 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range next {
							nd, err := tk.CoreV1().Nodes().Get(ctx, fmt.Sprintf("%s-node-%d", mode, i), metav1.GetOptions{})
							if err == nil {
								err = provs[ProviderRedfish].Reboot(ctx, Target{Node: nd, Kube: tk}, Graceful)
							}
							if err != nil {
								t.Error(err)
							}
						}
					}()
				}
				for i := range n {
					next <- i
				}
				close(next)
				wg.Wait()
				t.Logf("redfish provider alone (16 concurrent, no janitor): %d resets in %v: %.1f/s", n, time.Since(began).Round(time.Millisecond),
					float64(n)/time.Since(began).Seconds())
			}
			reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
			reg.SetClient(cluster, k, false)
			j, err := New(cfg, clusters.Config{}, reg, Options{Log: testLog, Providers: provs, Producer: &recorder{}})
			if err != nil {
				t.Fatal(err)
			}
			reg.SetDynamic(cluster, dyn)
			stop := run(t, j)
			defer stop()
			time.Sleep(2 * time.Second) // the janitor's caches synced

			// The test's own informer (it re-watches should its watch end)
			// notes when each SignalSent=True arrives.
			var mu sync.Mutex
			sentAt := map[string]time.Time{}
			signalled := map[string]time.Time{}
			all := make(chan struct{})
			seen := func(obj any) {
				u, ok := obj.(*unstructured.Unstructured)
				if !ok || !condIs(u, CondSignalSent, "True") || !strings.HasPrefix(u.GetName(), "load-"+mode+"-") {
					return
				}
				at := time.Now()
				mu.Lock()
				defer mu.Unlock()
				if _, ok := signalled[u.GetName()]; !ok {
					signalled[u.GetName()] = at
					if len(signalled) == n {
						close(all)
					}
				}
			}
			inf := dynamicinformer.NewDynamicSharedInformerFactory(tdyn, 0).ForResource(kindReboot.GVR).Informer()
			if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, o any) { seen(o) }}); err != nil {
				t.Fatal(err)
			}
			ictx, icancel := context.WithCancel(ctx)
			defer icancel()
			go inf.Run(ictx.Done())
			cache.WaitForCacheSync(ictx.Done(), inf.HasSynced)
			began := time.Now()
			var wg sync.WaitGroup
			var createdAll time.Time
			next := make(chan int)
			for range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range next {
						node := fmt.Sprintf("%s-node-%d", mode, i)
						o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": Group + "/v1alpha1", "kind": "RebootNode",
							"metadata": map[string]any{"name": names[i]}, "spec": map[string]any{"nodeName": node, "force": false}}}
						mu.Lock()
						sentAt[names[i]] = time.Now()
						mu.Unlock()
						if _, err := tdyn.Resource(kindReboot.GVR).Create(ctx, o, metav1.CreateOptions{}); err != nil {
							t.Error(err)
						}
					}
				}()
			}
			for i := range n {
				next <- i
			}
			close(next)
			wg.Wait()
			createdAll = time.Now()
			select {
			case <-all:
			case <-time.After(time.Duration(n)*100*time.Millisecond + 30*time.Second):
				mu.Lock()
				for _, name := range names {
					if _, ok := signalled[name]; !ok {
						o, err := tdyn.Resource(kindReboot.GVR).Get(ctx, name, metav1.GetOptions{})
						t.Logf("not signalled: %v %v", err, o)
						break
					}
				}
				t.Fatalf("%d of %d signalled", len(signalled), n)
			}
			mu.Lock()
			defer mu.Unlock()
			var lat []time.Duration
			var last time.Time
			for name, at := range signalled {
				lat = append(lat, at.Sub(sentAt[name]))
				if at.After(last) {
					last = at
				}
			}
			slices.Sort(lat)
			pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(float64(len(lat))*p))] }
			t.Logf("%s: %d RebootNodes: created in %v (%.0f creates/s, the ceiling: the test's creates alone), all SignalSent after %v: %.1f reboots started/s; created→SignalSent p50 %v p99 %v max %v",
				mode, n, createdAll.Sub(began).Round(time.Millisecond), float64(n)/createdAll.Sub(began).Seconds(),
				last.Sub(began).Round(time.Millisecond), float64(n)/last.Sub(began).Seconds(),
				pct(0.50).Round(time.Millisecond), pct(0.99).Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
		})
	}
}
