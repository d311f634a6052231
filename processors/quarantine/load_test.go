package quarantine

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// TestLoadSimultaneousFailures measures how fast one quarantine replica
// handles N nodes failing at once against a real kube-apiserver: N fatal
// events spread over 12 partition batches handled concurrently (as the
// pipeline does), with the client QPS/burst under test. It runs only with
// FAULTLINE_QUARANTINE_LOAD=1 (README.md has the numbers):
//
//	FAULTLINE_QUARANTINE_LOAD=1 go test ./processors/quarantine -run TestLoad -v
//
// FAULTLINE_QUARANTINE_LOAD_NODES (default 1000) and
// FAULTLINE_QUARANTINE_LOAD_QPS (default "50,200,500") change the sweep.
func TestLoadSimultaneousFailures(t *testing.T) {
	if os.Getenv("FAULTLINE_QUARANTINE_LOAD") != "1" {
		t.Skip("set FAULTLINE_QUARANTINE_LOAD=1 to run the load measurement")
	}
	nodes := 1000
	if v := os.Getenv("FAULTLINE_QUARANTINE_LOAD_NODES"); v != "" {
		nodes, _ = strconv.Atoi(v)
	}
	qpsList := []float32{50, 200, 500}
	if v := os.Getenv("FAULTLINE_QUARANTINE_LOAD_QPS"); v != "" {
		qpsList = nil
		for _, f := range splitComma(v) {
			q, _ := strconv.ParseFloat(f, 32)
			qpsList = append(qpsList, float32(q))
		}
	}
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	admin := kube.RESTConfig()
	admin.QPS, admin.Burst = 2000, 4000
	fast, err := kubernetes.NewForConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	run := 0
	for _, breakerPct := range []float64{100, 10} {
		for _, qps := range qpsList {
			run++
			group := fmt.Sprintf("load%d", run)
			names := make([]string, nodes)
			for i := range names {
				names[i] = fmt.Sprintf("%s-%04d", group, i)
			}
			createNodesParallel(t, fast, group, names)
			rc := kube.RESTConfig()
			rc.QPS, rc.Burst = qps, int(2*qps)
			k, err := kubernetes.NewForConfig(rc)
			if err != nil {
				t.Fatal(err)
			}
			cfg := testConfig(group)
			cfg.Breaker.MaxPercent = breakerPct
			cfg.NodeEvents = false
			reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
			reg.SetClient("c1", k, false)
			h, err := New(cfg, reg, Options{Log: testLog})
			if err != nil {
				t.Fatal(err)
			}
			const partitions = 12
			batches := make([][]*kgo.Record, partitions)
			for i, n := range names {
				r := record("c1", fatal(n, "XID_ERROR_48", "GPU-1"))
				r.Partition = int32(i % partitions)
				batches[i%partitions] = append(batches[i%partitions], r)
			}
			var (
				mu   sync.Mutex
				acts []*faultlinev1.Action
				wg   sync.WaitGroup
			)
			start := time.Now()
			for _, b := range batches {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
					defer cancel()
					res, err := h.Handle(ctx, b)
					if err != nil {
						t.Errorf("Handle: %v", err)
						return
					}
					a, deferred := splitOut(t, res.Out)
					if len(deferred) > 0 {
						t.Errorf("%d records deferred", len(deferred))
					}
					mu.Lock()
					acts = append(acts, a...)
					mu.Unlock()
				}()
			}
			wg.Wait()
			took := time.Since(start)
			applied, held := 0, 0
			for _, a := range acts {
				switch {
				case a.Kind == events.KindQuarantine && a.Outcome == events.OutcomeApplied:
					applied++
				case a.Kind == events.KindQuarantine && a.Outcome == events.OutcomeHeld:
					held++
				}
			}
			cordoned := 0
			list, err := fast.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{LabelSelector: "test=" + group})
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range list.Items {
				if n.Spec.Unschedulable {
					cordoned++
				}
			}
			if applied+held != nodes || cordoned != applied {
				t.Errorf("applied %d + held %d != %d, or cordoned %d != applied", applied, held, nodes, cordoned)
			}
			t.Logf("RESULT nodes=%d breaker=%.0f%% qps=%.0f burst=%d: %d cordoned, %d held in %v (%.0f nodes handled/s, %.0f cordons/s)",
				nodes, breakerPct, qps, int(2*qps), applied, held, took.Round(time.Millisecond),
				float64(nodes)/took.Seconds(), float64(applied)/took.Seconds())
		}
	}
}

func createNodesParallel(t *testing.T, k kubernetes.Interface, group string, names []string) {
	t.Helper()
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for _, n := range names {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"test": group}}}
			if _, err := k.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{}); err != nil {
				t.Errorf("create node %s: %v", n, err)
			}
		}()
	}
	wg.Wait()
}

func splitComma(s string) []string {
	var out []string
	cur := ""
	for _, r := range s {
		if r == ',' {
			out = append(out, cur)
			cur = ""
			continue
		}
		cur += string(r)
	}
	if cur != "" {
		out = append(out, cur)
	}
	return out
}
