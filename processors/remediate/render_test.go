package remediate

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// hostileCheck is the check name of the security review: pasted into the
// YAML text of reasonTemplate it sets force: true and another nodeName.
const hostileCheck = "XID_48\n  force: true\n  nodeName: victim"

// reasonTemplate is a custom template that places the check name after
// the spec's own fields.
const reasonTemplate = `apiVersion: janitor.dgxc.nvidia.com/v1alpha1
kind: RebootNode
metadata:
  name: {{ .Name }}
spec:
  nodeName: {{ .NodeName }}
  force: false
  reason: {{ .CheckName }}
`

// annotatedTemplate puts client strings in annotations, plain and quoted,
// joined and transformed, the way an operator's custom template might.
const annotatedTemplate = `apiVersion: janitor.dgxc.nvidia.com/v1alpha1
kind: RebootNode
metadata:
  name: {{ .Name }}
  annotations:
    example.com/check: {{ .CheckName }}
    example.com/check-quoted: {{ quote .CheckName }}
    example.com/check-lower: {{ lower .CheckName }}
    example.com/entities: "{{ range $i, $e := .Entities }}{{ if $i }};{{ end }}{{ $e.Type }}={{ $e.Value }}{{ end }}"
    example.com/gpus: {{ join .GPUs "," }}
    example.com/custom: {{ .CustomRecommendedAction }}
spec:
  nodeName: {{ .NodeName }}
  force: false
`

func hostileData() Data {
	d := otherSample
	d.NodeName = "gpu-node-7"
	d.CheckName = hostileCheck
	d.CustomRecommendedAction = "a\"b: {c}\n- d"
	d.Entities = []Entity{{Type: "GPU", Value: "GPU-1\"\n  nodeName: victim"}, {Type: "NIC\nforce: true", Value: "mlx5_0: [x]"}}
	d.GPUs = []string{"GPU-1\"\n  nodeName: victim", "GPU-2 # comment"}
	return d
}

// TestRenderIsStructural renders every default template and a custom one
// with hostile values: each value lands, unchanged, where the template put
// it, and nothing else changes (spec.force stays false, the node is the
// event's). Pasting the same values into the YAML text (what faultline
// did before) gives another object, or none.
func TestRenderIsStructural(t *testing.T) {
	c := DefaultConfig()
	c.Templates = []Template{{Action: "custom:annotated", Object: annotatedTemplate}, {Action: "custom:reason", Object: reasonTemplate}}
	if err := c.Validate("remediate."); err != nil {
		t.Fatal(err)
	}
	d := hostileData()
	// What the review found: pasted into the text, the check name sets
	// force: true and retargets the reboot.
	text, err := c.template("custom:reason").renderText(d)
	if spec, _ := text["spec"].(map[string]any); err != nil || spec["force"] != true || spec["nodeName"] != "victim" {
		t.Fatalf("the text rendering no longer shows the injection: %v %v", text, err)
	}
	reason, _ := c.template("custom:reason").render(d)
	if r, _, _ := unstructured.NestedString(reason.Object, "spec", "reason"); r != hostileCheck {
		t.Fatalf("spec.reason = %q, want the check name", r)
	}
	for _, action := range []string{"RESTART_VM", "COMPONENT_RESET", "custom:annotated", "custom:reason"} {
		tm := c.template(action)
		obj, err := tm.render(d)
		if err != nil {
			t.Fatalf("%s: %v", action, err)
		}
		if err := tm.checkTarget(obj, d.NodeName); err != nil {
			t.Fatalf("%s: %v", action, err)
		}
		spec := obj.Object["spec"].(map[string]any)
		if spec["nodeName"] != "gpu-node-7" || (action != "COMPONENT_RESET" && spec["force"] != false) || len(obj.Object) != 4 {
			t.Fatalf("%s: object %v", action, obj.Object)
		}
		if action == "COMPONENT_RESET" {
			uuids, _, _ := unstructured.NestedStringSlice(obj.Object, "spec", "selector", "uuids")
			if strings.Join(uuids, "|") != strings.Join(d.GPUs, "|") {
				t.Fatalf("GPUReset uuids %q, want %q", uuids, d.GPUs)
			}
		}
		// (The defaults quote what they take from clients; the custom one
		// does not, as the review found.)
		if text, err := tm.renderText(d); strings.HasPrefix(action, "custom:") && err == nil && equalObjects(text, obj.Object) {
			t.Fatalf("%s: the pasted text gives the same object; the test values are not hostile", action)
		}
	}
	obj, _ := c.template("custom:annotated").render(d)
	ann := obj.GetAnnotations()
	for k, want := range map[string]string{
		"example.com/check":        hostileCheck,
		"example.com/check-quoted": hostileCheck,
		"example.com/check-lower":  strings.ToLower(hostileCheck),
		"example.com/entities":     "GPU=GPU-1\"\n  nodeName: victim;NIC\nforce: true=mlx5_0: [x]",
		"example.com/gpus":         "GPU-1\"\n  nodeName: victim,GPU-2 # comment",
		"example.com/custom":       "a\"b: {c}\n- d",
	} {
		if ann[k] != want {
			t.Errorf("annotation %s = %q, want %q", k, ann[k], want)
		}
	}
	if len(ann) != 6 {
		t.Fatalf("annotations %v", ann)
	}
}

func equalObjects(a, b map[string]any) bool {
	return strings.EqualFold(strings.TrimSpace(strings.ReplaceAll(toString(a), " ", "")), strings.TrimSpace(strings.ReplaceAll(toString(b), " ", "")))
}

func toString(m map[string]any) string {
	o := unstructured.Unstructured{Object: m}
	b, _ := o.MarshalJSON()
	return string(b)
}

// TestTemplatesThatReadValuesRefused: a template whose output depends on a
// value's content cannot be rendered structurally; it is refused at start,
// named; and one whose node field does not hold the node, too.
func TestTemplatesThatReadValuesRefused(t *testing.T) {
	for name, tc := range map[string]struct{ object, nodeField, want string }{
		"compares a value": {object: "apiVersion: a/v1\nkind: X\nmetadata: {name: {{ .Name }}}\nspec:\n  nodeName: {{ .NodeName }}\n" +
			"{{ if eq .CheckName \"XID_ERROR_48\" }}  force: true\n{{ end }}", want: "depends on the content of a client value"},
		"value as a number": {object: "apiVersion: a/v1\nkind: X\nmetadata: {name: {{ .Name }}}\nspec:\n  nodeName: {{ .NodeName }}\n  n: {{ len .GPUs }}{{ index .GPUs 0 | len }}\n",
			want: "depends on the content of a client value"},
		"no node field": {object: "apiVersion: a/v1\nkind: X\nmetadata: {name: {{ .Name }}}\nspec:\n  host: {{ .NodeName }}\n", want: `node_field: "spec.nodeName"`},
		"another nodeName": {object: "apiVersion: a/v1\nkind: X\nmetadata: {name: {{ .Name }}}\nspec:\n  nodeName: {{ .NodeName }}\n  target: {nodeName: {{ .CheckName }}}\n",
			want: "spec.target.nodeName"},
		"node field elsewhere": {object: "apiVersion: a/v1\nkind: X\nmetadata: {name: {{ .Name }}}\nspec:\n  host: {{ .NodeName }}\n", nodeField: "spec.host"},
	} {
		t.Run(name, func(t *testing.T) {
			c := DefaultConfig()
			c.Templates = []Template{{Action: "custom:x", Object: tc.object, NodeField: tc.nodeField}}
			err := c.Validate("remediate.")
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "remediate.templates[0]: ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming the template and containing %q", err, tc.want)
			}
		})
	}
}

// TestCheckTargetRefuses: an object that names another node, anywhere, is
// refused.
func TestCheckTargetRefuses(t *testing.T) {
	c := DefaultConfig()
	// Passes the start checks (the samples have no such detail), and pastes
	// a client string after the node name at run time.
	c.Templates = []Template{{Action: "custom:suffix", Object: "apiVersion: a/v1\nkind: X\nmetadata: {name: {{ .Name }}}\n" +
		"spec:\n  nodeName: {{ .NodeName }}{{ index .Details \"suffix\" }}\n"}}
	if err := c.Validate("remediate."); err != nil {
		t.Fatal(err)
	}
	tm := c.template("custom:suffix")
	d := hostileData()
	d.Details = map[string]string{"suffix": "-victim"}
	obj, err := tm.render(d)
	if err != nil {
		t.Fatal(err)
	}
	if err := tm.checkTarget(obj, d.NodeName); !errors.Is(err, ErrWrongTarget) || !strings.Contains(err.Error(), `spec.nodeName is "gpu-node-7-victim"`) {
		t.Fatalf("err = %v", err)
	}
}
