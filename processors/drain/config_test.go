package drain

import (
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestValidateNamesTheBadKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		key  string
	}{
		{"mode", func(c *Config) { c.Mode = "Gently" }, "drain.mode"},
		{"rule mode", func(c *Config) { c.Rules = []Rule{{Mode: "x"}} }, "drain.rules[0].mode"},
		{"rule namespace", func(c *Config) { c.Rules = []Rule{{Mode: ModeImmediate, Namespace: "("}} }, "drain.rules[0].namespace"},
		{"rule selector", func(c *Config) { c.Rules = []Rule{{Mode: ModeImmediate, Selector: "a in ("}} }, "drain.rules[0].selector"},
		{"system", func(c *Config) { c.SystemNamespaces = "" }, "drain.system_namespaces"},
		{"system without kube-system", func(c *Config) { c.SystemNamespaces = "monitoring" }, "drain.system_namespaces"},
		{"system without kube-node-lease", func(c *Config) { c.SystemNamespaces = "kube-system|kube-public" }, "drain.system_namespaces"},
		{"empty dir", func(c *Config) { c.EmptyDir = "keep" }, "drain.empty_dir"},
		{"poll", func(c *Config) { c.PollInterval = 0 }, "drain.poll_interval"},
		{"skip wait", func(c *Config) { c.SkipWaitForDeleteTimeout = -time.Second }, "drain.skip_wait_for_delete_timeout"},
		{"sub-second grace", func(c *Config) { c.GracePeriod = 500 * time.Millisecond }, "drain.grace_period"},
		{"grace not whole seconds", func(c *Config) { c.GracePeriod = 1500 * time.Millisecond }, "drain.grace_period"},
		{"workers", func(c *Config) { c.Workers = 0 }, "drain.workers"},
		{"batch timeout", func(c *Config) { c.BatchTimeout = 0 }, "drain.batch_timeout"},
		{"slow cluster", func(c *Config) { c.SlowCluster = -time.Second }, "drain.slow_cluster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mod(&c)
			err := c.Validate("drain.")
			if err == nil || !strings.HasPrefix(err.Error(), tc.key+":") {
				t.Fatalf("want error naming %s, got %v", tc.key, err)
			}
		})
	}
	c := DefaultConfig()
	if err := c.Validate("drain."); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, g := range []time.Duration{-time.Second, 0, 30 * time.Second} {
		c := DefaultConfig()
		c.GracePeriod = g
		if err := c.Validate("drain."); err != nil {
			t.Fatalf("grace_period %v: %v", g, err)
		}
	}
}

func TestParseRule(t *testing.T) {
	r, err := ParseRule("DeleteAfterTimeout,namespace=batch-.*,selector=tier=train,timeout=15m")
	if err != nil || r.Mode != ModeDeleteAfterTimeout || r.Namespace != "batch-.*" || r.Selector != "tier=train" || r.Timeout != 15*time.Minute {
		t.Fatalf("%+v %v", r, err)
	}
	if _, err := ParseRule("Immediate,colour=red"); err == nil {
		t.Fatal("unknown key accepted")
	}
}

// GPU UUIDs of the tests (events.IsGPUUUID).
const (
	gpuA = "GPU-0000000a-0000-0000-0000-00000000000a"
	gpuB = "GPU-0000000b-0000-0000-0000-00000000000b"
)

func TestClassify(t *testing.T) {
	c := DefaultConfig()
	c.EmptyDir = EmptyDirSkip
	c.Rules = []Rule{{Namespace: "batch-.*", Selector: "tier=train", Mode: ModeAllowCompletion}}
	if err := c.Validate("drain."); err != nil {
		t.Fatal(err)
	}
	gpuPod := func(ann string) *corev1.Pod {
		p := pod("ml", nil)
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{resourceGPU: resource.MustParse("1")}
		if ann != "" {
			p.Annotations = map[string]string{DefaultGPUAnnotation: ann}
		}
		return p
	}
	// requesting is a pod requesting one of an extended resource.
	requesting := func(res corev1.ResourceName) *corev1.Pod {
		p := pod("ml", nil)
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{res: resource.MustParse("1")}
		return p
	}
	withEnv := pod("ml", nil)
	withEnv.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: gpuB + "," + gpuA}}
	emptyDir := pod("ml", nil)
	emptyDir.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	listedAt := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	kubelet := func(pods ...string) Scope {
		return Scope{GPUs: []string{gpuA}, GPUPods: &PodList{Pods: pods, At: listedAt}}
	}
	// started is a GPU pod created at created and started on the node
	// at started (zero: not yet).
	started := func(created, started time.Time) *corev1.Pod {
		p := gpuPod("")
		p.CreationTimestamp = metav1.NewTime(created)
		if !started.IsZero() {
			st := metav1.NewTime(started)
			p.Status.StartTime = &st
		}
		return p
	}
	hourBefore := listedAt.Add(-time.Hour)
	// The kubelet lists at 12:00:00.5; a pod started 200 ms later has
	// the StartTime 12:00:00 (whole seconds, truncated).
	otherListed := started(hourBefore, hourBefore)
	otherListed.Annotations = map[string]string{DefaultGPUAnnotation: gpuB}
	halfPast := Scope{GPUs: []string{gpuA}, GPUPods: &PodList{At: listedAt.Add(500 * time.Millisecond)}}
	for _, tc := range []struct {
		name  string
		pod   *corev1.Pod
		scope Scope
		want  string // skip reason or mode
	}{
		{"system", pod("kube-system", nil), Scope{}, SkipSystem},
		{"faultline's own", pod("faultline", nil), Scope{}, SkipSystem},
		{"rule", pod("batch-7", map[string]string{"tier": "train"}), Scope{}, string(ModeAllowCompletion)},
		{"rule selector misses", pod("batch-7", nil), Scope{}, string(ModeImmediate)},
		{"emptyDir skipped", emptyDir, Scope{}, SkipEmptyDir},
		{"partial: annotated other GPU", gpuPod(gpuB), Scope{GPUs: []string{gpuA}}, SkipOutOfScope},
		{"partial: annotated this GPU", gpuPod(gpuB + ", " + gpuA), Scope{GPUs: []string{gpuA}}, string(ModeImmediate)},
		{"partial: GPU unknown but requested", gpuPod(""), Scope{GPUs: []string{gpuA}}, string(ModeImmediate)},
		{"partial: no GPU", pod("ml", nil), Scope{GPUs: []string{gpuA}}, SkipOutOfScope},
		{"partial: env", withEnv, Scope{GPUs: []string{gpuA}}, string(ModeImmediate)},
		{"partial: requests a MIG device", requesting("nvidia.com/mig-1g.10gb"), Scope{GPUs: []string{gpuA}}, string(ModeImmediate)},
		{"partial: requests a shared MIG device", requesting("nvidia.com/mig-1g.10gb.shared"), Scope{GPUs: []string{gpuA}}, string(ModeImmediate)},
		{"partial: requests a time-sliced GPU", requesting("nvidia.com/gpu.shared"), Scope{GPUs: []string{gpuA}}, string(ModeImmediate)},
		{"partial: requests nvidia.com/gpu", requesting(resourceGPU), Scope{GPUs: []string{gpuA}}, string(ModeImmediate)},
		{"partial: requests a NIC", requesting("nvidia.com/rdma_shared_device_a"), Scope{GPUs: []string{gpuA}}, SkipOutOfScope},
		{"partial: the kubelet lists it", started(hourBefore, hourBefore), kubelet("other/q", "ml/p"), string(ModeImmediate)},
		{"partial: the kubelet lists others", started(hourBefore, hourBefore), kubelet("ml/q"), SkipOutOfScope},
		{"partial: the kubelet lists none", started(hourBefore, hourBefore), kubelet(), SkipOutOfScope},
		{"partial: created after the listing", started(listedAt.Add(time.Second), listedAt.Add(time.Second)), kubelet(), string(ModeImmediate)},
		{"partial: started in the listing's second, after it", started(listedAt, listedAt), halfPast, string(ModeImmediate)},
		{"partial: pending before the listing, started after", started(hourBefore, listedAt.Add(time.Minute)), kubelet(), string(ModeImmediate)},
		{"partial: created before the listing, not started", started(hourBefore, time.Time{}), kubelet(), string(ModeImmediate)},
		{"partial: annotated this GPU, not listed", gpuPod(gpuA), kubelet(), string(ModeImmediate)},
		{"partial: annotated other GPU, listed", otherListed, kubelet("ml/p"), string(ModeImmediate)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl := c.classify(tc.pod, tc.scope, false)
			got := pl.skip
			if got == "" {
				got = string(pl.mode)
			}
			if got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
}

// TestRuleNamespace: a rule's namespace is matched against the whole
// name, and a rule with none matches every namespace
// ("--drain.rules=AllowCompletion,selector=app=trainer" matched no pod).
func TestRuleNamespace(t *testing.T) {
	trainer := map[string]string{"app": "trainer"}
	for _, tc := range []struct {
		name string
		rule Rule
		pod  *corev1.Pod
		want Mode
	}{
		{"no namespace, selector matches", Rule{Selector: "app=trainer", Mode: ModeAllowCompletion}, pod("ml", trainer), ModeAllowCompletion},
		{"no namespace, another namespace", Rule{Selector: "app=trainer", Mode: ModeAllowCompletion}, pod("team-b", trainer), ModeAllowCompletion},
		{"no namespace, selector misses", Rule{Selector: "app=trainer", Mode: ModeAllowCompletion}, pod("ml", nil), ModeImmediate},
		{"no namespace, no selector: every pod", Rule{Mode: ModeDeleteAfterTimeout}, pod("ml", nil), ModeDeleteAfterTimeout},
		{"namespace matches the whole name", Rule{Namespace: "ml", Mode: ModeAllowCompletion}, pod("ml", nil), ModeAllowCompletion},
		{"namespace is not a substring match", Rule{Namespace: "ml", Mode: ModeAllowCompletion}, pod("ml-dev", nil), ModeImmediate},
		{"alternatives are anchored together", Rule{Namespace: "a|ml", Mode: ModeAllowCompletion}, pod("xml", nil), ModeImmediate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Rules = []Rule{tc.rule}
			if err := c.Validate("drain."); err != nil {
				t.Fatal(err)
			}
			pl := c.classify(tc.pod, Scope{}, false)
			if pl.skip != "" || pl.mode != tc.want {
				t.Fatalf("got mode %q skip %q, want %s", pl.mode, pl.skip, tc.want)
			}
		})
	}
	// As the flag spells it.
	r, err := ParseRule("AllowCompletion,selector=app=trainer")
	if err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.Rules = []Rule{r}
	if err := c.Validate("drain."); err != nil {
		t.Fatal(err)
	}
	if pl := c.classify(pod("ml", trainer), Scope{}, false); pl.mode != ModeAllowCompletion {
		t.Fatalf("flag rule: got %q, want AllowCompletion", pl.mode)
	}
}

// TestSystemNamespaces: system_namespaces is matched against the whole
// namespace name, however it is written ("kube-system|monitoring" also
// skipped "ml-monitoring-x").
func TestSystemNamespaces(t *testing.T) {
	const kubeNS = "kube-system|kube-public|kube-node-lease"
	for _, tc := range []struct {
		pattern, ns string
		skip        bool
	}{
		{kubeNS + "|monitoring", "monitoring", true},
		{kubeNS + "|monitoring", "kube-system", true},
		{kubeNS + "|monitoring", "ml-monitoring-x", false},
		{kubeNS + "|monitoring", "kube-system-extra", false},
		{kubeNS + "|monitoring-.*", "monitoring-x", true},
		{kubeNS + "|monitoring-.*", "ml-monitoring-x", false},
		{".*", "anything", true},
		{DefaultSystemNamespaces, "faultline-agents", true},
		{DefaultSystemNamespaces, "kube-public", true},
		{DefaultSystemNamespaces, "my-kube-system", false},
	} {
		t.Run(tc.pattern+" "+tc.ns, func(t *testing.T) {
			c := DefaultConfig()
			c.SystemNamespaces = tc.pattern
			if err := c.Validate("drain."); err != nil {
				t.Fatal(err)
			}
			if got := c.classify(pod(tc.ns, nil), Scope{}, false).skip == SkipSystem; got != tc.skip {
				t.Fatalf("skipped as system: %v, want %v", got, tc.skip)
			}
		})
	}
}

func pod(ns string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

func TestScopeWiden(t *testing.T) {
	t1, t2 := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC), time.Date(2026, 11, 22, 12, 5, 0, 0, time.UTC)
	a := Scope{GPUs: []string{gpuA}, GPUPods: &PodList{Pods: []string{"ml/p"}, At: t2}}
	b := Scope{GPUs: []string{gpuB, gpuA}, GPUPods: &PodList{Pods: []string{"ml/q", "ml/p"}, At: t1}}
	for _, tc := range []struct {
		name       string
		s, o, want Scope
	}{
		{"node covers all", Scope{}, a, Scope{}},
		{"all covers node", a, Scope{}, Scope{}},
		{"GPUs and listings add up, the earlier time", a, b,
			Scope{GPUs: []string{gpuA, gpuB}, GPUPods: &PodList{Pods: []string{"ml/p", "ml/q"}, At: t1}}},
		{"one listing unknown: unknown", a, Scope{GPUs: []string{gpuB}}, Scope{GPUs: []string{gpuA, gpuB}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.s.widen(tc.o); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("widen = %+v (pods %+v), want %+v (pods %+v)", got, got.GPUPods, tc.want, tc.want.GPUPods)
			}
		})
	}
}

// TestUsesGPUUnnamed: without a kubelet listing, a pod is judged by its
// names only where they name GPUs (a UUID, or "all"); a container that
// requests a GPU and names none — a sidecar's "void" elsewhere in the pod
// notwithstanding, an index, a MIG id, an empty value — makes the pod
// unknown, so it is evicted. Before, any NVIDIA_VISIBLE_DEVICES or GPU
// annotation took the pod for naming its GPUs: a job requesting 8 GPUs
// with a "void" sidecar stayed on the GPU being reset.
func TestUsesGPUUnnamed(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate("drain."); err != nil {
		t.Fatal(err)
	}
	gpus := corev1.ResourceList{resourceGPU: resource.MustParse("8")}
	ctr := func(name, visible string, res corev1.ResourceList) corev1.Container {
		ct := corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Limits: res}}
		if visible != "-" {
			ct.Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: visible}}
		}
		return ct
	}
	for _, tc := range []struct {
		name string
		ann  map[string]string
		ctrs []corev1.Container
		want bool
	}{
		{"train requests 8, a void sidecar", nil, []corev1.Container{ctr("train", "-", gpus), ctr("logs", "void", nil)}, true},
		{"train requests 8, a none sidecar", nil, []corev1.Container{ctr("train", "-", gpus), ctr("logs", "none", nil)}, true},
		{"requests, names an index", nil, []corev1.Container{ctr("train", "0", gpus)}, true},
		{"requests, names a MIG id", nil, []corev1.Container{ctr("train", "MIG-0a1b2c3d-0000-0000-0000-000000000000", gpus)}, true},
		{"requests, an empty value", nil, []corev1.Container{ctr("train", "", gpus)}, true},
		{"requests, an empty annotation", map[string]string{DefaultGPUAnnotation: ""}, []corev1.Container{ctr("train", "-", gpus)}, true},
		{"requests, names another GPU's UUID", nil, []corev1.Container{ctr("train", gpuB, gpus)}, false},
		{"requests, the annotation names another GPU", map[string]string{DefaultGPUAnnotation: gpuB}, []corev1.Container{ctr("train", "-", gpus)}, false},
		{"requests, names the GPU", nil, []corev1.Container{ctr("train", gpuA, gpus)}, true},
		{"requests, names the GPU in upper case", nil, []corev1.Container{ctr("train", "GPU-"+strings.ToUpper(strings.TrimPrefix(gpuA, "GPU-")), gpus)}, true},
		{"requests, names all", nil, []corev1.Container{ctr("train", "all", gpus)}, true},
		{"one container names another GPU, a second requests unnamed", nil, []corev1.Container{ctr("a", gpuB, gpus), ctr("b", "-", gpus)}, true},
		{"requests none, a void sidecar", nil, []corev1.Container{ctr("web", "-", nil), ctr("logs", "void", nil)}, false},
		{"requests none, names none", nil, []corev1.Container{ctr("web", "-", nil)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pod("ml", nil)
			p.Annotations = tc.ann
			p.Spec.Containers = tc.ctrs
			if got := c.usesGPU(p, Scope{GPUs: []string{gpuA}}); got != tc.want {
				t.Errorf("usesGPU = %v, want %v", got, tc.want)
			}
		})
	}
}
