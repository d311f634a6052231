package drain

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
	"github.com/faultline/faultline/schemas/validate"
)

// resetFault is the quarantine action (details as processors/quarantine
// writes them) of a COMPONENT_RESET fault on gpus with the kubelet's
// listing pods, from an event the gateway accepts.
func resetFault(t *testing.T, id string, gpus, pods []string) trigger {
	t.Helper()
	ev := &datamodels.HealthEvent{Agent: "a", ComponentClass: "GPU", CheckName: "XID_ERROR_48", NodeName: "n", IsFatal: true,
		RecommendedAction: datamodels.RecommendedAction_COMPONENT_RESET, Metadata: map[string]string{
			events.MetaGPUPods: strings.Join(pods, ","), events.MetaGPUPodsAt: t0.Format(time.RFC3339Nano)}}
	for _, g := range gpus {
		ev.EntitiesImpacted = append(ev.EntitiesImpacted, &datamodels.Entity{EntityType: events.EntityGPU, EntityValue: g})
	}
	if err := (validate.Validator{MaxBatch: 1, MaxFutureSkew: time.Minute}).Validate(ev, t0); err != nil {
		t.Fatalf("the gateway refuses the event: %v", err)
	}
	a := &faultlinev1.Action{Id: "q-" + id, Role: events.RoleQuarantine, Kind: events.KindQuarantine, Outcome: events.OutcomeApplied,
		CheckName: ev.CheckName, RecommendedAction: ev.RecommendedAction.String(), EventIds: []string{id},
		Details: map[string]string{events.DetailEntities: events.EntityKey(ev),
			events.MetaGPUPods: ev.Metadata[events.MetaGPUPods], events.MetaGPUPodsAt: ev.Metadata[events.MetaGPUPodsAt]}}
	return trigger{src: a, cluster: "c", node: "n", eventID: id}
}

// TestWidenStaysBounded: faults joining a running drain, each as large as
// the gateway accepts (64 GPU entities, UUIDs or names of 512 bytes, a 2
// KiB listing; a listing is kept only for UUIDs), keep
// the drain state small: past maxScopeGPUs GPUs or maxScopePodBytes of
// listing the scope is the whole node (it drains every pod a GPU scope
// would). The GPU lists and listings used to add up without a bound: 12
// faults made 134 KB of state, 200 made 2.2 MB, far past the 256 KiB all
// of a node's annotations share (then no drain or quarantine write on the
// node succeeds).
func TestWidenStaysBounded(t *testing.T) {
	const maxState = 32 << 10
	pad := strings.Repeat("x", validate.MaxEntityValue)
	// gpus are 64 GPU UUIDs of fault i (of its own, or of the fault 0),
	// big 64 names of 512 bytes (no UUIDs: no listing is kept for them),
	// pods its listing of 204 pods (2,040 bytes).
	gpus := func(i int) []string {
		var out []string
		for j := range validate.MaxEntities {
			out = append(out, fmt.Sprintf("GPU-%08x-0000-0000-0000-%012x", i, j))
		}
		return out
	}
	big := func(i int) []string {
		var out []string
		for j := range validate.MaxEntities {
			out = append(out, fmt.Sprintf("GPU-%03d-%02d-%s", i, j, pad)[:validate.MaxEntityValue])
		}
		return out
	}
	pods := func(i int) []string {
		var out []string
		for k := range 204 {
			out = append(out, fmt.Sprintf("ml/p%05d", i*204+k))
		}
		return out
	}
	same := func(f func(int) []string) func(int) []string { return func(int) []string { return f(0) } }
	for _, tc := range []struct {
		name       string
		faults     int
		gpus, pods func(i int) []string
		// wantGPUs, wantPods: the scope's GPUs and listed pods at the end
		// (0, -1: the whole node).
		wantGPUs, wantPods int
	}{
		{"one fault", 1, gpus, pods, 64, 204},
		{"12 faults, new GPUs", 12, gpus, pods, 0, -1},
		{"200 faults, new GPUs", 200, gpus, pods, 0, -1},
		{"200 faults, same GPUs, same pods", 200, same(gpus), same(pods), 64, 204},
		{"3 faults, same GPUs, new pods: within the bound", 3, same(gpus), pods, 64, 612},
		{"200 faults, same GPUs, new pods", 200, same(gpus), pods, 0, -1},
		{"one fault, 512-byte names", 1, big, pods, 64, -1},
		{"12 faults, new 512-byte names", 12, big, pods, 0, -1},
		{"200 faults, same 512-byte names", 200, same(big), pods, 64, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var (
				st      *State
				largest int
			)
			for i := range tc.faults {
				id := fmt.Sprintf("e%d", i)
				var adm admission
				st, adm = admit(st, id, (&Handler{}).options(resetFault(t, id, tc.gpus(i), tc.pods(i))), true, t0, "d", "me")
				if want := map[bool]admission{true: admitStart, false: admitWiden}[i == 0]; adm != want {
					t.Fatalf("fault %d: admission %d, want %d", i, adm, want)
				}
				largest = max(largest, len(st.encode()))
			}
			pods := -1
			if st.GPUPods != nil {
				pods = len(st.GPUPods.Pods)
			}
			t.Logf("%d faults: largest state %d bytes; scope %d GPUs, %d pods listed", tc.faults, largest, len(st.GPUs), pods)
			if largest > maxState {
				t.Errorf("drain state reached %d bytes, want at most %d", largest, maxState)
			}
			if len(st.GPUs) != tc.wantGPUs || pods != tc.wantPods {
				t.Errorf("scope %d GPUs, %d pods listed; want %d, %d", len(st.GPUs), pods, tc.wantGPUs, tc.wantPods)
			}
		})
	}
}

// TestScopeOfAGPUNotNamedByUUID: a GPU reset's fault whose GPU is named by
// its PCI address (the fabric agent's gpuIDByPCI fallback) or index
// (NVLINK-INACTIVE's index:N, NVSentinel's DCGM events without GPU_UUID)
// drains every pod using any GPU: the kubelet's listing for such a GPU is
// always empty and no pod names it, so GPU pods were left on the GPU the
// remediation then resets.
func TestScopeOfAGPUNotNamedByUUID(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate("drain."); err != nil {
		t.Fatal(err)
	}
	hourBefore := metav1.NewTime(t0.Add(-time.Hour))
	running := func(mod func(p *corev1.Pod)) *corev1.Pod {
		p := pod("ml", nil)
		p.CreationTimestamp, p.Status.StartTime = hourBefore, &hourBefore
		mod(p)
		return p
	}
	requests := running(func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{resourceGPU: resource.MustParse("1")}
	})
	annotated := running(func(p *corev1.Pod) { p.Annotations = map[string]string{DefaultGPUAnnotation: gpuB} })
	visible := running(func(p *corev1.Pod) {
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
	})
	none := running(func(p *corev1.Pod) {
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}}
	})
	plain := running(func(*corev1.Pod) {})
	claims := running(func(p *corev1.Pod) { // a GPU through DRA (gpu.nvidia.com), no extended resource
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: new("ml-gpu")}}
	})
	for _, tc := range []struct {
		name string
		gpus []string
		pod  *corev1.Pod
		want bool
	}{
		{"PCI address, requests a GPU", []string{"0000:17:00.0"}, requests, true},
		{"index, annotated with a UUID", []string{"index:3"}, annotated, true},
		{"index, NVIDIA_VISIBLE_DEVICES=all", []string{"3"}, visible, true},
		{"a UUID and an index, requests a GPU", []string{gpuA, "index:3"}, requests, true},
		{"PCI address, NVIDIA_VISIBLE_DEVICES=void", []string{"0000:17:00.0"}, none, false},
		{"PCI address, no GPU", []string{"0000:17:00.0"}, plain, false},
		{"PCI address, a resource claim (DRA)", []string{"0000:17:00.0"}, claims, true},
		// The listing is still used for a GPU named by its UUID.
		{"UUID, requests a GPU, not listed", []string{gpuA}, requests, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The agent's pod lookup said "known, no pods" (an empty
			// listing at t0).
			o := (&Handler{}).options(resetFault(t, "e1", tc.gpus, nil))
			if got := c.classify(tc.pod, o.scope, false).skip == ""; got != tc.want {
				t.Fatalf("scope %+v: in scope %v, want %v", o.scope, got, tc.want)
			}
		})
	}
}
