package quarantine

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/client-go/kubernetes"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// hostile is an event no rule set matches (an unknown agent) that asks
// to force both the quarantine and the drain.
func hostile(node string, role datamodels.SubmitterRole) *datamodels.HealthEvent {
	ev := fatal(node, "NOT_A_FAULT", "GPU-1")
	ev.Agent = "some-tool"
	ev.QuarantineOverrides = &datamodels.BehaviourOverrides{Force: true}
	ev.DrainOverrides = &datamodels.BehaviourOverrides{Force: true}
	if role != datamodels.SubmitterRole_SUBMITTER_ROLE_UNSPECIFIED {
		ev.Submitter = &datamodels.Submitter{Name: "token:prod#3", Role: role}
	}
	return ev
}

// TestOverridesOnlyFromOperators: quarantineOverrides and drainOverrides
// take effect only from an operator credential; from an agent, the
// pipeline or an event without a submitter they are ignored and the
// decision says so; an operator's force never bypasses the circuit
// breaker (nor the opt-out label, see TestKube/OptOutLabelAndForce).
func TestOverridesOnlyFromOperators(t *testing.T) {
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	k := kube.Client()
	names := []string{"ovr-agent", "ovr-none", "ovr-pipeline", "ovr-skip", "ovr-op", "ovr-rule", "ovr-held"}
	for i := range 14 {
		names = append(names, fmt.Sprintf("ovr-spare-%02d", i))
	}
	createNodes(t, k, "ovr", names...)
	cfg := testConfig("ovr")
	cfg.Breaker.MaxPercent = 10 // 2 of 21 nodes
	cfg.Breaker.AutoClose = false
	h := newTestHandler(t, cfg, map[string]kubernetes.Interface{"c1": k})

	for _, tc := range []struct {
		node string
		role datamodels.SubmitterRole
		who  string
	}{
		{"ovr-agent", datamodels.SubmitterRole_SUBMITTER_ROLE_AGENT, "agent credential token:prod#3"},
		{"ovr-none", datamodels.SubmitterRole_SUBMITTER_ROLE_UNSPECIFIED, "agent credential (none recorded)"},
		{"ovr-pipeline", datamodels.SubmitterRole_SUBMITTER_ROLE_PIPELINE, "pipeline credential token:prod#3"},
	} {
		before := getNode(t, k, tc.node)
		acts, _ := handle(t, h, record("c1", hostile(tc.node, tc.role)))
		if kinds(acts) != "skip/skipped" {
			t.Fatalf("%s: actions %s", tc.node, kinds(acts))
		}
		want := "quarantineOverrides.force, drainOverrides.force ignored: sent by " + tc.who
		a := acts[0]
		if a.Details[events.DetailOverridesIgnored] != want || !strings.Contains(a.Reason, want) || a.Details[events.DetailDrainOverrides] != "" {
			t.Fatalf("%s: decision %q details %v, want it to say %q", tc.node, a.Reason, a.Details, want)
		}
		if after := getNode(t, k, tc.node); after.ResourceVersion != before.ResourceVersion {
			t.Fatalf("%s: node changed by an ignored override", tc.node)
		}
	}

	// An operator credential bound to another node: its overrides are
	// ignored too (the gateway refuses such an event; this holds the line).
	bound := hostile("ovr-agent", datamodels.SubmitterRole_SUBMITTER_ROLE_OPERATOR)
	bound.Submitter.Node = "ovr-spare-00"
	acts, _ := handle(t, h, record("c1", bound))
	if kinds(acts) != "skip/skipped" || !strings.HasSuffix(acts[0].Details[events.DetailOverridesIgnored], "operator credential token:prod#3 bound to node ovr-spare-00") {
		t.Fatalf("bound operator: %s %v", kinds(acts), acts[0].GetDetails())
	}

	// An agent's skip does not stop a quarantine its rules decide.
	skip := fatal("ovr-skip", "XID_ERROR_48", "GPU-1")
	skip.QuarantineOverrides = &datamodels.BehaviourOverrides{Skip: true}
	skip.Submitter = &datamodels.Submitter{Name: "token:prod#3", Role: datamodels.SubmitterRole_SUBMITTER_ROLE_AGENT}
	acts, _ = handle(t, h, record("c1", skip))
	if kinds(acts) != "quarantine/applied" || !strings.Contains(acts[0].Details[events.DetailOverridesIgnored], "quarantineOverrides.skip ignored") {
		t.Fatalf("agent skip: %s %v", kinds(acts), acts[0].GetDetails())
	}

	// An operator's force quarantines without a rule, takes a breaker slot
	// (the second and last) and passes its drain override on.
	acts, _ = handle(t, h, record("c1", hostile("ovr-op", datamodels.SubmitterRole_SUBMITTER_ROLE_OPERATOR)))
	if kinds(acts) != "quarantine/applied" || acts[0].Rule != RuleForce || acts[0].Details[events.DetailForce] != "true" ||
		acts[0].Details[events.DetailDrainOverrides] != "force" || acts[0].Details[events.DetailSubmitterRole] != "operator" ||
		acts[0].Details[events.DetailSubmitter] != "token:prod#3" || !getNode(t, k, "ovr-op").Spec.Unschedulable {
		t.Fatalf("operator force: %s %v", kinds(acts), acts[0].GetDetails())
	}
	// The breaker is full: the next rule-matched quarantine trips it...
	acts, _ = handle(t, h, record("c1", fatal("ovr-rule", "XID_ERROR_48", "GPU-1")))
	if kinds(acts) != "breaker_open/applied,quarantine/held_by_breaker" {
		t.Fatalf("rule match past the limit: %s", kinds(acts))
	}
	// ...and holds an operator's force too.
	before := getNode(t, k, "ovr-held")
	acts, _ = handle(t, h, record("c1", hostile("ovr-held", datamodels.SubmitterRole_SUBMITTER_ROLE_OPERATOR)))
	if kinds(acts) != "quarantine/held_by_breaker" || acts[0].Rule != RuleForce || acts[0].Details[events.DetailForce] != "true" {
		t.Fatalf("operator force with the breaker open: %s", kinds(acts))
	}
	if after := getNode(t, k, "ovr-held"); after.ResourceVersion != before.ResourceVersion || after.Spec.Unschedulable {
		t.Fatal("operator force bypassed the open breaker")
	}
}

// maxEvent is the largest event the gateway accepts (gateway/validate.go):
// 64 entities with 256-byte types and 512-byte values, an 8 KiB message,
// 256-byte names; the values full of characters JSON escapes six-fold.
func maxEvent(node string, fault int) *datamodels.HealthEvent {
	pad := func(prefix string, n int) string {
		s := prefix + strings.Repeat("<&>\"", n)
		return s[:n]
	}
	ev := fatal(node, pad(fmt.Sprintf("XID_%03d_", fault), 256), "")
	ev.Agent = pad("faultline-agent-", 256)
	ev.ComponentClass = "GPU"
	ev.Message = pad("m", 8192)
	for i := range 64 {
		ev.EntitiesImpacted = append(ev.EntitiesImpacted, &datamodels.Entity{
			EntityType: pad(fmt.Sprintf("T%02d", i), 256), EntityValue: pad(fmt.Sprintf("GPU-%03d-%02d-", fault, i), 512)})
	}
	ev.ErrorCode = []string{pad("XID-", 128)}
	return ev
}

// TestStateBoundedWithLargestEvents quarantines one node for many faults of
// the largest events the gateway accepts, on a real kube-apiserver: every
// update applies (before the bound, the third such fault made the node's
// annotations exceed Kubernetes' 256 KiB and every later update failed as
// Invalid), the state stays within its budget, and a recovery still lifts
// a fault whose entities are kept as a hash.
func TestStateBoundedWithLargestEvents(t *testing.T) {
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	k := kube.Client()
	createNodes(t, k, "big", "big-1")
	h := newTestHandler(t, testConfig("big"), map[string]kubernetes.Interface{"c1": k})
	const faults = 80 // more than maxFaults
	var first *datamodels.HealthEvent
	for i := range faults {
		ev := maxEvent("big-1", i)
		if first == nil {
			first = ev
		}
		acts, _ := handle(t, h, record("c1", ev))
		if len(acts) != 1 || acts[0].Outcome != events.OutcomeApplied {
			t.Fatalf("fault %d: %s %s", i, kinds(acts), acts[0].GetReason())
		}
		// A repeat of the same fault (a new event id) is an update too.
		again := maxEvent("big-1", i)
		again.GeneratedTimestamp = timestamppb.New(time.Now().Add(time.Millisecond))
		if acts, _ = handle(t, h, record("c1", again)); acts[0].Outcome != events.OutcomeApplied {
			t.Fatalf("repeat of fault %d: %s %s", i, kinds(acts), acts[0].GetReason())
		}
	}
	n := getNode(t, k, "big-1")
	raw := n.Annotations[AnnotationState]
	st, err := ReadState(n)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for k, v := range n.Annotations {
		total += len(k) + len(v)
	}
	t.Logf("state %d bytes for %d faults; all annotations %d bytes", len(raw), len(st.Faults), total)
	if len(raw) > MaxStateBytes || len(st.Faults) != maxFaults || !n.Spec.Unschedulable {
		t.Fatalf("state %d bytes (budget %d), %d faults (want %d), cordoned %v", len(raw), MaxStateBytes, len(st.Faults), maxFaults, n.Spec.Unschedulable)
	}
	for key, f := range st.Faults {
		if len(key) > maxCheckKey+maxEntityKey+1 || len(f.Entity) > maxEntityKey || len(f.Check) > maxCheckKey {
			t.Fatalf("fault %q is not bounded: check %d, entity %d bytes", key, len(f.Check), len(f.Entity))
		}
	}
	// The newest fault recovers by the same check and entities.
	last := maxEvent("big-1", faults-1)
	rec := healthy("big-1", last.CheckName, "")
	rec.EntitiesImpacted = last.EntitiesImpacted
	rec.GeneratedTimestamp = timestamppb.New(time.Now().Add(time.Second))
	acts, _ := handle(t, h, record("c1", rec))
	if kinds(acts) != "unquarantine/in_progress" {
		t.Fatalf("recovery of a large fault: %s", kinds(acts))
	}
	if st, _ := ReadState(getNode(t, k, "big-1")); len(st.Faults) != maxFaults-1 {
		t.Fatalf("%d faults after the recovery, want %d", len(st.Faults), maxFaults-1)
	}
}

func TestFitKeepsTheBudget(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	st := &State{Faults: map[string]*Fault{}}
	for i := range maxFaults {
		ev := maxEvent("n", i)
		f := Fault{Check: ev.CheckName, Entity: fmt.Sprint(ev.EntitiesImpacted), Agent: ev.Agent, Message: ev.Message,
			Rule: "r", Class: "GPU", Since: now, LastSeen: now.Add(time.Duration(i) * time.Second), Cordon: true, Acked: i < 4}
		st.AddFault(FaultKey(f.Check, f.Entity), f, fmt.Sprintf("%064d", i))
		for j := range maxEventIDs {
			st.AddFault(FaultKey(f.Check, f.Entity), f, fmt.Sprintf("%063d%d", i, j))
		}
	}
	b, _ := json.Marshal(st)
	budget := len(b) / 2
	rep := st.Fit(budget)
	b, _ = json.Marshal(st)
	if len(b) > budget || rep.Bytes != len(b) {
		t.Fatalf("%d bytes after Fit, budget %d (report %+v)", len(b), budget, rep)
	}
	// The acknowledged faults went first, then the oldest were compacted.
	for i, k := range rep.Dropped[:4] {
		if !strings.Contains(k, fmt.Sprintf("XID_%03d_", i)) {
			t.Fatalf("dropped %v, want the acknowledged ones first", rep.Dropped)
		}
	}
	if rep.Compacted == 0 || !st.Active() {
		t.Fatalf("report %+v, active %v", rep, st.Active())
	}
	// A budget too small for anything keeps the newest cordoning fault.
	st.Fit(10)
	if len(st.Faults) != 1 || !st.Active() {
		t.Fatalf("%d faults left, active %v", len(st.Faults), st.Active())
	}
}

// TestRuleErrorsCountedAndCostLimited: an expression that runs past the
// CEL cost limit fails instead of running on, and rule errors are counted,
// logged and named on the decision, not dropped.
func TestRuleErrorsCountedAndCostLimited(t *testing.T) {
	rs, err := ParseRules([]byte(`
[[rule-sets]]
name = "quadratic"
priority = 10
  [[rule-sets.match.all]]
  expression = "event.entitiesImpacted.map(a, event.entitiesImpacted.map(b, event.entitiesImpacted.map(c, a.entityValue + b.entityValue + c.entityValue))).size() == 0"
  [rule-sets.cordon]
  shouldCordon = true
[[rule-sets]]
name = "missing-key"
priority = 5
  [[rule-sets.match.all]]
  expression = "event.metadata['pool'] == 'a'"
[[rule-sets]]
name = "fatal"
  [[rule-sets.match.all]]
  expression = "event.isFatal"
`))
	if err != nil {
		t.Fatal(err)
	}
	pol, err := CompileLimited(rs, DefaultRuleCostLimit)
	if err != nil {
		t.Fatal(err)
	}
	ev := maxEvent("n", 1)
	began := time.Now()
	d, errs := pol.Evaluate(ev, nil)
	if took := time.Since(began); took > 5*time.Second { // the cost limit stops it in far under 1 ms; a loaded machine may stall a goroutine
		t.Fatalf("evaluation took %v", took)
	}
	if d == nil || d.Rule != "fatal" || len(errs) != 2 || !strings.Contains(errs[0].Error(), "cost limit") {
		t.Fatalf("decision %+v, errors %v", d, errs)
	}

	cl := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	h, err := NewWithPolicy(testConfig("cel"), pol, cl, Options{Log: testLog, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	acts, _ := handle(t, h, record("nowhere", ev), record("nowhere", maxEvent("n", 2)))
	if kinds(acts) != "quarantine/dry_run,quarantine/dry_run" || !strings.Contains(acts[0].Details[events.DetailRuleErrors], `rule set "quadratic"`) {
		t.Fatalf("actions %s %v", kinds(acts), acts[0].GetDetails())
	}
	var m dto.Metric
	if err := h.m.ruleErrors.WithLabelValues("quadratic").Write(&m); err != nil || m.GetCounter().GetValue() != 2 {
		t.Fatalf("rule errors counted %v (%v), want 2", m.GetCounter().GetValue(), err)
	}
}

// TestAgentOverridesNeverReachTheRules: a rule that keys on the overrides
// sees only an operator's.
func TestAgentOverridesNeverReachTheRules(t *testing.T) {
	rs, err := ParseRules([]byte(`
[[rule-sets]]
name = "forced"
  [[rule-sets.match.all]]
  expression = "event.quarantineOverrides.force"
[[rule-sets]]
name = "by-operator"
  [[rule-sets.match.all]]
  expression = "event.submitter.role == 'operator'"
`))
	if err != nil {
		t.Fatal(err)
	}
	pol, err := Compile(rs)
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewWithPolicy(testConfig("vars"), pol, clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog})
	if err != nil {
		t.Fatal(err)
	}
	acts, _ := handle(t, h, record("nowhere", hostile("n1", datamodels.SubmitterRole_SUBMITTER_ROLE_AGENT)),
		record("nowhere", hostile("n2", datamodels.SubmitterRole_SUBMITTER_ROLE_OPERATOR)))
	got := []string{}
	for _, a := range acts {
		got = append(got, a.Node+":"+a.Kind+"/"+a.Rule)
	}
	if strings.Join(got, ",") != "n1:skip/,n2:quarantine/forced" {
		t.Fatalf("decisions %v", got)
	}
}

// TestKeyPayloadMismatchDeadLettered: a record whose key names another
// cluster or node than its payload is dead-lettered, never acted on.
func TestKeyPayloadMismatchDeadLettered(t *testing.T) {
	h, err := New(testConfig("key"), clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog})
	if err != nil {
		t.Fatal(err)
	}
	good := record("prod", fatal("n1", "XID_ERROR_48", "GPU-1"))
	otherCluster := record("prod", fatal("n1", "XID_ERROR_48", "GPU-1"))
	otherCluster.Key = []byte("staging/n1")
	otherNode := record("prod", fatal("n1", "XID_ERROR_48", "GPU-1"))
	otherNode.Key = []byte("prod/n2")
	res, err := h.Handle(context.Background(), []*kgo.Record{good, otherCluster, otherNode})
	if err != nil {
		t.Fatal(err)
	}
	acts, _ := splitOut(t, res.Out)
	if len(acts) != 1 || acts[0].Cluster != "prod" || acts[0].Node != "n1" {
		t.Fatalf("actions %v", actionsOf(acts))
	}
	if len(res.Dead) != 2 || !strings.Contains(res.Dead[0].Reason.Error(), `names cluster "staging", the event's cluster is "prod"`) ||
		!strings.Contains(res.Dead[1].Reason.Error(), `names node "n2", the event's nodeName is "n1"`) {
		t.Fatalf("dead letters %v", res.Dead)
	}
}

func actionsOf(acts []*faultlinev1.Action) []string {
	var out []string
	for _, a := range acts {
		out = append(out, a.Cluster+"/"+a.Node+":"+a.Kind+"/"+a.Outcome)
	}
	return out
}
