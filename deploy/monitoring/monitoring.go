// Package monitoring ships faultline's Prometheus rules (alerting and
// recording, with promtool unit tests) and Grafana dashboards (the
// pipeline over Prometheus, the fleet over ClickHouse) as plain files, and
// reads them back for the tests that keep them true: every metric they
// use is exported by a running binary, every SQL panel runs on ClickHouse.
package monitoring

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Files holds prometheus/ and grafana/.
//
//go:embed prometheus/*.yaml grafana/*.json
var Files embed.FS

// RulesFile and RulesTestFile are the rules and their promtool tests.
const (
	RulesFile     = "prometheus/faultline-rules.yaml"
	RulesTestFile = "prometheus/faultline-rules_test.yaml"
)

// metricRE matches a faultline metric name in PromQL (recording rules'
// names have colons and are not matched).
var metricRE = regexp.MustCompile(`\bfaultline_[a-z0-9_]+\b`)

// histogramSuffixes are the series a histogram exports besides its name.
var histogramSuffixes = []string{"_bucket", "_sum", "_count"}

// Exprs returns every PromQL expression of the rules and the dashboards,
// each named by where it is.
func Exprs() (map[string]string, error) {
	out := map[string]string{}
	rules, err := ReadRules()
	if err != nil {
		return nil, err
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out[RulesFile+" "+r.Record+r.Alert] = r.Expr
		}
	}
	ds, err := Dashboards()
	if err != nil {
		return nil, err
	}
	for _, d := range ds {
		for _, p := range d.Panels {
			for _, t := range p.Targets {
				if t.Expr != "" {
					out[d.File+" "+p.Title+" "+t.RefID] = t.Expr
				}
			}
		}
	}
	return out, nil
}

// Rules is the part of the rules file the tests read.
type Rules struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Record      string            `json:"record"`
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

// ReadRules reads RulesFile.
func ReadRules() (*Rules, error) {
	b, err := fs.ReadFile(Files, RulesFile)
	if err != nil {
		return nil, err
	}
	var rules Rules
	if err := yaml.Unmarshal(b, &rules); err != nil {
		return nil, fmt.Errorf("%s: %w", RulesFile, err)
	}
	return &rules, nil
}

// MetricNames returns the faultline metrics the rules and dashboards use
// (a histogram by its name, without _bucket, _sum or _count), sorted.
func MetricNames() ([]string, error) {
	exprs, err := Exprs()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, e := range exprs {
		for _, m := range metricRE.FindAllString(e, -1) {
			for _, s := range histogramSuffixes {
				m = strings.TrimSuffix(m, s)
			}
			seen[m] = true
		}
	}
	var out []string
	for m := range seen {
		out = append(out, m)
	}
	slices.Sort(out)
	return out, nil
}

// Dashboard is the part of a Grafana dashboard the tests read.
type Dashboard struct {
	File   string  `json:"-"`
	UID    string  `json:"uid"`
	Title  string  `json:"title"`
	Panels []Panel `json:"panels"`
}

// Panel is a dashboard panel.
type Panel struct {
	ID      int    `json:"id"`
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		RefID        string `json:"refId"`
		Expr         string `json:"expr"`
		RawSQL       string `json:"rawSql"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
}

// Dashboards reads grafana/*.json.
func Dashboards() ([]Dashboard, error) {
	files, err := fs.Glob(Files, "grafana/*.json")
	if err != nil {
		return nil, err
	}
	var out []Dashboard
	for _, f := range files {
		b, err := fs.ReadFile(Files, f)
		if err != nil {
			return nil, err
		}
		var d Dashboard
		if err := json.Unmarshal(b, &d); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		d.File = f
		out = append(out, d)
	}
	return out, nil
}

// PanelSQL is one SQL query of a ClickHouse panel.
type PanelSQL struct {
	Where string
	SQL   string
}

// SQLPanels returns the SQL of every ClickHouse panel.
func SQLPanels() ([]PanelSQL, error) {
	ds, err := Dashboards()
	if err != nil {
		return nil, err
	}
	var out []PanelSQL
	for _, d := range ds {
		for _, p := range d.Panels {
			for _, t := range p.Targets {
				if t.RawSQL != "" {
					out = append(out, PanelSQL{Where: d.File + " " + p.Title, SQL: t.RawSQL})
				}
			}
		}
	}
	return out, nil
}

var timeFilterRE = regexp.MustCompile(`\$__timeFilter\(([a-z_.]+)\)`)

// Expand replaces the Grafana ClickHouse plugin's macros and the
// dashboard's variables the way Grafana sends them: $__timeFilter(col),
// $__fromTime, $__toTime and ${cluster}.
func Expand(sql, cluster string, from, to time.Time) string {
	f, t := "toDateTime("+strconv.FormatInt(from.Unix(), 10)+")", "toDateTime("+strconv.FormatInt(to.Unix(), 10)+")"
	sql = timeFilterRE.ReplaceAllString(sql, "$1 >= "+f+" AND $1 <= "+t)
	return strings.NewReplacer("$__fromTime", f, "$__toTime", t, "${cluster}", strings.ReplaceAll(cluster, "'", "")).Replace(sql)
}
