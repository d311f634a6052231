package remediate

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/template"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// TopicRequeue carries remediations waiting for their resource's condition
// back to the remediate role after Config.PollInterval.
const TopicRequeue = "faultline.remediate.requeue"

// RebootNodeTemplate is the default object of REPLACE_VM, RESTART_VM and
// RESTART_BM: the janitor's RebootNode (cluster-scoped).
const RebootNodeTemplate = `apiVersion: janitor.dgxc.nvidia.com/v1alpha1
kind: RebootNode
metadata:
  name: {{ .Name }}
spec:
  nodeName: {{ .NodeName }}
`

// GPUResetTemplate is the default object of COMPONENT_RESET: faultline's
// GPUReset (cluster-scoped, deploy/crds/gpureset.yaml).
const GPUResetTemplate = `apiVersion: remediation.faultline.io/v1alpha1
kind: GPUReset
metadata:
  name: {{ .Name }}
spec:
  nodeName: {{ .NodeName }}
  gpuUUIDs: [{{ range $i, $g := .GPUs }}{{ if $i }}, {{ end }}{{ quote $g }}{{ end }}]
  reason: {{ quote .CheckName }}
`

// Template maps one recommended action to the custom resource that carries
// it out.
type Template struct {
	// Action is a RecommendedAction name (RESTART_VM, COMPONENT_RESET...),
	// or "custom:<name>" for CUSTOM events whose customRecommendedAction
	// is <name>.
	Action string `toml:"action"`
	// Group is the equivalence group: while a resource of the group is in
	// progress on a node, another fault of any action of the group creates
	// nothing. The budget counts per group. Default the action.
	Group string `toml:"group"`
	// Object is a Go text/template of the object (YAML) over Data.
	Object string `toml:"object"`
	// Resource is the plural resource name. Default lower(kind)+"s".
	Resource string `toml:"resource"`
	// CompleteCondition is the status condition type that says the work is
	// done when True. Default "Completed".
	CompleteCondition string `toml:"complete_condition"`
	// FailedCondition is the status condition type that says the work
	// failed when True. Default "Failed".
	FailedCondition string `toml:"failed_condition"`

	tmpl       *template.Template
	gvr        schema.GroupVersionResource
	kind       string
	namespaced bool
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
	// CompletionTimeout: a resource with neither condition this long after
	// it was created counts as failed. Default 1h.
	CompletionTimeout time.Duration `toml:"completion_timeout"`
	// PollInterval is how often a remediation in progress is looked at.
	// Default 15s.
	PollInterval time.Duration `toml:"poll_interval"`
	// Workers bounds the nodes handled at once per batch. Default 64.
	Workers int `toml:"workers"`
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
		PollInterval:      15 * time.Second,
		Workers:           64,
		Identity:          "faultline-remediate/" + host,
	}
}

// RegisterFlags adds the config's flags with the given prefix ("remediate.").
// Templates are set in the TOML file.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.NamePrefix, prefix+"name-prefix", c.NamePrefix, "prefix of remediation resource names")
	fs.IntVar(&c.Budget, prefix+"budget", c.Budget, "remediations of one group per node within the budget window before CONTACT_SUPPORT (0: no budget)")
	fs.DurationVar(&c.BudgetWindow, prefix+"budget-window", c.BudgetWindow, "window of the remediation budget")
	fs.DurationVar(&c.CompletionTimeout, prefix+"completion-timeout", c.CompletionTimeout, "a remediation without a condition this long after creation has failed")
	fs.DurationVar(&c.PollInterval, prefix+"poll-interval", c.PollInterval, "how often a remediation in progress is looked at")
	fs.IntVar(&c.Workers, prefix+"workers", c.Workers, "nodes handled concurrently per batch")
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

// Validate names the first bad key, with the given prefix ("remediate."),
// and compiles the templates (the defaults, overridden by Templates).
func (c *Config) Validate(prefix string) error {
	if c.NamePrefix == "" || strings.ToLower(c.NamePrefix) != c.NamePrefix {
		return fmt.Errorf("%sname_prefix: must be non-empty lower case, got %q", prefix, c.NamePrefix)
	}
	if c.Budget < 0 {
		return fmt.Errorf("%sbudget: must not be negative, got %d", prefix, c.Budget)
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"budget_window", c.BudgetWindow}, {"completion_timeout", c.CompletionTimeout}, {"poll_interval", c.PollInterval}} {
		if d.v <= 0 {
			return fmt.Errorf("%s%s: must be positive, got %v", prefix, d.key, d.v)
		}
	}
	if c.Workers < 1 {
		return fmt.Errorf("%sworkers: must be at least 1, got %d", prefix, c.Workers)
	}
	if c.Identity == "" {
		return fmt.Errorf("%sidentity: required", prefix)
	}
	c.byAction = map[string]*Template{}
	all := append(DefaultTemplates(), c.Templates...)
	for i := range all {
		t := all[i]
		key := fmt.Sprintf("%stemplates[%d]", prefix, i-len(DefaultTemplates()))
		if i < len(DefaultTemplates()) {
			key = "default template " + t.Action
		}
		if err := t.compile(); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		c.byAction[t.Action] = &t
	}
	return nil
}

func (t *Template) compile() error {
	if t.Action == "" {
		return fmt.Errorf("action: required")
	}
	if name, ok := strings.CutPrefix(t.Action, "custom:"); ok && name == "" {
		return fmt.Errorf("action: %q names no custom action", t.Action)
	}
	if t.Group == "" {
		t.Group = strings.ToLower(strings.ReplaceAll(t.Action, "_", "-"))
	}
	if t.CompleteCondition == "" {
		t.CompleteCondition = "Completed"
	}
	if t.FailedCondition == "" {
		t.FailedCondition = "Failed"
	}
	tm, err := template.New(t.Action).Funcs(templateFuncs).Option("missingkey=error").Parse(t.Object)
	if err != nil {
		return fmt.Errorf("object: %w", err)
	}
	t.tmpl = tm
	obj, err := t.render(sampleData)
	if err != nil {
		return fmt.Errorf("object: %w", err)
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
	return nil
}

// render executes the template and parses the object.
func (t *Template) render(d Data) (*unstructured.Unstructured, error) {
	var buf bytes.Buffer
	if err := t.tmpl.Execute(&buf, d); err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	m := map[string]any{}
	if err := yaml.Unmarshal(buf.Bytes(), &m); err != nil {
		return nil, fmt.Errorf("parse rendered object: %w\n%s", err, buf.String())
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// template returns the template for an action ("custom:<name>" for CUSTOM).
func (c *Config) template(action string) *Template { return c.byAction[action] }
