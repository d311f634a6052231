package quarantine

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/ext"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// DefaultRules is the shipped rule-set file (default_rules.toml): fatal
// events of faultline's agents, the correlator's derived verdicts, preflight
// checks and NVSentinel's monitors quarantine the node.
//
//go:embed default_rules.toml
var DefaultRules []byte

// RuleSets is the rule file: NVSentinel's fault-quarantine format.
//
//	[[rule-sets]]
//	name = "gpu-fatal"
//	priority = 100
//	  [[rule-sets.match.all]]
//	  kind = "HealthEvent"
//	  expression = "event.componentClass == 'GPU' && event.isFatal"
//	  [rule-sets.cordon]
//	  shouldCordon = true
//	  [rule-sets.taint]
//	  key = "faultline.io/unhealthy"
//	  value = "gpu"
//	  effect = "NoSchedule"
type RuleSets struct {
	RuleSets []RuleSet `toml:"rule-sets"`
}

// RuleSet is one named policy: when its match holds for an unhealthy event
// and its node, the node is quarantined as it says.
type RuleSet struct {
	// Name identifies the rule set in errors, annotations and actions.
	Name string `toml:"name"`
	// Version is informational (NVSentinel files carry it).
	Version string `toml:"version"`
	// Priority orders rule sets: the highest matching one decides; ties keep
	// file order.
	Priority int `toml:"priority"`
	// Match: every All expression and (when Any is not empty) at least one
	// Any expression must be true.
	Match Match `toml:"match"`
	// Cordon says whether to cordon.
	Cordon Cordon `toml:"cordon"`
	// Taint to set; empty key: none.
	Taint Taint `toml:"taint"`
	// Condition: set the node condition of the event's component class.
	// Default true.
	Condition *bool `toml:"condition"`
}

// Match lists the CEL expressions of a rule set.
type Match struct {
	All []Expr `toml:"all"`
	Any []Expr `toml:"any"`
}

// Expr is one CEL expression over `event` and `node`; Kind ("HealthEvent"
// or "Node") is documentation only: both variables are always bound.
type Expr struct {
	Kind       string `toml:"kind"`
	Expression string `toml:"expression"`
}

// Cordon is the cordon part of a rule set.
type Cordon struct {
	ShouldCordon bool `toml:"shouldCordon"`
}

// Taint is a node taint set by a rule set.
type Taint struct {
	Key    string `toml:"key" json:"key"`
	Value  string `toml:"value" json:"value,omitempty"`
	Effect string `toml:"effect" json:"effect"`
}

// LoadRules reads a rule file; path "" gives DefaultRules.
func LoadRules(path string) (RuleSets, error) {
	b := DefaultRules
	if path != "" {
		var err error
		if b, err = os.ReadFile(path); err != nil {
			return RuleSets{}, fmt.Errorf("read rules: %w", err)
		}
	}
	return ParseRules(b)
}

// ParseRules decodes a rule file, rejecting unknown keys.
func ParseRules(b []byte) (RuleSets, error) {
	var rs RuleSets
	md, err := toml.Decode(string(b), &rs)
	if err != nil {
		return RuleSets{}, fmt.Errorf("parse rules: %w", err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return RuleSets{}, fmt.Errorf("parse rules: unknown key %s", und[0])
	}
	return rs, nil
}

// Policy is a compiled rule file.
type Policy struct {
	sets []compiledSet
}

type compiledSet struct {
	RuleSet
	all, any []cel.Program
}

// Match is the decision of a Policy for one event.
type Decision struct {
	// Rule is the matching rule set's name.
	Rule      string
	Cordon    bool
	Taint     *Taint
	Condition bool
}

// DefaultRuleCostLimit is the CEL cost one expression may spend on one
// event (Config.RuleCostLimit). The shipped rules spend 2 to 5 on the
// largest event the gateway accepts; a comprehension over its 64 entities
// or a regular expression over its 8 KiB message, a few hundred to a few
// thousand. An expression that runs into the limit has spent a few
// milliseconds (a triple comprehension over 64 entities, which would run
// for over a second, stops after ~2.5 ms on the 2-core test machine).
const DefaultRuleCostLimit = 10_000

// Compile type-checks every expression of every rule set, with
// DefaultRuleCostLimit. An invalid expression is an error naming the rule
// set and carrying CEL's message.
func Compile(rs RuleSets) (*Policy, error) { return CompileLimited(rs, DefaultRuleCostLimit) }

// CompileLimited is Compile with a cost limit per expression evaluation: an
// expression that spends more (a comprehension over every entity of every
// entity, say) stops with an error, counted and logged by the role, and
// its rule set does not match.
func CompileLimited(rs RuleSets, costLimit uint64) (*Policy, error) {
	if costLimit == 0 {
		return nil, errors.New("cost limit: must be positive")
	}
	env, err := cel.NewEnv(
		cel.Variable("event", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("node", cel.MapType(cel.StringType, cel.DynType)),
		ext.Strings(), ext.Lists(), ext.Sets(),
	)
	if err != nil {
		return nil, fmt.Errorf("cel environment: %w", err)
	}
	p := &Policy{}
	names := map[string]bool{}
	for i, r := range rs.RuleSets {
		if r.Name == "" {
			return nil, fmt.Errorf("rule-sets[%d].name: required", i)
		}
		if names[r.Name] {
			return nil, fmt.Errorf("rule set %q: name used twice", r.Name)
		}
		names[r.Name] = true
		if len(r.Match.All) == 0 && len(r.Match.Any) == 0 {
			return nil, fmt.Errorf("rule set %q: match: needs at least one expression in all or any", r.Name)
		}
		if err := r.Taint.validate(); err != nil {
			return nil, fmt.Errorf("rule set %q: taint: %w", r.Name, err)
		}
		cs := compiledSet{RuleSet: r}
		for _, part := range []struct {
			name  string
			exprs []Expr
			out   *[]cel.Program
		}{{"all", r.Match.All, &cs.all}, {"any", r.Match.Any, &cs.any}} {
			for j, e := range part.exprs {
				prg, err := compileExpr(env, e.Expression, costLimit)
				if err != nil {
					return nil, fmt.Errorf("rule set %q: match.%s[%d] %q: %w", r.Name, part.name, j, e.Expression, err)
				}
				*part.out = append(*part.out, prg)
			}
		}
		p.sets = append(p.sets, cs)
	}
	sort.SliceStable(p.sets, func(i, j int) bool { return p.sets[i].Priority > p.sets[j].Priority })
	return p, nil
}

func compileExpr(env *cel.Env, src string, costLimit uint64) (cel.Program, error) {
	if strings.TrimSpace(src) == "" {
		return nil, errors.New("empty expression")
	}
	ast, iss := env.Compile(src)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	if t := ast.OutputType(); !t.IsExactType(cel.BoolType) && !t.IsExactType(cel.DynType) {
		return nil, fmt.Errorf("expression gives %s, want bool", t)
	}
	return env.Program(ast, cel.EvalOptions(cel.OptOptimize), cel.CostLimit(costLimit))
}

func (t Taint) validate() error {
	if t.Key == "" {
		if t.Value != "" || t.Effect != "" {
			return errors.New("key is required when value or effect is set")
		}
		return nil
	}
	if errs := validation.IsQualifiedName(t.Key); len(errs) > 0 {
		return fmt.Errorf("key %q: %s", t.Key, strings.Join(errs, "; "))
	}
	if t.Value != "" {
		if errs := validation.IsValidLabelValue(t.Value); len(errs) > 0 {
			return fmt.Errorf("value %q: %s", t.Value, strings.Join(errs, "; "))
		}
	}
	switch corev1.TaintEffect(t.Effect) {
	case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
	default:
		return fmt.Errorf("effect %q: want NoSchedule, PreferNoSchedule or NoExecute", t.Effect)
	}
	return nil
}

// Names lists the rule-set names in evaluation order.
func (p *Policy) Names() []string {
	out := make([]string, len(p.sets))
	for i, s := range p.sets {
		out[i] = s.Name
	}
	return out
}

// RuleError is an expression of a rule set that failed on an event: a
// missing key, a type error, or the cost limit.
type RuleError struct {
	// Rule is the rule set's name.
	Rule string
	Err  error
}

func (e *RuleError) Error() string { return fmt.Sprintf("rule set %q: %v", e.Rule, e.Err) }

func (e *RuleError) Unwrap() error { return e.Err }

// Evaluate returns the decision of the highest-priority matching rule set,
// or nil. An expression that fails at run time (a missing key, the cost
// limit) counts as false for its rule set; the errors (*RuleError) are
// returned alongside, for the caller to count and log.
func (p *Policy) Evaluate(ev *datamodels.HealthEvent, node *corev1.Node) (*Decision, []error) {
	vars := map[string]any{"event": events.Vars(ev), "node": NodeVars(node, ev.GetNodeName())}
	var errs []error
	for _, s := range p.sets {
		ok, err := s.matches(vars)
		if err != nil {
			errs = append(errs, &RuleError{Rule: s.Name, Err: err})
		}
		if !ok {
			continue
		}
		d := &Decision{Rule: s.Name, Cordon: s.Cordon.ShouldCordon, Condition: s.Condition == nil || *s.Condition}
		if s.Taint.Key != "" {
			t := s.Taint
			d.Taint = &t
		}
		return d, errs
	}
	return nil, errs
}

func (s compiledSet) matches(vars map[string]any) (bool, error) {
	for _, prg := range s.all {
		ok, err := evalBool(prg, vars)
		if err != nil || !ok {
			return false, err
		}
	}
	if len(s.any) == 0 {
		return true, nil
	}
	var firstErr error
	for _, prg := range s.any {
		ok, err := evalBool(prg, vars)
		if ok {
			return true, nil
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return false, firstErr
}

func evalBool(prg cel.Program, vars map[string]any) (bool, error) {
	out, _, err := prg.Eval(vars)
	if err != nil {
		return false, err
	}
	b, ok := out.Value().(bool)
	if !ok {
		return false, fmt.Errorf("expression gave %T, want bool", out.Value())
	}
	return b, nil
}

// NodeVars is the CEL `node` variable, shaped like the Node object:
// node.metadata.{name,labels,annotations}, node.spec.{unschedulable,taints}.
// A nil node (a dry-run cluster without a kubeconfig) has only its name.
func NodeVars(n *corev1.Node, name string) map[string]any {
	labels, annos := map[string]any{}, map[string]any{}
	taints := []any{}
	unsched := false
	if n != nil {
		name = n.Name
		for k, v := range n.Labels {
			labels[k] = v
		}
		for k, v := range n.Annotations {
			annos[k] = v
		}
		for _, t := range n.Spec.Taints {
			taints = append(taints, map[string]any{"key": t.Key, "value": t.Value, "effect": string(t.Effect)})
		}
		unsched = n.Spec.Unschedulable
	}
	return map[string]any{
		"metadata": map[string]any{"name": name, "labels": labels, "annotations": annos},
		"spec":     map[string]any{"unschedulable": unsched, "taints": taints},
	}
}
