package monitoring_test

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// This file checks PromQL against the registered metrics: Prometheus's
// parser reads each expression, and a walk of its AST works out the
// labels of every subexpression and reports a metric or recorded series
// nobody exports, a matcher or grouping label the series do not carry,
// rate or increase over a gauge, delta or deriv over a counter, and
// histogram_quantile over buckets whose le was aggregated away.

// pval is the inferred value of a subexpression.
type pval struct {
	// scalar: a number or string, no series.
	scalar bool
	// labels the result's series carry.
	labels map[string]bool
	// counter: a selector of series that only grow; name: its metric.
	counter bool
	name    string
	// unknown: the series are not known (reported once, where named);
	// nothing is checked or inferred about them.
	unknown bool
}

// promChecker checks expressions against reg and, for the recording
// rules' outputs, recorded (each rule's result labels, filled as the
// rules are read in order).
type promChecker struct {
	reg      map[string]registered
	recorded map[string]map[string]bool
	errs     []string
}

func (p *promChecker) errorf(format string, args ...any) {
	p.errs = append(p.errs, fmt.Sprintf(format, args...))
}

// check parses expr and returns the labels of its result and the problems
// found.
func (p *promChecker) check(expr string) (map[string]bool, []string) {
	e, err := parser.ParseExpr(expr)
	if err != nil {
		return nil, []string{"cannot parse: " + err.Error()}
	}
	p.errs = nil
	return p.eval(e).labels, p.errs
}

func (p *promChecker) eval(e parser.Expr) pval {
	switch e := e.(type) {
	case *parser.NumberLiteral, *parser.StringLiteral:
		return pval{scalar: true}
	case *parser.ParenExpr:
		return p.eval(e.Expr)
	case *parser.UnaryExpr:
		return p.eval(e.Expr)
	case *parser.MatrixSelector:
		return p.eval(e.VectorSelector)
	case *parser.SubqueryExpr:
		return p.eval(e.Expr)
	case *parser.VectorSelector:
		return p.selector(e)
	case *parser.AggregateExpr:
		return p.aggregate(e)
	case *parser.BinaryExpr:
		return p.binary(e)
	case *parser.Call:
		return p.call(e)
	}
	p.errorf("%s: this test does not read a %T; teach it", e, e)
	return pval{unknown: true}
}

func (p *promChecker) selector(vs *parser.VectorSelector) pval {
	name := vs.Name
	var ms []*labels.Matcher
	for _, m := range vs.LabelMatchers {
		switch {
		case m.Name != labels.MetricName:
			ms = append(ms, m)
		case m.Type == labels.MatchEqual:
			name = m.Value
		}
	}
	v := pval{name: name, labels: map[string]bool{}}
	switch s, ok := series(p.reg, name); {
	case strings.Contains(name, ":"):
		rec, ok := p.recorded[name]
		if !ok {
			p.errorf("%s: no recording rule records it", name)
		}
		if rec == nil {
			// Unrecorded, or its rule's labels are not known.
			return pval{name: name, unknown: true}
		}
		v.labels = rec
	case ok:
		v.labels, v.counter = s.Labels, s.Counter
	case strings.HasPrefix(name, "faultline_") || strings.HasPrefix(name, "preflight_"):
		p.errorf("%s: no faultline binary exports it", name)
		return pval{name: name, unknown: true}
	default:
		// Not faultline's (up, kube-state-metrics): its known labels
		// (externalMetrics), target labels and any it is matched on; a
		// counter by the convention of its name.
		for _, l := range slices.Concat(externalMetrics[name], targetLabels) {
			v.labels[l] = true
		}
		for _, m := range ms {
			v.labels[m.Name] = true
		}
		v.counter = strings.HasSuffix(name, "_total")
	}
	for _, m := range ms {
		if !v.labels[m.Name] {
			p.errorf("%s{%s}: %s has no label %q (it has %v)", name, m, name, m.Name, keys(v.labels))
		}
	}
	return v
}

func (p *promChecker) aggregate(a *parser.AggregateExpr) pval {
	if a.Param != nil {
		p.eval(a.Param)
	}
	in := p.eval(a.Expr)
	if in.unknown {
		return in
	}
	out := map[string]bool{}
	if a.Without {
		for l := range in.labels {
			if !slices.Contains(a.Grouping, l) {
				out[l] = true
			}
		}
	} else {
		for _, l := range a.Grouping {
			if !in.labels[l] {
				p.errorf("%s by (%s): the series summed have no label %q (they have %v)", a.Op, strings.Join(a.Grouping, ", "), l, keys(in.labels))
			}
			out[l] = true
		}
	}
	switch a.Op {
	case parser.TOPK, parser.BOTTOMK, parser.LIMITK, parser.LIMIT_RATIO:
		// They pick series and keep them whole.
		return pval{labels: in.labels}
	case parser.COUNT_VALUES:
		if s, ok := a.Param.(*parser.StringLiteral); ok {
			out[s.Val] = true
		}
	}
	return pval{labels: out}
}

// binary works out a binary operation's labels the way Prometheus's
// engine does (resultMetric): on keeps the matching labels, ignoring
// drops them, group_left/right keeps the many side's and adds the
// included ones; and/unless keep the left side's, or either's.
func (p *promChecker) binary(b *parser.BinaryExpr) pval {
	l, r := p.eval(b.LHS), p.eval(b.RHS)
	switch {
	case l.scalar && r.scalar:
		return pval{scalar: true}
	case l.scalar:
		return r
	case r.scalar:
		return l
	case l.unknown || r.unknown:
		return pval{unknown: true}
	}
	m := b.VectorMatching
	if m.On {
		for _, x := range m.MatchingLabels {
			if !l.labels[x] || !r.labels[x] {
				p.errorf("%s on (%s): %q is not a label of both sides (left %v, right %v)", b.Op, strings.Join(m.MatchingLabels, ", "), x, keys(l.labels), keys(r.labels))
			}
		}
	}
	switch {
	case b.Op == parser.LOR:
		out := maps.Clone(l.labels)
		maps.Copy(out, r.labels)
		return pval{labels: out}
	case b.Op.IsSetOperator():
		return pval{labels: l.labels}
	case m.Card == parser.CardOneToOne && m.On:
		return pval{labels: set(m.MatchingLabels)}
	}
	many, one := l, r
	if m.Card == parser.CardOneToMany {
		many, one = r, l
	}
	out := maps.Clone(many.labels)
	if m.Card == parser.CardOneToOne {
		for _, x := range m.MatchingLabels {
			delete(out, x)
		}
	}
	for _, x := range m.Include {
		if !one.labels[x] {
			p.errorf("%s %s (%s): the one side has no label %q (it has %v)", b.Op, m.Card, strings.Join(m.Include, ", "), x, keys(one.labels))
		}
		out[x] = true
	}
	return pval{labels: out}
}

// call: a function's result has the labels of its first vector or range
// argument, but for those below.
func (p *promChecker) call(c *parser.Call) pval {
	var in pval // the first vector or range argument
	unknown := false
	for _, arg := range c.Args {
		v := p.eval(arg)
		unknown = unknown || v.unknown
		if !v.scalar && in.labels == nil {
			in = v
		}
	}
	switch {
	case unknown:
		return pval{unknown: true}
	case c.Func.ReturnType == parser.ValueTypeScalar:
		return pval{scalar: true}
	}
	fn, out := c.Func.Name, in.labels
	switch fn {
	case "rate", "irate", "increase", "resets":
		if !in.counter {
			p.errorf("%s(%s[…]): %s is not a counter (a gauge or recorded series): use delta, deriv or the value itself", fn, in.name, in.name)
		}
	case "delta", "idelta", "deriv", "predict_linear":
		if in.counter {
			p.errorf("%s(%s[…]): %s is a counter: use rate or increase (they handle its resets)", fn, in.name, in.name)
		}
	case "histogram_quantile":
		if !in.labels["le"] {
			p.errorf("histogram_quantile over series without le (aggregate by (…, le)): %v", keys(in.labels))
		}
		out = maps.Clone(in.labels)
		delete(out, "le")
	case "absent", "absent_over_time":
		out = nil
	case "label_replace", "label_join":
		out = maps.Clone(in.labels)
		if dst, ok := c.Args[1].(*parser.StringLiteral); ok {
			out[dst.Val] = true
		}
	}
	if out == nil {
		out = map[string]bool{}
	}
	return pval{labels: out}
}

// grafanaVarRE is a Grafana template variable: $var, ${var} or
// ${var:format}.
var grafanaVarRE = regexp.MustCompile(`\$\{?(\w+)(?::\w+)?\}?`)

// expandGrafana replaces a panel query's template variables before
// Prometheus's parser reads it, as Grafana does before it sends it:
// $__interval, $__rate_interval and $__range by a duration, any other
// variable (a label value) by its name.
func expandGrafana(expr string) string {
	return grafanaVarRE.ReplaceAllStringFunc(expr, func(v string) string {
		name := grafanaVarRE.FindStringSubmatch(v)[1]
		switch name {
		case "__interval", "__rate_interval", "__range":
			return "5m"
		}
		return name
	})
}

func set(ls []string) map[string]bool {
	out := map[string]bool{}
	for _, l := range ls {
		out[l] = true
	}
	return out
}

func keys(m map[string]bool) []string {
	return slices.Sorted(maps.Keys(m))
}
