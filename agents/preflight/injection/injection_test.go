package injection

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/agents/preflight/checks"
	"github.com/faultline/faultline/agents/preflight/gang"
)

// classMap answers DeviceClasses from a map keyed by the claim's
// resourceClaimName or resourceClaimTemplateName (the real resolver, over
// the API server, is exercised by the webhook's kube tests).
type classMap map[string][]string

func (c classMap) DeviceClasses(_ context.Context, _ string, pc corev1.PodResourceClaim) ([]string, error) {
	if pc.ResourceClaimName != nil {
		return c[*pc.ResourceClaimName], nil
	}
	return c[*pc.ResourceClaimTemplateName], nil
}

func testInjector(mod func(*Config)) *Injector {
	cfg := Config{
		Checks:        []CheckSpec{{Name: checks.DCGMDiag}, {Name: checks.NCCLLoopback}, {Name: checks.NCCLAllreduce}},
		GPU:           Detection{ResourceNames: []string{"nvidia.com/gpu"}, DeviceClasses: []string{"gpu.nvidia.com"}},
		Network:       Detection{ResourceNames: []string{"nvidia.com/mlnxnics", "rdma/ib"}, DeviceClasses: []string{"rdma.example.com"}},
		EnvPatterns:   []string{"NCCL_*", "UCX_*"},
		Image:         "faultline-preflight:test",
		StateHostPath: "/var/lib/faultline-preflight",
		TokenSecret:   "faultline-preflight-token",
		Runner:        checks.DefaultConfig(),
	}
	if mod != nil {
		mod(&cfg)
	}
	return New(cfg, classMap{"gpus": {"gpu.nvidia.com"}, "nic-tmpl": {"rdma.example.com"}, "other": {"fpga.example.com"}},
		gang.NewDiscovery(gang.LabelsMethod{IDLabel: "gang", SizeLabel: "gang-size"}))
}

func res(kv ...string) corev1.ResourceRequirements {
	l := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return corev1.ResourceRequirements{Limits: l, Requests: l.DeepCopy()}
}

func pod(mod func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "trainer-0", Namespace: "training"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "trainer"}}}}
	if mod != nil {
		mod(p)
	}
	return p
}

// apply applies a patch Mutate returned to the pod's JSON, as the API
// server does (nil: no change).
func apply(t *testing.T, p *corev1.Pod, patch []byte) *corev1.Pod {
	t.Helper()
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var out corev1.Pod
	if err := json.Unmarshal(applyRaw(t, raw, patch), &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// applyRaw applies patch (nil: none) to a pod's JSON.
func applyRaw(t *testing.T, raw, patch []byte) []byte {
	t.Helper()
	if patch == nil {
		return raw
	}
	ops, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatalf("patch %s: %v", patch, err)
	}
	out, err := ops.Apply(raw)
	if err != nil {
		t.Fatalf("patch %s does not apply to %s: %v", patch, raw, err)
	}
	return out
}

func names(cs []corev1.Container) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

func envNames(c corev1.Container) []string {
	var out []string
	for _, e := range c.Env {
		out = append(out, e.Name)
	}
	return out
}

func TestMutate(t *testing.T) {
	for _, tc := range []struct {
		name      string
		pod       *corev1.Pod
		mod       func(*Config)
		outcome   string
		inits     []string
		skipped   string
		check     func(t *testing.T, p *corev1.Pod)
		gangLabel string
	}{
		{name: "no GPU", pod: pod(func(p *corev1.Pod) { p.Spec.Containers[0].Resources = res("cpu", "4", "rdma/ib", "1") }), outcome: "no_gpu"},
		{name: "GPU, no network: NCCL checks skipped",
			pod:     pod(func(p *corev1.Pod) { p.Spec.Containers[0].Resources = res("nvidia.com/gpu", "2") }),
			outcome: "injected", inits: []string{"preflight-dcgm-diag"},
			skipped: "nccl-loopback: no network devices; nccl-allreduce: no network devices"},
		{name: "largest GPU and network counts of all containers, user init container kept last",
			pod: pod(func(p *corev1.Pod) {
				p.Spec.Containers[0].Resources = res("nvidia.com/gpu", "4", "rdma/ib", "1")
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "side", Resources: res("nvidia.com/gpu", "8", "nvidia.com/mlnxnics", "4")})
				p.Spec.InitContainers = []corev1.Container{{Name: "user-init", Image: "busybox", Resources: res("rdma/ib", "2")}}
			}),
			outcome: "injected", inits: []string{"preflight-dcgm-diag", "preflight-nccl-loopback", "user-init"}, skipped: "nccl-allreduce: not in a gang",
			check: func(t *testing.T, p *corev1.Pod) {
				dcgm, loop := p.Spec.InitContainers[0], p.Spec.InitContainers[1]
				if q := dcgm.Resources.Limits["nvidia.com/gpu"]; q.String() != "8" {
					t.Errorf("dcgm gpus %s", q.String())
				}
				if _, ok := dcgm.Resources.Limits["rdma/ib"]; ok {
					t.Error("dcgm-diag got network devices")
				}
				for rn, want := range map[corev1.ResourceName]string{"nvidia.com/gpu": "8", "nvidia.com/mlnxnics": "4", "rdma/ib": "2"} {
					if q := loop.Resources.Limits[rn]; q.String() != want {
						t.Errorf("loopback %s = %s, want %s", rn, q.String(), want)
					}
					if q := loop.Resources.Requests[rn]; q.String() != want {
						t.Errorf("loopback request %s = %s", rn, q.String())
					}
				}
				if !slices.Equal(loop.Command, []string{"faultline-preflight"}) || !slices.Equal(loop.Args[:2], []string{"check", "nccl-loopback"}) {
					t.Errorf("command %v %v", loop.Command, loop.Args)
				}
			}},
		{name: "NCCL env by glob, NCCL_TOPO_FILE with its volume",
			pod: pod(func(p *corev1.Pod) {
				c := &p.Spec.Containers[0]
				c.Resources = res("nvidia.com/gpu", "8", "rdma/ib", "4")
				c.Env = []corev1.EnvVar{{Name: "NCCL_IB_HCA", Value: "mlx5"}, {Name: "UCX_TLS", Value: "rc"}, {Name: "HOME", Value: "/root"},
					{Name: "NCCL_TOPO_FILE", Value: "/etc/nccl/topo/h100.xml"}, {Name: "NCCL_DEBUG", ValueFrom: &corev1.EnvVarSource{
						ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "nccl"}, Key: "debug"}}}}
				c.VolumeMounts = []corev1.VolumeMount{{Name: "topo", MountPath: "/etc/nccl"}, {Name: "data", MountPath: "/data"}}
				p.Spec.Volumes = []corev1.Volume{{Name: "topo"}, {Name: "data"}}
			}),
			outcome: "injected", inits: []string{"preflight-dcgm-diag", "preflight-nccl-loopback"}, skipped: "nccl-allreduce: not in a gang",
			check: func(t *testing.T, p *corev1.Pod) {
				loop := p.Spec.InitContainers[1]
				got := envNames(loop)
				for _, want := range []string{"NCCL_IB_HCA", "UCX_TLS", "NCCL_TOPO_FILE", "NCCL_DEBUG"} {
					if !slices.Contains(got, want) {
						t.Errorf("loopback env lacks %s: %v", want, got)
					}
				}
				if slices.Contains(got, "HOME") || slices.Contains(envNames(p.Spec.InitContainers[0]), "NCCL_IB_HCA") {
					t.Errorf("env copied where it should not be: %v", got)
				}
				if !slices.ContainsFunc(loop.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "topo" && m.ReadOnly }) ||
					slices.ContainsFunc(loop.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "data" }) {
					t.Errorf("mounts %+v", loop.VolumeMounts)
				}
			}},
		{name: "NCCL_TOPO_FILE from the image: not copied (topology by instance type)",
			pod: pod(func(p *corev1.Pod) {
				p.Spec.Containers[0].Resources = res("nvidia.com/gpu", "8", "rdma/ib", "4")
				p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NCCL_TOPO_FILE", Value: "/opt/topo.xml"}}
			}),
			outcome: "injected", inits: []string{"preflight-dcgm-diag", "preflight-nccl-loopback"}, skipped: "nccl-allreduce: not in a gang",
			check: func(t *testing.T, p *corev1.Pod) {
				if slices.Contains(envNames(p.Spec.InitContainers[1]), "NCCL_TOPO_FILE") {
					t.Error("NCCL_TOPO_FILE copied without its volume")
				}
			}},
		{name: "gang: label, annotations, ConfigMap volume and the marker emptyDir in nccl-allreduce only",
			pod: pod(func(p *corev1.Pod) {
				p.Labels = map[string]string{"gang": "Job_7", "gang-size": "2"}
				p.Spec.Containers[0].Resources = res("nvidia.com/gpu", "8", "rdma/ib", "4")
			}),
			outcome: "injected", inits: []string{"preflight-dcgm-diag", "preflight-nccl-loopback", "preflight-nccl-allreduce"}, gangLabel: "lbl-job-7-2ae1ce52",
			check: func(t *testing.T, p *corev1.Pod) {
				if !slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool {
					return v.Name == VolumeGang && v.ConfigMap != nil && v.ConfigMap.Name == "preflight-lbl-job-7-2ae1ce52" && *v.ConfigMap.Optional
				}) {
					t.Errorf("volumes %+v", p.Spec.Volumes)
				}
				// A failed run's marker must outlive the container's
				// restarts: a pod-local emptyDir at the check's
				// gang.marker_dir, writable.
				if !slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == VolumeGangMarker && v.EmptyDir != nil }) {
					t.Errorf("no marker emptyDir: volumes %+v", p.Spec.Volumes)
				}
				marker := func(m corev1.VolumeMount) bool { return m.Name == VolumeGangMarker }
				if ar := p.Spec.InitContainers[2]; !slices.ContainsFunc(ar.VolumeMounts, func(m corev1.VolumeMount) bool {
					return marker(m) && m.MountPath == checks.DefaultConfig().Gang.MarkerDir && !m.ReadOnly
				}) {
					t.Errorf("nccl-allreduce mounts %+v", ar.VolumeMounts)
				}
				for _, c := range p.Spec.InitContainers[:2] {
					if slices.ContainsFunc(c.VolumeMounts, marker) {
						t.Errorf("%s mounts the marker directory", c.Name)
					}
				}
				if p.Annotations[gang.AnnotationMethod] != "labels" || p.Annotations[gang.AnnotationName] != "Job_7" {
					t.Errorf("annotations %v", p.Annotations)
				}
			}},
		{name: "DRA: GPU claim and network claim template",
			pod: pod(func(p *corev1.Pod) {
				p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr("gpus")},
					{Name: "nic", ResourceClaimTemplateName: ptr("nic-tmpl")}, {Name: "fpga", ResourceClaimName: ptr("other")}}
				p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}, {Name: "nic"}, {Name: "fpga"}}
			}),
			outcome: "injected", inits: []string{"preflight-dcgm-diag", "preflight-nccl-loopback"}, skipped: "nccl-allreduce: not in a gang",
			check: func(t *testing.T, p *corev1.Pod) {
				claims := func(c corev1.Container) (out []string) {
					for _, r := range c.Resources.Claims {
						out = append(out, r.Name)
					}
					return out
				}
				if got := claims(p.Spec.InitContainers[0]); !slices.Equal(got, []string{"gpu"}) {
					t.Errorf("dcgm claims %v", got)
				}
				if got := claims(p.Spec.InitContainers[1]); !slices.Equal(got, []string{"gpu", "nic"}) {
					t.Errorf("loopback claims %v", got)
				}
			}},
		{name: "the pod's own container of a check's name: that check left out (two of a name fail the pod)",
			pod: pod(func(p *corev1.Pod) {
				p.Spec.InitContainers = []corev1.Container{{Name: "preflight-dcgm-diag", Image: "user/own:1"}}
				p.Spec.Containers[0].Resources = res("nvidia.com/gpu", "8", "rdma/ib", "4")
			}),
			outcome: "injected", inits: []string{"preflight-nccl-loopback", "preflight-dcgm-diag"},
			skipped: "dcgm-diag: the pod already has a container named preflight-dcgm-diag; nccl-allreduce: not in a gang"},
		{name: "DRA claim of another class only", pod: pod(func(p *corev1.Pod) {
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "fpga", ResourceClaimName: ptr("other")}}
		}), outcome: "no_gpu"},
		{name: "third-party check: contract env, own command",
			mod: func(c *Config) {
				c.Checks = []CheckSpec{{Name: "vendor-burnin", Image: "vendor/burnin:1", Command: []string{"/burnin"}, Env: map[string]string{"LEVEL": "2"}}}
			},
			pod:     pod(func(p *corev1.Pod) { p.Spec.Containers[0].Resources = res("nvidia.com/gpu", "1") }),
			outcome: "injected", inits: []string{"preflight-vendor-burnin"},
			check: func(t *testing.T, p *corev1.Pod) {
				c := p.Spec.InitContainers[0]
				if c.Image != "vendor/burnin:1" || !slices.Equal(c.Command, []string{"/burnin"}) || len(c.Args) != 0 {
					t.Errorf("container %+v", c)
				}
				for _, want := range []string{"PREFLIGHT_CHECK", "FAULTLINE_GATEWAY_ADDR", "FAULTLINE_TOKEN_FILE", "PREFLIGHT_TIMEOUT", "LEVEL", "NODE_NAME", "POD_NAME"} {
					if !slices.Contains(envNames(c), want) {
						t.Errorf("env lacks %s: %v", want, envNames(c))
					}
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inj := testInjector(tc.mod)
			r, err := inj.Mutate(context.Background(), gang.Pod{Pod: tc.pod})
			if err != nil {
				t.Fatal(err)
			}
			if r.Outcome != tc.outcome {
				t.Fatalf("outcome %q, want %q", r.Outcome, tc.outcome)
			}
			if tc.outcome == "no_gpu" {
				if r.Patch != nil {
					t.Fatalf("GPU-less pod patched: %s", r.Patch)
				}
				return
			}
			got := apply(t, tc.pod, r.Patch)
			if !slices.Equal(names(got.Spec.InitContainers), tc.inits) {
				t.Fatalf("init containers %v, want %v", names(got.Spec.InitContainers), tc.inits)
			}
			if got.Annotations[AnnotationSkipped] != tc.skipped {
				t.Errorf("skipped %q, want %q", got.Annotations[AnnotationSkipped], tc.skipped)
			}
			if got.Labels[gang.LabelGang] != tc.gangLabel || r.Gang != tc.gangLabel {
				t.Errorf("gang label %q (result %q), want %q", got.Labels[gang.LabelGang], r.Gang, tc.gangLabel)
			}
			if !slices.ContainsFunc(got.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == VolumeState && v.HostPath != nil }) ||
				!slices.ContainsFunc(got.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == VolumeToken && v.Secret != nil }) {
				t.Errorf("state/token volumes missing: %+v", got.Spec.Volumes)
			}
			if tc.check != nil {
				tc.check(t, got)
			}
			// Reinvocation (or the pod read back): nothing more to change.
			again, err := inj.Mutate(context.Background(), gang.Pod{Pod: got})
			if err != nil {
				t.Fatal(err)
			}
			if again.Patch != nil || again.Outcome != "unchanged" {
				t.Fatalf("second invocation: %s %s", again.Outcome, again.Patch)
			}
		})
	}
}

// A pod mutated under an older configuration is brought to the current one
// on reinvocation, not given a second copy of the checks; a pod that lost
// its GPUs (another webhook's change) loses the injection.
func TestReinvocationChanges(t *testing.T) {
	p := pod(func(p *corev1.Pod) {
		p.Annotations = map[string]string{"team": "a"}
		p.Spec.Containers[0].Resources = res("nvidia.com/gpu", "8", "rdma/ib", "4")
		p.Spec.InitContainers = []corev1.Container{{Name: "user-init", Image: "busybox"}}
	})
	r, err := testInjector(nil).Mutate(context.Background(), gang.Pod{Pod: p})
	if err != nil {
		t.Fatal(err)
	}
	injected := apply(t, p, r.Patch)

	fewer := testInjector(func(c *Config) { c.Checks = c.Checks[:1] })
	r, err = fewer.Mutate(context.Background(), gang.Pod{Pod: injected})
	if err != nil {
		t.Fatal(err)
	}
	got := apply(t, injected, r.Patch)
	if !slices.Equal(names(got.Spec.InitContainers), []string{"preflight-dcgm-diag", "user-init"}) {
		t.Fatalf("after config change: %v", names(got.Spec.InitContainers))
	}

	lost := got.DeepCopy()
	lost.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	r, err = fewer.Mutate(context.Background(), gang.Pod{Pod: lost})
	if err != nil {
		t.Fatal(err)
	}
	if r.Outcome != "removed" {
		t.Fatalf("outcome %s", r.Outcome)
	}
	back := apply(t, lost, r.Patch)
	if !slices.Equal(names(back.Spec.InitContainers), []string{"user-init"}) || len(back.Spec.Volumes) != 0 ||
		back.Annotations["team"] != "a" || back.Annotations[AnnotationInjected] != "" {
		t.Fatalf("not restored: inits %v volumes %v annotations %v", names(back.Spec.InitContainers), back.Spec.Volumes, back.Annotations)
	}
	if strings.Contains(string(r.Patch), "/spec/containers") {
		t.Fatalf("patch touches the user's containers: %s", r.Patch)
	}
}

func ptr[T any](v T) *T { return &v }

// TestOwnVolumeOfOurName: a pod that already has a volume of a name the
// checks mount (a spec copied from an injected pod) gets no check rather
// than a second volume of that name, which the API server would refuse.
func TestOwnVolumeOfOurName(t *testing.T) {
	p := pod(func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources = res("nvidia.com/gpu", "8")
		p.Spec.Volumes = []corev1.Volume{{Name: VolumeToken, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	})
	r, err := testInjector(nil).Mutate(context.Background(), gang.Pod{Pod: p})
	if err != nil {
		t.Fatal(err)
	}
	if r.Outcome != "no_check" || r.Patch != nil || len(r.Skipped) == 0 || !strings.Contains(r.Skipped[0], "the pod already has a volume named preflight-token") {
		t.Fatalf("outcome %q patch %s skipped %q", r.Outcome, r.Patch, r.Skipped)
	}
}

// TestGangLabelOnlyWithAllreduce: only a gang pod that runs the gang-wide
// check carries the gang label (the controller lists every labelled pod as
// a peer); a gang pod that does not — no network devices, a name clash, no
// GPUs (an MPIJob launcher) — is marked excluded with the reason, so the
// controller does not count it in the gang's size. Labelled, a pod with
// only dcgm-diag was a peer that never joined the all-reduce.
func TestGangLabelOnlyWithAllreduce(t *testing.T) {
	inGang := func(r corev1.ResourceRequirements, mod func(*corev1.Pod)) *corev1.Pod {
		return pod(func(p *corev1.Pod) {
			p.Labels = map[string]string{"gang": "job1", "gang-size": "2"}
			p.Spec.Containers[0].Resources = r
			if mod != nil {
				mod(p)
			}
		})
	}
	for _, tc := range []struct {
		name             string
		pod              *corev1.Pod
		mod              func(*Config)
		peer             bool
		excluded, reason string
	}{
		{name: "GPUs and NICs: a peer", pod: inGang(res("nvidia.com/gpu", "8", "rdma/ib", "4"), nil), peer: true},
		{name: "GPUs, no NIC", pod: inGang(res("nvidia.com/gpu", "8"), nil), excluded: "lbl-job1", reason: "nccl-allreduce: no network devices"},
		{name: "name clash", pod: inGang(res("nvidia.com/gpu", "8", "rdma/ib", "4"), func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "preflight-nccl-allreduce", Image: "x"}}
		}), excluded: "lbl-job1", reason: "already has a container named preflight-nccl-allreduce"},
		{name: "no GPUs (launcher)", pod: inGang(res("cpu", "2"), nil), excluded: "lbl-job1", reason: "no GPUs"},
		{name: "no gang check configured", pod: inGang(res("nvidia.com/gpu", "8"), nil),
			mod: func(c *Config) { c.Checks = []CheckSpec{{Name: checks.DCGMDiag}} }},
		{name: "singleton without NIC", pod: pod(func(p *corev1.Pod) { p.Spec.Containers[0].Resources = res("nvidia.com/gpu", "8") })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := testInjector(tc.mod).Mutate(context.Background(), gang.Pod{Pod: tc.pod})
			if err != nil {
				t.Fatal(err)
			}
			got := tc.pod
			if r.Patch != nil {
				got = apply(t, tc.pod, r.Patch)
			}
			_, labelled := got.Labels[gang.LabelGang]
			if labelled != tc.peer || (r.Gang != "") != tc.peer {
				t.Fatalf("gang label %q (result %q), want a peer: %v", got.Labels[gang.LabelGang], r.Gang, tc.peer)
			}
			if _, ok := got.Annotations[gang.AnnotationMethod]; ok != tc.peer {
				t.Errorf("method annotation %v, want %v", ok, tc.peer)
			}
			if got.Labels[gang.LabelExcluded] != tc.excluded || !strings.Contains(got.Annotations[gang.AnnotationExcluded], tc.reason) {
				t.Errorf("excluded %q (%q), want %q (%q)", got.Labels[gang.LabelExcluded], got.Annotations[gang.AnnotationExcluded], tc.excluded, tc.reason)
			}
			// Idempotent: the mutated pod mutates to itself.
			if r2, err := testInjector(tc.mod).Mutate(context.Background(), gang.Pod{Pod: got}); err != nil || r2.Patch != nil {
				t.Errorf("reinvocation: %v, patch %s", err, r2.Patch)
			}
		})
	}
}

// TestAllreduceContainerName: the gang controller finds the gang-wide
// check's init container by gang.AllreduceContainer (it cannot import this
// package): the name injected must be that one, or no pod would ever be a
// peer.
func TestAllreduceContainerName(t *testing.T) {
	if got := ContainerPrefix + checks.NCCLAllreduce; got != gang.AllreduceContainer {
		t.Fatalf("injected %q, the controller looks for %q", got, gang.AllreduceContainer)
	}
}

// TestMutateRelaySocket: with inject.relay_socket the checks send through
// the node agent's relay: each gets the socket's directory (hostPath,
// Directory, read-only) and the socket's path in it as --relay-socket,
// neither the gateway token Secret (a cluster-wide credential) nor the
// node spool, and the pod gets the socket's group as a supplemental group
// (once; recorded so that a reinvocation, or an injection that no longer
// applies, takes it away again while a group the pod had stays). A pod
// whose own container mounts the checks' relay volume gets no check, and
// so no such volume: the API server refuses it.
func TestMutateRelaySocket(t *testing.T) {
	relay := func(c *Config) {
		c.RelaySocket, c.RelayGroup, c.TokenSecret = "/run/faultline-agent/agent.sock", 64500, ""
	}
	gpuPod := func(groups ...int64) *corev1.Pod {
		return pod(func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources = res("nvidia.com/gpu", "8", "rdma/ib", "4")
			p.Spec.SecurityContext = &corev1.PodSecurityContext{SupplementalGroups: groups}
		})
	}
	for _, tt := range []struct {
		name       string
		pod        *corev1.Pod
		wantGroups []int64
	}{
		{"no groups", gpuPod(), []int64{64500}},
		{"the pod's groups kept", gpuPod(1000), []int64{1000, 64500}},
		{"the pod has the group", gpuPod(64500, 1000), []int64{64500, 1000}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			inj := testInjector(relay)
			r, err := inj.Mutate(context.Background(), gang.Pod{Pod: tt.pod})
			if err != nil {
				t.Fatal(err)
			}
			got := apply(t, tt.pod, r.Patch)
			if len(got.Spec.InitContainers) != 2 {
				t.Fatalf("init containers %v", names(got.Spec.InitContainers))
			}
			for _, c := range got.Spec.InitContainers {
				want := []corev1.VolumeMount{{Name: VolumeRelay, MountPath: "/run/faultline-agent", ReadOnly: true}}
				if !slices.Equal(c.VolumeMounts, want) {
					t.Errorf("%s mounts %v, want only %v", c.Name, c.VolumeMounts, want)
				}
				if !slices.Contains(c.Args, "--relay-socket=/run/faultline-agent/agent.sock") {
					t.Errorf("%s args %v: no --relay-socket", c.Name, c.Args)
				}
			}
			if len(got.Spec.Volumes) != 1 || got.Spec.Volumes[0].Name != VolumeRelay || got.Spec.Volumes[0].HostPath == nil ||
				got.Spec.Volumes[0].HostPath.Path != "/run/faultline-agent" || *got.Spec.Volumes[0].HostPath.Type != corev1.HostPathDirectoryOrCreate {
				t.Fatalf("volumes %+v, want only the relay socket's directory", got.Spec.Volumes)
			}
			if g := got.Spec.SecurityContext.SupplementalGroups; !slices.Equal(g, tt.wantGroups) {
				t.Fatalf("supplementalGroups %v, want %v", g, tt.wantGroups)
			}
			// Reinvoked, nothing changes.
			r, err = inj.Mutate(context.Background(), gang.Pod{Pod: got})
			if err != nil || r.Patch != nil || r.Outcome != "unchanged" {
				t.Fatalf("reinvocation: outcome %s patch %s err %v", r.Outcome, r.Patch, err)
			}
			// No GPUs any more: the injection is taken back, the group too.
			lost := got.DeepCopy()
			lost.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
			r, err = inj.Mutate(context.Background(), gang.Pod{Pod: lost})
			if err != nil {
				t.Fatal(err)
			}
			back := apply(t, lost, r.Patch)
			if len(back.Spec.InitContainers)+len(back.Spec.Volumes) != 0 || back.Annotations[AnnotationRelayGroup] != "" ||
				!slices.Equal(back.Spec.SecurityContext.SupplementalGroups, tt.pod.Spec.SecurityContext.SupplementalGroups) {
				t.Fatalf("not restored: inits %v volumes %v groups %v annotations %v", names(back.Spec.InitContainers), back.Spec.Volumes,
					back.Spec.SecurityContext.SupplementalGroups, back.Annotations)
			}
		})
	}
	t.Run("a container of the pod mounts the relay volume", func(t *testing.T) {
		p := gpuPod()
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: VolumeRelay, MountPath: "/sock"}}
		r, err := testInjector(relay).Mutate(context.Background(), gang.Pod{Pod: p})
		if err != nil {
			t.Fatal(err)
		}
		if r.Outcome != "no_check" || strings.Contains(string(r.Patch), VolumeRelay) || len(r.Skipped) == 0 ||
			!strings.Contains(r.Skipped[0], "container main mounts preflight-relay, which only the injected checks may") {
			t.Fatalf("outcome %q patch %s skipped %q", r.Outcome, r.Patch, r.Skipped)
		}
	})
	t.Run("third-party check", func(t *testing.T) {
		inj := testInjector(func(c *Config) {
			relay(c)
			c.Checks = []CheckSpec{{Name: "burn", Image: "burn:1", Command: []string{"/burn"}}}
		})
		r, err := inj.Mutate(context.Background(), gang.Pod{Pod: gpuPod()})
		if err != nil {
			t.Fatal(err)
		}
		c := apply(t, gpuPod(), r.Patch).Spec.InitContainers[0]
		if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
			return e.Name == "FAULTLINE_RELAY_SOCKET" && e.Value == "/run/faultline-agent/agent.sock"
		}) {
			t.Fatalf("env %v: no FAULTLINE_RELAY_SOCKET", envNames(c))
		}
		// The gateway and the token file are not theirs in relay mode
		// (no token is mounted): a check that used them would fail.
		for _, e := range c.Env {
			if e.Name == "FAULTLINE_GATEWAY_ADDR" || e.Name == "FAULTLINE_TOKEN_FILE" {
				t.Errorf("env %v: %s in relay mode", envNames(c), e.Name)
			}
		}
	})
}

// TestPatchKeepsUnknownFields: the patch applies to the pod's JSON as the
// API server holds it, which has fields newer than this build's API types
// (a newer Kubernetes): it adds and removes single init containers,
// volumes, supplemental groups, labels and annotations, so that what the
// webhook does not own — whatever fields it has — stays as it was, on
// injection and on the reinvocation that takes the injection back.
// Replacing whole lists and maps rebuilt from the typed pod dropped such
// fields from every GPU pod.
func TestPatchKeepsUnknownFields(t *testing.T) {
	const podJSON = `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"trainer-0","namespace":"training",
 "labels":{"gang":"job1","gang-size":"2","app":"x"},"annotations":{"team":"a","example.com/a~b":"c"}},
 "spec":{"futureSpecField":1,
  "securityContext":{"runAsUser":1000,"supplementalGroups":[1000],"futureSecurityField":{"x":1}},
  "initContainers":[{"name":"user-init","image":"busybox","futureInitField":"keep"}],
  "containers":[{"name":"main","image":"trainer","resources":{"limits":{"nvidia.com/gpu":"8","rdma/ib":"4"}}}],
  "volumes":[{"name":"data","emptyDir":{},"futureVolumeField":true}]}}`
	inj := testInjector(func(c *Config) {
		c.RelaySocket, c.RelayGroup, c.TokenSecret = "/run/faultline-agent/agent.sock", 64500, ""
	})
	decode := func(raw []byte) (*corev1.Pod, map[string]any) {
		t.Helper()
		p, err := gang.DecodePod(raw)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		return p.Pod, m
	}
	_, before := decode([]byte(podJSON))
	own := func(t *testing.T, raw []byte, injected bool) {
		t.Helper()
		p, m := decode(raw)
		spec := m["spec"].(map[string]any)
		var user map[string]any
		for _, c := range spec["initContainers"].([]any) {
			if c.(map[string]any)["name"] == "user-init" {
				user = c.(map[string]any)
			}
		}
		var data map[string]any
		for _, v := range spec["volumes"].([]any) {
			if v.(map[string]any)["name"] == "data" {
				data = v.(map[string]any)
			}
		}
		sc := spec["securityContext"].(map[string]any)
		if user["futureInitField"] != "keep" || data["futureVolumeField"] != true || sc["futureSecurityField"] == nil ||
			sc["runAsUser"] == nil || spec["futureSpecField"] == nil {
			t.Fatalf("fields unknown to the webhook dropped: %s", raw)
		}
		wantInits, wantVols, wantGroups := []string{"user-init"}, 1, []int64{1000}
		if injected {
			wantInits = []string{"preflight-dcgm-diag", "preflight-nccl-loopback", "preflight-nccl-allreduce", "user-init"}
			wantVols, wantGroups = 4, []int64{1000, 64500}
		}
		if !slices.Equal(names(p.Spec.InitContainers), wantInits) || len(p.Spec.Volumes) != wantVols ||
			!slices.Equal(p.Spec.SecurityContext.SupplementalGroups, wantGroups) {
			t.Fatalf("inits %v volumes %d groups %v, want %v %d %v", names(p.Spec.InitContainers), len(p.Spec.Volumes),
				p.Spec.SecurityContext.SupplementalGroups, wantInits, wantVols, wantGroups)
		}
		// The user's labels and annotations as they were; the webhook's
		// keys only while injected.
		meta, orig := m["metadata"].(map[string]any), before["metadata"].(map[string]any)
		for _, f := range []string{"labels", "annotations"} {
			got := meta[f].(map[string]any)
			for k, v := range orig[f].(map[string]any) {
				if got[k] != v {
					t.Errorf("%s %q = %v, want %v", f, k, got[k], v)
				}
			}
			for k := range got {
				// Taken back, a gang pod is marked excluded (no GPUs).
				ours := strings.Contains(k, "faultline.io/") && (injected || k == gang.LabelExcluded || k == gang.AnnotationExcluded)
				if _, had := orig[f].(map[string]any)[k]; !had && !ours {
					t.Errorf("%s %q left by the webhook (injected: %v)", f, k, injected)
				}
			}
		}
	}

	r, err := inj.Mutate(context.Background(), gang.Pod{Pod: must(decode([]byte(podJSON)))})
	if err != nil || r.Outcome != "injected" {
		t.Fatalf("outcome %s err %v", r.Outcome, err)
	}
	injected := applyRaw(t, []byte(podJSON), r.Patch)
	own(t, injected, true)

	// Reinvoked on the patched pod: nothing to change, one injection.
	r, err = inj.Mutate(context.Background(), gang.Pod{Pod: must(decode(injected))})
	if err != nil || r.Patch != nil || r.Outcome != "unchanged" {
		t.Fatalf("reinvocation: %s %s %v", r.Outcome, r.Patch, err)
	}
	// Reinvoked after a change (another webhook's, or a new configuration):
	// the earlier injection is replaced, not doubled.
	fewer := testInjector(func(c *Config) {
		c.RelaySocket, c.RelayGroup, c.TokenSecret = "/run/faultline-agent/agent.sock", 64500, ""
		c.Checks = c.Checks[1:]
	})
	r, err = fewer.Mutate(context.Background(), gang.Pod{Pod: must(decode(injected))})
	if err != nil {
		t.Fatal(err)
	}
	again := applyRaw(t, injected, r.Patch)
	if p, _ := decode(again); !slices.Equal(names(p.Spec.InitContainers), []string{"preflight-nccl-loopback", "preflight-nccl-allreduce", "user-init"}) ||
		len(p.Spec.Volumes) != 4 || !slices.Equal(p.Spec.SecurityContext.SupplementalGroups, []int64{1000, 64500}) {
		t.Fatalf("after a configuration change: inits %v volumes %d groups %v (patch %s)", names(p.Spec.InitContainers), len(p.Spec.Volumes),
			p.Spec.SecurityContext.SupplementalGroups, r.Patch)
	}
	r, err = fewer.Mutate(context.Background(), gang.Pod{Pod: must(decode(again))})
	if err != nil || r.Patch != nil {
		t.Fatalf("reinvocation after the change: %s %v", r.Patch, err)
	}

	// The GPUs gone: the injection is taken back, element by element.
	var m map[string]any
	if err := json.Unmarshal(injected, &m); err != nil {
		t.Fatal(err)
	}
	m["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)["resources"] = map[string]any{}
	lost, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	r, err = inj.Mutate(context.Background(), gang.Pod{Pod: must(decode(lost))})
	if err != nil || r.Outcome != "removed" {
		t.Fatalf("outcome %s err %v", r.Outcome, err)
	}
	back := applyRaw(t, lost, r.Patch)
	own(t, back, false)
	// Excluded from the gang (a launcher): those two keys are the
	// webhook's, the rest stays.
	if p, _ := decode(back); p.Labels[gang.LabelExcluded] == "" {
		t.Fatalf("labels %v", p.Labels)
	}
}

func must[T, U any](v T, _ U) T { return v }

// TestMapKeysEscaped: label and annotation keys go into the patch as JSON
// pointer tokens ("~" as "~0", "/" as "~1"); a key is set or removed on
// its own, the others stay.
func TestMapKeysEscaped(t *testing.T) {
	orig := map[string]string{"a/b~c": "1", "keep": "2", "gone/x": "3"}
	want := map[string]string{"a/b~c": "9", "keep": "2", "new~/y": "4"}
	b, err := json.Marshal(mapOps("/metadata/labels", orig, want))
	if err != nil {
		t.Fatal(err)
	}
	raw := applyRaw(t, []byte(`{"metadata":{"labels":{"a/b~c":"1","keep":"2","gone/x":"3","future":{"x":1}}}}`), b)
	if got := string(raw); got != `{"metadata":{"labels":{"a/b~c":"9","future":{"x":1},"keep":"2","new~/y":"4"}}}` {
		t.Fatalf("patch %s gave %s", b, got)
	}
}
