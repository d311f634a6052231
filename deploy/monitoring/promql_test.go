package monitoring_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// This file checks PromQL against the registered metrics: a small parser
// of the PromQL the rules and dashboards use, which works out the labels
// of every subexpression and reports a metric or recorded series nobody
// exports, a matcher or grouping label the series do not carry, rate or
// increase over a gauge, delta or deriv over a counter, and
// histogram_quantile over buckets whose le was aggregated away.

type tok struct {
	kind byte // 'i' identifier, 'n' number or duration, 's' string, 'o' operator, 0 end
	s    string
}

func lexPromQL(src string) ([]tok, error) {
	var out []tok
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(src) && src[i] != '\n' {
				i++
			}
		case c == '_' || unicode.IsLetter(rune(c)):
			j := i
			for j < len(src) && (src[j] == '_' || src[j] == ':' || unicode.IsLetter(rune(src[j])) || unicode.IsDigit(rune(src[j]))) {
				j++
			}
			out = append(out, tok{'i', src[i:j]})
			i = j
		case unicode.IsDigit(rune(c)) || c == '.':
			j := i
			for j < len(src) && (src[j] == '.' || unicode.IsDigit(rune(src[j])) || unicode.IsLetter(rune(src[j]))) {
				j++
			}
			out = append(out, tok{'n', src[i:j]})
			i = j
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(src) && src[j] != c {
				if src[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			if j >= len(src) {
				return nil, fmt.Errorf("unterminated string")
			}
			s := src[i : j+1]
			if c == '\'' {
				s = strconv.Quote(strings.ReplaceAll(s[1:len(s)-1], `\'`, `'`))
			}
			v, err := strconv.Unquote(s)
			if err != nil {
				return nil, fmt.Errorf("string %s: %w", s, err)
			}
			out = append(out, tok{'s', v})
			i = j + 1
		default:
			op := string(c)
			if i+1 < len(src) {
				switch two := src[i : i+2]; two {
				case "==", "!=", ">=", "<=", "=~", "!~":
					op = two
				}
			}
			if !strings.Contains("=!<>~+-*/%^(){}[],:@", string(c)) {
				return nil, fmt.Errorf("unexpected %q", c)
			}
			out = append(out, tok{'o', op})
			i += len(op)
		}
	}
	return append(out, tok{}), nil
}

// pval is the inferred value of a subexpression.
type pval struct {
	scalar bool
	// labels the result's series carry.
	labels map[string]bool
	// matrix: a range selector's series (rate's argument): counter says
	// whether they only grow; recorded: a recording rule's output.
	matrix, counter, recorded bool
	name                      string
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
	toks     []tok
	pos      int
	errs     []string
}

func (p *promChecker) peek() tok { return p.toks[p.pos] }
func (p *promChecker) next() tok { t := p.toks[p.pos]; p.pos++; return t }
func (p *promChecker) is(kind byte, s string) bool {
	t := p.peek()
	return t.kind == kind && t.s == s
}
func (p *promChecker) expect(s string) {
	if t := p.next(); t.kind != 'o' || t.s != s {
		panic(fmt.Sprintf("want %q, got %q", s, t.s))
	}
}
func (p *promChecker) errorf(format string, args ...any) {
	p.errs = append(p.errs, fmt.Sprintf(format, args...))
}

// check parses expr and returns the labels of its result and the problems
// found.
func (p *promChecker) check(expr string) (labels map[string]bool, errs []string) {
	toks, err := lexPromQL(expr)
	if err != nil {
		return nil, []string{err.Error()}
	}
	p.toks, p.pos, p.errs = toks, 0, nil
	defer func() {
		if r := recover(); r != nil {
			labels, errs = nil, append(p.errs, fmt.Sprintf("cannot parse (this test's parser): %v", r))
		}
	}()
	v := p.binary(0)
	if p.peek().kind != 0 {
		panic(fmt.Sprintf("trailing %q", p.peek().s))
	}
	return v.labels, p.errs
}

var precedence = map[string]int{
	"or": 1, "and": 2, "unless": 2,
	"==": 3, "!=": 3, ">": 3, "<": 3, ">=": 3, "<=": 3,
	"+": 4, "-": 4, "*": 5, "/": 5, "%": 5, "atan2": 5, "^": 6,
}

func (p *promChecker) binary(min int) pval {
	left := p.unary()
	for {
		op := p.peek().s
		prec, ok := precedence[op]
		if !ok || prec < min || p.peek().kind == 's' || p.peek().kind == 'n' {
			return left
		}
		p.next()
		var on bool
		var match []string
		if p.is('i', "bool") {
			p.next()
		}
		if p.is('i', "on") || p.is('i', "ignoring") {
			on = p.next().s == "on"
			match = p.labelList()
		}
		group := false
		if p.is('i', "group_left") || p.is('i', "group_right") {
			p.next()
			group = true
			if p.is('o', "(") {
				p.labelList()
			}
		}
		nextMin := prec + 1
		if op == "^" {
			nextMin = prec
		}
		right := p.binary(nextMin)
		left = p.combine(op, left, right, on, match, group)
	}
}

func (p *promChecker) combine(op string, l, r pval, on bool, match []string, group bool) pval {
	if l.scalar && r.scalar {
		return pval{scalar: true}
	}
	if l.scalar {
		return r
	}
	if r.scalar {
		return l
	}
	if l.unknown || r.unknown {
		return pval{unknown: true}
	}
	if on {
		for _, m := range match {
			if !l.labels[m] || !r.labels[m] {
				p.errorf("%s on (%s): %q is not a label of both sides (left %v, right %v)", op, strings.Join(match, ", "), m, keys(l.labels), keys(r.labels))
			}
		}
	}
	switch op {
	case "and", "unless":
		return pval{labels: l.labels}
	case "or":
		u := map[string]bool{}
		for k := range l.labels {
			u[k] = true
		}
		for k := range r.labels {
			u[k] = true
		}
		return pval{labels: u}
	}
	if on && !group && precedence[op] != 3 {
		return pval{labels: set(match)}
	}
	return pval{labels: l.labels}
}

func (p *promChecker) unary() pval {
	if p.is('o', "-") || p.is('o', "+") {
		p.next()
		return p.unary()
	}
	v := p.primary()
	// Subqueries are not read; offset and @ modifiers are skipped.
	for {
		switch {
		case p.is('i', "offset"):
			p.next()
			if p.is('o', "-") {
				p.next()
			}
			p.next()
		case p.is('o', "@"):
			p.next()
			p.next()
			if p.is('o', "(") {
				p.expect("(")
				p.expect(")")
			}
		default:
			return v
		}
	}
}

var aggregations = map[string]bool{"sum": true, "min": true, "max": true, "avg": true, "count": true, "group": true,
	"stddev": true, "stdvar": true, "topk": true, "bottomk": true, "quantile": true, "count_values": true, "limitk": true}

func (p *promChecker) primary() pval {
	t := p.peek()
	switch {
	case t.kind == 'n':
		p.next()
		return pval{scalar: true}
	case t.kind == 's':
		p.next()
		return pval{scalar: true}
	case t.kind == 'o' && t.s == "(":
		p.next()
		v := p.binary(0)
		p.expect(")")
		return v
	case t.kind == 'o' && t.s == "{":
		return p.selector("")
	case t.kind == 'i' && aggregations[t.s]:
		return p.aggregation()
	case t.kind == 'i' && p.toks[p.pos+1].s == "(" && p.toks[p.pos+1].kind == 'o':
		return p.call()
	case t.kind == 'i':
		p.next()
		return p.selector(t.s)
	}
	panic(fmt.Sprintf("unexpected %q", t.s))
}

func (p *promChecker) labelList() []string {
	p.expect("(")
	var out []string
	for !p.is('o', ")") {
		t := p.next()
		if t.kind != 'i' {
			panic(fmt.Sprintf("label name expected, got %q", t.s))
		}
		out = append(out, t.s)
		if p.is('o', ",") {
			p.next()
		}
	}
	p.expect(")")
	return out
}

func (p *promChecker) aggregation() pval {
	op := p.next().s
	var by, without []string
	var haveBy, haveWithout bool
	grouping := func() {
		switch {
		case p.is('i', "by"):
			p.next()
			by, haveBy = p.labelList(), true
		case p.is('i', "without"):
			p.next()
			without, haveWithout = p.labelList(), true
		}
	}
	grouping()
	p.expect("(")
	var in pval
	switch op {
	case "topk", "bottomk", "quantile", "count_values", "limitk":
		p.binary(0)
		p.expect(",")
	}
	in = p.binary(0)
	p.expect(")")
	if !haveBy && !haveWithout {
		grouping()
	}
	if in.scalar {
		p.errorf("%s over a scalar", op)
		return pval{labels: map[string]bool{}}
	}
	if in.unknown {
		return in
	}
	for _, l := range by {
		if !in.labels[l] {
			p.errorf("%s by (%s): the series summed have no label %q (they have %v)", op, strings.Join(by, ", "), l, keys(in.labels))
		}
	}
	switch {
	case haveBy:
		return pval{labels: set(by)}
	case haveWithout:
		out := map[string]bool{}
		for k := range in.labels {
			if !slices.Contains(without, k) {
				out[k] = true
			}
		}
		return pval{labels: out}
	}
	return pval{labels: map[string]bool{}}
}

func (p *promChecker) call() pval {
	fn := p.next().s
	p.expect("(")
	var args []pval
	for !p.is('o', ")") {
		args = append(args, p.binary(0))
		if p.is('o', ",") {
			p.next()
		}
	}
	p.expect(")")
	arg := func(i int) pval {
		if i >= len(args) {
			panic(fmt.Sprintf("%s: too few arguments", fn))
		}
		return args[i]
	}
	for _, a := range args {
		if a.unknown {
			return pval{unknown: true}
		}
	}
	switch fn {
	case "rate", "irate", "increase", "resets":
		a := arg(0)
		if !a.matrix {
			p.errorf("%s of %s: not a range selector", fn, a.name)
		} else if !a.counter {
			p.errorf("%s(%s[…]): %s is not a counter (a gauge or recorded series): use delta, deriv or the value itself", fn, a.name, a.name)
		}
		return pval{labels: a.labels}
	case "delta", "idelta", "deriv", "predict_linear":
		a := arg(0)
		if !a.matrix {
			p.errorf("%s of %s: not a range selector", fn, a.name)
		} else if a.counter {
			p.errorf("%s(%s[…]): %s is a counter: use rate or increase (they handle its resets)", fn, a.name, a.name)
		}
		return pval{labels: a.labels}
	case "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time", "last_over_time",
		"stddev_over_time", "stdvar_over_time", "changes", "present_over_time":
		a := arg(0)
		if !a.matrix {
			p.errorf("%s of %s: not a range selector", fn, a.name)
		}
		return pval{labels: a.labels}
	case "quantile_over_time":
		return pval{labels: arg(1).labels}
	case "histogram_quantile":
		a := arg(1)
		if !a.labels["le"] {
			p.errorf("histogram_quantile over series without le (aggregate by (…, le)): %v", keys(a.labels))
		}
		out := map[string]bool{}
		for k := range a.labels {
			if k != "le" {
				out[k] = true
			}
		}
		return pval{labels: out}
	case "time", "scalar", "pi":
		return pval{scalar: true}
	case "vector":
		return pval{labels: map[string]bool{}}
	case "absent", "absent_over_time":
		arg(0)
		return pval{labels: map[string]bool{}}
	case "abs", "ceil", "floor", "round", "exp", "ln", "log2", "log10", "sqrt", "sgn", "clamp", "clamp_min", "clamp_max",
		"sort", "sort_desc", "timestamp":
		return pval{labels: arg(0).labels}
	case "label_replace":
		a := arg(0)
		out := map[string]bool{}
		for k := range a.labels {
			out[k] = true
		}
		// The target label is the second argument, a string: not kept by
		// this parser; the result keeps the input's labels.
		return pval{labels: out}
	}
	panic(fmt.Sprintf("function %s: this test's parser does not know it; teach it", fn))
}

func (p *promChecker) selector(name string) pval {
	type matcher struct{ label, op, value string }
	var ms []matcher
	if p.is('o', "{") {
		p.next()
		for !p.is('o', "}") {
			l := p.next()
			op := p.next()
			v := p.next()
			if l.kind != 'i' || op.kind != 'o' || v.kind != 's' {
				panic(fmt.Sprintf("bad matcher %q %q %q", l.s, op.s, v.s))
			}
			if l.s == "__name__" && op.s == "=" {
				name = v.s
			} else {
				ms = append(ms, matcher{l.s, op.s, v.s})
			}
			if p.is('o', ",") {
				p.next()
			}
		}
		p.next()
	}
	v := pval{name: name, labels: map[string]bool{}}
	switch s, ok := series(p.reg, name); {
	case strings.Contains(name, ":"):
		rec, ok := p.recorded[name]
		if !ok {
			p.errorf("%s: no recording rule records it", name)
			return p.skipRange(pval{name: name, unknown: true})
		}
		v.labels, v.recorded = rec, true
	case ok:
		v.labels, v.counter = s.Labels, s.Counter
	case strings.HasPrefix(name, "faultline_") || strings.HasPrefix(name, "preflight_"):
		p.errorf("%s: no faultline binary exports it", name)
		return p.skipRange(pval{name: name, unknown: true})
	default:
		// Not faultline's (up, kube-state-metrics): any labels.
		for _, m := range ms {
			v.labels[m.label] = true
		}
	}
	for _, m := range ms {
		if !v.labels[m.label] {
			p.errorf("%s{%s%s%q}: %s has no label %q (it has %v)", name, m.label, m.op, m.value, name, m.label, keys(v.labels))
		}
	}
	return p.skipRange(v)
}

// skipRange reads a selector's [range], if any.
func (p *promChecker) skipRange(v pval) pval {
	if p.is('o', "[") {
		p.next()
		for !p.is('o', "]") {
			if p.is('o', ":") {
				panic("subqueries are not read; teach this parser")
			}
			p.next()
		}
		p.next()
		v.matrix = true
	}
	return v
}

func set(ls []string) map[string]bool {
	out := map[string]bool{}
	for _, l := range ls {
		out[l] = true
	}
	return out
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
