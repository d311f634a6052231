package remediate

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/faultline/faultline/processors/clusters"
)

func TestValidateNamesTheBadKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		key  string
	}{
		{"budget", func(c *Config) { c.Budget = -1 }, "remediate.budget"},
		{"window", func(c *Config) { c.BudgetWindow = 0 }, "remediate.budget_window"},
		{"prefix", func(c *Config) { c.NamePrefix = "Maint" }, "remediate.name_prefix"},
		{"prefix not a DNS label", func(c *Config) { c.NamePrefix = "my_maint" }, `remediate.name_prefix: "my_maint" begins every resource name: a lowercase RFC 1123 label`},
		{"action unknown", func(c *Config) { c.Templates = []Template{{Action: "RESTART_VMM", Object: RebootNodeTemplate}} },
			`remediate.templates[0]: action: "RESTART_VMM" is not a recommended action a template serves (COMPONENT_RESET, REPLACE_VM, RESTART_BM, RESTART_VM, RUN_DCGMEUD, RUN_FIELDDIAG) nor custom:<name>`},
		{"action never templated", func(c *Config) { c.Templates = []Template{{Action: "CONTACT_SUPPORT", Object: RebootNodeTemplate}} }, "remediate.templates[0]: action: \"CONTACT_SUPPORT\""},
		{"action twice", func(c *Config) {
			c.Templates = []Template{{Action: "custom:x", Object: RebootNodeTemplate}, {Action: "COMPONENT_RESET", Object: GPUResetTemplate}, {Action: "COMPONENT_RESET", Object: GPUResetTemplate}}
		}, `remediate.templates[2].action: "COMPONENT_RESET" already set by remediate.templates[1]`},
		// The drain for COMPONENT_RESET evicts only the GPUs' pods: a
		// whole-node object for it would kill the node's other pods.
		{"COMPONENT_RESET to a reboot", func(c *Config) { c.Templates = []Template{{Action: "COMPONENT_RESET", Object: RebootNodeTemplate}} },
			"remediate.templates[0]: object: renders the same object whatever the fault's GPUs"},
		{"COMPONENT_RESET to a terminate", func(c *Config) {
			c.Templates = []Template{{Action: "RESTART_VM", Object: RebootNodeTemplate}, {Action: "COMPONENT_RESET", Group: "terminate", Object: TerminateNodeTemplate}}
		}, "remediate.templates[1]: object: renders the same object whatever the fault's GPUs"},
		{"retention negative", func(c *Config) { c.Retention = -time.Hour }, "remediate.retention"},
		{"retention under the budget window", func(c *Config) { c.Retention = 12 * time.Hour }, "remediate.retention"},
		{"retention within the completion timeout", func(c *Config) {
			c.BudgetWindow, c.CompletionTimeout, c.Retention = time.Hour, 2*time.Hour, 2*time.Hour
		}, "remediate.retention"},
		// A RebootNode queued past the retention would have its trigger
		// skipped, its QueueTimeout never followed nor escalated.
		{"retention within the queue and completion timeouts", func(c *Config) {
			c.BudgetWindow, c.CompletionTimeout, c.Retention = time.Hour, time.Hour, 2*time.Hour
		}, "remediate.retention: must be 0 (keep all) or more than queue_timeout + completion_timeout (12h0m0s + 1h0m0s)"},
		// A group is read from one resource: a REPLACE_VM TerminateNode in
		// the reboot group would start beside a RebootNode in progress,
		// spend no reboot's budget and escalate no failed reboot.
		{"group of another resource", func(c *Config) {
			c.Templates = []Template{{Action: "REPLACE_VM", Group: "reboot", Object: TerminateNodeTemplate}}
		}, `remediate.templates[0].group: "reboot" is also the group of RESTART_BM, whose resources are rebootnodes.janitor.dgxc.nvidia.com in namespace "", not terminatenodes.janitor.dgxc.nvidia.com in ""`},
		{"template syntax", func(c *Config) { c.Templates = []Template{{Action: "RESTART_VM", Object: "{{ .Name "}} }, "remediate.templates[0]"},
		{"template field", func(c *Config) {
			c.Templates = []Template{{Action: "RESTART_VM", Object: "kind: X\napiVersion: a/v1\nmetadata: {name: {{ .Nope }}}"}}
		}, "remediate.templates[0]"},
		{"template kind", func(c *Config) { c.Templates = []Template{{Action: "custom:x", Object: "metadata: {name: a}"}} }, "remediate.templates[0]"},
		{"custom name", func(c *Config) { c.Templates = []Template{{Action: "custom:", Object: RebootNodeTemplate}} }, "remediate.templates[0]"},
		{"complete_when syntax", func(c *Config) {
			c.Templates = []Template{{Action: "RESTART_VM", Object: RebootNodeTemplate, CompleteWhen: []string{"NodeReady"}}}
		}, "remediate.templates[0]: complete_when[0]"},
		{"failed_when status", func(c *Config) {
			c.Templates = []Template{{Action: "RESTART_VM", Object: RebootNodeTemplate, FailedWhen: []string{"NodeReady=False", "NodeReady=false"}}}
		}, "remediate.templates[0]: failed_when[1]"},
		{"failed_when reason", func(c *Config) {
			c.Templates = []Template{{Action: "RESTART_VM", Object: RebootNodeTemplate, FailedWhen: []string{"NodeReady=False/"}}}
		}, "remediate.templates[0]: failed_when[0]"},
		{"both in complete and failed", func(c *Config) {
			c.Templates = []Template{{Action: "RESTART_VM", Object: RebootNodeTemplate, FailedWhen: []string{"NodeReady=True"}}}
		}, "remediate.templates[0]: failed_when[0]"},
		{"shorthand and list", func(c *Config) {
			c.Templates = []Template{{Action: "RESTART_VM", Object: RebootNodeTemplate, CompleteCondition: "Done", CompleteWhen: []string{"Done=True"}}}
		}, "remediate.templates[0]: complete_condition"},
		{"shorthand syntax", func(c *Config) {
			c.Templates = []Template{{Action: "RESTART_VM", Object: RebootNodeTemplate, FailedCondition: "Broken=True"}}
		}, "remediate.templates[0]: failed_condition"},
		{"finished_field", func(c *Config) {
			c.Templates = []Template{{Action: "RESTART_VM", Object: RebootNodeTemplate, FinishedField: "status..x"}}
		}, "remediate.templates[0]: finished_field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mod(&c)
			err := c.Validate("remediate.")
			if err == nil || !strings.HasPrefix(err.Error(), tc.key) {
				t.Fatalf("want error naming %s, got %v", tc.key, err)
			}
		})
	}
}

// TestGroupIsALabelValue: a template's group is the value of the
// faultline.io/group label on its resources and in the selector that lists
// them, so it must be a label value. The group a custom action defaulted
// to ("custom:flash") was not: every create (422) and list (400) of that
// action failed at run time.
func TestGroupIsALabelValue(t *testing.T) {
	c := DefaultConfig()
	c.Templates = []Template{{Action: "custom:Flash_FW", Object: RebootNodeTemplate}}
	if err := c.Validate("remediate."); err != nil {
		t.Fatal(err)
	}
	if g := c.template("custom:Flash_FW").Group; len(validation.IsValidLabelValue(g)) > 0 {
		t.Errorf("default group of custom:Flash_FW is %q, not a label value: %v", g, validation.IsValidLabelValue(g))
	}
	for _, tc := range []struct{ action, group, want string }{
		{"RESTART_VM", "reboot node", `remediate.templates[0]: group: "reboot node" is not a label value`},
		{"custom:flash", "custom:flash", `remediate.templates[0]: group: "custom:flash" is not a label value`},
		{"custom:flash fw", "", `remediate.templates[0]: group: "custom-flash fw" is not a label value`},
		{"RESTART_VM", strings.Repeat("g", 64), `remediate.templates[0]: group: "` + strings.Repeat("g", 64) + `" is not a label value`},
	} {
		c := DefaultConfig()
		c.Templates = []Template{{Action: tc.action, Group: tc.group, Object: RebootNodeTemplate}}
		if err := c.Validate("remediate."); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s group %q: err %v, want %q", tc.action, tc.group, err, tc.want)
		}
	}
}

func TestDefaultTemplatesRender(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate("remediate."); err != nil {
		t.Fatal(err)
	}
	for action, want := range map[string]string{"REPLACE_VM": "RebootNode", "RESTART_VM": "RebootNode", "RESTART_BM": "RebootNode", "COMPONENT_RESET": "GPUReset"} {
		tm := c.template(action)
		if tm == nil || tm.kind != want || tm.namespaced {
			t.Fatalf("%s: %+v", action, tm)
		}
		obj, err := tm.render(sampleData)
		if err != nil {
			t.Fatal(err)
		}
		if obj.GetName() != sampleData.Name || obj.Object["spec"].(map[string]any)["nodeName"] != "node-1" {
			t.Fatalf("%s rendered %v", action, obj.Object)
		}
	}
	if tm := c.template("COMPONENT_RESET"); tm.gvr.Group != JanitorGroup || tm.gvr.Resource != "gpuresets" {
		t.Fatalf("COMPONENT_RESET: %v", tm.gvr)
	}
	noGPU := sampleData
	noGPU.GPUs = nil
	if obj, _ := c.template("COMPONENT_RESET").render(noGPU); obj.Object["spec"].(map[string]any)["selector"] != nil {
		t.Fatalf("GPUReset without GPUs has a selector: %v", obj.Object["spec"])
	}
	if c.template("REPLACE_VM").Group != c.template("RESTART_BM").Group {
		t.Fatal("reboots must share one equivalence group")
	}
}

// startingAt is s with startTime at.
func startingAt(s map[string]any, at time.Time) map[string]any {
	s["startTime"] = at.UTC().Format(time.RFC3339)
	return s
}

// st is a resource status for TestCompletion: conditions as
// "Type=Status/Reason", and whether completionTime is set.
func st(finished bool, conds ...string) map[string]any {
	var cs []any
	for _, c := range conds {
		typ, rest, _ := strings.Cut(c, "=")
		status, reason, _ := strings.Cut(rest, "/")
		cs = append(cs, map[string]any{"type": typ, "status": status, "reason": reason, "message": "m"})
	}
	s := map[string]any{"conditions": cs, "startTime": "2026-01-01T00:00:00Z"}
	if finished {
		s["completionTime"] = "2026-01-01T00:10:00Z"
	}
	return s
}

// TestCompletion reads the statuses the janitor's controllers write
// (NVIDIA/NVSentinel janitor/pkg/controller/{rebootnode,terminatenode,
// gpureset}_controller.go) with the default completion of each kind, and
// the generic and shorthand completion of other kinds.
func TestCompletion(t *testing.T) {
	c := DefaultConfig()
	c.CompletionTimeout = time.Hour
	c.Templates = []Template{
		{Action: "custom:terminate", Object: TerminateNodeTemplate},
		{Action: "custom:generic", Object: "apiVersion: example.com/v1\nkind: Fix\nmetadata: {name: {{ .Name }}}\nspec: {nodeName: {{ .NodeName }}}\n"},
		{Action: "custom:legacy", Object: "apiVersion: example.com/v1\nkind: Fix\nmetadata: {name: {{ .Name }}}\nspec: {nodeName: {{ .NodeName }}}\n", CompleteCondition: "Done"},
		{Action: "custom:reboot-reasons", Object: RebootNodeTemplate, FailedWhen: []string{"NodeReady=False/Timeout"}, FinishedField: "none"},
	}
	now := time.Date(2026, 1, 1, 0, 30, 0, 0, time.UTC)
	h, err := New(c, clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	names := map[status]string{inProgress: "in progress", completed: "completed", failed: "failed", cancelled: "cancelled"}
	for _, tc := range []struct {
		action string
		status map[string]any
		age    time.Duration
		want   status
	}{
		// RebootNode.
		{"RESTART_VM", nil, time.Minute, inProgress},
		{"RESTART_VM", st(false, "SignalSent=Unknown/Initializing", "NodeReady=Unknown/Initializing"), time.Minute, inProgress},
		{"RESTART_VM", st(false, "SignalSent=Unknown/Initializing", "NodeReady=Unknown/Initializing", "ManualMode=True/OutsideActorRequired"), time.Minute, inProgress},
		{"RESTART_VM", st(false, "SignalSent=True/Succeeded", "NodeReady=Unknown/Initializing"), time.Minute, inProgress},
		{"RESTART_VM", st(true, "SignalSent=True/Succeeded", "NodeReady=True/Succeeded"), time.Minute, completed},
		{"RESTART_VM", st(true, "SignalSent=True/Succeeded", "NodeReady=False/Timeout"), time.Minute, failed},
		{"RESTART_VM", st(true, "SignalSent=True/Succeeded", "NodeReady=False/MaxRetriesExceeded"), time.Minute, failed},
		{"RESTART_VM", st(true, "SignalSent=True/Succeeded", "NodeReady=False/Failed"), time.Minute, failed},
		{"RESTART_VM", st(true, "SignalSent=False/Failed", "NodeReady=Unknown/Initializing"), time.Minute, failed},
		// faultline's janitor refused it, the node no longer drained.
		{"RESTART_VM", st(true, "SignalSent=False/NotDrained", "NodeReady=False/NotDrained"), time.Minute, cancelled},
		// Its graceful reboot sent and ignored, the node lifted before the forced one.
		{"RESTART_VM", st(true, "SignalSent=True/Succeeded", "NodeReady=False/NotDrained"), time.Minute, cancelled},
		{"RESTART_VM", st(true, "SignalSent=True/Succeeded", "NodeReady=Unknown/Initializing"), time.Minute, failed}, // finished, not ready
		{"RESTART_VM", startingAt(st(false, "SignalSent=True/Succeeded", "NodeReady=Unknown/Initializing"), now.Add(-2*time.Hour)), 2 * time.Hour, failed},
		// completion_timeout counts from status.startTime (the janitor's
		// signal), not the creation: queued for 5h, started 10 minutes ago.
		{"RESTART_VM", startingAt(st(false, "SignalSent=True/Succeeded", "NodeReady=Unknown/Initializing"), now.Add(-10*time.Minute)), 5 * time.Hour, inProgress},
		// Not started (no status: queued behind the janitor's limits):
		// queue_timeout (12h) from the creation, not completion_timeout.
		{"RESTART_VM", nil, 5 * time.Hour, inProgress},
		{"RESTART_VM", nil, 13 * time.Hour, failed},
		{"COMPONENT_RESET", nil, 5 * time.Hour, inProgress},
		// Conditions but no startTime (another janitor): from the creation.
		{"RESTART_VM", map[string]any{"conditions": st(false, "SignalSent=Unknown/Initializing")["conditions"]}, 2 * time.Hour, failed},
		// The janitor ended it unstarted: queued too long (a failure), or
		// its node escalated since (cancelled: escalated already; read as
		// a failure it escalated the node again, refusing its next
		// queued resource in turn).
		{"RESTART_VM", st(true, "SignalSent=False/QueueTimeout", "NodeReady=False/QueueTimeout"), 7 * time.Hour, failed},
		{"RESTART_VM", st(true, "SignalSent=False/Escalated", "NodeReady=False/Escalated"), 7 * time.Hour, cancelled},
		// TerminateNode.
		{"custom:terminate", st(false, "SignalSent=True/Succeeded", "NodeTerminated=Unknown/Initializing"), time.Minute, inProgress},
		{"custom:terminate", st(true, "SignalSent=True/Succeeded", "NodeTerminated=True/Succeeded"), time.Minute, completed},
		{"custom:terminate", st(true, "SignalSent=True/Succeeded", "NodeTerminated=False/Timeout"), time.Minute, failed},
		{"custom:terminate", st(true, "SignalSent=False/Failed", "NodeTerminated=Unknown/Initializing"), time.Minute, failed},
		{"custom:terminate", st(true, "SignalSent=False/NotDrained", "NodeTerminated=False/NotDrained"), time.Minute, cancelled},
		{"custom:terminate", st(true, "SignalSent=False/Escalated", "NodeTerminated=False/Escalated"), time.Minute, cancelled},
		// GPUReset.
		{"COMPONENT_RESET", st(false, "Ready=False/Pending"), time.Minute, inProgress},
		{"COMPONENT_RESET", st(false, "Ready=True/ReadyForReset", "ResetJobCompleted=True/ResetJobSucceeded", "ServicesRestored=False/RestoringServices"), time.Minute, inProgress},
		{"COMPONENT_RESET", st(false, "Ready=True/ReadyForReset", "ResetJobCompleted=True/ResetJobFailed"), time.Minute, inProgress},
		{"COMPONENT_RESET", st(true, "ServicesRestored=True/ServiceRestoreSucceeded", "Complete=True/GPUResetSucceeded"), time.Minute, completed},
		{"COMPONENT_RESET", st(true, "ResetJobCompleted=True/ResetJobFailed", "Complete=True/ResetJobFailed"), time.Minute, failed},
		{"COMPONENT_RESET", st(true, "Ready=True/ReadyForReset", "Complete=True/NodeNotFound"), time.Minute, failed},
		{"COMPONENT_RESET", st(true, "Ready=False/Pending", "Complete=True/GPUAlreadyUnderMaintenance"), time.Minute, failed},
		{"COMPONENT_RESET", st(true, "Complete=True/NotDrained"), time.Minute, cancelled},
		{"COMPONENT_RESET", st(true, "Complete=True/Escalated"), time.Minute, cancelled},
		{"COMPONENT_RESET", st(true, "Complete=True/QueueTimeout"), time.Minute, failed},
		// Other kinds: Completed / Failed, no finished field.
		{"custom:generic", st(true), time.Minute, inProgress},
		{"custom:generic", st(false, "Completed=True/X"), time.Minute, completed},
		{"custom:generic", st(false, "Failed=True/X"), time.Minute, failed},
		{"custom:generic", nil, 2 * time.Hour, failed}, // no queue: completion_timeout from the creation
		{"custom:legacy", st(false, "Completed=True/X"), time.Minute, inProgress},
		{"custom:legacy", st(false, "Done=True/X"), time.Minute, completed},
		{"custom:legacy", st(false, "Failed=True/X"), time.Minute, failed},
		// Overrides: only Timeout fails, no finished field.
		{"custom:reboot-reasons", st(true, "SignalSent=False/Failed", "NodeReady=Unknown/Initializing"), time.Minute, inProgress},
		{"custom:reboot-reasons", st(true, "NodeReady=False/Timeout"), time.Minute, failed},
		{"custom:reboot-reasons", st(true, "NodeReady=True/Succeeded"), time.Minute, completed},
	} {
		tm := h.cfg.template(tc.action)
		if tm == nil {
			t.Fatalf("no template %s", tc.action)
		}
		o, _ := tm.render(sampleData)
		o.SetAnnotations(map[string]string{AnnotationCreated: now.Add(-tc.age).Format(time.RFC3339Nano)})
		if tc.status != nil {
			_ = unstructured.SetNestedField(o.Object, tc.status, "status")
		}
		got, why := h.status(tm, o)
		if got != tc.want {
			t.Errorf("%s %s %v: %s (%s), want %s", tc.action, tm.kind, tc.status, names[got], why, names[tc.want])
		}
		if got == failed && why == "" {
			t.Errorf("%s %v: failed without a why", tc.action, tc.status)
		}
	}
}

// TestCompletionFromTheJanitorsRecord: a resource whose signal the
// janitor recorded (faultline.io/janitor-state, written before the
// signal) but whose status it could not write (startTime comes with
// SignalSent) has started: completion_timeout counts from the record's
// `at`. Before, it counted as queued, failing only after queue_timeout
// (12h) with the node cordoned and drained meanwhile.
func TestCompletionFromTheJanitorsRecord(t *testing.T) {
	now := time.Date(2026, 1, 1, 5, 0, 0, 0, time.UTC)
	h, err := New(DefaultConfig(), clusters.NewRegistry(clusters.DefaultConfig(), nil), Options{Log: testLog, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	tm := h.cfg.template("RESTART_VM")
	for _, tc := range []struct {
		name  string
		state string
		want  status
	}{
		{"recorded 2h ago", `{"step":"signal","at":"` + now.Add(-2*time.Hour).Format(time.RFC3339Nano) + `","provider":"aws","by":"j"}`, failed},
		{"recorded 10m ago", `{"step":"signal","at":"` + now.Add(-10*time.Minute).Format(time.RFC3339Nano) + `","provider":"aws","by":"j"}`, inProgress},
		{"no record", "", inProgress},
		{"unreadable record", "{", inProgress},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, _ := tm.render(sampleData)
			ann := map[string]string{AnnotationCreated: now.Add(-3 * time.Hour).Format(time.RFC3339Nano)}
			if tc.state != "" {
				ann[annotationJanitorState] = tc.state
			}
			o.SetAnnotations(ann)
			if got, why := h.status(tm, o); got != tc.want {
				t.Fatalf("created 3h ago, no status, %s: %d (%s), want %d", tc.name, got, why, tc.want)
			}
		})
	}
}

// TestByGPU: a template whose object depends on the event's GPUs (the
// default GPUReset's selector) makes resources that serve only their own
// GPUs; a reboot, or a reset naming no GPU, serves any.
func TestByGPU(t *testing.T) {
	c := DefaultConfig()
	c.Templates = []Template{{Action: "custom:flash", Object: "apiVersion: janitor.dgxc.nvidia.com/v1alpha1\nkind: GPUReset\nmetadata: {name: {{ .Name }}}\nspec: {nodeName: {{ .NodeName }}}\n"}}
	if err := c.Validate("remediate."); err != nil {
		t.Fatal(err)
	}
	for action, want := range map[string]bool{"COMPONENT_RESET": true, "RESTART_BM": false, "REPLACE_VM": false, "custom:flash": false} {
		if got := c.template(action).byGPU; got != want {
			t.Errorf("%s: byGPU %v, want %v", action, got, want)
		}
	}
}

// TestServesItsEntities: a template whose object lists the event's
// entities (a custom NIC reset) makes resources that serve only their own
// entities; before, its resources were annotated with the fault's GPUs
// alone, none for a NIC fault, read as "every GPU": a fault of mlx5_1
// joined a reset of mlx5_0 in progress, was said remediated and never was.
func TestServesItsEntities(t *testing.T) {
	c := DefaultConfig()
	c.Templates = []Template{{Action: "custom:nic-reset", Object: "apiVersion: example.com/v1\nkind: NICReset\nmetadata: {name: {{ .Name }}}\n" +
		"spec:\n  nodeName: {{ .NodeName }}\n  nics: [{{ range $i, $e := .Entities }}{{ if $i }}, {{ end }}{{ quote $e.Value }}{{ end }}]\n"}}
	if err := c.Validate("remediate."); err != nil {
		t.Fatal(err)
	}
	for action, want := range map[string]bool{"custom:nic-reset": true, "COMPONENT_RESET": false, "RESTART_BM": false} {
		if got := c.template(action).byEntity; got != want {
			t.Errorf("%s: byEntity %v, want %v", action, got, want)
		}
	}
	nic, reset := c.template("custom:nic-reset"), c.template("COMPONENT_RESET")
	made := func(ann map[string]string) *unstructured.Unstructured {
		o := &unstructured.Unstructured{}
		o.SetAnnotations(ann)
		return o
	}
	nics := func(vs ...string) Data {
		var d Data
		for _, v := range vs {
			d.Entities = append(d.Entities, Entity{Type: "NIC", Value: v})
		}
		return d
	}
	for _, tc := range []struct {
		name string
		tm   *Template
		o    *unstructured.Unstructured
		d    Data
		want bool
	}{
		{"its own NIC", nic, made(map[string]string{AnnotationGPUs: "", AnnotationEntities: "NIC=mlx5_0"}), nics("mlx5_0"), true},
		{"another NIC", nic, made(map[string]string{AnnotationGPUs: "", AnnotationEntities: "NIC=mlx5_0"}), nics("mlx5_1"), false},
		{"one of its NICs", nic, made(map[string]string{AnnotationEntities: "NIC=mlx5_0,NIC=mlx5_1"}), nics("mlx5_1"), true},
		{"made for every entity", nic, made(map[string]string{AnnotationEntities: ""}), nics("mlx5_1"), true},
		{"a fault of no entity, a resource of one", nic, made(map[string]string{AnnotationEntities: "NIC=mlx5_0"}), Data{}, false},
		{"made before the annotation", nic, made(nil), nics("mlx5_1"), true},
		{"a GPU reset of other GPUs", reset, made(map[string]string{AnnotationGPUs: "GPU-1"}), Data{GPUs: []string{"GPU-2"}}, false},
		{"a GPU reset of every GPU", reset, made(map[string]string{AnnotationGPUs: ""}), Data{GPUs: []string{"GPU-2"}}, true},
	} {
		if got := serves(tc.tm, tc.o, tc.d); got != tc.want {
			t.Errorf("%s: serves %v, want %v", tc.name, got, tc.want)
		}
	}
}
