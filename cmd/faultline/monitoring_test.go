package main

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/deploy/monitoring"
	"github.com/faultline/faultline/internal/chserver"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/internal/testenv"
)

// TestMonitoringMetricsExported runs `faultline dev` (the gateway and
// every processor role in one process, one registry), sends it events,
// scrapes its live /metrics and requires every faultline metric that a
// Prometheus rule or a Grafana panel of deploy/monitoring uses (but the
// node agent's).
func TestMonitoringMetricsExported(t *testing.T) {
	_, _, err := chserver.FindBinary()
	testenv.Server(t, "faultline dev (its local ClickHouse server)", err)
	base, dir := startDev(t)
	agent := readFile(t, filepath.Join(dir, "dev-token"))
	post(t, base, agent, `{"events":[{"agent":"faultline-agent","componentClass":"GPU","checkName":"SysLogsXIDError","isFatal":true,
	  "message":"Xid 79","recommendedAction":"REPLACE_VM","errorCode":["XID-79"],
	  "entitiesImpacted":[{"entityType":"GPU","entityValue":"GPU-m1"}],"nodeName":"metrics-node-1"}]}`)
	names, err := monitoring.MetricNames()
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		exported := map[string]bool{}
		for _, line := range strings.Split(string(b), "\n") {
			if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
				exported[strings.Fields(name)[0]] = true
			}
		}
		missing = missing[:0]
		for _, n := range names {
			// The node agent's (faultline-agent, its own binary) are
			// checked against its registry by deploy/monitoring's tests.
			if !exported[n] && !strings.HasPrefix(n, "faultline_agent_") {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if len(missing) > 0 {
		t.Fatalf("deploy/monitoring uses metrics that faultline does not export: %s", strings.Join(missing, ", "))
	}
	t.Log(fmt.Sprintf("all %d metrics of the rules and dashboards are exported", len(names)))
}

// TestClientCertificateExpiry: each process reports when the client
// certificates it presents to Kafka and ClickHouse expire, and the CA
// bundles it verifies them with, 0 for a peer it presents none to or
// verifies with the system roots.
func TestClientCertificateExpiry(t *testing.T) {
	ca := testenv.NewCA(t, "", "faultline-test")
	kp := ca.Issue(t, "faultline-store")
	cfg := DefaultConfig()
	cfg.Kafka.TLS = kafka.TLSConfig{Enabled: true, CAFile: ca.File, CertFile: kp.CertFile, KeyFile: kp.KeyFile}
	families, err := newRegistry(cfg).Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if got[f.GetName()] == nil {
				got[f.GetName()] = map[string]float64{}
			}
			if len(m.GetLabel()) == 1 {
				got[f.GetName()][m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	for name, want := range map[string]map[string]float64{
		"faultline_tls_client_certificate_expiry_timestamp_seconds": {"kafka": float64(kp.Cert.Leaf.NotAfter.Unix()), "clickhouse": 0},
		"faultline_tls_ca_expiry_timestamp_seconds":                 {"kafka.tls.ca_file": float64(ca.Cert.NotAfter.Unix()), "clickhouse.tls.ca_file": 0},
	} {
		if !maps.Equal(got[name], want) {
			t.Errorf("%s: %v, want %v", name, got[name], want)
		}
	}
}
