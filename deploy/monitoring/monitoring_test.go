package monitoring_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/deploy/monitoring"
	"github.com/faultline/faultline/internal/testenv"
)

// promtoolVersion is the promtool scripts/testenv/install.sh builds.
const promtoolVersion = "v0.316.0"

// promtool finds the promtool binary: $FAULTLINE_PROMTOOL, or the one
// install.sh promtool built under $FAULTLINE_CACHE.
func promtool() (string, error) {
	if p := os.Getenv("FAULTLINE_PROMTOOL"); p != "" {
		return p, nil
	}
	cache := os.Getenv("FAULTLINE_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "faultline")
	}
	p := filepath.Join(cache, "promtool", promtoolVersion, "promtool")
	if _, err := os.Stat(p); err != nil {
		return "", errors.New("promtool not built: run scripts/testenv/install.sh promtool")
	}
	return p, nil
}

// TestPromtool runs `promtool check rules` and `promtool test rules` (the
// unit tests in prometheus/faultline-rules_test.yaml) on the shipped rules.
func TestPromtool(t *testing.T) {
	bin, err := promtool()
	testenv.Server(t, "promtool", err)
	dir := "prometheus"
	for _, args := range [][]string{
		{"check", "rules", filepath.Base(monitoring.RulesFile)},
		{"test", "rules", filepath.Base(monitoring.RulesTestFile)},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

// TestDashboards checks the dashboards' shape: unique uids and panel ids,
// every panel with a query, Prometheus panels with PromQL that names
// faultline metrics, ClickHouse panels with SQL whose macros all expand.
func TestDashboards(t *testing.T) {
	ds, err := monitoring.Dashboards()
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) < 2 {
		t.Fatalf("want the pipeline and fleet dashboards, got %d", len(ds))
	}
	uids := map[string]bool{}
	for _, d := range ds {
		if d.UID == "" || uids[d.UID] {
			t.Errorf("%s: uid %q empty or repeated", d.File, d.UID)
		}
		uids[d.UID] = true
		ids := map[int]bool{}
		for _, p := range d.Panels {
			if ids[p.ID] {
				t.Errorf("%s: panel id %d repeated", d.File, p.ID)
			}
			ids[p.ID] = true
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", d.File, p.Title)
			}
			for _, tg := range p.Targets {
				switch {
				case tg.Expr != "" && !strings.Contains(tg.Expr, "faultline_") && !strings.Contains(tg.Expr, "preflight_"):
					t.Errorf("%s: panel %q: %q names no faultline metric", d.File, p.Title, tg.Expr)
				case tg.RawSQL != "":
					sql := monitoring.Expand(tg.RawSQL, "alpha", time.Unix(0, 0), time.Now())
					if strings.Contains(sql, "$") {
						t.Errorf("%s: panel %q: a macro or variable is left after expansion:\n%s", d.File, p.Title, sql)
					}
				case tg.Expr == "" && tg.RawSQL == "":
					t.Errorf("%s: panel %q: a target with neither expr nor rawSql", d.File, p.Title)
				}
			}
		}
	}
	names, err := monitoring.MetricNames()
	if err != nil {
		t.Fatal(err)
	}
	if len(names) < 10 {
		t.Errorf("only %d metrics found in the rules and dashboards: %v", len(names), names)
	}
}

// TestAlertsSayWhatToDo: every alert pages with a severity the
// receivers route on (critical or warning) and carries a summary (what is
// wrong, and where) and a description (what to look at or do): the
// runbook line an on-call engineer reads first.
func TestAlertsSayWhatToDo(t *testing.T) {
	rules, err := monitoring.ReadRules()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			sev := r.Labels["severity"]
			if sev != "critical" && sev != "warning" && !strings.Contains(sev, "{{") {
				t.Errorf("%s: severity %q, want critical or warning", r.Alert, sev)
			}
			for _, a := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no %s annotation", r.Alert, a)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no alerts read")
	}
}
