package conformance

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	agentconf "github.com/faultline/faultline/agents/conformance"
)

// reports: node → fingerprint; "!fp" is a partial report.
func reports(m map[string]string) map[string]Report {
	out := map[string]Report{}
	for n, fp := range m {
		out[n] = Report{Node: n, Fingerprint: strings.TrimPrefix(fp, "!"), Partial: strings.HasPrefix(fp, "!")}
	}
	return out
}

// partialReports: 8 nodes n1…n8 whose bmc_version is unreadable (ipmitool
// configured, /dev/ipmi0 not passed through; the reason may name the
// node), their GPU driver gpu[node] (default "550.54.14"); complete adds
// complete reports on that GPU driver with a readable BMC.
func partialReports(gpu map[string]string, complete ...string) map[string]Report {
	const ipmi = "unreadable: ipmitool mc info: exit status 1: Could not open device at /dev/ipmi0"
	out := map[string]Report{}
	add := func(node, bmc string, partial bool) {
		g := gpu[node]
		if g == "" {
			g = "550.54.14"
		}
		comps := map[string]string{"gpu_driver": g, "bmc_version": bmc, "kernel": "6.8.0-45-generic"}
		out[node] = Report{Node: node, Fingerprint: agentconf.Fingerprint(comps), Components: comps, Partial: partial}
	}
	for i := 1; i <= 8; i++ {
		node := fmt.Sprintf("n%d", i)
		bmc := ipmi
		if i%2 == 0 {
			bmc += " on " + node
		}
		add(node, bmc, true)
	}
	for _, node := range complete {
		add(node, "3.10", false)
	}
	return out
}

func TestComputeScore(t *testing.T) {
	eight := []string{"n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8"}
	fp := func(latest map[string]Report, node string) string { return latest[node].Fingerprint }
	unknown := func(nodes ...string) []Group {
		var out []Group
		for _, n := range nodes {
			out = append(out, Group{Unknown, []string{n}})
		}
		return out
	}
	const loading = "unreadable: nvidia module not loaded, NVIDIA GPU on the PCI bus"
	bmcOnly := partialReports(nil)
	otherGPU := partialReports(map[string]string{"n8": "550.90.07", "n7": loading})
	allLoading := map[string]string{}
	for _, n := range eight {
		allLoading[n] = loading
	}
	rebooting := partialReports(allLoading, "c1", "c2")
	for _, tc := range []struct {
		name   string
		nodes  []string
		latest map[string]Report
		f9     float64
		groups []Group
	}{
		{"bmc unreadable on every node: one group", eight, bmcOnly, 1, []Group{{fp(bmcOnly, "n1"), eight}}},
		{"bmc unreadable on every node: another GPU driver, one rebooting", eight, otherGPU, 6.0 / 8,
			[]Group{{fp(otherGPU, "n1"), eight[:6]}, {fp(otherGPU, "n8"), []string{"n8"}}, {Unknown, []string{"n7"}}}},
		{"rebooting nodes beside complete reports are unknown", append([]string{"c1", "c2"}, eight...), rebooting, 2.0 / 10,
			append([]Group{{fp(rebooting, "c1"), []string{"c1", "c2"}}}, unknown(eight...)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := ComputeScore(tc.nodes, tc.latest)
			if s.F9 != tc.f9 || !reflect.DeepEqual(s.Groups, tc.groups) {
				t.Fatalf("got %+v, want f9 %v groups %v", s, tc.f9, tc.groups)
			}
		})
	}
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
		{"partial reports are unknown", []string{"a", "b", "c", "d"}, map[string]string{"a": "!u", "b": "!u", "c": "!u", "d": "x"}, 1.0 / 4,
			[]Group{{"unknown", []string{"a"}}, {"unknown", []string{"b"}}, {"unknown", []string{"c"}}, {"x", []string{"d"}}}},
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
		{"unknown does not vote", m("x", "", "y", "x", "x"), "", []State{Conforming, StateUnknown, Drifted, Conforming, Conforming}},
		// Every member is a voter: one without a fresh complete report
		// votes for no fingerprint (seed: unknown is a group of its own).
		{"unknown members leave no majority", m("x", "", "y", "x"), "", []State{Undecided, StateUnknown, Undecided, Undecided}},
		// 7 of 10 agents silent: 2 on x decide nothing, the 1 on y is not drifted.
		{"silent agents", m("x", "x", "y", "", "", "", "", "", "", ""), "", []State{Undecided, Undecided, Undecided,
			StateUnknown, StateUnknown, StateUnknown, StateUnknown, StateUnknown, StateUnknown, StateUnknown}},
		// 9 of 10 rebooted into a new image report partial (driver not
		// loaded yet); the straggler on the old image is not the majority.
		{"straggler", m("old", "!new", "!new", "!new", "!new", "!new", "!new", "!new", "!new", "!new"), "", []State{Undecided, Undecided,
			Undecided, Undecided, Undecided, Undecided, Undecided, Undecided, Undecided, Undecided}},
		{"tie is undecided", m("x", "y"), "", []State{Undecided, Undecided}},
		{"baseline wins over majority", m("x", "x", "y"), "y", []State{Drifted, Drifted, Conforming}},
		{"baseline nobody has", m("x"), "z", []State{Drifted}},
		{"lone node is its majority", m("x"), "", []State{Conforming}},
		{"partial reports do not vote", m("x", "x", "x", "y", "!u"), "", []State{Conforming, Conforming, Conforming, Drifted, Drifted}},
		{"partial reports leave no majority", m("x", "x", "y", "!u", "!u"), "", []State{Undecided, Undecided, Undecided, Undecided, Undecided}},
		{"only partial reports: undecided", m("!u", "!u"), "", []State{Undecided, Undecided}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := states(Evaluate(tc.members, tc.baseline)); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestEvaluateOnlyPartial: a group whose reports are all partial (bmc
// unreadable on every node: ipmitool configured, /dev/ipmi0 not passed
// through) is decided on the components readable somewhere: the node on
// another GPU driver is drifted; a node rebooting (its GPU driver
// unreadable too) neither votes nor makes the others drift.
func TestEvaluateOnlyPartial(t *testing.T) {
	const ipmi = "unreadable: ipmitool mc info: exit status 1: Could not open device at /dev/ipmi0"
	report := func(node, gpu, bmc string) *Report {
		comps := map[string]string{"gpu_driver": gpu, "bmc_version": bmc, "kernel": "6.8.0-45-generic"}
		return &Report{Node: node, Fingerprint: agentconf.Fingerprint(comps), Components: comps, Partial: true}
	}
	group := func(gpus ...string) []Member {
		var out []Member
		for i, gpu := range gpus {
			node := fmt.Sprintf("n%d", i+1)
			bmc := ipmi
			if strings.HasSuffix(gpu, "@") { // a reason naming the node
				gpu, bmc = strings.TrimSuffix(gpu, "@"), ipmi+" on "+node
			}
			out = append(out, Member{Node: node, Report: report(node, gpu, bmc)})
		}
		return out
	}
	const (
		a, b    = "550.54.14", "550.90.07"
		loading = "unreadable: nvidia module not loaded, NVIDIA GPU on the PCI bus"
		C, D, U = Conforming, Drifted, Undecided
	)
	for _, tc := range []struct {
		name    string
		members []Member
		want    []State
	}{
		{"node 10 on another GPU driver", group(a, a, a, a, a, a, a, a, a, b), []State{C, C, C, C, C, C, C, C, C, D}},
		{"reasons differ from node to node", group(a+"@", a+"@", a+"@", b+"@"), []State{C, C, C, D}},
		{"rebooting nodes do not vote", group(a, a, a, a, a, a, loading, loading, loading, loading), []State{C, C, C, C, C, C, D, D, D, D}},
		// The straggler: 6 of 10 rebooted into a new image (GPU driver
		// loading) do not make the 4 on the old one a majority.
		{"rebooting nodes leave no majority", group(a, a, a, a, loading, loading, loading, loading, loading, loading), []State{U, U, U, U, U, U, U, U, U, U}},
		{"tie is undecided", group(a, a, b, b, loading), []State{Undecided, Undecided, Undecided, Undecided, Undecided}},
		{"GPU driver unreadable on every node: judged on the rest", group(loading, loading), []State{C, C}},
		{"unknown node beside", append(group(a, a, a, b), Member{Node: "n5"}), []State{C, C, C, D, StateUnknown}},
		{"silent agents leave no majority", append(group(a, a, b), Member{Node: "n4"}, Member{Node: "n5"}), []State{U, U, U, StateUnknown, StateUnknown}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs := Evaluate(tc.members, "")
			for i, v := range vs {
				if v.State != tc.want[i] {
					t.Errorf("%s: %s, want %s", v.Node, v.State, tc.want[i])
				}
				if v.State == Conforming || v.State == Drifted {
					if v.Expected != tc.members[0].Report.Fingerprint || v.Basis != BasisMajority {
						t.Errorf("%s: expected %s (%s), want n1's fingerprint", v.Node, v.Expected, v.Basis)
					}
				}
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

// TestDefaultInstallMajority: agents as the Helm chart configures them
// (no os_image_file or os_image_command, no bmc_command) on GPU nodes, and
// on CPU-only Ethernet nodes (no GPU, no RDMA device), report what they do
// not have as a stable value, so their reports vote: the one node on
// another GPU driver (kernel) is drifted, the others conforming. Partial is
// what Latest computes (a component value LIKE unreadablePattern).
func TestDefaultInstallMajority(t *testing.T) {
	for _, tc := range []struct{ tree, file, other string }{
		{"h100-a", "sys/module/nvidia/version", "550.90.07"},
		{"no-gpu", "proc/sys/kernel/osrelease", "6.8.0-50-generic"},
	} {
		t.Run(tc.tree, func(t *testing.T) {
			fixture := filepath.Join("..", "..", "agents", "conformance", "testdata", tc.tree)
			other := t.TempDir()
			if err := os.CopyFS(other, os.DirFS(fixture)); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(other, tc.file), []byte(tc.other+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			report := func(node, root string) *Report {
				cfg := agentconf.DefaultConfig()
				cfg.Sysfs, cfg.Procfs, cfg.BMCCommand = filepath.Join(root, "sys"), filepath.Join(root, "proc"), nil
				c, err := agentconf.New(cfg, nil)
				if err != nil {
					t.Fatal(err)
				}
				comps := c.Collect(t.Context())
				r := &Report{Node: node, Fingerprint: agentconf.Fingerprint(comps), Components: comps}
				for _, v := range comps {
					r.Partial = r.Partial || strings.HasPrefix(v, strings.TrimSuffix(unreadablePattern, "%"))
				}
				return r
			}
			var members []Member
			for i := 1; i <= 4; i++ {
				members = append(members, Member{Node: fmt.Sprintf("n%d", i), Report: report(fmt.Sprintf("n%d", i), fixture)})
			}
			members = append(members, Member{Node: "n5", Report: report("n5", other)})
			want := []State{Conforming, Conforming, Conforming, Conforming, Drifted}
			for i, v := range Evaluate(members, "") {
				if v.State != want[i] {
					t.Errorf("%s: %s (components %v), want %s", v.Node, v.State, members[i].Report.Components, want[i])
				}
			}
		})
	}
}

func ExampleDiff() {
	fmt.Println(Diff(map[string]string{"gpu_driver": "550.54.14", "kernel": "6.8.0-45"},
		map[string]string{"gpu_driver": "550.90.07", "kernel": "6.8.0-45", "ofed": "24.07"}))
	// Output: [gpu_driver: expected "550.54.14", actual "550.90.07" ofed: expected "(none)", actual "24.07"]
}
