package conformance

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	agentconf "github.com/faultline/faultline/agents/conformance"
)

func reports(m map[string]string) map[string]Report {
	out := map[string]Report{}
	for n, fp := range m {
		out[n] = Report{Node: n, Fingerprint: fp}
	}
	return out
}

func TestComputeScore(t *testing.T) {
	for _, tc := range []struct {
		name   string
		nodes  []string
		latest map[string]string
		f9     float64
		groups []Group
	}{
		{"homogeneous", []string{"a", "b", "c"}, map[string]string{"a": "x", "b": "x", "c": "x"}, 1, []Group{{"x", []string{"a", "b", "c"}}}},
		{"half", []string{"a", "b", "c", "d"}, map[string]string{"a": "x", "b": "x", "c": "y", "d": "y"}, 0.5,
			[]Group{{"x", []string{"a", "b"}}, {"y", []string{"c", "d"}}}},
		{"unknown are groups of one", []string{"a", "b", "c"}, map[string]string{"a": "x"}, 1.0 / 3,
			[]Group{{"unknown", []string{"b"}}, {"unknown", []string{"c"}}, {"x", []string{"a"}}}},
		{"duplicates count once", []string{"a", "a", "b"}, map[string]string{"a": "x", "b": "x"}, 1, []Group{{"x", []string{"a", "b"}}}},
		{"single node", []string{"a"}, map[string]string{"a": "x"}, 1, []Group{{"x", []string{"a"}}}},
		{"none", nil, nil, 1, []Group{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := ComputeScore(tc.nodes, reports(tc.latest))
			if s.F9 != tc.f9 || !reflect.DeepEqual(s.Groups, tc.groups) {
				t.Fatalf("got %+v, want f9 %v groups %v", s, tc.f9, tc.groups)
			}
		})
	}
}

func TestEvaluate(t *testing.T) {
	m := func(fps ...string) []Member {
		var out []Member
		for i, fp := range fps {
			mm := Member{Node: fmt.Sprintf("n%d", i)}
			if fp != "" { // "!fp": a partial report
				mm.Report = &Report{Fingerprint: strings.TrimPrefix(fp, "!"), Partial: strings.HasPrefix(fp, "!")}
			}
			out = append(out, mm)
		}
		return out
	}
	states := func(vs []Verdict) []State {
		var out []State
		for _, v := range vs {
			out = append(out, v.State)
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		members  []Member
		baseline string
		want     []State
	}{
		{"majority", m("x", "x", "y"), "", []State{Conforming, Conforming, Drifted}},
		{"unknown does not vote", m("x", "", "y", "x"), "", []State{Conforming, StateUnknown, Drifted, Conforming}},
		{"tie is undecided", m("x", "y"), "", []State{Undecided, Undecided}},
		{"baseline wins over majority", m("x", "x", "y"), "y", []State{Drifted, Drifted, Conforming}},
		{"baseline nobody has", m("x"), "z", []State{Drifted}},
		{"lone node is its majority", m("x"), "", []State{Conforming}},
		{"partial reports do not vote", m("x", "x", "y", "!u", "!u"), "", []State{Conforming, Conforming, Drifted, Drifted, Drifted}},
		{"only partial reports: undecided", m("!u", "!u"), "", []State{Undecided, Undecided}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := states(Evaluate(tc.members, tc.baseline)); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestUnreadablePattern: Latest's pattern matches what the agent writes.
func TestUnreadablePattern(t *testing.T) {
	if got := strings.TrimSuffix(unreadablePattern, "%"); got != agentconf.Unreadable {
		t.Fatalf("pattern %q, agent writes %q", unreadablePattern, agentconf.Unreadable)
	}
}

func ExampleDiff() {
	fmt.Println(Diff(map[string]string{"gpu_driver": "550.54.14", "kernel": "6.8.0-45"},
		map[string]string{"gpu_driver": "550.90.07", "kernel": "6.8.0-45", "ofed": "24.07"}))
	// Output: [gpu_driver: expected "550.54.14", actual "550.90.07" ofed: expected "(none)", actual "24.07"]
}
