package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/faultline/faultline/deploy/chart"
	"github.com/faultline/faultline/internal/syncbuf"
	"github.com/faultline/faultline/internal/testenv"
)

// TestProcessReadyOnceRolesRun: `faultline process` on the chart's
// config, probed where the chart's role Deployment probes it. While a role
// cannot start — here the store waiting for a ClickHouse that does not
// answer, as in an outage or a migration still running — the process is
// alive (liveness passes: restarting it would not bring ClickHouse back)
// and not ready, so a rolling update does not take the old, working pods
// down for it; once its roles run it is ready. Before, readiness was
// /healthz, which answers as soon as the metrics server listens, before
// any role opened.
func TestProcessReadyOnceRolesRun(t *testing.T) {
	helm := testenv.Helm(t)
	kafka := testenv.StartKafka(t)
	ch := testenv.StartClickHouse(t)
	objs, err := chart.Render(context.Background(), helm, t.TempDir(), "faultline", "faultline", []string{chart.ValueSets()["default"]},
		"--set", "kafka.brokers="+kafka.Addr(), "--set", "kafka.replicationFactor=1", "--set", "kafka.minInsyncReplicas=1", "--set", "kafka.partitions=3")
	if err != nil {
		t.Fatal(err)
	}
	probe := func(kind string) string {
		c := firstContainerOf(t, chart.Find(objs, "Deployment", "faultline-store"))
		p, _, _ := unstructured.NestedString(c, kind, "httpGet", "path")
		return p
	}
	readyPath, livePath := probe("readinessProbe"), probe("livenessProbe")
	conf, err := chart.ConfigTOML(objs, "faultline-config")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		clickhouse string
		ready      bool
	}{
		{"clickhouse unreachable", freeAddr(t), false},
		{"clickhouse up", ch.Addr(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			metrics := freeAddr(t)
			c := conf
			for _, r := range [][2]string{
				{`metrics_addr = ":9464"`, fmt.Sprintf("metrics_addr = %q", metrics)},
				{`addr = "clickhouse.clickhouse.svc:9000"`, fmt.Sprintf("addr = %q", tc.clickhouse)},
			} {
				if !strings.Contains(c, r[0]) {
					t.Fatalf("rendered config.toml has no %s:\n%s", r[0], c)
				}
				c = strings.Replace(c, r[0], r[1], 1)
			}
			path := filepath.Join(t.TempDir(), "config.toml")
			if err := os.WriteFile(path, []byte(c), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			errs := make(chan error, 1)
			logs := &syncbuf.Buffer{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := run(ctx, []string{"process", "--config", path, "--role=store"}, io.Discard, logs); err != nil && ctx.Err() == nil {
					errs <- err
				}
			}()
			t.Cleanup(func() {
				cancel()
				wg.Wait()
			})
			get := func(p string) int {
				resp, err := http.Get("http://" + metrics + p)
				if err != nil {
					return 0
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			waitForOrFail(t, time.Minute, errs, logs, func() bool { return get(livePath) == http.StatusOK })
			if !tc.ready {
				// The store retries ClickHouse meanwhile (backing off to 5s).
				time.Sleep(3 * time.Second)
				if code := get(readyPath); code == http.StatusOK {
					t.Fatalf("readiness %s answers %d while the store role waits for ClickHouse:\n%s", readyPath, code, logs.String())
				}
				if code := get(livePath); code != http.StatusOK {
					t.Fatalf("liveness %s answers %d while the store role waits for ClickHouse", livePath, code)
				}
				return
			}
			waitForOrFail(t, time.Minute, errs, logs, func() bool { return get(readyPath) == http.StatusOK })
		})
	}
}

// firstContainerOf returns the first container of a workload's pod template.
func firstContainerOf(t *testing.T, o *unstructured.Unstructured) map[string]any {
	t.Helper()
	if o == nil {
		t.Fatal("no such workload")
	}
	cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if len(cs) == 0 {
		t.Fatalf("%s has no container", o.GetName())
	}
	return cs[0].(map[string]any)
}
