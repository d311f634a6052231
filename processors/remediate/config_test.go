package remediate

import (
	"strings"
	"testing"
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
		{"template syntax", func(c *Config) { c.Templates = []Template{{Action: "RESTART_VM", Object: "{{ .Name "}} }, "remediate.templates[0]"},
		{"template field", func(c *Config) {
			c.Templates = []Template{{Action: "RESTART_VM", Object: "kind: X\napiVersion: a/v1\nmetadata: {name: {{ .Nope }}}"}}
		}, "remediate.templates[0]"},
		{"template kind", func(c *Config) { c.Templates = []Template{{Action: "custom:x", Object: "metadata: {name: a}"}} }, "remediate.templates[0]"},
		{"custom name", func(c *Config) { c.Templates = []Template{{Action: "custom:", Object: RebootNodeTemplate}} }, "remediate.templates[0]"},
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
	if c.template("REPLACE_VM").Group != c.template("RESTART_BM").Group {
		t.Fatal("reboots must share one equivalence group")
	}
}
