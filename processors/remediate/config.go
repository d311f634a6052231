package remediate

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/requeue"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TopicRequeue carries remediations waiting for their resource's condition
// back to the remediate role after Config.PollInterval.
const TopicRequeue = "faultline.remediate.requeue"

// TopicSlow is the remediate role's slow lane (requeue.Lane): the
// remediations of a cluster whose API writes take longer than
// Config.SlowCluster.
const TopicSlow = "faultline.remediate.slow"

// JanitorGroup is the API group of NVIDIA NVSentinel's janitor operator
// (janitor/api/v1alpha1/groupversion_info.go: janitor.dgxc.nvidia.com,
// version v1alpha1), whose RebootNode, GPUReset and TerminateNode the
// default templates create and whose completion faultline knows
// (KindCompletion).
const JanitorGroup = "janitor.dgxc.nvidia.com"

// RebootNodeTemplate is the default object of REPLACE_VM, RESTART_VM and
// RESTART_BM: the janitor's RebootNode (cluster-scoped; spec.force is
// required by the janitor's CRD, defaulting to false).
const RebootNodeTemplate = `apiVersion: janitor.dgxc.nvidia.com/v1alpha1
kind: RebootNode
metadata:
  name: {{ .Name }}
spec:
  nodeName: {{ .NodeName }}
  force: false
`

// GPUResetTemplate is the default object of COMPONENT_RESET: the janitor's
// GPUReset (cluster-scoped). spec.selector.uuids are the event's GPU
// entities; without any, or when one is not a UUID (Data.GPUs), the
// selector is left out and the janitor resets every GPU of the node
// (janitor/api/v1alpha1/gpureset_types.go).
const GPUResetTemplate = `apiVersion: janitor.dgxc.nvidia.com/v1alpha1
kind: GPUReset
metadata:
  name: {{ .Name }}
spec:
  nodeName: {{ .NodeName }}
{{- if .GPUs }}
  selector:
    uuids: [{{ range $i, $g := .GPUs }}{{ if $i }}, {{ end }}{{ quote $g }}{{ end }}]
{{- end }}
`

// TerminateNodeTemplate is the janitor's TerminateNode (cluster-scoped).
// No action maps to it by default; a template may use it (its completion
// is known, see KindCompletion).
const TerminateNodeTemplate = `apiVersion: janitor.dgxc.nvidia.com/v1alpha1
kind: TerminateNode
metadata:
  name: {{ .Name }}
spec:
  nodeName: {{ .NodeName }}
  force: false
`

// Completion is how a resource's status says that its work is over.
// A condition matcher is "Type=Status" or "Type=Status/Reason", Status
// one of True, False, Unknown; it matches a status.conditions entry of
// that type and status (and reason, when given).
type Completion struct {
	// CompleteWhen: the work succeeded when a condition matches one of
	// these. Looked at first.
	CompleteWhen []string
	// FailedWhen: the work failed when a condition matches one of these.
	FailedWhen []string
	// CancelledWhen: the operator did not attempt the work because its
	// premise is gone (the janitor's NotDrained: the node is no longer
	// quarantined and drained, the fault having recovered meanwhile) when a
	// condition matches one of these. Looked at before FailedWhen. A
	// cancelled remediation is neither a failure (no escalation, not the
	// node's last result) nor spent budget.
	CancelledWhen []string
	// FinishedField is a field of .status (dotted path) the operator sets
	// once it stops working on the resource, whatever the outcome: set,
	// with no CompleteWhen match, means failed. Empty: none.
	FinishedField string
}

// KindCompletion is the completion of the janitor's kinds, read from
// NVIDIA/NVSentinel (janitor/api/v1alpha1/*_types.go and
// janitor/pkg/controller/*_controller.go). Every terminal outcome sets
// status.completionTime in the same status update as its condition.
//
//   - RebootNode: conditions SignalSent and NodeReady, both Unknown
//     ("Initializing") at first. Success: NodeReady=True (reason
//     Succeeded). Failure: NodeReady=False (reasons Failed: the CSP could
//     not be asked; Timeout; MaxRetriesExceeded) or SignalSent=False
//     (reason Failed: the reboot signal could not be sent). In progress:
//     anything else, e.g. SignalSent=True with NodeReady=Unknown, or
//     ManualMode=True while an outside actor has to send the signal.
//   - TerminateNode: conditions SignalSent and NodeTerminated, the same
//     way: NodeTerminated=True (Succeeded) once the node is gone or was
//     deleted; NodeTerminated=False (Timeout, MaxRetriesExceeded) or
//     SignalSent=False (Failed) is a failure.
//   - GPUReset: conditions Ready, ServicesTornDown, ResetJobCreated,
//     ResetJobCompleted, ServicesRestored, Terminating are steps, never
//     the result. The result is Complete=True, for success and failure
//     alike: reason GPUResetSucceeded is success (status.phase
//     Succeeded), any other reason (ResetJobFailed, NodeNotFound,
//     ServiceTeardownTimeoutExceeded, RestoreTimeoutExceeded,
//     ResetJobNotFound, InternalError, ...) is a failure (status.phase
//     Failed).
//
// faultline's janitor (processors/janitor) refuses a resource whose node is
// no longer quarantined and drained with reason NotDrained, no signal sent:
// SignalSent=False/NotDrained (RebootNode, TerminateNode) or
// Complete=True/NotDrained (GPUReset); and a reboot whose graceful signal
// went out but whose forced reboot it did not send, the node lifted
// meanwhile, with NodeReady=False/NotDrained (SignalSent stays True). That
// is a cancellation, not a failure (CancelledWhen). So is a resource it
// refuses, not started, because this role escalated its node after the
// resource was created (reason Escalated: SignalSent=False/Escalated,
// Complete=True/Escalated): the node is already a human's; read as a
// failure it was escalated again, which moved the escalation's time past
// the node's next queued resource, refused in turn, and the group never
// remediated again.
//
// Kinds not in the map get GenericCompletion.
var KindCompletion = map[schema.GroupKind]Completion{
	{Group: JanitorGroup, Kind: "RebootNode"}: {
		CompleteWhen:  []string{"NodeReady=True"},
		FailedWhen:    []string{"NodeReady=False", "SignalSent=False"},
		CancelledWhen: []string{"SignalSent=False/NotDrained", "NodeReady=False/NotDrained", "SignalSent=False/Escalated"},
		FinishedField: "completionTime",
	},
	{Group: JanitorGroup, Kind: "TerminateNode"}: {
		CompleteWhen:  []string{"NodeTerminated=True"},
		FailedWhen:    []string{"NodeTerminated=False", "SignalSent=False"},
		CancelledWhen: []string{"SignalSent=False/NotDrained", "SignalSent=False/Escalated"},
		FinishedField: "completionTime",
	},
	{Group: JanitorGroup, Kind: "GPUReset"}: {
		CompleteWhen:  []string{"Complete=True/GPUResetSucceeded"},
		FailedWhen:    []string{"Complete=True"},
		CancelledWhen: []string{"Complete=True/NotDrained", "Complete=True/Escalated"},
		FinishedField: "completionTime",
	},
}

// GenericCompletion is the completion of kinds faultline does not know:
// a Completed condition True is success, a Failed condition True is a
// failure (what faultline assumed of every kind before it read the
// janitor).
var GenericCompletion = Completion{CompleteWhen: []string{"Completed=True"}, FailedWhen: []string{"Failed=True"}}

// Template maps one recommended action to the custom resource that carries
// it out.
type Template struct {
	// Action is a RecommendedAction name (RESTART_VM, COMPONENT_RESET...),
	// or "custom:<name>" for CUSTOM events whose customRecommendedAction
	// is <name>.
	Action string `toml:"action"`
	// Group is the equivalence group: while a resource of the group is in
	// progress on a node, another fault of any action of the group creates
	// nothing. The budget counts per group; it labels the resources, so it
	// is a label value. Default the action, lower case, "_" and ":"
	// written "-" ("custom:flash" → "custom-flash").
	Group string `toml:"group"`
	// Object is a Go text/template of the object (YAML) over Data. The
	// values of Data are placed into the parsed object as strings, never
	// pasted into the YAML text (see render.go): a template places values,
	// it cannot compare them.
	Object string `toml:"object"`
	// NodeField is the dotted path of the field that names the node the
	// object acts on. Default "spec.nodeName". An object whose field does
	// not hold the event's node (or with any other nodeName field that does
	// not) is refused, with a remediate/refused action.
	NodeField string `toml:"node_field"`
	// Resource is the plural resource name. Default lower(kind)+"s".
	Resource string `toml:"resource"`
	// CompleteWhen are the condition matchers of success (see Completion).
	// Default by the rendered object's group and kind: KindCompletion,
	// else GenericCompletion.
	CompleteWhen []string `toml:"complete_when"`
	// FailedWhen are the condition matchers of failure. Default by kind.
	FailedWhen []string `toml:"failed_when"`
	// CancelledWhen are the condition matchers of a remediation not
	// attempted because its premise is gone (looked at before
	// FailedWhen; neither a failure nor budget). Default by kind.
	CancelledWhen []string `toml:"cancelled_when"`
	// FinishedField is the .status field whose presence ends the work
	// ("completionTime"); "none" for no such field. Default by kind.
	FinishedField string `toml:"finished_field"`
	// CompleteCondition is shorthand for CompleteWhen = ["<it>=True"];
	// not together with CompleteWhen.
	CompleteCondition string `toml:"complete_condition"`
	// FailedCondition is shorthand for FailedWhen = ["<it>=True"]; not
	// together with FailedWhen.
	FailedCondition string `toml:"failed_condition"`

	tmpl       *template.Template
	gvr        schema.GroupVersionResource
	kind       string
	namespaced bool
	namespace  string
	nodePath   []string
	complete   []condMatch
	failed     []condMatch
	cancelled  []condMatch
	finished   []string // path under .status; nil: none
	// byGPU: the object depends on the event's GPUs (a GPUReset's
	// selector), so a resource serves only the GPUs it was made for
	// (AnnotationGPUs).
	byGPU bool
	// byEntity: the object depends on the event's other entities too (a
	// custom template listing .Entities), so a resource serves only the
	// entities it was made for (AnnotationEntities).
	byEntity bool
}

// condMatch is one parsed condition matcher.
type condMatch struct{ typ, status, reason string }

func (m condMatch) String() string {
	if m.reason != "" {
		return m.typ + "=" + m.status + "/" + m.reason
	}
	return m.typ + "=" + m.status
}

// parseCondMatch parses "Type=Status" or "Type=Status/Reason".
func parseCondMatch(s string) (condMatch, error) {
	typ, rest, ok := strings.Cut(s, "=")
	st, reason, hasReason := strings.Cut(rest, "/")
	m := condMatch{typ: typ, status: st, reason: reason}
	switch {
	case !ok || typ == "" || strings.ContainsAny(typ, " \t"):
		return m, fmt.Errorf("%q: want Type=Status or Type=Status/Reason", s)
	case st != "True" && st != "False" && st != "Unknown":
		return m, fmt.Errorf("%q: status must be True, False or Unknown, got %q", s, st)
	case hasReason && (reason == "" || strings.ContainsAny(reason, " \t/")):
		return m, fmt.Errorf("%q: bad reason %q", s, reason)
	}
	return m, nil
}

// Config is the remediate role's configuration (flags "remediate.*").
type Config struct {
	// Templates replace the defaults for their actions; the defaults cover
	// REPLACE_VM, RESTART_VM, RESTART_BM (group "reboot", RebootNode) and
	// COMPONENT_RESET (group "gpu-reset", GPUReset).
	Templates []Template `toml:"templates"`
	// NamePrefix of the resources' names. Default "maintenance".
	NamePrefix string `toml:"name_prefix"`
	// Budget is how many resources of one group a node may get within
	// BudgetWindow; a fault beyond it is escalated to CONTACT_SUPPORT.
	// 0 disables the budget. Default 3.
	Budget int `toml:"budget"`
	// BudgetWindow is the budget's window. Default 24h.
	BudgetWindow time.Duration `toml:"budget_window"`
	// CompletionTimeout: a resource neither complete nor failed (see
	// Completion) this long after it started (status.startTime, else the
	// janitor's record of its signal, else its creation; see QueueTimeout)
	// counts as failed.
	// Default 1h. The janitor fails a reboot or termination itself after
	// its own timeout (30 minutes when its config sets none) and says so
	// in its conditions, which faultline reads as a failure first.
	CompletionTimeout time.Duration `toml:"completion_timeout"`
	// QueueTimeout: a resource of the janitor's kinds that its janitor has
	// not started (no status.startTime, which the janitor writes when it
	// sends the signal) this long after it was created counts as failed;
	// once started, CompletionTimeout counts from status.startTime. A
	// resource waiting for the janitor's slots or cooldown (a rack-wide
	// fault) is not failed meanwhile. Keep it above the janitor's
	// max_queue_age (6h), past which the janitor never starts it. Default
	// 12h.
	QueueTimeout time.Duration `toml:"queue_timeout"`
	// Retention: a finished resource created longer ago than this is
	// deleted the next time the role reads its node's group, unless it is
	// the group's newest (whose result and sequence number the next
	// remediation reads). A trigger older than this is not acted on (its
	// resource may be gone). 0 keeps every resource and acts on every
	// trigger; else at least BudgetWindow and more than QueueTimeout +
	// CompletionTimeout (a trigger is followed that long: its resource
	// queued, then started). Default 168h (7 days).
	Retention time.Duration `toml:"retention"`
	// PollInterval is how often a remediation in progress is looked at.
	// Default 15s.
	PollInterval time.Duration `toml:"poll_interval"`
	// Workers bounds the nodes handled at once per batch. Default 64.
	Workers int `toml:"workers"`
	// BatchTimeout bounds one batch: the calls it makes on its nodes'
	// resources. Default 2m.
	BatchTimeout time.Duration `toml:"batch_timeout"`
	// SlowCluster: a cluster whose API writes take longer than this on
	// average, with other clusters served beside it, has its
	// remediations stepped on the role's slow lane (TopicSlow, a second
	// consumer group), so its slowness holds only its own (requeue.Lane);
	// a write in flight for twice this long counts before it is
	// answered, the batch's steps there abandoned and handed to the lane.
	// 0: never. Default 500ms.
	SlowCluster time.Duration `toml:"slow_cluster"`
	// Identity names this processor on resources. Default "faultline-remediate/<hostname>".
	Identity string `toml:"identity"`

	byAction map[string]*Template
}

// DefaultTemplates are the shipped action → resource mappings.
func DefaultTemplates() []Template {
	return []Template{
		{Action: "REPLACE_VM", Group: "reboot", Object: RebootNodeTemplate, Resource: "rebootnodes"},
		{Action: "RESTART_VM", Group: "reboot", Object: RebootNodeTemplate, Resource: "rebootnodes"},
		{Action: "RESTART_BM", Group: "reboot", Object: RebootNodeTemplate, Resource: "rebootnodes"},
		{Action: "COMPONENT_RESET", Group: "gpu-reset", Object: GPUResetTemplate, Resource: "gpuresets"},
	}
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	if host == "" {
		host = "unknown"
	}
	return Config{
		NamePrefix:        "maintenance",
		Budget:            3,
		BudgetWindow:      24 * time.Hour,
		CompletionTimeout: time.Hour,
		QueueTimeout:      12 * time.Hour,
		Retention:         7 * 24 * time.Hour,
		PollInterval:      15 * time.Second,
		Workers:           64,
		BatchTimeout:      2 * time.Minute,
		SlowCluster:       500 * time.Millisecond,
		Identity:          "faultline-remediate/" + host,
	}
}

// RegisterFlags adds the config's flags with the given prefix ("remediate.").
// Templates are set in the TOML file.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.NamePrefix, prefix+"name-prefix", c.NamePrefix, "prefix of remediation resource names")
	fs.IntVar(&c.Budget, prefix+"budget", c.Budget, "remediations of one group per node within the budget window before CONTACT_SUPPORT (0: no budget)")
	fs.DurationVar(&c.BudgetWindow, prefix+"budget-window", c.BudgetWindow, "window of the remediation budget")
	fs.DurationVar(&c.CompletionTimeout, prefix+"completion-timeout", c.CompletionTimeout, "a remediation neither complete nor failed this long after its start (status.startTime, else its creation) has failed")
	fs.DurationVar(&c.QueueTimeout, prefix+"queue-timeout", c.QueueTimeout, "a janitor resource not started (no status.startTime) this long after creation has failed")
	fs.DurationVar(&c.Retention, prefix+"retention", c.Retention, "finished remediations older than this are deleted, triggers older than this ignored (0: keep all)")
	fs.DurationVar(&c.PollInterval, prefix+"poll-interval", c.PollInterval, "how often a remediation in progress is looked at")
	fs.DurationVar(&c.BatchTimeout, prefix+"batch-timeout", c.BatchTimeout, "bound of one batch (more than 1s: a batch may hold that long for a requeued item)")
	fs.IntVar(&c.Workers, prefix+"workers", c.Workers, "nodes handled concurrently per batch")
	fs.DurationVar(&c.SlowCluster, prefix+"slow-cluster", c.SlowCluster, "a cluster whose API writes take longer than this on average has its remediations stepped on the slow lane (0: never)")
	fs.StringVar(&c.Identity, prefix+"identity", c.Identity, "processor identity written on resources")
}

// templateFuncs are the functions templates may use besides the builtins.
var templateFuncs = template.FuncMap{
	"quote": strconv.Quote,
	"lower": strings.ToLower,
	"upper": strings.ToUpper,
	"join":  strings.Join,
}

// sampleData renders each template once at start, to learn its kind.
var sampleData = Data{
	Name: "maintenance-sample", Cluster: "c", NodeName: "node-1", CheckName: "XID_ERROR_48",
	RecommendedAction: "RESTART_VM", EventID: "e1", EventIDs: []string{"e1"}, GPUs: []string{"GPU-1"},
	Entities: []Entity{{Type: "GPU", Value: "GPU-1"}}, Details: map[string]string{},
}

// otherSample differs from sampleData in every client value, so that a
// template that compares a value with a constant differs on one of them.
var otherSample = Data{
	Name: "maintenance-other", Cluster: "d", NodeName: "node-2", CheckName: "NIC_LINK_DOWN",
	RecommendedAction: "COMPONENT_RESET", CustomRecommendedAction: "flash", EventID: "e2", EventIDs: []string{"e2", "e3"},
	GPUs: []string{"GPU-2", "GPU-3"}, Entities: []Entity{{Type: "GPU", Value: "GPU-2"}, {Type: "GPU", Value: "GPU-3"}},
	Details: map[string]string{"drainId": "d1", "scope": "node", "entities": "GPU=GPU-2,GPU=GPU-3"},
}

// Validate names the first bad key, with the given prefix ("remediate."),
// and compiles the templates (the defaults, overridden by Templates).
func (c *Config) Validate(prefix string) error {
	if errs := validation.IsDNS1123Label(c.NamePrefix); len(errs) > 0 {
		return fmt.Errorf("%sname_prefix: %q begins every resource name: %s", prefix, c.NamePrefix, strings.Join(errs, "; "))
	}
	if c.Budget < 0 {
		return fmt.Errorf("%sbudget: must not be negative, got %d", prefix, c.Budget)
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"budget_window", c.BudgetWindow}, {"completion_timeout", c.CompletionTimeout}, {"queue_timeout", c.QueueTimeout}, {"poll_interval", c.PollInterval}} {
		if d.v <= 0 {
			return fmt.Errorf("%s%s: must be positive, got %v", prefix, d.key, d.v)
		}
	}
	switch {
	case c.Retention < 0:
		return fmt.Errorf("%sretention: must not be negative, got %v", prefix, c.Retention)
	case c.Retention > 0 && c.Retention < c.BudgetWindow:
		return fmt.Errorf("%sretention: must be 0 (keep all) or at least budget_window (%v): the budget counts the resources; got %v", prefix, c.BudgetWindow, c.Retention)
	case c.Retention > 0 && c.Retention <= c.QueueTimeout+c.CompletionTimeout:
		// A trigger is followed until its resource ends: queued up to
		// queue_timeout, then completion_timeout from its start. Skipped
		// past the retention, its failure would never be escalated.
		return fmt.Errorf("%sretention: must be 0 (keep all) or more than queue_timeout + completion_timeout (%v + %v): a trigger older than the retention is not followed, its remediation's failure never escalated; got %v",
			prefix, c.QueueTimeout, c.CompletionTimeout, c.Retention)
	}
	if c.Workers < 1 {
		return fmt.Errorf("%sworkers: must be at least 1, got %d", prefix, c.Workers)
	}
	if c.BatchTimeout <= 0 {
		return fmt.Errorf("%sbatch_timeout: must be positive, got %v", prefix, c.BatchTimeout)
	}
	if c.SlowCluster < 0 {
		return fmt.Errorf("%sslow_cluster: must not be negative (0: never), got %v", prefix, c.SlowCluster)
	}
	if c.Identity == "" {
		return fmt.Errorf("%sidentity: required", prefix)
	}
	c.byAction = map[string]*Template{}
	defaults := len(DefaultTemplates())
	all := append(DefaultTemplates(), c.Templates...)
	seen := map[string]int{} // action → index in c.Templates
	for i := range all {
		t := all[i]
		key := fmt.Sprintf("%stemplates[%d]", prefix, i-defaults)
		if i < defaults {
			key = "default template " + t.Action
		} else if j, dup := seen[t.Action]; dup {
			return fmt.Errorf("%s.action: %q already set by %stemplates[%d]", key, t.Action, prefix, j)
		} else {
			seen[t.Action] = i - defaults
		}
		if err := t.compile(); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		c.byAction[t.Action] = &t
	}
	// A group is read from one resource in one namespace (its progress,
	// budget and last failure): templates of one group sharing anything
	// else would each see only their own resources.
	for _, t := range all[defaults:] {
		for _, action := range slices.Sorted(maps.Keys(c.byAction)) {
			if o, u := c.byAction[action], c.byAction[t.Action]; o != u && o.Group == u.Group && (o.gvr != u.gvr || o.namespace != u.namespace) {
				return fmt.Errorf("%stemplates[%d].group: %q is also the group of %s, whose resources are %s in namespace %q, not %s in %q: "+
					"a group's progress, budget and failures are read from one resource; give it another group",
					prefix, seen[t.Action], u.Group, o.Action, o.gvr.GroupResource(), o.namespace, u.gvr.GroupResource(), u.namespace)
			}
		}
	}
	return nil
}

// templated lists the recommended actions a template can serve: not NONE
// or UNKNOWN (nothing to do), CONTACT_SUPPORT (escalated) or CUSTOM
// (custom:<name>).
var templated = func() []string {
	var names []string
	for name := range datamodels.RecommendedAction_value {
		switch datamodels.RecommendedAction(datamodels.RecommendedAction_value[name]) {
		case datamodels.RecommendedAction_NONE, datamodels.RecommendedAction_UNKNOWN,
			datamodels.RecommendedAction_CONTACT_SUPPORT, datamodels.RecommendedAction_CUSTOM:
			continue
		}
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}()

func (t *Template) compile() error {
	if t.Action == "" {
		return fmt.Errorf("action: required")
	}
	if name, ok := strings.CutPrefix(t.Action, "custom:"); ok && name == "" {
		return fmt.Errorf("action: %q names no custom action", t.Action)
	} else if !ok && !slices.Contains(templated, t.Action) {
		return fmt.Errorf("action: %q is not a recommended action a template serves (%s) nor custom:<name>", t.Action, strings.Join(templated, ", "))
	}
	if t.Group == "" {
		t.Group = strings.ToLower(strings.NewReplacer("_", "-", ":", "-").Replace(t.Action))
	}
	// The group is the value of LabelGroup on the resources and in the
	// selector that lists them: anything else fails every create and list.
	if errs := validation.IsValidLabelValue(t.Group); len(errs) > 0 {
		return fmt.Errorf("group: %q is not a label value (it labels the resources, %s): %s", t.Group, LabelGroup, strings.Join(errs, "; "))
	}
	tm, err := template.New(t.Action).Funcs(templateFuncs).Option("missingkey=error").Parse(t.Object)
	if err != nil {
		return fmt.Errorf("object: %w", err)
	}
	t.tmpl = tm
	if err := t.checkStructural(sampleData, otherSample); err != nil {
		return fmt.Errorf("object: %w", err)
	}
	obj, err := t.render(sampleData)
	if err != nil {
		return fmt.Errorf("object: %w", err)
	}
	otherGPU := sampleData
	otherGPU.GPUs, otherGPU.Entities = []string{"GPU-9"}, []Entity{{Type: "GPU", Value: "GPU-9"}}
	if o, err := t.render(otherGPU); err == nil && !sameObject(o.Object, obj.Object) {
		t.byGPU = true
	}
	if t.Action == datamodels.RecommendedAction_COMPONENT_RESET.String() && !t.byGPU {
		// The drain decides its scope from the action: for COMPONENT_RESET
		// it evicts only the pods of the fault's GPUs. An object that is
		// the same whatever the GPUs acts on the whole node (a reboot, a
		// terminate): it would kill the node's other pods, never evicted.
		return fmt.Errorf("object: renders the same object whatever the fault's GPUs (.GPUs, .Entities), so it acts on the whole node, " +
			"but the drain for COMPONENT_RESET evicts only the pods of the fault's GPUs: use an object of the GPUs (GPUReset's spec.selector.uuids = .GPUs), " +
			"or have the fault's source recommend RESTART_BM (a correlate rule's emit.recommended_action, say), whose drain takes the whole node")
	}
	otherEntity := sampleData
	otherEntity.Entities = append(slices.Clone(sampleData.Entities), Entity{Type: "NIC", Value: "mlx5_9"})
	if o, err := t.render(otherEntity); err == nil && !sameObject(o.Object, obj.Object) {
		t.byEntity = true
	}
	gv, err := schema.ParseGroupVersion(obj.GetAPIVersion())
	if err != nil || obj.GetAPIVersion() == "" || obj.GetKind() == "" {
		return fmt.Errorf("object: needs apiVersion and kind (got %q %q)", obj.GetAPIVersion(), obj.GetKind())
	}
	if t.Resource == "" {
		t.Resource = strings.ToLower(obj.GetKind()) + "s"
	}
	t.kind = obj.GetKind()
	t.gvr = gv.WithResource(t.Resource)
	t.namespaced = obj.GetNamespace() != ""
	t.namespace = obj.GetNamespace()
	if t.NodeField == "" {
		t.NodeField = "spec.nodeName"
	}
	t.nodePath = strings.Split(t.NodeField, ".")
	for _, d := range []Data{sampleData, otherSample} {
		o, err := t.render(d)
		if err != nil {
			return fmt.Errorf("object: %w", err)
		}
		if err := t.checkTarget(o, d.NodeName); err != nil {
			return fmt.Errorf("node_field: %q must hold {{ .NodeName }}: %w", t.NodeField, err)
		}
	}
	return t.compileCompletion(gv.WithKind(t.kind).GroupKind())
}

// compileCompletion resolves the completion keys (the kind's defaults for
// those not set) and parses them.
func (t *Template) compileCompletion(gk schema.GroupKind) error {
	def, ok := KindCompletion[gk]
	if !ok {
		def = GenericCompletion
	}
	for _, f := range []struct {
		short, long string
		cond        string
		when        *[]string
		def         []string
	}{
		{"complete_condition", "complete_when", t.CompleteCondition, &t.CompleteWhen, def.CompleteWhen},
		{"failed_condition", "failed_when", t.FailedCondition, &t.FailedWhen, def.FailedWhen},
		{"", "cancelled_when", "", &t.CancelledWhen, def.CancelledWhen},
	} {
		switch {
		case f.cond != "" && len(*f.when) > 0:
			return fmt.Errorf("%s: not together with %s", f.short, f.long)
		case f.cond != "":
			if _, err := parseCondMatch(f.cond + "=True"); err != nil {
				return fmt.Errorf("%s: %q is not a condition type", f.short, f.cond)
			}
			*f.when = []string{f.cond + "=True"}
		case len(*f.when) == 0:
			*f.when = slices.Clone(f.def)
		}
	}
	seen := map[condMatch]string{}
	for _, f := range []struct {
		key  string
		when []string
		out  *[]condMatch
	}{{"complete_when", t.CompleteWhen, &t.complete}, {"failed_when", t.FailedWhen, &t.failed}, {"cancelled_when", t.CancelledWhen, &t.cancelled}} {
		*f.out = nil
		for i, s := range f.when {
			m, err := parseCondMatch(s)
			if err != nil {
				return fmt.Errorf("%s[%d]: %w", f.key, i, err)
			}
			if prev, dup := seen[m]; dup {
				return fmt.Errorf("%s[%d]: %q is already in %s", f.key, i, s, prev)
			}
			seen[m] = f.key
			*f.out = append(*f.out, m)
		}
	}
	if t.FinishedField == "" {
		t.FinishedField = def.FinishedField
	}
	t.finished = nil
	if t.FinishedField != "" && t.FinishedField != "none" {
		for _, p := range strings.Split(t.FinishedField, ".") {
			if p == "" || strings.ContainsAny(p, " \t[]") {
				return fmt.Errorf("finished_field: %q is not a field path under .status (or \"none\")", t.FinishedField)
			}
		}
		t.finished = strings.Split(t.FinishedField, ".")
	}
	return nil
}

// template returns the template for an action ("custom:<name>" for CUSTOM).
func (c *Config) template(action string) *Template { return c.byAction[action] }

// Pipeline returns the runner settings of the role's consumer.
func (c Config) Pipeline() pipeline.Config {
	return pipeline.Config{Role: Role, Topics: Topics, BatchTimeout: c.BatchTimeout, FetchMaxWait: requeue.FetchMaxWait}
}
