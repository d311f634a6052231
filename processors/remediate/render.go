package remediate

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// Rendering is structural: the strings of Data come from clients (a check
// name, entity values, details), so they never go through the YAML text.
// The template is executed over placeholders (short alphanumeric tokens,
// one per value, with a random nonce per render), the output is parsed,
// and only then is each placeholder in a string of the parsed object (a
// value or a key) replaced by its value. A check name with newlines can
// therefore only ever be a string where the template put the check name;
// it cannot add `force: true` or a second `nodeName`.
//
// Template functions keep working on placeholders: quote (the quoted
// placeholder parses back to the placeholder), join, printf, and lower and
// upper (a placeholder's case says which was applied). What cannot work is
// a template whose output depends on a value's content — `eq .CheckName
// "X"`, `len .NodeName`, a value used as a number or a boolean: compile
// renders two samples both ways (placeholders, and the plain text) and
// refuses such a template at start, naming it.

// placeholders hands out the tokens of one render and puts the values back.
type placeholders struct {
	nonce string
	vals  []string
	re    *regexp.Regexp
}

func newPlaceholders() *placeholders {
	n, err := rand.Int(rand.Reader, big.NewInt(1e12))
	if err != nil {
		n = big.NewInt(0)
	}
	nonce := fmt.Sprintf("%012d", n)
	return &placeholders{nonce: nonce, re: regexp.MustCompile(`(?i)fl` + nonce + `t([0-9]+)z`)}
}

// put returns the placeholder of v: "Fl<nonce>t<i>Z".
func (p *placeholders) put(v string) string {
	p.vals = append(p.vals, v)
	return "Fl" + p.nonce + "t" + strconv.Itoa(len(p.vals)-1) + "Z"
}

// data returns d with every client string replaced by a placeholder (the
// group is configuration and stays).
func (p *placeholders) data(d Data) Data {
	out := d
	for _, f := range []*string{&out.Name, &out.Cluster, &out.NodeName, &out.CheckName, &out.RecommendedAction,
		&out.CustomRecommendedAction, &out.EventID} {
		*f = p.put(*f)
	}
	list := func(s []string) []string {
		if s == nil {
			return nil
		}
		o := make([]string, len(s))
		for i, v := range s {
			o[i] = p.put(v)
		}
		return o
	}
	out.EventIDs, out.GPUs = list(d.EventIDs), list(d.GPUs)
	if d.Entities != nil {
		out.Entities = make([]Entity, len(d.Entities))
		for i, e := range d.Entities {
			out.Entities[i] = Entity{Type: p.put(e.Type), Value: p.put(e.Value)}
		}
	}
	if d.Details != nil {
		out.Details = make(map[string]string, len(d.Details))
		for k, v := range d.Details {
			out.Details[k] = p.put(v)
		}
	}
	return out
}

// fill replaces the placeholders in s by their values.
func (p *placeholders) fill(s string) (string, error) {
	var bad error
	out := p.re.ReplaceAllStringFunc(s, func(m string) string {
		i, _ := strconv.Atoi(p.re.FindStringSubmatch(m)[1])
		if i >= len(p.vals) {
			bad = fmt.Errorf("unknown placeholder %q", m)
			return m
		}
		v := p.vals[i]
		orig := "Fl" + p.nonce + "t" + strconv.Itoa(i) + "Z"
		switch m {
		case orig:
			return v
		case strings.ToLower(orig):
			return strings.ToLower(v)
		case strings.ToUpper(orig):
			return strings.ToUpper(v)
		}
		bad = fmt.Errorf("a value was transformed in a way faultline cannot redo (%q)", m)
		return m
	})
	return out, bad
}

// fillTree puts the values into every string of a parsed object, keys
// included (a key that would collide with another is an error).
func (p *placeholders) fillTree(x any) (any, error) {
	switch v := x.(type) {
	case string:
		return p.fill(v)
	case []any:
		for i := range v {
			f, err := p.fillTree(v[i])
			if err != nil {
				return nil, err
			}
			v[i] = f
		}
		return v, nil
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			fk, err := p.fill(k)
			if err != nil {
				return nil, err
			}
			if _, dup := out[fk]; dup {
				return nil, fmt.Errorf("key %q: a value made it collide with another key", fk)
			}
			fe, err := p.fillTree(e)
			if err != nil {
				return nil, err
			}
			out[fk] = fe
		}
		return out, nil
	}
	return x, nil
}

// render builds the template's object for d structurally (see above).
func (t *Template) render(d Data) (*unstructured.Unstructured, error) {
	p := newPlaceholders()
	m, err := t.execute(p.data(d))
	if err != nil {
		return nil, err
	}
	filled, err := p.fillTree(m)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	return &unstructured.Unstructured{Object: filled.(map[string]any)}, nil
}

// renderText is the plain rendering (values pasted into the YAML text),
// used only to check at start that a template's output does not depend on
// the values' content.
func (t *Template) renderText(d Data) (map[string]any, error) { return t.execute(d) }

// execute runs the template and parses its output.
func (t *Template) execute(d Data) (map[string]any, error) {
	var buf bytes.Buffer
	if err := t.tmpl.Execute(&buf, d); err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	m := map[string]any{}
	if err := yaml.Unmarshal(buf.Bytes(), &m); err != nil {
		return nil, fmt.Errorf("parse rendered object: %w\n%s", err, buf.String())
	}
	return m, nil
}

// checkStructural renders the samples both ways: a template that uses a
// value's content (compares it, measures it, uses it as a number) would
// build a different object from placeholders than from the text.
func (t *Template) checkStructural(samples ...Data) error {
	for _, d := range samples {
		obj, err := t.render(d)
		if err != nil {
			return err
		}
		text, err := t.renderText(d)
		if err != nil {
			return err
		}
		if !sameObject(obj.Object, text) {
			return errors.New("the output depends on the content of a client value (a comparison, len, or a value used as a number or boolean): " +
				"values are placed as strings into the parsed object, so templates may only place them")
		}
	}
	return nil
}

// sameObject compares a structural rendering with the text one. An empty
// value pasted after "key: " is YAML's null where the structural rendering
// has the empty string; that counts as the same.
func sameObject(structural, text any) bool {
	switch s := structural.(type) {
	case map[string]any:
		t, ok := text.(map[string]any)
		if !ok || len(s) != len(t) {
			return false
		}
		for k, v := range s {
			w, ok := t[k]
			if !ok || !sameObject(v, w) {
				return false
			}
		}
		return true
	case []any:
		t, ok := text.([]any)
		if !ok || len(s) != len(t) {
			return false
		}
		for i := range s {
			if !sameObject(s[i], t[i]) {
				return false
			}
		}
		return true
	case string:
		if s == "" && text == nil {
			return true
		}
	}
	return reflect.DeepEqual(structural, text)
}

// ErrWrongTarget marks a rendered object that does not target the event's
// node; remediate refuses to create it.
var ErrWrongTarget = errors.New("rendered object does not target the event's node")

// checkTarget refuses an object that could act on another node than the
// event's: the template's NodeField must hold node, every other field
// called nodeName (any case) anywhere in the object too, and a namespaced
// object must be in the template's namespace.
func (t *Template) checkTarget(obj *unstructured.Unstructured, node string) error {
	v, ok, _ := unstructured.NestedString(obj.Object, t.nodePath...)
	if !ok || v != node {
		return fmt.Errorf("%w: %s is %q, the event's node is %q", ErrWrongTarget, t.NodeField, v, node)
	}
	if t.namespaced && obj.GetNamespace() != t.namespace {
		return fmt.Errorf("%w: namespace %q, the template's is %q", ErrWrongTarget, obj.GetNamespace(), t.namespace)
	}
	var walk func(path string, x any) error
	walk = func(path string, x any) error {
		switch v := x.(type) {
		case map[string]any:
			for k, e := range v {
				p := path + "." + k
				if s, ok := e.(string); ok && strings.EqualFold(k, "nodeName") && s != node {
					return fmt.Errorf("%w: %s is %q, the event's node is %q", ErrWrongTarget, p[1:], s, node)
				}
				if err := walk(p, e); err != nil {
					return err
				}
			}
		case []any:
			for i, e := range v {
				if err := walk(path+"["+strconv.Itoa(i)+"]", e); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk("", obj.Object)
}
