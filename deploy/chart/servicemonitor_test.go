package chart

import (
	"fmt"
	"io/fs"
	"net"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/faultline/faultline/deploy/monitoring"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestServiceMonitorsScrapeWhatServes: every ServiceMonitor scrapes
// /metrics where its binary serves it — the endpoint's port, through the
// Service, is the container port the component's config listens on (on
// every interface, not loopback), with https where that listener has TLS
// (the gateway's REST port with gateway.tls) and a serverName its
// certificate names — and the NetworkPolicy on those pods lets the
// metricsFrom peers reach that port.
func TestServiceMonitorsScrapeWhatServes(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  string
		args []string
	}{
		{"default", "default", []string{"--set", "serviceMonitor.enabled=true"}},
		{"secure", "secure", nil},
		{"cloud", "cloud", []string{"--set", "serviceMonitor.enabled=true"}},
		{"secure, gateway from one namespace", "secure", []string{"--set", "networkPolicy.gatewayFrom[0].namespaceSelector.matchLabels.team=gpu-infra"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, tc.set, tc.args...)
			var metricsFrom []any
			for _, o := range objs {
				c, _, _ := unstructured.NestedString(o.Object, "spec", "podSelector", "matchLabels", "app.kubernetes.io/component")
				if o.GetKind() == "NetworkPolicy" && c == "store" {
					rules, _, _ := unstructured.NestedSlice(o.Object, "spec", "ingress")
					metricsFrom, _, _ = unstructured.NestedSlice(rules[0].(map[string]any), "from")
				}
			}
			n := 0
			for _, sm := range objs {
				if sm.GetKind() != "ServiceMonitor" {
					continue
				}
				n++
				checkServiceMonitor(t, objs, sm, metricsFrom)
			}
			if n < 3 {
				t.Fatalf("%d ServiceMonitors rendered, want the gateway's, the roles' and the webhook's", n)
			}
			checkAgentPodMonitor(t, objs)
		})
	}
}

// checkAgentPodMonitor: the agents (no Service: they serve /metrics on
// the node's address) are scraped by a PodMonitor whose port is the
// DaemonSet's container port their --metrics-addr listens on (none with
// agent.metricsPort 0: they listen on loopback).
func checkAgentPodMonitor(t *testing.T, objs []*unstructured.Unstructured) {
	var pm, ds *unstructured.Unstructured
	for _, o := range objs {
		c := o.GetLabels()["app.kubernetes.io/component"]
		switch {
		case o.GetKind() == "PodMonitor" && c == "agent":
			pm = o
		case o.GetKind() == "DaemonSet" && c == "agent":
			ds = o
		}
	}
	if ds == nil {
		t.Fatal("no agent DaemonSet")
	}
	containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	agent := containers[0].(map[string]any)
	if pm == nil {
		if agent["ports"] != nil {
			t.Fatalf("the agents serve /metrics on %v; no PodMonitor scrapes them", agent["ports"])
		}
		return // agent.metricsPort 0: loopback only, nothing to scrape
	}
	sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	if pods, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "template", "metadata", "labels"); !labelsMatch(sel, pods) {
		t.Errorf("PodMonitor %s selects %v; the agent's pods are labelled %v", pm.GetName(), sel, pods)
	}
	eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	if len(eps) != 1 {
		t.Fatalf("PodMonitor %s: %d endpoints, want 1", pm.GetName(), len(eps))
	}
	ep := eps[0].(map[string]any)
	var port any
	for _, p := range agent["ports"].([]any) {
		if p := p.(map[string]any); p["name"] == ep["port"] {
			port = p["containerPort"]
		}
	}
	want := fmt.Sprintf("--metrics-addr=[$(HOST_IP)]:%v", port)
	if port == nil || ep["path"] != "/metrics" || !slices.Contains(agent["args"].([]any), any(want)) {
		t.Errorf("PodMonitor %s scrapes port %v (container port %v) path %v; the agent runs with %v", pm.GetName(), ep["port"], port, ep["path"], agent["args"])
	}
	// The alert rules find the agents' targets by one job name, whatever
	// the release is called (FaultlineAgentsNotAnswering).
	job := ""
	for _, r := range asSlice(ep["relabelings"]) {
		if r := r.(map[string]any); r["targetLabel"] == "job" {
			job, _ = r["replacement"].(string)
		}
	}
	rules, err := fs.ReadFile(monitoring.Files, monitoring.RulesFile)
	if err != nil {
		t.Fatal(err)
	}
	if sel := fmt.Sprintf("up{job=%q}", job); job == "" || !strings.Contains(string(rules), sel) {
		t.Errorf("PodMonitor %s gives the agents' targets job %q; the alert rules select no %s", pm.GetName(), job, sel)
	}
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

func labelsMatch(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

func checkServiceMonitor(t *testing.T, objs []*unstructured.Unstructured, sm *unstructured.Unstructured, metricsFrom []any) {
	sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	component := sel["app.kubernetes.io/component"]
	var svc, deploy, policy *unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case "Service":
			if s, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector"); reflect.DeepEqual(s, sel) {
				svc = o
			}
		case "Deployment":
			if s, _, _ := unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels"); reflect.DeepEqual(s, sel) {
				deploy = o
			}
		case "NetworkPolicy":
			if s, _, _ := unstructured.NestedStringMap(o.Object, "spec", "podSelector", "matchLabels"); reflect.DeepEqual(s, sel) {
				policy = o
			}
		}
	}
	if svc == nil || deploy == nil {
		t.Errorf("ServiceMonitor %s: no Service or Deployment selected by %v", sm.GetName(), sel)
		return
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 {
		t.Errorf("ServiceMonitor %s: %d endpoints, want 1", sm.GetName(), len(eps))
		return
	}
	ep := eps[0].(map[string]any)
	portName, _ := ep["port"].(string)
	if ep["path"] != "/metrics" {
		t.Errorf("ServiceMonitor %s: path %v, want /metrics", sm.GetName(), ep["path"])
	}
	// Service port → target port (a container port's name) → number.
	var target any
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	for _, p := range ports {
		if p := p.(map[string]any); p["name"] == portName {
			target = p["targetPort"]
		}
	}
	if target == nil {
		t.Errorf("ServiceMonitor %s: Service %s has no port %q", sm.GetName(), svc.GetName(), portName)
		return
	}
	containerPort, containerPortName := int64(0), ""
	for _, p := range must(unstructured.NestedSlice(firstContainer(t, deploy), "ports")) {
		p := p.(map[string]any)
		if p["name"] == target || toInt(p["containerPort"]) == toInt(target) {
			containerPort, containerPortName = toInt(p["containerPort"]), p["name"].(string)
		}
	}
	if containerPort == 0 {
		t.Errorf("ServiceMonitor %s: Deployment %s has no container port %v", sm.GetName(), deploy.GetName(), target)
		return
	}

	// Where the binary serves /metrics, and whether with TLS: its
	// config.toml, from the ConfigMap mounted as its volume "config".
	var configMap string
	for _, v := range must(unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "volumes")) {
		if v := v.(map[string]any); v["name"] == "config" {
			configMap, _, _ = unstructured.NestedString(v, "configMap", "name")
		}
	}
	var listen string
	tlsOn := false
	switch component {
	case "gateway":
		var c struct {
			Gateway struct {
				HTTPAddr string `toml:"http_addr"`
				TLSCert  string `toml:"tls_cert"`
			} `toml:"gateway"`
		}
		decodeConfig(t, objs, configMap, &c)
		listen, tlsOn = c.Gateway.HTTPAddr, c.Gateway.TLSCert != ""
	case "preflight":
		var c struct {
			Webhook struct {
				MetricsAddr string `toml:"metrics_addr"`
			} `toml:"webhook"`
		}
		decodeConfig(t, objs, configMap, &c)
		listen = c.Webhook.MetricsAddr
	default:
		var c struct {
			MetricsAddr string `toml:"metrics_addr"`
		}
		decodeConfig(t, objs, configMap, &c)
		listen = c.MetricsAddr
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		t.Errorf("ServiceMonitor %s: %s listens on %q: %v", sm.GetName(), component, listen, err)
		return
	}
	if strconv.FormatInt(containerPort, 10) != port {
		t.Errorf("ServiceMonitor %s scrapes container port %d; %s serves /metrics on %s", sm.GetName(), containerPort, component, listen)
	}
	if host != "" && host != "0.0.0.0" && host != "::" {
		t.Errorf("ServiceMonitor %s: %s serves /metrics on %s, which Prometheus cannot reach", sm.GetName(), component, listen)
	}
	scheme, _ := ep["scheme"].(string)
	switch {
	case tlsOn && scheme != "https":
		t.Errorf("ServiceMonitor %s scrapes %q (scheme %q), but %s serves it with TLS (%s): every scrape fails", sm.GetName(), portName, scheme, component, listen)
	case !tlsOn && scheme != "" && scheme != "http":
		t.Errorf("ServiceMonitor %s scrapes with scheme %q a plain-HTTP listener", sm.GetName(), scheme)
	}
	if tlsOn {
		serverName, _, _ := unstructured.NestedString(ep, "tlsConfig", "serverName")
		for _, cert := range objs {
			if cert.GetKind() != "Certificate" || !strings.HasSuffix(cert.GetName(), "-gateway") {
				continue
			}
			names, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
			if !slices.Contains(names, serverName) {
				t.Errorf("ServiceMonitor %s: tlsConfig.serverName %q is not a name of the gateway's certificate %v", sm.GetName(), serverName, names)
			}
		}
	}

	// The NetworkPolicy on the pods lets the metricsFrom peers in.
	if policy == nil {
		return
	}
	allowed := false
	for _, r := range must(unstructured.NestedSlice(policy.Object, "spec", "ingress")) {
		r := r.(map[string]any)
		hasPort := false
		for _, p := range must(unstructured.NestedSlice(r, "ports")) {
			if pp := p.(map[string]any)["port"]; pp == containerPortName || toInt(pp) == containerPort {
				hasPort = true
			}
		}
		from := must(unstructured.NestedSlice(r, "from"))
		if hasPort && (len(from) == 0 || reflect.DeepEqual(from, metricsFrom)) {
			allowed = true
		}
	}
	if !allowed {
		t.Errorf("ServiceMonitor %s: NetworkPolicy %s lets no metricsFrom peer (%v) reach port %s", sm.GetName(), policy.GetName(), metricsFrom, containerPortName)
	}
}

func decodeConfig(t *testing.T, objs []*unstructured.Unstructured, name string, v any) {
	t.Helper()
	s, err := ConfigTOML(objs, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := toml.Decode(s, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func must(s []any, _ bool, _ error) []any { return s }

func toInt(v any) int64 {
	switch v := v.(type) {
	case int64:
		return v
	case float64:
		return int64(v)
	case int:
		return int64(v)
	case string:
		n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		return n
	}
	return 0
}
