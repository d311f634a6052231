package drain

import (
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
		{"empty dir", func(c *Config) { c.EmptyDir = "keep" }, "drain.empty_dir"},
		{"poll", func(c *Config) { c.PollInterval = 0 }, "drain.poll_interval"},
		{"workers", func(c *Config) { c.Workers = 0 }, "drain.workers"},
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
	withEnv := pod("ml", nil)
	withEnv.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "GPU-b,GPU-a"}}
	emptyDir := pod("ml", nil)
	emptyDir.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		gpus []string
		want string // skip reason or mode
	}{
		{"system", pod("kube-system", nil), nil, SkipSystem},
		{"faultline's own", pod("faultline", nil), nil, SkipSystem},
		{"rule", pod("batch-7", map[string]string{"tier": "train"}), nil, string(ModeAllowCompletion)},
		{"rule selector misses", pod("batch-7", nil), nil, string(ModeImmediate)},
		{"emptyDir skipped", emptyDir, nil, SkipEmptyDir},
		{"partial: annotated other GPU", gpuPod("GPU-b"), []string{"GPU-a"}, SkipOutOfScope},
		{"partial: annotated this GPU", gpuPod("GPU-b, GPU-a"), []string{"GPU-a"}, string(ModeImmediate)},
		{"partial: GPU unknown but requested", gpuPod(""), []string{"GPU-a"}, string(ModeImmediate)},
		{"partial: no GPU", pod("ml", nil), []string{"GPU-a"}, SkipOutOfScope},
		{"partial: env", withEnv, []string{"GPU-a"}, string(ModeImmediate)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl := c.classify(tc.pod, tc.gpus, false)
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

func pod(ns string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
}
