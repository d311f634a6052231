package podres_test

import (
	"context"
	"slices"
	"testing"
	"time"

	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/faultline/faultline/agents/podres"
	"github.com/faultline/faultline/agents/podres/podrestest"
)

func TestPods(t *testing.T) {
	const g0, g1, g2 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111", "GPU-22222222-2222-2222-2222-222222222222"
	pod := podrestest.Pod
	cases := []struct {
		name      string
		pods      []*podresv1.PodResources
		gpus      []string
		want      []string
		wantKnown bool
	}{
		{"one pod on the GPU", []*podresv1.PodResources{pod("ml", "train-0", "nvidia.com/gpu", g0, g1), pod("ml", "train-1", "nvidia.com/gpu", g2)},
			[]string{g1}, []string{"ml/train-0"}, true},
		{"pods of several GPUs, sorted, once", []*podresv1.PodResources{pod("b", "p", "nvidia.com/gpu", g0), pod("a", "q", "nvidia.com/gpu", g1), pod("b", "p2", "nvidia.com/gpu", g0)},
			[]string{g0, g1}, []string{"a/q", "b/p", "b/p2"}, true},
		{"no pod holds it", []*podresv1.PodResources{pod("ml", "train-1", "nvidia.com/gpu", g2)}, []string{g0}, nil, true},
		{"nothing allocated", nil, []string{g0}, nil, true},
		{"other resources are not GPUs", []*podresv1.PodResources{pod("net", "sriov", "nvidia.com/hostdev", "0000:3b:00.2"), pod("x", "y", "example.com/fpga", g0)},
			[]string{g0}, nil, true},
		// NVIDIA's device plugin names the replicas of a time-sliced or
		// MPS-shared GPU "<UUID>::<replica>" (AnnotatedID, internal/rm of
		// NVIDIA/k8s-device-plugin), under nvidia.com/gpu or, renamed,
		// nvidia.com/gpu.shared. Before, they were taken for no GPU: free.
		{"time-sliced GPU: every pod on a share", []*podresv1.PodResources{pod("ml", "train-0", "nvidia.com/gpu", g0+"::0", g0+"::1"),
			pod("ml", "infer-0", "nvidia.com/gpu.shared", g0+"::2"), pod("ml", "train-1", "nvidia.com/gpu", g1+"::0")},
			[]string{g0}, []string{"ml/infer-0", "ml/train-0"}, true},
		// The network operator's NICs (SR-IOV VFs by PCI address) beside
		// the GPUs: before, any nvidia.com/ device not named "GPU-…" made
		// every GPU's pods unknown.
		{"NICs under nvidia.com/ beside GPUs", []*podresv1.PodResources{pod("ml", "train-0", "nvidia.com/gpu", g0), pod("ml", "train-0", "nvidia.com/hostdev", "0000:3b:00.2"),
			pod("ml", "train-1", "nvidia.com/sriov_rdma", "0000:3b:00.3")}, []string{g0}, []string{"ml/train-0"}, true},
		// The device plugin and NVML write lower-case hex; a GPUReset
		// may name the GPU in upper case (its selector accepts either).
		// Before, it found no pod holding the GPU: free, and reset.
		{"UUID asked in upper case", []*podresv1.PodResources{pod("ml", "train-0", "nvidia.com/gpu", "GPU-abcdef01-2345-6789-abcd-ef0123456789")},
			[]string{"GPU-ABCDEF01-2345-6789-ABCD-EF0123456789"}, []string{"ml/train-0"}, true},
		{"UUID held in upper case", []*podresv1.PodResources{pod("ml", "train-0", "nvidia.com/gpu", "GPU-ABCDEF01-2345-6789-ABCD-EF0123456789::1")},
			[]string{"GPU-abcdef01-2345-6789-abcd-ef0123456789"}, []string{"ml/train-0"}, true},
		{"a GPU resource renamed, by UUID", []*podresv1.PodResources{pod("ml", "a", "nvidia.com/a100", g1)}, []string{g1}, []string{"ml/a"}, true},
		{"a resource renamed, index ids: unknown", []*podresv1.PodResources{pod("ml", "a", "nvidia.com/a100", "0")}, []string{g1}, nil, false},
		{"GPUs passed through to VMs: unknown", []*podresv1.PodResources{pod("vm", "v", "nvidia.com/pgpu", "0000:41:00.0")}, []string{g0}, nil, false},
		{"index ids: unknown", []*podresv1.PodResources{pod("ml", "train-0", "nvidia.com/gpu", "0", "1")}, []string{g0}, nil, false},
		{"MIG slices: unknown", []*podresv1.PodResources{pod("ml", "mig", "nvidia.com/mig-1g.10gb", "MIG-aaaa")}, []string{g0}, nil, false},
		{"MIG slices shared: unknown", []*podresv1.PodResources{pod("ml", "mig", "nvidia.com/mig-1g.10gb.shared", "MIG-aaaa::1")}, []string{g0}, nil, false},
		// NVIDIA's DRA driver names its devices "gpu-0", not by UUID.
		{"GPUs of a ResourceClaim: unknown", []*podresv1.PodResources{{Namespace: "ml", Name: "claimed", Containers: []*podresv1.ContainerResources{{Name: "main",
			DynamicResources: []*podresv1.DynamicResource{{ClaimName: "gpu", ClaimNamespace: "ml", ClaimResources: []*podresv1.ClaimResource{{DriverName: podres.DRADriver, PoolName: "node-1", DeviceName: "gpu-0"}}}}}}}},
			[]string{g0}, nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := podrestest.Start(t, tc.pods...)
			l, err := podres.New(k.Socket, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			alloc, err := l.Allocations(context.Background(), time.Now())
			if err != nil {
				t.Fatal(err)
			}
			got, known := alloc.Pods(tc.gpus)
			if known != tc.wantKnown || !slices.Equal(got, tc.want) {
				t.Errorf("Pods(%v) = %v, %v; want %v, %v", tc.gpus, got, known, tc.want, tc.wantKnown)
			}
		})
	}
}

// TestAllocationsCachedAndErrors: one List per TTL; a kubelet that does
// not answer is an error, not an empty answer.
func TestAllocationsCachedAndErrors(t *testing.T) {
	k := podrestest.Start(t, podrestest.Pod("a", "p", "nvidia.com/gpu", "GPU-1"))
	l, err := podres.New(k.Socket, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, now := context.Background(), time.Now()
	for _, at := range []time.Time{now, now.Add(time.Second), now.Add(6 * time.Second)} {
		if _, err := l.Allocations(ctx, at); err != nil {
			t.Fatal(err)
		}
	}
	if k.Calls() != 2 {
		t.Errorf("%d List calls for 3 reads over 6s with a 5s TTL, want 2", k.Calls())
	}
	gone, err := podres.New(t.TempDir()+"/missing.sock", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	if a, err := gone.Allocations(ctx, now); err == nil {
		t.Errorf("no kubelet: allocations %v, want an error", a)
	}
}
