package monitoring_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// metricKind is what a registered metric is.
type metricKind string

const (
	counter   metricKind = "counter"
	gauge     metricKind = "gauge"
	histogram metricKind = "histogram"
	summary   metricKind = "summary"
)

// registered is one metric a faultline binary registers.
type registered struct {
	Name   string
	Kind   metricKind
	Labels []string
	Where  string
}

// constructors are client_golang's metric constructors, by the kind they
// make and whether their second argument is the label names.
var constructors = map[string]struct {
	kind metricKind
	vec  bool
}{
	"NewCounter": {counter, false}, "NewCounterVec": {counter, true}, "NewCounterFunc": {counter, false},
	"NewGauge": {gauge, false}, "NewGaugeVec": {gauge, true}, "NewGaugeFunc": {gauge, false},
	"NewHistogram": {histogram, false}, "NewHistogramVec": {histogram, true},
	"NewSummary": {summary, false}, "NewSummaryVec": {summary, true},
}

// sourceDirs are where the deployables' code lives (loadtest's tools
// register their own metrics, which no rule reads).
var sourceDirs = []string{"agents", "cmd", "gateway", "internal", "processors", "schemas"}

// registeredMetrics reads every metric the binaries register from their
// source: each client_golang constructor call, whose options name the
// metric with a string literal and whose label names are a []string
// literal. The roles build their metrics inside constructors that connect
// to Kafka, ClickHouse and Kubernetes first, so the source, not a live
// registry, is what a test without servers can read; a constructor call
// this reader cannot follow (a name that is not a literal, Namespace or
// Subsystem, promauto, a hand-made Desc) is an error, not a metric
// silently missed.
func registeredMetrics(root string) (map[string]registered, []error) {
	out := map[string]registered{}
	var errs []error
	fset := token.NewFileSet()
	for _, dir := range sourceDirs {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if !strings.Contains(string(src), `"github.com/prometheus/client_golang/prometheus`) {
				return nil
			}
			f, err := parser.ParseFile(fset, path, src, 0)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			pkg := "prometheus"
			for _, im := range f.Imports {
				p, _ := strconv.Unquote(im.Path.Value)
				switch {
				case p == "github.com/prometheus/client_golang/prometheus" && im.Name != nil:
					pkg = im.Name.Name
				case p == "github.com/prometheus/client_golang/prometheus/promauto":
					errs = append(errs, fmt.Errorf("%s: promauto: this test reads only prometheus.New… calls; teach it", rel))
				}
			}
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if x, ok := sel.X.(*ast.Ident); !ok || x.Name != pkg {
					return true
				}
				at := fmt.Sprintf("%s:%d", rel, fset.Position(call.Pos()).Line)
				if sel.Sel.Name == "NewDesc" || sel.Sel.Name == "MustNewConstMetric" {
					errs = append(errs, fmt.Errorf("%s: prometheus.%s: this test reads only prometheus.New… constructors; teach it", at, sel.Sel.Name))
					return true
				}
				c, ok := constructors[sel.Sel.Name]
				if !ok {
					return true
				}
				m, err := readConstructor(call, c.kind, c.vec)
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: prometheus.%s: %w", at, sel.Sel.Name, err))
					return true
				}
				m.Where = at
				if prev, ok := out[m.Name]; ok && (prev.Kind != m.Kind || !slices.Equal(prev.Labels, m.Labels)) {
					errs = append(errs, fmt.Errorf("%s: %s registered as %s%v, and at %s as %s%v", at, m.Name, m.Kind, m.Labels, prev.Where, prev.Kind, prev.Labels))
				}
				out[m.Name] = m
				return true
			})
			return nil
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	return out, errs
}

func readConstructor(call *ast.CallExpr, kind metricKind, vec bool) (registered, error) {
	m := registered{Kind: kind}
	if len(call.Args) == 0 {
		return m, fmt.Errorf("no options")
	}
	opts, ok := call.Args[0].(*ast.CompositeLit)
	if !ok {
		return m, fmt.Errorf("options are not a composite literal")
	}
	for _, e := range opts.Elts {
		kv, ok := e.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		key, _ := kv.Key.(*ast.Ident)
		if key == nil {
			continue
		}
		switch key.Name {
		case "Name":
			lit, ok := kv.Value.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return m, fmt.Errorf("Name is not a string literal")
			}
			m.Name, _ = strconv.Unquote(lit.Value)
		case "ConstLabels": // prometheus.Labels{"peer": …}: its keys
			lit, ok := kv.Value.(*ast.CompositeLit)
			if !ok {
				return m, fmt.Errorf("ConstLabels is not a literal")
			}
			for _, e := range lit.Elts {
				pair, ok := e.(*ast.KeyValueExpr)
				if !ok {
					return m, fmt.Errorf("ConstLabels is not a map literal")
				}
				l, ok := pair.Key.(*ast.BasicLit)
				if !ok || l.Kind != token.STRING {
					return m, fmt.Errorf("a ConstLabels key is not a string literal")
				}
				name, _ := strconv.Unquote(l.Value)
				m.Labels = append(m.Labels, name)
			}
		case "Namespace", "Subsystem":
			return m, fmt.Errorf("%s: this test reads only Name and the label names; teach it", key.Name)
		}
	}
	if m.Name == "" {
		return m, fmt.Errorf("no Name")
	}
	if !vec {
		return m, nil
	}
	if len(call.Args) < 2 {
		return m, fmt.Errorf("%s: no label names", m.Name)
	}
	labels, ok := call.Args[1].(*ast.CompositeLit)
	if !ok {
		return m, fmt.Errorf("%s: label names are not a []string literal", m.Name)
	}
	for _, e := range labels.Elts {
		lit, ok := e.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return m, fmt.Errorf("%s: a label name is not a string literal", m.Name)
		}
		l, _ := strconv.Unquote(lit.Value)
		m.Labels = append(m.Labels, l)
	}
	return m, nil
}

// targetLabels are the labels Prometheus adds to every scraped series
// (the Prometheus Operator's, for a ServiceMonitor).
var targetLabels = []string{"instance", "job", "namespace", "pod", "service", "container", "endpoint"}

// seriesKind is a series of a registered metric: a counter's or gauge's
// own name, a histogram's _bucket (with le), _sum and _count, a
// summary's own (with quantile), _sum and _count.
type seriesKind struct {
	Metric registered
	// Counter: the series only grows (rate and increase apply).
	Counter bool
	// Labels are the series' labels, target labels included.
	Labels map[string]bool
}

// series resolves a series name against the registered metrics.
func series(reg map[string]registered, name string) (seriesKind, bool) {
	lookup := func(m registered, counterLike bool, extra ...string) seriesKind {
		s := seriesKind{Metric: m, Counter: counterLike, Labels: map[string]bool{}}
		for _, l := range slices.Concat(m.Labels, targetLabels, extra) {
			s.Labels[l] = true
		}
		return s
	}
	if m, ok := reg[name]; ok {
		switch m.Kind {
		case counter:
			return lookup(m, true), true
		case gauge:
			return lookup(m, false), true
		case summary:
			return lookup(m, false, "quantile"), true
		}
		// A histogram has no series of its own name.
		return seriesKind{}, false
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suf)
		if !ok {
			continue
		}
		m, ok := reg[base]
		if !ok || (m.Kind != histogram && m.Kind != summary) || (suf == "_bucket" && m.Kind != histogram) {
			continue
		}
		if suf == "_bucket" {
			return lookup(m, true, "le"), true
		}
		return lookup(m, true), true
	}
	return seriesKind{}, false
}
