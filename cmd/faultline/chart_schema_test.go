package main

import (
	"bytes"
	"context"
	"encoding"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/agents/agent"
	"github.com/faultline/faultline/agents/preflight/webhook"
	"github.com/faultline/faultline/deploy/chart"
	"github.com/faultline/faultline/internal/config"
	"github.com/faultline/faultline/internal/testenv"
)

var updateChartSchema = flag.Bool("update-chart-schema", false, "rewrite the config definitions of deploy/chart/faultline/values.schema.json")

const chartSchema = "../../deploy/chart/faultline/values.schema.json"

// chartOwned are the keys of each binary's config.toml that the Helm
// chart sets itself (from its structured values, or to match the mounts
// it makes); values.schema.json refuses them under config.
var chartOwned = map[string][]string{
	"faultlineConfig": {"metrics_addr", "role", "dev", "kafka", "clickhouse",
		"gateway.grpc_addr", "gateway.http_addr", "gateway.tokens_file", "gateway.tls_cert", "gateway.tls_key", "gateway.client_ca",
		"kube.clusters", "kube.dry_run_clusters", "janitor.local.signing_key_file"},
	"agentConfig": {"node_name", "checks", "metrics_addr", "pod_resources_socket", "time_zone_file",
		"gateway.addr", "gateway.token_file", "gateway.insecure", "gateway.ca_file", "spool.dir",
		"local_actions.listen", "local_actions.verify_key_file", "local_actions.state_file",
		"nic.sysfs_root", "nic.state_file", "nic.metadata_path", "kmsg.state_dir",
		"fabric.sys_root", "fabric.proc_root", "fabric.nvswitch_glob", "conformance.sysfs", "conformance.procfs"},
	"preflightConfig": {"webhook.listen", "webhook.metrics_addr", "webhook.service_name", "webhook.service_namespace",
		"webhook.service_port", "webhook.configuration_name", "tls", "namespaces.include",
		"inject.image", "inject.image_pull_policy", "inject.token_secret", "inject.relay_socket", "inject.relay_socket_group",
		"check.gateway.addr", "check.relay_socket"},
}

// TestChartValuesSchema: the chart's values.schema.json describes, under
// config, agent.config and preflight.config, exactly the keys of the
// binaries' config.toml (less the ones the chart owns), so a misspelled
// key fails `helm install` instead of the pod, and that agent.checks
// accepts exactly the checks the agent registers (agent.CheckNames), so a
// new check cannot be left out of the chart. -update-chart-schema
// rewrites the definitions and that list from the code.
func TestChartValuesSchema(t *testing.T) {
	raw, err := os.ReadFile(chartSchema)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	defs, _ := doc["definitions"].(map[string]any)
	if defs == nil {
		t.Fatal("values.schema.json has no definitions")
	}
	want := map[string]any{
		"faultlineConfig": configSchema(reflect.TypeOf(DefaultConfig()), "", chartOwned["faultlineConfig"]),
		"agentConfig":     configSchema(reflect.TypeOf(agent.DefaultConfig()), "", chartOwned["agentConfig"]),
		"preflightConfig": configSchema(reflect.TypeOf(webhook.DefaultConfig()), "", chartOwned["preflightConfig"]),
	}
	for k, v := range want {
		defs[k] = v
	}
	checks, err := schemaAt(doc, "properties", "agent", "properties", "checks", "items")
	if err != nil {
		t.Fatal(err)
	}
	checks["enum"] = agent.CheckNames()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		t.Fatal(err)
	}
	if *updateChartSchema {
		if err := os.WriteFile(chartSchema, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if !bytes.Equal(raw, buf.Bytes()) {
		t.Fatalf("%s is out of date with the config types or the agent's registered checks: go test ./cmd/faultline -run TestChartValuesSchema -update-chart-schema", chartSchema)
	}
}

// schemaAt is the schema object at that path of doc.
func schemaAt(doc map[string]any, path ...string) (map[string]any, error) {
	m := doc
	for i, k := range path {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("values.schema.json has no object at %s", strings.Join(path[:i+1], "."))
		}
		m = next
	}
	return m, nil
}

var (
	durationType  = reflect.TypeFor[time.Duration]()
	unmarshalText = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// configSchema is the JSON schema of a config type's TOML form: objects
// closed to unknown keys, durations as strings ("30s").
func configSchema(t reflect.Type, prefix string, owned []string) map[string]any {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == durationType:
		return map[string]any{"type": "string", "pattern": `^-?([0-9]+(\.[0-9]*)?(ns|us|µs|ms|s|m|h))+$|^0$`}
	case reflect.PointerTo(t).Implements(unmarshalText) && t.Kind() != reflect.Struct:
		return map[string]any{"type": "string"}
	}
	switch t.Kind() {
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Slice, reflect.Array:
		return map[string]any{"type": "array", "items": configSchema(t.Elem(), prefix, owned)}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": configSchema(t.Elem(), prefix, owned)}
	case reflect.Struct:
		props := map[string]any{}
		addFields(t, prefix, owned, props)
		return map[string]any{"type": "object", "additionalProperties": false, "properties": props}
	}
	return map[string]any{}
}

func addFields(t reflect.Type, prefix string, owned []string, props map[string]any) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		switch {
		case tag == "-" || !f.IsExported() || f.Tag.Get("chart") == "-":
			// chart:"-": a removed key, kept in the type only to name
			// its replacement when set; the schema refuses it.
			continue
		case f.Anonymous && tag == "":
			addFields(f.Type, prefix, owned, props)
			continue
		case tag == "":
			continue
		}
		path := prefix + tag
		isOwned := false
		for _, o := range owned {
			if o == path {
				isOwned = true
			}
		}
		if isOwned {
			continue
		}
		props[tag] = configSchema(f.Type, path+".", owned)
	}
}

// TestChartConfigLoads renders the chart's value sets (and the default
// set with the conformance and csp checks) and loads each config.toml it
// makes with the binaries' own loader (unknown keys and wrong types fail),
// validates the agent's (every enabled check's section; not the gateway
// keys, whose files are mounted Secrets), then checks the values reached
// their keys.
func TestChartConfigLoads(t *testing.T) {
	helm := testenv.Helm(t)
	ctx := context.Background()
	type valueSet struct {
		file string
		args []string
	}
	sets := map[string]valueSet{}
	for set, file := range chart.ValueSets() {
		sets[set] = valueSet{file: file}
	}
	sets["conformance-csp"] = valueSet{chart.ValueSets()["default"], []string{"--set", "agent.checks={nic,conformance,csp}"}}
	for set, vs := range sets {
		t.Run(set, func(t *testing.T) {
			objs, err := chart.Render(ctx, helm, t.TempDir(), "faultline", "faultline", []string{vs.file}, vs.args...)
			if err != nil {
				t.Fatal(err)
			}
			fn := "faultline"
			if set == "cloud" {
				fn = "fl"
			}
			load := func(cm string, cfg any) {
				t.Helper()
				s, err := chart.ConfigTOML(objs, cm)
				if err != nil {
					t.Fatal(err)
				}
				path := filepath.Join(t.TempDir(), "config.toml")
				if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
					t.Fatal(err)
				}
				if _, err := config.Load(cm, []string{"--config", path}, cfg, func(*flag.FlagSet) {}, func() error { return nil }, io.Discard); err != nil {
					t.Fatalf("%s: %v\n%s", cm, err, s)
				}
			}
			cfg := DefaultConfig()
			load(fn+"-config", &cfg)
			if err := cfg.Gateway.Validate(); err != nil {
				t.Errorf("gateway: %v", err)
			}
			if cfg.MetricsAddr != ":9464" || cfg.Gateway.GRPCAddr != ":50051" || !strings.HasPrefix(cfg.Kafka.Brokers, "") || cfg.Kafka.Brokers == "" || cfg.ClickHouse.Addr == "" {
				t.Errorf("chart-owned keys: metrics_addr %q grpc_addr %q brokers %q clickhouse %q", cfg.MetricsAddr, cfg.Gateway.GRPCAddr, cfg.Kafka.Brokers, cfg.ClickHouse.Addr)
			}
			ac := agent.DefaultConfig()
			load(fn+"-agent", &ac)
			v := ac
			v.NodeName, v.Gateway = "gpu-node-1", agent.DefaultConfig().Gateway
			if err := v.Validate(); err != nil {
				t.Errorf("agent config: %v", err)
			}
			wc := webhook.DefaultConfig()
			load(fn+"-preflight", &wc)
			if err := wc.Validate(); err != nil {
				t.Errorf("preflight config: %v", err)
			}
			// The checks send through the agent's relay socket: the one the
			// agent serves, whose group the checks' pods get; no token.
			if wc.Inject.TokenSecret != "" || wc.Inject.RelaySocket != "/run/faultline-agent/agent.sock" || ac.NVSentinelSocket != "/run/faultline-agent/agent.sock" ||
				ac.NVSentinelSocketGroup != fmt.Sprint(wc.Inject.RelaySocketGroup) || wc.Inject.RelaySocketGroup == 0 {
				t.Errorf("preflight inject %+v, agent nvsentinel_socket %q group %q", wc.Inject, ac.NVSentinelSocket, ac.NVSentinelSocketGroup)
			}
			switch set {
			case "secure":
				if cfg.Store.Retention != 2160*time.Hour || cfg.Store.BatchRecords != 20000 || cfg.Quarantine.Breaker.MaxPercent != 5.5 ||
					cfg.Kube.QPS != 100 || cfg.LogLevel != "debug" {
					t.Errorf("config values: retention %s batch %d max_percent %v qps %v log_level %s", cfg.Store.Retention, cfg.Store.BatchRecords, cfg.Quarantine.Breaker.MaxPercent, cfg.Kube.QPS, cfg.LogLevel)
				}
				if !cfg.Kafka.TLS.Enabled || cfg.Kafka.SASL.Mechanism != "SCRAM-SHA-512" || cfg.Kafka.SASL.PasswordFile != "/var/run/secrets/faultline/kafka/password" ||
					cfg.ClickHouse.Cluster != "fleet" || !cfg.ClickHouse.TLS.Enabled || cfg.ClickHouse.PasswordFile != "/var/run/secrets/faultline/clickhouse/password" {
					t.Errorf("kafka %+v clickhouse %+v", cfg.Kafka, cfg.ClickHouse)
				}
				if len(cfg.Kube.Clusters) != 3 || cfg.Kube.Clusters[0].Kubeconfig != "in-cluster" || !cfg.Kube.Clusters[2].DryRun ||
					cfg.Kube.Clusters[1].Kubeconfig != "/var/run/secrets/faultline/kube/gpu-west/kubeconfig" {
					t.Errorf("kube clusters %+v", cfg.Kube.Clusters)
				}
				if cfg.Correlate.Rules != "/etc/faultline/rules/correlate.toml" || cfg.Gateway.ClientCA == "" || ac.Kmsg.PollInterval != 10*time.Second ||
					wc.Webhook.FailurePolicy != "Ignore" || wc.TLS.Mode != "files" || len(wc.Namespaces.Include) != 2 {
					t.Errorf("rules %q client_ca %q kmsg poll %s webhook %+v tls %+v", cfg.Correlate.Rules, cfg.Gateway.ClientCA, ac.Kmsg.PollInterval, wc.Webhook, wc.TLS)
				}
			case "cloud":
				if cfg.Kafka.SASL.Mechanism != "OAUTHBEARER" || cfg.Kafka.SASL.TokenFile == "" || cfg.Kafka.ReplicationFactor != 2 || ac.Kmsg.Source != "file" ||
					!ac.Gateway.Insecure || ac.PodResourcesSocket != "" {
					t.Errorf("kafka %+v agent %+v", cfg.Kafka, ac)
				}
				// The cloud set enables every check the agent registers.
				if got, want := slices.Sorted(slices.Values(ac.Checks)), slices.Sorted(slices.Values(agent.CheckNames())); !slices.Equal(got, want) {
					t.Errorf("cloud set's agent checks %q, want every registered check %q", got, want)
				}
				if ac.Conformance.OSImageFile != "/host/etc/faultline/os-image.sha256" || ac.CSP.PollInterval != time.Minute {
					t.Errorf("conformance %+v csp %+v", ac.Conformance, ac.CSP)
				}
			case "conformance-csp":
				if !slices.Equal(ac.Checks, []string{"nic", "conformance", "csp"}) || ac.Conformance.Sysfs != "/host/sys" || ac.Conformance.Procfs != "/host/proc" ||
					len(ac.Conformance.BMCCommand) != 0 || ac.Conformance.Interval != 6*time.Hour ||
					ac.CSP.MetadataURL != "http://metadata.google.internal/computeMetadata/v1/instance" {
					t.Errorf("agent checks %q conformance %+v csp %+v", ac.Checks, ac.Conformance, ac.CSP)
				}
			case "default":
				if len(ac.Checks) != 2 || ac.NIC.SysfsRoot != "/host/sys" || ac.Spool.Dir != "/var/lib/faultline-agent/spool" || ac.Gateway.Addr != "faultline-gateway.faultline.svc:50051" ||
					wc.TLS.Mode != "self-signed" || wc.Webhook.ServiceName != "faultline-preflight" || wc.Webhook.ServiceNamespace != "faultline" {
					t.Errorf("agent %+v webhook %+v", ac, wc)
				}
			}
		})
	}
}
