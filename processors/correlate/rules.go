package correlate

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"text/template"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/google/cel-go/cel"

	"github.com/faultline/faultline/internal/celbound"
	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
	"github.com/faultline/faultline/sql"
)

// DefaultRules is the shipped rules file (default_rules.toml), used when
// Config.Rules is "".
//
//go:embed default_rules.toml
var DefaultRules []byte

// Scopes of a rule: what one verdict is about.
const (
	// ScopeEntity: one verdict per (cluster, node, entity key of the
	// trigger); the derived event carries the trigger's entities.
	ScopeEntity = "entity"
	// ScopeNode: one verdict per (cluster, node); entity NODE=<node>.
	ScopeNode = "node"
	// ScopeCluster: one verdict per (cluster, fault signature), the
	// signature being "checkName|firstErrorCode" of the trigger; the derived
	// event's node is ClusterNode and its entity FABRIC=<signature>.
	ScopeCluster = "cluster"
)

// Sources of a rule's triggers.
const (
	SourceEvents  = "events"
	SourceActions = "actions"
)

// ClusterNode is the node name (and Kafka key node part) of cluster-scoped
// derived events, which are about no single node.
const ClusterNode = "_cluster"

// EntityFabric is the entity type of cluster-scoped derived events.
const EntityFabric = "FABRIC"

// RulesFile is the TOML rules file.
type RulesFile struct {
	Rules []RuleSpec `toml:"rule"`
}

// RuleSpec is one rule as written in the rules file. Durations are Go
// duration strings ("10m", "24h").
type RuleSpec struct {
	// Name names the rule; it is the derived events' derivedBy.
	Name string `toml:"name"`
	// Source of the triggers: "events" (default) or "actions".
	Source string `toml:"source"`
	// Trigger is a CEL boolean over `event` (the HealthEvent with the
	// HealthEvent JSON field names: checkName, errorCode, ...) or, for source "actions", `action`.
	// Derived and STORE_ONLY events never trigger, whatever it says.
	Trigger string `toml:"trigger"`
	// Scope is "entity" (default), "node" or "cluster".
	Scope string `toml:"scope"`
	// Window is how far back the query looks from the evaluation time.
	Window string `toml:"window"`
	// Query is a file of sql/rules ("name.sql"), a path relative to the
	// rules file, or inline SQL.
	Query string `toml:"query"`
	// Candidates (optional) is the sweep's query for groups whose
	// condition can start to hold with nothing arriving.
	Candidates string `toml:"candidates"`
	// Onset is where a verdict can start: "event" (default: an arriving
	// event, or the sweep's candidates) or "sweep" (only the sweep's
	// candidates; an arriving event is evaluated only while the verdict
	// stands, for its recovery). "sweep" suits a condition that an
	// arriving event can only end, such as a port staying DOWN; it needs
	// candidates.
	Onset string `toml:"onset"`
	// Threshold: the rule holds when the query's value >= Threshold.
	Threshold float64 `toml:"threshold"`
	// Stabilization: a standing verdict recovers only once the condition no
	// longer holds and this long has passed since the last counted event
	// and since the verdict. Default 0.
	Stabilization string `toml:"stabilization"`
	// Recover emits a healthy derived event when the verdict clears.
	// Default true.
	Recover *bool `toml:"recover"`
	// Recovery is where a standing verdict can recover: "event" (default:
	// an arriving trigger of its group, or the sweep) or "sweep" (only the
	// sweep, every sweep_interval; a trigger of a standing verdict is not
	// evaluated). "sweep" suits a rule whose trigger always counts in its
	// own window: recovery needs the stabilization to have passed since
	// the last counted event, so no trigger could end the verdict, and
	// evaluating them (thousands a batch in a fabric-wide incident) finds
	// nothing. Elsewhere it delays a recovery by up to sweep_interval.
	Recovery string `toml:"recovery"`
	// Causes is where the verdicts' cause ids are read: "value" (default:
	// the one query that reads every trigger's value returns them too) or
	// "verdicts" (that query is wrapped so ClickHouse neither computes the
	// ids nor carries them through the JOIN, and the query runs once more,
	// as written, for the triggers that start a verdict). "verdicts" suits
	// a query whose cause ids cost much more than its values, such as
	// FabricIncident's per-trigger filter over a whole group's events;
	// elsewhere the second query reads the window again for nothing.
	Causes string `toml:"causes"`
	// Shadow records verdicts (as STORE_ONLY derived events, metadata
	// mode=shadow) without letting anything act on them.
	Shadow bool `toml:"shadow"`
	// SuppressedBy names rules (cluster-scoped) whose standing verdict in
	// the same cluster turns this rule's verdicts into STORE_ONLY records
	// (metadata mode=suppressed); one that still holds once none stands
	// goes live in the sweep, while fewer of the cluster's nodes than the
	// suppressor's threshold still hold this rule's suppressed verdicts.
	// Only a verdict whose signature's check is one of this rule's checks
	// (its params named checks or ending in _checks) suppresses it, when it
	// names any: an NVSwitch SXid incident does not suppress the NIC rules.
	// Where a codes param goes with the checks (counter_checks and
	// counter_codes, checks and codes), the signature's code must be one
	// of them too: an rnr_nak_retry_err incident does not suppress the
	// rules that read only link_downed of the degradation checks.
	SuppressedBy []string `toml:"suppressed_by"`
	// Params are bound to the queries as @name.
	Params map[string]any `toml:"params"`
	// Durations are bound to the queries as @name_ms (milliseconds).
	Durations map[string]string `toml:"durations"`
	// Emit is the derived event template.
	Emit EmitSpec `toml:"emit"`
}

// EmitSpec is the template of a rule's derived events.
type EmitSpec struct {
	// CheckName of the derived event. Default the rule name.
	CheckName string `toml:"check_name"`
	// ComponentClass. Default the trigger's.
	ComponentClass string `toml:"component_class"`
	// RecommendedAction by name (REPLACE_VM, CONTACT_SUPPORT, ...).
	RecommendedAction string `toml:"recommended_action"`
	// IsFatal of the verdict.
	IsFatal bool `toml:"is_fatal"`
	// Message is a text/template over Vars.
	Message string `toml:"message"`
	// RecoveryMessage is the healthy event's message template.
	RecoveryMessage string `toml:"recovery_message"`
	// ProcessingStrategy of live verdicts: EXECUTE_REMEDIATION (default)
	// or STORE_ONLY.
	ProcessingStrategy string `toml:"processing_strategy"`
}

// Vars are what message templates see.
type Vars struct {
	Rule, Cluster, Node, Entity, Check string
	Value, Threshold                   float64
	Window                             time.Duration
}

// Rule is a compiled rule.
type Rule struct {
	Spec          RuleSpec
	Name          string
	Source        string
	Scope         string
	Window        time.Duration
	Stabilization time.Duration
	Threshold     float64
	Recover       bool
	Shadow        bool
	Query         string
	Candidates    string
	SweepOnset    bool
	SweepRecovery bool
	CausesApart   bool // Causes "verdicts"
	CheckName     string
	Action        datamodels.RecommendedAction
	Strategy      datamodels.ProcessingStrategy
	query         string // Query without comments, as sent
	args          map[string]any
	trigger       *celbound.Program
	message       *template.Template
	recovery      *template.Template

	// readsBatch, readsBatchActions: the query reads the external table
	// batch / batch_actions, so it is sent along.
	readsBatch, readsBatchActions bool
	// readsMachine: the query reads triggers.machine, so a sweep names the
	// machine each node reports now (Handler.machines).
	readsMachine bool
	// reads: what the rule counts, per check name of its params named
	// checks or ending in _checks: the error codes of the matching codes
	// param (checks -> codes, counter_checks -> counter_codes), nil for
	// every code. A suppressor's verdict suppresses the rule only when its
	// signature (check|code) is among them (suppressedBy). Empty: any
	// verdict does.
	reads map[string][]string
}

// ConfigError is a rules-file error naming the rule and the field.
type ConfigError struct {
	Rule, Field string
	Err         error
}

func (e *ConfigError) Error() string {
	if e.Rule == "" {
		return fmt.Sprintf("correlate rules: %s: %v", e.Field, e.Err)
	}
	return fmt.Sprintf("correlate rule %s: %s: %v", e.Rule, e.Field, e.Err)
}

func (e *ConfigError) Unwrap() error { return e.Err }

// LoadRules reads and compiles a rules file; "" compiles DefaultRules.
func LoadRules(path string) ([]*Rule, error) {
	if path == "" {
		return ParseRules(DefaultRules, nil)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, &ConfigError{Field: "rules", Err: err}
	}
	return ParseRules(b, os.DirFS(filepath.Dir(path)))
}

// ParseRules compiles a rules file. Query files are looked up in dir
// (may be nil) first, then in the shipped sql/rules.
func ParseRules(b []byte, dir fs.FS) ([]*Rule, error) {
	var f RulesFile
	md, err := toml.Decode(string(b), &f)
	if err != nil {
		return nil, &ConfigError{Field: "rules", Err: err}
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, &ConfigError{Field: strings.Join(keys, ", "), Err: errors.New("unknown key")}
	}
	if len(f.Rules) == 0 {
		return nil, &ConfigError{Field: "rule", Err: errors.New("no rules")}
	}
	seen := map[string]bool{}
	out := make([]*Rule, 0, len(f.Rules))
	for i, s := range f.Rules {
		if s.Name == "" {
			return nil, &ConfigError{Rule: fmt.Sprintf("#%d", i+1), Field: "name", Err: errors.New("required")}
		}
		if seen[s.Name] {
			return nil, &ConfigError{Rule: s.Name, Field: "name", Err: errors.New("duplicate rule name")}
		}
		seen[s.Name] = true
		r, err := compileRule(s, dir)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	for _, r := range out {
		for _, by := range r.Spec.SuppressedBy {
			i := slices.IndexFunc(out, func(o *Rule) bool { return o.Name == by })
			if i < 0 {
				return nil, &ConfigError{Rule: r.Name, Field: "suppressed_by", Err: fmt.Errorf("no rule %q", by)}
			}
			if out[i].Scope != ScopeCluster {
				return nil, &ConfigError{Rule: r.Name, Field: "suppressed_by", Err: fmt.Errorf("rule %q is not cluster-scoped", by)}
			}
		}
	}
	return out, nil
}

var (
	batchRE       = regexp.MustCompile(`\bbatch\b`)
	batchActionRE = regexp.MustCompile(`\bbatch_actions\b`)
	machineRE     = regexp.MustCompile(`\bmachine\b`)
	paramRE       = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
	// builtinParams are bound by the engine.
	builtinParams = map[string]bool{"window_ms": true, "since": true, "until": true, "threshold": true}
	refRE         = regexp.MustCompile(`@([A-Za-z_][A-Za-z0-9_]*)`)
	recentRE      = regexp.MustCompile(`\brecent_events\b`)
)

// MaxRecentLookback is the longest window of a rule whose queries read
// recent_events: it keeps clickhouse.RecentRetention (8 days), a day of
// it left as margin. A longer window counted only what the table still
// held, silently. (The rules' durations — a burst's sticky gap, a drop's
// hold — do not reach back past the window: the engine binds @since to
// the window's start.)
const MaxRecentLookback = clickhouse.RecentRetention - 24*time.Hour

// withinRecentRetention refuses a rule whose queries read recent_events
// over a window longer than MaxRecentLookback.
func (r *Rule) withinRecentRetention() error {
	if r.Window <= MaxRecentLookback || !recentRE.MatchString(stripComments(r.Query)) && !recentRE.MatchString(stripComments(r.Candidates)) {
		return nil
	}
	return fmt.Errorf("%s looks back further than recent_events keeps (%s, less a day: at most %s)", r.Window, clickhouse.RecentRetention, MaxRecentLookback)
}

func compileRule(s RuleSpec, dir fs.FS) (*Rule, error) {
	bad := func(field string, err error) error { return &ConfigError{Rule: s.Name, Field: field, Err: err} }
	r := &Rule{Spec: s, Name: s.Name, Source: s.Source, Scope: s.Scope, Threshold: s.Threshold, Recover: true, Shadow: s.Shadow}
	if r.Source == "" {
		r.Source = SourceEvents
	}
	if r.Source != SourceEvents && r.Source != SourceActions {
		return nil, bad("source", fmt.Errorf("%q is not events or actions", s.Source))
	}
	if r.Scope == "" {
		r.Scope = ScopeEntity
	}
	switch {
	case r.Scope != ScopeEntity && r.Scope != ScopeNode && r.Scope != ScopeCluster:
		return nil, bad("scope", fmt.Errorf("%q is not entity, node or cluster", s.Scope))
	case r.Source == SourceActions && r.Scope != ScopeNode:
		return nil, bad("scope", errors.New("rules over actions are node-scoped"))
	}
	if s.Recover != nil {
		r.Recover = *s.Recover
	}
	var err error
	if r.Window, err = time.ParseDuration(s.Window); err != nil || r.Window <= 0 {
		return nil, bad("window", fmt.Errorf("%q is not a positive duration", s.Window))
	}
	if s.Stabilization != "" {
		if r.Stabilization, err = time.ParseDuration(s.Stabilization); err != nil || r.Stabilization < 0 {
			return nil, bad("stabilization", fmt.Errorf("%q is not a duration >= 0", s.Stabilization))
		}
	}
	if math.IsNaN(s.Threshold) || math.IsInf(s.Threshold, 0) || s.Threshold <= 0 {
		return nil, bad("threshold", fmt.Errorf("must be a finite number above 0, got %v", s.Threshold))
	}
	if r.Query, err = loadSQL(s.Query, dir); err != nil {
		return nil, bad("query", err)
	}
	r.query = strings.TrimRight(strings.TrimSpace(stripComments(r.Query)), ";")
	r.readsBatch, r.readsBatchActions = batchRE.MatchString(r.query), batchActionRE.MatchString(r.query)
	r.readsMachine = r.Scope != ScopeCluster && machineRE.MatchString(r.query)
	if s.Candidates != "" {
		if r.Candidates, err = loadSQL(s.Candidates, dir); err != nil {
			return nil, bad("candidates", err)
		}
	}
	switch s.Onset {
	case "", "event":
	case "sweep":
		if s.Candidates == "" {
			return nil, bad("onset", errors.New(`"sweep" needs a candidates query: nothing else could start the verdict`))
		}
		r.SweepOnset = true
	default:
		return nil, bad("onset", fmt.Errorf("%q is not event or sweep", s.Onset))
	}
	switch s.Recovery {
	case "", "event":
	case "sweep":
		if !r.Recover {
			return nil, bad("recovery", errors.New(`"sweep" with recover = false: the verdicts do not recover`))
		}
		r.SweepRecovery = true
	default:
		return nil, bad("recovery", fmt.Errorf("%q is not event or sweep", s.Recovery))
	}
	switch s.Causes {
	case "", "value":
	case "verdicts":
		r.CausesApart = true
	default:
		return nil, bad("causes", fmt.Errorf("%q is not value or verdicts", s.Causes))
	}
	r.args = map[string]any{}
	for k, v := range s.Params {
		if !paramRE.MatchString(k) || builtinParams[k] {
			return nil, bad("params."+k, errors.New("not a usable parameter name"))
		}
		bv, err := paramValue(v)
		if err != nil {
			return nil, bad("params."+k, err)
		}
		r.args[k] = bv
	}
	r.reads = readChecks(r.args)
	for k, v := range s.Durations {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || !paramRE.MatchString(k) {
			return nil, bad("durations."+k, fmt.Errorf("%q is not a duration >= 0", v))
		}
		if _, dup := r.args[k+"_ms"]; dup || builtinParams[k+"_ms"] {
			return nil, bad("durations."+k, errors.New("clashes with another parameter"))
		}
		r.args[k+"_ms"] = uint64(d.Milliseconds())
	}
	for field, q := range map[string]string{"query": r.Query, "candidates": r.Candidates} {
		for _, m := range refRE.FindAllStringSubmatch(stripComments(q), -1) {
			if _, ok := r.args[m[1]]; !ok && !builtinParams[m[1]] {
				return nil, bad(field, fmt.Errorf("uses @%s, which is neither built in (window_ms, since, until, threshold) nor in params/durations", m[1]))
			}
		}
	}
	if err := r.withinRecentRetention(); err != nil {
		return nil, bad("window", err)
	}
	if r.trigger, err = compileTrigger(r.Source, s.Trigger); err != nil {
		return nil, bad("trigger", err)
	}
	e := s.Emit
	r.CheckName = e.CheckName
	if r.CheckName == "" {
		r.CheckName = s.Name
	}
	if e.RecommendedAction == "" {
		e.RecommendedAction = "NONE"
	}
	v, ok := datamodels.RecommendedAction_value[e.RecommendedAction]
	if !ok {
		return nil, bad("emit.recommended_action", fmt.Errorf("unknown action %q", e.RecommendedAction))
	}
	r.Action = datamodels.RecommendedAction(v)
	switch e.ProcessingStrategy {
	case "", "EXECUTE_REMEDIATION":
		r.Strategy = datamodels.ProcessingStrategy_EXECUTE_REMEDIATION
	case "STORE_ONLY":
		r.Strategy = datamodels.ProcessingStrategy_STORE_ONLY
	default:
		return nil, bad("emit.processing_strategy", fmt.Errorf("%q is not EXECUTE_REMEDIATION or STORE_ONLY", e.ProcessingStrategy))
	}
	if e.Message == "" {
		e.Message = "{{.Rule}}: value {{.Value}} reached threshold {{.Threshold}} within {{.Window}}"
	}
	if e.RecoveryMessage == "" {
		e.RecoveryMessage = "{{.Rule}} cleared: value {{.Value}} below threshold {{.Threshold}} within {{.Window}}"
	}
	if r.message, err = parseTemplate(e.Message); err != nil {
		return nil, bad("emit.message", err)
	}
	if r.recovery, err = parseTemplate(e.RecoveryMessage); err != nil {
		return nil, bad("emit.recovery_message", err)
	}
	return r, nil
}

func parseTemplate(s string) (*template.Template, error) {
	t, err := template.New("m").Option("missingkey=error").Parse(s)
	if err != nil {
		return nil, err
	}
	// Execute once with zero values to catch unknown fields at load.
	if err := t.Execute(&bytes.Buffer{}, Vars{}); err != nil {
		return nil, err
	}
	return t, nil
}

func render(t *template.Template, v Vars) string {
	var b bytes.Buffer
	if err := t.Execute(&b, v); err != nil {
		return v.Rule
	}
	return b.String()
}

// loadSQL resolves a query reference: inline SQL, or a .sql file from dir
// or the shipped sql/rules.
func loadSQL(ref string, dir fs.FS) (string, error) {
	ref = strings.TrimSpace(ref)
	if ref == "" {
		return "", errors.New("required")
	}
	if !strings.HasSuffix(ref, ".sql") || strings.ContainsAny(ref, " \n\t") {
		return ref, nil
	}
	if dir != nil {
		if b, err := fs.ReadFile(dir, ref); err == nil {
			return string(b), nil
		}
	}
	b, err := fs.ReadFile(sql.Rules, "rules/"+ref)
	if err != nil {
		return "", fmt.Errorf("no query file %q (next to the rules file or in sql/rules)", ref)
	}
	return string(b), nil
}

// stripComments drops "--" line comments (parameter references in them
// are documentation).
func stripComments(q string) string {
	lines := strings.Split(q, "\n")
	for i, l := range lines {
		if j := strings.Index(l, "--"); j >= 0 {
			lines[i] = l[:j]
		}
	}
	return strings.Join(lines, "\n")
}

// readChecks returns what a rule's params say it counts (Rule.reads):
// each check of a param named checks or ending in _checks, with the codes
// of the param that ends in codes instead (checks: codes; counter_checks:
// counter_codes), or nil — every code — where there is none. A check that
// two params name is read with every code either reads.
func readChecks(args map[string]any) map[string][]string {
	reads := map[string][]string{}
	for k, v := range args {
		cs, ok := v.([]string)
		if !ok || (k != "checks" && !strings.HasSuffix(k, "_checks")) {
			continue
		}
		codes, _ := args[strings.TrimSuffix(k, "checks")+"codes"].([]string)
		for _, c := range cs {
			prev, seen := reads[c]
			switch {
			case seen && prev == nil:
			case codes == nil || !seen:
				reads[c] = codes
			default:
				reads[c] = append(slices.Clone(prev), codes...)
			}
		}
	}
	return reads
}

// paramValue converts a TOML value to what clickhouse-go binds.
func paramValue(v any) (any, error) {
	switch v := v.(type) {
	case string, int64, float64, bool:
		return v, nil
	case []any:
		if len(v) == 0 {
			return []string{}, nil
		}
		switch v[0].(type) {
		case string:
			out := make([]string, len(v))
			for i, x := range v {
				s, ok := x.(string)
				if !ok {
					return nil, errors.New("mixed array")
				}
				out[i] = s
			}
			return out, nil
		case int64:
			out := make([]int64, len(v))
			for i, x := range v {
				n, ok := x.(int64)
				if !ok {
					return nil, errors.New("mixed array")
				}
				out[i] = n
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("unsupported value %v (%T): use a string, number, bool or an array of strings or integers", v, v)
}

// TriggerCostLimit is the CEL cost a trigger expression may spend on one
// record; past it the evaluation stops with an error (counted in
// faultline_correlate_trigger_errors_total, logged) and the record does not
// trigger the rule. A trigger whose worst case on the largest event the
// gateway accepts is proven within the limit runs without the cost
// tracker on the records that fit the gateway's limits
// (internal/celbound); the shipped triggers' proven worst cases are 36 to
// 2,214 (TestTriggerCostLimit checks each has one).
const TriggerCostLimit = 10_000

// compileTrigger compiles a rule's trigger expression.
func compileTrigger(source, src string) (*celbound.Program, error) {
	if strings.TrimSpace(src) == "" {
		return nil, errors.New("required")
	}
	v, sample := "event", events.Vars(&datamodels.HealthEvent{})
	if source == SourceActions {
		v, sample = "action", ActionVars(&faultlinev1.Action{})
	}
	env, err := cel.NewEnv(cel.Variable(v, cel.MapType(cel.StringType, cel.DynType)))
	if err != nil {
		return nil, err
	}
	ast, iss := env.Compile(src)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	if t := ast.OutputType(); !t.IsExactType(cel.BoolType) && !t.IsExactType(cel.DynType) {
		return nil, fmt.Errorf("must be a boolean expression, is %s", t)
	}
	return celbound.Compile(env, ast, map[string]any{v: sample}, TriggerCostLimit, cel.EvalOptions(cel.OptOptimize))
}

// matches evaluates the trigger on a record's variables (fits: they fit
// celbound's sizes); an evaluation error (a missing key, the cost limit)
// is a non-match, returned for the caller to count and log.
func (r *Rule) matches(vars map[string]any, fits bool) (bool, error) {
	out, err := r.trigger.Eval(vars, fits)
	if err != nil {
		return false, err
	}
	b, ok := out.(bool)
	if !ok {
		return false, fmt.Errorf("trigger gave %T, want bool", out)
	}
	return b, nil
}

// Names lists rule names, sorted.
func Names(rules []*Rule) []string {
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = r.Name
	}
	sort.Strings(out)
	return out
}
