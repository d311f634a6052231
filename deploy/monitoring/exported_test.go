package monitoring_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"

	"github.com/faultline/faultline/deploy/monitoring"
)

// repoRoot is the module's root, from this package's directory.
const repoRoot = "../.."

var templateLabelRE = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)

// TestRulesMatchRegisteredMetrics checks the rules, the dashboards and the
// rules' promtool tests against the metrics the binaries register (read
// from their source, so no server is started): every faultline metric a
// query names is registered, every label it matches or groups by is one
// the series carry, rate and increase read counters, delta and deriv
// gauges, histogram_quantile keeps le, the labels an alert's annotations
// or a panel's legend print are in the query's result, and every series a
// promtool test feeds in is one a binary exports, with its labels.
// TestMonitoringMetricsExported (cmd/faultline) checks the names against
// a live /metrics; this test needs no server and also reads the labels.
func TestRulesMatchRegisteredMetrics(t *testing.T) {
	reg, errs := registeredMetrics(repoRoot)
	for _, err := range errs {
		t.Error(err)
	}
	if len(reg) < 50 {
		t.Fatalf("only %d metrics read from the source: the reader is broken", len(reg))
	}
	rules, err := monitoring.ReadRules()
	if err != nil {
		t.Fatal(err)
	}
	pc := &promChecker{reg: reg, recorded: map[string]map[string]bool{}}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			name := r.Record + r.Alert
			got, errs := pc.check(r.Expr)
			for _, e := range errs {
				t.Errorf("%s %s: %s", monitoring.RulesFile, name, e)
			}
			if r.Record != "" {
				pc.recorded[r.Record] = got
				continue
			}
			for k, text := range r.Annotations {
				for _, m := range templateLabelRE.FindAllStringSubmatch(text, -1) {
					if got != nil && !got[m[1]] && r.Labels[m[1]] == "" {
						t.Errorf("%s %s: annotation %s prints $labels.%s, which the alert's series do not have (%v)", monitoring.RulesFile, name, k, m[1], keys(got))
					}
				}
			}
		}
	}

	ds, err := monitoring.Dashboards()
	if err != nil {
		t.Fatal(err)
	}
	legendRE := regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	for _, d := range ds {
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				if tg.Expr == "" {
					continue
				}
				got, errs := pc.check(expandGrafana(tg.Expr))
				for _, e := range errs {
					t.Errorf("%s %q: %s", d.File, p.Title, e)
				}
				for _, m := range legendRE.FindAllStringSubmatch(tg.LegendFormat, -1) {
					if got != nil && !got[m[1]] {
						t.Errorf("%s %q: legend prints {{%s}}, which the query's series do not have (%v)", d.File, p.Title, m[1], keys(got))
					}
				}
			}
		}
	}

	// The promtool tests feed series a binary exports, with all its labels.
	b, err := fs.ReadFile(monitoring.Files, monitoring.RulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var tests struct {
		Tests []struct {
			InputSeries []struct {
				Series string `json:"series"`
			} `json:"input_series"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(b, &tests); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests.Tests {
		for _, in := range tc.InputSeries {
			ls, err := parser.ParseMetric(in.Series)
			if err != nil {
				t.Errorf("%s: input series %s: %v", monitoring.RulesTestFile, in.Series, err)
				continue
			}
			name := ls.Get(labels.MetricName)
			if want, ok := externalMetrics[name]; ok {
				ls.Range(func(l labels.Label) {
					if l.Name != labels.MetricName && !slices.Contains(want, l.Name) {
						t.Errorf("%s: input series %s: %s has no label %q (it has %v)", monitoring.RulesTestFile, in.Series, name, l.Name, want)
					}
				})
				continue
			}
			s, ok := series(reg, name)
			if !ok {
				t.Errorf("%s: input series %s: no faultline binary exports %s", monitoring.RulesTestFile, in.Series, name)
				continue
			}
			want := slices.Clone(s.Metric.Labels)
			if strings.HasSuffix(name, "_bucket") {
				want = append(want, "le")
			}
			for _, l := range want {
				if !ls.Has(l) {
					t.Errorf("%s: input series %s lacks label %q (%s has %v)", monitoring.RulesTestFile, in.Series, l, name, want)
				}
			}
			ls.Range(func(l labels.Label) {
				if l.Name != labels.MetricName && !s.Labels[l.Name] {
					t.Errorf("%s: input series %s: %s has no label %q (it has %v)", monitoring.RulesTestFile, in.Series, name, l.Name, want)
				}
			})
		}
	}
}

// externalMetrics are the metrics of other exporters a rule reads (with
// their labels), fed to the promtool tests: kube-state-metrics' (the
// namespace is the object's, its ServiceMonitor honouring labels).
var externalMetrics = map[string][]string{
	"kube_deployment_spec_replicas":                  {"namespace", "deployment"},
	"kube_daemonset_status_desired_number_scheduled": {"namespace", "daemonset"},
	"kube_daemonset_status_current_number_scheduled": {"namespace", "daemonset"},
	"kube_daemonset_status_number_available":         {"namespace", "daemonset"},
	"kube_pod_owner":                                 {"namespace", "pod", "uid", "owner_kind", "owner_name", "owner_is_controller"},
	"kube_pod_status_phase":                          {"namespace", "pod", "uid", "phase"},
	"kube_pod_info":                                  {"namespace", "pod", "uid", "node", "host_ip", "pod_ip", "created_by_kind", "created_by_name", "priority_class", "host_network"},
	"kube_node_status_condition":                     {"node", "condition", "status"},
	"kube_pod_container_status_restarts_total":       {"namespace", "pod", "container"},
	"up": {"instance", "job", "namespace", "pod", "container", "endpoint"},
}

// docMetricRE is a metric named in prose, with the labels written after
// it: {label}, {label,label}, {label="value"} or {label=a|b}.
var docMetricRE = regexp.MustCompile("\\b((?:faultline|preflight)_[a-z0-9_]+)(\\{[^}`]*\\})?")

// notMetrics are faultline_/preflight_ words in the docs that name no
// metric.
var notMetrics = map[string]bool{
	"faultline_preflight": true, // the Pushgateway job of the preflight checks
}

// TestDocsNameRegisteredMetrics: every faultline metric the Markdown
// documents name is one a binary registers, with the labels they write
// after it; the alert table of deploy/monitoring/README.md is the rules'
// alerts.
func TestDocsNameRegisteredMetrics(t *testing.T) {
	reg, errs := registeredMetrics(repoRoot)
	for _, err := range errs {
		t.Error(err)
	}
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != repoRoot || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".md") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, path)
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range docMetricRE.FindAllStringSubmatch(line, -1) {
				name := m[1]
				if notMetrics[name] {
					continue
				}
				s, ok := series(reg, name)
				if !ok {
					if _, isHist := reg[name]; !isHist {
						t.Errorf("%s:%d: %s: no faultline binary registers it", rel, i+1, name)
						continue
					}
					s, _ = series(reg, name+"_count")
				}
				if m[2] == "" {
					continue
				}
				for _, part := range strings.Split(strings.Trim(m[2], "{}"), ",") {
					l, _, _ := strings.Cut(part, "=")
					l = strings.TrimSpace(l)
					if l != "" && !s.Labels[l] {
						t.Errorf("%s:%d: %s%s: %s has no label %q (it has %v)", rel, i+1, name, m[2], name, l, s.Metric.Labels)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	checkMetricTables(t, reg)

	rules, err := monitoring.ReadRules()
	if err != nil {
		t.Fatal(err)
	}
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				alerts = append(alerts, r.Alert)
			}
		}
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(Faultline[A-Za-z]+)` \\|").FindAllStringSubmatch(string(readme), -1) {
		documented = append(documented, m[1])
	}
	slices.Sort(alerts)
	slices.Sort(documented)
	if !slices.Equal(alerts, documented) {
		t.Errorf("deploy/monitoring/README.md's alert table %v, the rules' alerts %v", documented, alerts)
	}
}

// metricTables are the Markdown tables of a binary's metrics (columns
// metric | type | labels | …) and the prefix of the metrics each must
// list, all of them.
var metricTables = map[string]string{
	"agents/preflight/README.md": "preflight_",
}

var backtickRE = regexp.MustCompile("`([^`]+)`")

// checkMetricTables: each row's type and label names are the registered
// metric's, and the table lists every registered metric of its prefix.
func checkMetricTables(t *testing.T, reg map[string]registered) {
	for file, prefix := range metricTables {
		b, err := os.ReadFile(filepath.Join(repoRoot, file))
		if err != nil {
			t.Fatal(err)
		}
		listed := map[string]bool{}
		inTable := false
		for i, line := range strings.Split(string(b), "\n") {
			cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
			if len(cells) < 3 || !strings.HasPrefix(strings.TrimSpace(line), "|") {
				inTable = false
				continue
			}
			if strings.TrimSpace(cells[0]) == "metric" && strings.TrimSpace(cells[1]) == "type" && strings.TrimSpace(cells[2]) == "labels" {
				inTable = true
				continue
			}
			m := backtickRE.FindStringSubmatch(cells[0])
			if !inTable || m == nil {
				continue
			}
			name := m[1]
			listed[name] = true
			r, ok := reg[name]
			if !ok {
				t.Errorf("%s:%d: %s: no binary registers it", file, i+1, name)
				continue
			}
			if kind := strings.TrimSpace(cells[1]); kind != string(r.Kind) {
				t.Errorf("%s:%d: %s is a %s, the table says %s", file, i+1, name, r.Kind, kind)
			}
			var labels []string
			for _, l := range backtickRE.FindAllStringSubmatch(cells[2], -1) {
				labels = append(labels, l[1])
			}
			want := slices.Clone(r.Labels)
			slices.Sort(want)
			slices.Sort(labels)
			if !slices.Equal(labels, want) {
				t.Errorf("%s:%d: %s has labels %v, the table says %v", file, i+1, name, want, labels)
			}
		}
		for name, r := range reg {
			if strings.HasPrefix(name, prefix) && !listed[name] {
				t.Errorf("%s: the metrics table lacks %s (%s %v, %s)", file, name, r.Kind, r.Labels, r.Where)
			}
		}
	}
}
