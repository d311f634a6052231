package gang

import (
	"context"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	dynfake "k8s.io/client-go/dynamic/fake"
)

func TestIdentify(t *testing.T) {
	d := NewDiscovery(WorkloadMethod{}, VolcanoMethod{}, KueueMethod{}, LabelsMethod{IDLabel: "example.com/gang", SizeLabel: "example.com/gang-size"})
	mk := func(labels, annots map[string]string) Pod {
		return Pod{Pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "training", Labels: labels, Annotations: annots}}}
	}
	for _, tc := range []struct {
		name         string
		pod          Pod
		method, id   string
		expected     int
		wantSingleOK bool
	}{
		{name: "singleton", pod: mk(nil, nil), wantSingleOK: true},
		{name: "workloadRef", pod: func() Pod {
			p := mk(nil, map[string]string{"volcano.sh/pod-group": "pg"})
			p.WorkloadRef = &WorkloadRef{Name: "llm", PodGroup: "workers", PodGroupReplicaKey: "3"}
			return p
		}(), method: "workloadRef", id: "wl-llm-workers-3"},
		{name: "volcano annotation set by volcano", pod: mk(nil, map[string]string{"scheduling.k8s.io/group-name": "job-a"}), method: "volcano", id: "volcano-job-a"},
		{name: "volcano annotation of the ADR", pod: mk(nil, map[string]string{"volcano.sh/pod-group": "job-b"}), method: "volcano", id: "volcano-job-b"},
		{name: "kueue workload label with total count", pod: mk(map[string]string{KueueWorkloadLabel: "wl-1"}, map[string]string{KueueTotalCountAnnot: "4"}),
			method: "kueue", id: "kueue-wl-1", expected: 4},
		{name: "kueue pod group label", pod: mk(map[string]string{KueuePodGroupLabel: "grp"}, nil), method: "kueue", id: "kueue-grp"},
		{name: "configured labels", pod: mk(map[string]string{"example.com/gang": "Run.7", "example.com/gang-size": "16"}, nil),
			method: "labels", id: "lbl-run-7-81571460", expected: 16},
		{name: "volcano wins over kueue (order of methods)", pod: mk(map[string]string{KueueWorkloadLabel: "wl"}, map[string]string{"volcano.sh/pod-group": "pg"}),
			method: "volcano", id: "volcano-pg"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, ok := d.Identify(tc.pod)
			if tc.wantSingleOK {
				if ok {
					t.Fatalf("singleton got gang %+v", g)
				}
				return
			}
			if !ok || g.Method != tc.method || g.ID != tc.id || g.Expected != tc.expected || g.Namespace != "training" {
				t.Fatalf("got %+v (%v), want method %s id %s expected %d", g, ok, tc.method, tc.id, tc.expected)
			}
			if errs := validation.IsDNS1123Subdomain(g.ConfigMapName()); len(errs) > 0 {
				t.Errorf("ConfigMap name %q: %v", g.ConfigMapName(), errs)
			}
		})
	}
}

func TestMakeID(t *testing.T) {
	long := strings.Repeat("Very_Long-Job.Name", 10)
	ids := map[string]bool{}
	for _, parts := range [][]string{{"volcano", "a"}, {"lbl", "A B/C"}, {"x", long}, {"x", long + "2"}, {"--", "__"}, {"wl", "a", "", "0"}} {
		id := MakeID(parts...)
		if len(id) > 52 || !regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$`).MatchString(id) {
			t.Errorf("MakeID(%q) = %q: not a valid ID", parts, id)
		}
		if errs := validation.IsValidLabelValue(id); len(errs) > 0 {
			t.Errorf("MakeID(%q) = %q: %v", parts, id, errs)
		}
		if errs := validation.IsDNS1123Subdomain(ConfigMapPrefix + id); len(errs) > 0 {
			t.Errorf("MakeID(%q) = %q: %v", parts, id, errs)
		}
		if ids[id] {
			t.Errorf("MakeID(%q) = %q collides", parts, id)
		}
		ids[id] = true
	}
	if MakeID("x", long) == MakeID("x", long+"2") {
		t.Error("long IDs differing at the end collide")
	}
	if MakeID("volcano", "Job") != MakeID("volcano", "Job") {
		t.Error("not deterministic")
	}
}

// TestMakeIDDistinct: distinct (method, parts) give distinct IDs — names
// with characters folded by the sanitising once shared one ID, so two
// gangs of a namespace shared a selector, ConfigMap and size — and every
// ID is a valid label value and ConfigMap name. Clean parts keep the ID
// earlier versions gave them (pods admitted before an upgrade carry it);
// parts whose dashes fall differently still share one.
func TestMakeIDDistinct(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b []string
	}{
		{"folded characters", []string{"lbl", "Job_1"}, []string{"lbl", "job-1"}},
		{"upper vs lower case", []string{"lbl", "Job1"}, []string{"lbl", "job1"}},
		{"empty part", []string{"wl", "a", "", "0"}, []string{"wl", "a", "0"}},
		{"method vs value", []string{"volcano", "x"}, []string{"kueue", "x"}},
		{"trimmed edges", []string{"lbl", "-x"}, []string{"lbl", "x"}},
		{"dots", []string{"lbl", "a.b"}, []string{"lbl", "a-b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := MakeID(tc.a...), MakeID(tc.b...)
			if a == b {
				t.Fatalf("MakeID(%q) = MakeID(%q) = %q", tc.a, tc.b, a)
			}
			for _, id := range []string{a, b} {
				if len(id) > 52 {
					t.Errorf("%q: longer than 52", id)
				}
				if errs := validation.IsValidLabelValue(id); len(errs) > 0 {
					t.Errorf("%q: %v", id, errs)
				}
				if errs := validation.IsDNS1123Subdomain(ConfigMapPrefix + id); len(errs) > 0 {
					t.Errorf("%q: %v", id, errs)
				}
			}
		})
	}
	// Clean parts keep the readable join, the IDs of earlier versions.
	for _, tc := range []struct {
		parts []string
		want  string
	}{{[]string{"wl", "llm", "workers", "3"}, "wl-llm-workers-3"}, {[]string{"kueue", "train-job-1"}, "kueue-train-job-1"},
		{[]string{"volcano", "pg.7"}, "volcano-pg.7"},
		{[]string{"kueue", "job-llama3-70b-finetune-sweep-learning-rate-3e-5-run-7-7f9c2"}, "kueue-job-llama3-70b-finetune-sweep-learnin-9eeb9ff5"},
		{[]string{"kueue", "pod-my-long-distributed-training-job-name-0-8a7b3"}, "kueue-pod-my-long-distributed-training-job-7f3b3139"}} {
		if id := MakeID(tc.parts...); id != tc.want {
			t.Errorf("MakeID(%q) = %q, want %q (as earlier versions)", tc.parts, id, tc.want)
		}
	}
}

func TestDecodePod(t *testing.T) {
	p, err := DecodePod([]byte(`{"metadata":{"name":"a"},"spec":{"workloadRef":{"name":"w","podGroup":"g"},"schedulingGroup":{"podGroupName":"pg"},"containers":[{"name":"c"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "a" || p.WorkloadRef == nil || p.WorkloadRef.Name != "w" || p.SchedulingGroup != "pg" || len(p.Spec.Containers) != 1 {
		t.Fatalf("%+v", p)
	}
	if _, err := DecodePod([]byte(`{"spec":`)); err == nil {
		t.Fatal("truncated JSON accepted")
	}
	// Names match as the API server matches them, case-sensitively: it
	// would drop "speC", so the webhook must not patch what it reads there.
	p, err = DecodePod([]byte(`{"metadata":{"Name":"a"},"speC":{"containers":[{"name":"c"}],"workloadRef":{"name":"w"}},"spec":{"SchedulingGroup":{"podGroupName":"pg"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "" || len(p.Spec.Containers) != 0 || p.WorkloadRef != nil || p.SchedulingGroup != "" {
		t.Fatalf("fields read under names the API server does not know: %+v", p)
	}
}

type lister []*corev1.Pod

func (l lister) GangPods(ns, id string) ([]*corev1.Pod, error) {
	var out []*corev1.Pod
	for _, p := range l {
		if p.Namespace == ns && p.Labels[LabelGang] == id {
			out = append(out, p)
		}
	}
	return out, nil
}

func TestDiscoverGang(t *testing.T) {
	mk := func(name, id, ip string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "training", Labels: map[string]string{LabelGang: id}},
			Spec: corev1.PodSpec{NodeName: "node-" + name}, Status: corev1.PodStatus{PodIP: ip}}
	}
	l := lister{mk("w-2", "g", "10.0.0.3"), mk("w-10", "g", "10.0.0.11"), mk("w-1", "g", "10.0.0.2"), mk("x", "other", "10.0.0.9")}
	peers, err := NewDiscovery().DiscoverGang(l, l[0])
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range peers {
		got = append(got, p.PodName+"@"+p.PodIP+"@"+p.NodeName)
	}
	if strings.Join(got, ",") != "w-1@10.0.0.2@node-w-1,w-10@10.0.0.11@node-w-10,w-2@10.0.0.3@node-w-2" {
		t.Fatalf("peers %v", got)
	}
	single := mk("solo", "", "10.0.0.5")
	delete(single.Labels, LabelGang)
	peers, _ = NewDiscovery().DiscoverGang(l, single)
	if len(peers) != 1 || peers[0].PodName != "solo" {
		t.Fatalf("singleton peers %v", peers)
	}
}

func TestLabelsExpected(t *testing.T) {
	m := LabelsMethod{IDLabel: "gang", SizeLabel: "size"}
	member := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: map[string]string{"gang": "a", "size": "three"}}}
	if _, err := m.Expected(context.Background(), Gang{}, member); err == nil || !strings.Contains(err.Error(), `label size="three" is not a gang size`) {
		t.Fatalf("err %v", err)
	}
	member.Labels["size"] = "3"
	if n, err := m.Expected(context.Background(), Gang{}, member); err != nil || n != 3 {
		t.Fatalf("%d %v", n, err)
	}
	if _, ok := m.Identify(Pod{Pod: &corev1.Pod{}}); ok {
		t.Fatal("pod without the label identified")
	}
}

// The Workload API (scheduling.k8s.io/v1alpha1, Kubernetes 1.35) is newer
// than the test API server, so its minCount lookup runs against client-go's
// fake dynamic client with the object as the KEP-4671 API defines it.
func TestWorkloadExpected(t *testing.T) {
	wl := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.k8s.io/v1alpha1", "kind": "Workload",
		"metadata": map[string]any{"name": "llm", "namespace": "training"},
		"spec": map[string]any{"podGroups": []any{
			map[string]any{"name": "driver", "policy": map[string]any{"basic": map[string]any{}}},
			map[string]any{"name": "workers", "policy": map[string]any{"gang": map[string]any{"minCount": int64(4)}}},
		}}}}
	gvr := schema.GroupVersionResource{Group: "scheduling.k8s.io", Version: "v1alpha1", Resource: "workloads"}
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "WorkloadList"}, wl)
	m := WorkloadMethod{Dyn: dyn}
	g, _ := m.Identify(Pod{Pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "training"}},
		WorkloadRef: &WorkloadRef{Name: "llm", PodGroup: "workers", PodGroupReplicaKey: "1"}})
	n, err := m.Expected(context.Background(), g, nil)
	if err != nil || n != 4 {
		t.Fatalf("expected %d, %v", n, err)
	}
	g.Name = "llm/evaluators"
	if _, err := m.Expected(context.Background(), g, nil); err == nil || !strings.Contains(err.Error(), `no pod group "evaluators"`) {
		t.Fatalf("err %v", err)
	}
}
