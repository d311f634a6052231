package chart

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestValuesDocumented: every value in values.yaml is in the README's
// values table (itself or a parent key, for free-form maps such as
// nodeSelector), and every key the table names is a value.
func TestValuesDocumented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(Dir(), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	var leaves []string
	all := map[string]bool{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		if prefix != "" {
			all[prefix] = true
		}
		m, ok := v.(map[string]any)
		if !ok || len(m) == 0 {
			leaves = append(leaves, prefix)
			return
		}
		for k, sub := range m {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			walk(p, sub)
		}
	}
	walk("", values)
	sort.Strings(leaves)

	readme, err := os.ReadFile(filepath.Join(Dir(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "\n## Values\n")
	if !ok {
		t.Fatal("README has no ## Values section")
	}
	table, _, _ = strings.Cut(table, "\n## ")
	row := regexp.MustCompile(`(?m)^\| ([^|]+) \|`)
	tick := regexp.MustCompile("`([^`]+)`")
	documented := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(table, -1) {
		for _, k := range tick.FindAllStringSubmatch(m[1], -1) {
			documented[k[1]] = true
			if !all[k[1]] {
				t.Errorf("README values table names %q, which is not a value", k[1])
			}
		}
	}
	for _, leaf := range leaves {
		ok := false
		for p := leaf; p != ""; {
			if documented[p] {
				ok = true
				break
			}
			i := strings.LastIndex(p, ".")
			if i < 0 {
				break
			}
			p = p[:i]
		}
		if !ok {
			t.Errorf("value %s is not in the README's values table", leaf)
		}
	}
}
