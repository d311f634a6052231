package quarantine

import (
	"math"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

func TestCompileErrorsNameTheRule(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"bad_expression.toml", `rule set "broken-gpu-rule": match.all[0]`},
		{"not_bool.toml", `rule set "string-rule": match.all[0] "'yes'": expression gives string, want bool`},
		{"bad_taint.toml", `rule set "bad-taint": taint: effect "Sometimes"`},
		{"unknown_key.toml", `unknown key rule-sets.match.all.expresion`},
	} {
		t.Run(tc.file, func(t *testing.T) {
			rs, err := LoadRules("testdata/" + tc.file)
			if err == nil {
				_, err = Compile(rs)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestDefaultRules(t *testing.T) {
	pol := mustPolicy(t, "")
	ts := time.Now()
	ev := func(agent string, fatal bool, mut ...func(*datamodels.HealthEvent)) *datamodels.HealthEvent {
		e := &datamodels.HealthEvent{Agent: agent, IsFatal: fatal, CheckName: "C", ComponentClass: "GPU", NodeName: "n1",
			GeneratedTimestamp: nil}
		for _, m := range mut {
			m(e)
		}
		_ = ts
		return e
	}
	derived := func(e *datamodels.HealthEvent) { e.DerivedBy = "RepeatedXIDOnSameGPU" }
	replace := func(e *datamodels.HealthEvent) { e.RecommendedAction = datamodels.RecommendedAction_REPLACE_VM }
	contact := func(e *datamodels.HealthEvent) { e.RecommendedAction = datamodels.RecommendedAction_CONTACT_SUPPORT }
	for _, tc := range []struct {
		name string
		ev   *datamodels.HealthEvent
		rule string // "" = no match
	}{
		{"faultline agent fatal", ev("faultline-agent", true), "faultline-agent-fatal"},
		{"faultline agent non-fatal", ev("faultline-agent", false), ""},
		{"derived fatal verdict", ev("faultline-correlate", true, derived), "faultline-derived-verdicts"},
		{"derived non-fatal contact support", ev("faultline-correlate", false, derived, contact), "faultline-derived-verdicts"},
		{"derived non-fatal no action", ev("faultline-correlate", false, derived), ""},
		{"preflight failure", ev("faultline-preflight", true), "preflight-checks"},
		{"nvsentinel preflight", ev("preflight-dcgm-diag", false, replace), "preflight-checks"},
		{"gpu-health-monitor fatal", ev("gpu-health-monitor", true), "nvsentinel-monitors-fatal"},
		{"syslog-health-monitor fatal", ev("syslog-health-monitor", true), "nvsentinel-monitors-fatal"},
		{"csp-health-monitor replace", ev("csp-health-monitor", false, replace), "nvsentinel-monitors-fatal"},
		{"nic-health-monitor fatal", ev("nic-health-monitor", true), "nvsentinel-monitors-fatal"},
		{"nic-health-monitor non-fatal", ev("nic-health-monitor", false), ""},
		{"unknown agent fatal", ev("someone-else", true), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, errs := pol.Evaluate(tc.ev, nil)
			if len(errs) > 0 {
				t.Fatalf("evaluation errors: %v", errs)
			}
			got := ""
			if d != nil {
				got = d.Rule
				if !d.Cordon || d.Taint == nil || d.Taint.Key != "faultline.io/unhealthy" {
					t.Errorf("decision %+v: want cordon and the faultline.io/unhealthy taint", d)
				}
			}
			if got != tc.rule {
				t.Fatalf("rule %q, want %q", got, tc.rule)
			}
		})
	}
}

func TestPriorityAndNodeExpressions(t *testing.T) {
	pol := mustPolicy(t, "testdata/priority.toml")
	xid := &datamodels.HealthEvent{IsFatal: true, ErrorCode: []string{"XID-48"}, NodeName: "n1"}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"pool": "prod"}}}
	d, _ := pol.Evaluate(xid, node)
	if d == nil || d.Rule != "xid48" || d.Taint.Effect != "NoExecute" || d.Condition {
		t.Fatalf("decision %+v, want xid48 with NoExecute and no condition", d)
	}
	node.Labels["pool"] = "canary"
	if d, _ = pol.Evaluate(xid, node); d == nil || d.Rule != "catch-all-fatal" || d.Taint != nil {
		t.Fatalf("canary node: decision %+v, want catch-all-fatal", d)
	}
	if d, _ = pol.Evaluate(&datamodels.HealthEvent{ErrorCode: []string{"XID-13"}}, node); d != nil {
		t.Fatalf("non-fatal XID-13 matched %q", d.Rule)
	}
}

func TestCamelCase(t *testing.T) {
	for in, want := range map[string]string{
		"XID_ERROR_48":         "XidError48",
		"nic-link-flap":        "NicLinkFlap",
		"InfiniBandStateCheck": "InfiniBandStateCheck",
		"48":                   "Check48",
		"":                     "Check",
		"gpu.fell off bus":     "GpuFellOffBus",
	} {
		if got := CamelCase(in); got != want {
			t.Errorf("CamelCase(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{"GPU": "GPUHealthy", "NIC": "NICHealthy", "": "NodeHealthy", "NVSwitch": "NVSwitchHealthy", "infiniband": "InfinibandHealthy"} {
		if got := ConditionType(in); got != want {
			t.Errorf("ConditionType(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRenderOwnsOnlyItsOwn(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	taint := &Taint{Key: "faultline.io/unhealthy", Value: "fatal", Effect: "NoSchedule"}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{"other": "x"}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "team/maint", Effect: "NoSchedule"}}}}
	st, _ := ReadState(n)
	st.AddFault(FaultKey("XID", "GPU=1"), Fault{Check: "XID", Entity: "GPU=1", Class: "GPU", Rule: "r", Cordon: true, Taint: taint, Condition: true, LastSeen: now}, "e1")
	RenderConditions(n, st, now)
	if !RenderObject(n, st, "me", now) {
		t.Fatal("first render changed nothing")
	}
	if !n.Spec.Unschedulable || len(n.Spec.Taints) != 2 || n.Labels[LabelQuarantined] != "true" || !st.Cordoned {
		t.Fatalf("not quarantined: %+v", n.Spec)
	}
	if c := n.Status.Conditions; len(c) != 1 || c[0].Type != "GPUHealthy" || c[0].Status != corev1.ConditionFalse || c[0].Reason != "Xid" {
		t.Fatalf("conditions %+v", c)
	}
	// Re-render with the state read back: idempotent.
	st2, err := ReadState(n)
	if err != nil {
		t.Fatal(err)
	}
	if RenderObject(n, st2, "me", now) || RenderConditions(n, st2, now) {
		t.Fatal("second render changed the node")
	}
	removed, _ := st2.Recover("XID", nil, now.Add(time.Second))
	if len(removed) != 1 {
		t.Fatalf("recover removed %v", removed)
	}
	RenderConditions(n, st2, now)
	RenderObject(n, st2, "me", now)
	if n.Spec.Unschedulable || len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != "team/maint" {
		t.Fatalf("not restored: %+v", n.Spec)
	}
	if _, ok := n.Labels[LabelQuarantined]; ok || n.Annotations[AnnotationState] != "" || n.Annotations["other"] != "x" {
		t.Fatalf("metadata: %v %v", n.Labels, n.Annotations)
	}
	if c := n.Status.Conditions[0]; c.Status != corev1.ConditionTrue {
		t.Fatalf("condition not recovered: %+v", c)
	}
}

func TestStaleRecoveryKeepsFault(t *testing.T) {
	now := time.Now()
	st := &State{Faults: map[string]*Fault{}}
	st.AddFault("C|", Fault{Check: "C", LastSeen: now}, "e1")
	removed, stale := st.Recover("C", nil, now.Add(-time.Minute))
	if len(removed) != 0 || len(stale) != 1 {
		t.Fatalf("removed %v stale %v", removed, stale)
	}
}

func TestConfigValidateNamesKey(t *testing.T) {
	for _, tc := range []struct {
		mut  func(*Config)
		want string
	}{
		{func(c *Config) { c.Workers = 0 }, "quarantine.workers"},
		{func(c *Config) { c.OptOutLabel = "novalue" }, "quarantine.opt_out_label"},
		{func(c *Config) { c.Breaker.MaxPercent = 150 }, "quarantine.breaker.max_percent"},
		// NaN compares false with both bounds.
		{func(c *Config) { c.Breaker.MaxPercent = math.NaN() }, "quarantine.breaker.max_percent: must be in (0, 100], got NaN"},
		{func(c *Config) { c.NodeEvents, c.NodeEventQPS = true, math.NaN() }, "quarantine.node_event_qps: must be a finite number above 0 when node_events is on, got NaN"},
		{func(c *Config) { c.NodeEvents, c.NodeEventQPS = true, math.Inf(1) }, "quarantine.node_event_qps: must be a finite number above 0 when node_events is on, got +Inf"},
		{func(c *Config) { c.NodeEvents, c.NodeEventQPS = true, 0 }, "quarantine.node_event_qps"},
		{func(c *Config) { c.Breaker.GPUNodeSelector = "a in (" }, "quarantine.breaker.gpu_node_selector"},
		{func(c *Config) { c.Breaker.Namespace = "Bad_NS" }, "quarantine.breaker.namespace"},
		{func(c *Config) { c.SlowCluster = -time.Second }, "quarantine.slow_cluster: must not be negative (0: never), got -1s"},
		{func(c *Config) { c.RetryMaxPollRecords = 0 }, "quarantine.retry_max_poll_records: must be at least 1, got 0"},
	} {
		c := DefaultConfig()
		tc.mut(&c)
		if err := c.Validate("quarantine."); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want it to name %s", err, tc.want)
		}
	}
	if err := DefaultConfig().Validate("quarantine."); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
}

func mustPolicy(t testing.TB, path string) *Policy {
	t.Helper()
	rs, err := LoadRules(path)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := Compile(rs)
	if err != nil {
		t.Fatal(err)
	}
	return pol
}
