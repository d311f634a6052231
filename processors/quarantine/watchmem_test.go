package quarantine

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/processors/clusters"
)

// gpuNode is a GPU node as a fleet's apiserver holds it: the labels that
// NVIDIA's GPU feature discovery (the "Generated Labels" of
// NVIDIA/gpu-feature-discovery's README), the GPU operator and node
// feature discovery put on it, the cloud's topology labels and the usual
// annotations (no status: the node watch keeps none of it but faultline's
// conditions).
func gpuNode(i int) *corev1.Node {
	name := fmt.Sprintf("gpu-node-%05d", i)
	l := map[string]string{
		"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux", "kubernetes.io/hostname": name,
		"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
		"node.kubernetes.io/instance-type": "p5.48xlarge", "beta.kubernetes.io/instance-type": "p5.48xlarge",
		"topology.kubernetes.io/region": "us-east-1", "topology.kubernetes.io/zone": "us-east-1a",
		"nvidia.com/cuda.driver.major": "550", "nvidia.com/cuda.driver.minor": "90", "nvidia.com/cuda.driver.rev": "07",
		"nvidia.com/cuda.driver-version.full": "550.90.07", "nvidia.com/cuda.runtime.major": "12", "nvidia.com/cuda.runtime.minor": "4",
		"nvidia.com/gfd.timestamp": "1732838400", "nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0",
		"nvidia.com/gpu.count": "8", "nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.machine": "p5.48xlarge",
		"nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.replicas": "1",
		"nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "single",
		"nvidia.com/mps.capable": "false", "nvidia.com/gpu.present": "true", "nvidia.com/gpu-driver-upgrade-state": "upgrade-done",
	}
	for _, c := range []string{"container-toolkit", "dcgm", "dcgm-exporter", "device-plugin", "driver", "gpu-feature-discovery", "node-status-exporter", "operator-validator"} {
		l["nvidia.com/gpu.deploy."+c] = "true"
	}
	for _, f := range []string{"ADX", "AESNI", "AVX", "AVX2", "AVX512BW", "AVX512CD", "AVX512DQ", "AVX512F", "AVX512VL", "AVX512VNNI", "FMA3", "GFNI", "SHA", "VAES", "VPCLMULQDQ", "WAITPKG", "AMXBF16", "AMXINT8", "AMXTILE", "SERIALIZE"} {
		l["feature.node.kubernetes.io/cpu-cpuid."+f] = "true"
	}
	for k, v := range map[string]string{
		"cpu-hardware_multithreading": "true", "cpu-model.family": "6", "cpu-model.id": "143", "cpu-model.vendor_id": "Intel",
		"kernel-version.full": "5.15.0-1063-aws", "kernel-version.major": "5", "kernel-version.minor": "15", "kernel-version.revision": "0",
		"pci-10de.present": "true", "pci-1d0f.present": "true", "system-os_release.ID": "ubuntu", "system-os_release.VERSION_ID": "22.04",
		"storage-nonrotationaldisk": "true", "rdma.available": "true", "network-sriov.capable": "true",
	} {
		l["feature.node.kubernetes.io/"+k] = v
	}
	var feats []string
	for k := range l {
		if f, ok := strings.CutPrefix(k, "feature.node.kubernetes.io/"); ok {
			feats = append(feats, f)
		}
	}
	a := map[string]string{
		"nfd.node.kubernetes.io/feature-labels":                  strings.Join(feats, ","),
		"nfd.node.kubernetes.io/extended-resources":              "",
		"node.alpha.kubernetes.io/ttl":                           "0",
		"volumes.kubernetes.io/controller-managed-attach-detach": "true",
		"csi.volume.kubernetes.io/nodeid":                        `{"ebs.csi.aws.com":"i-0` + fmt.Sprintf("%016x", i) + `","efs.csi.aws.com":"i-0` + fmt.Sprintf("%016x", i) + `"}`,
		"alpha.kubernetes.io/provided-node-ip":                   fmt.Sprintf("10.0.%d.%d", i/250, i%250),
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l, Annotations: a},
		Spec: corev1.NodeSpec{ProviderID: fmt.Sprintf("aws:///us-east-1a/i-0%016x", i)}}
}

// BenchmarkNodeWatchMemory measures what a replica's node watch holds per
// node (the transform keeps name, UID, labels, annotations, taints,
// unschedulable and faultline's conditions): 5,000 GPU nodes as gpuNode
// writes them, then a node cache started and synced (testenv.HeldHeap),
// beside the node's size as the apiserver's JSON (metadata and spec: the
// test writes no status; a real node's status, its images and
// conditions, is several KB more that the transform drops).
//
//	go test -run '^$' -bench NodeWatchMemory -benchtime 1x ./processors/quarantine
func BenchmarkNodeWatchMemory(b *testing.B) {
	const n = 5000
	kube := testenv.StartKube(b, testenv.KubeOptions{})
	rc := kube.RESTConfig()
	rc.QPS, rc.Burst = -1, 0
	k, err := kubernetes.NewForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}
	var g errgroup.Group
	g.SetLimit(32)
	size := 0
	for i := range n {
		nd := gpuNode(i)
		if i == 0 {
			j, _ := json.Marshal(nd)
			size = len(j)
		}
		g.Go(func() error {
			_, err := k.CoreV1().Nodes().Create(context.Background(), nd, metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	reg := clusters.NewRegistry(clusters.DefaultConfig(), nil)
	cl := reg.SetClient("c", k, false)
	b.ResetTimer()
	for range b.N {
		b.ReportMetric(testenv.HeldHeap(b, n, func() (func() bool, func()) {
			c := newNodeCaches(testLog, nil)
			nc := c.get(cl)
			return func() bool { l, _ := nc.lister.List(labels.Everything()); return nc.synced() && len(l) == n }, c.close
		}), "heap-B/node")
	}
	b.ReportMetric(float64(size), "json-B/node")
}

// BenchmarkNodeWatchCopy is the CPU the node watch spends per node event
// on what it keeps (watchCopy: labels and annotations interned), beside
// the same copy with maps.Clone (no interning) and the decoding of the
// event's node from the apiserver's JSON, which the watch does first:
// a GPU node as gpuNode writes it, with a kubelet's status (conditions,
// capacity, 40 images).
//
//	go test -run '^$' -bench NodeWatchCopy ./processors/quarantine
func BenchmarkNodeWatchCopy(b *testing.B) {
	nd := gpuNode(7)
	for _, t := range []string{"Ready", "MemoryPressure", "DiskPressure", "PIDPressure"} {
		nd.Status.Conditions = append(nd.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeConditionType(t), Status: corev1.ConditionFalse,
			Reason: "Kubelet" + t, Message: "kubelet reports " + t, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()})
	}
	nd.Status.Capacity = corev1.ResourceList{"cpu": resource.MustParse("192"), "memory": resource.MustParse("2Ti"), "nvidia.com/gpu": resource.MustParse("8")}
	nd.Status.Allocatable = nd.Status.Capacity
	for i := range 40 {
		nd.Status.Images = append(nd.Status.Images, corev1.ContainerImage{Names: []string{fmt.Sprintf("nvcr.io/nvidia/image-%d@sha256:%064x", i, i), fmt.Sprintf("nvcr.io/nvidia/image-%d:v1.%d", i, i)}, SizeBytes: int64(i) << 24})
	}
	raw, err := json.Marshal(nd)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("decode", func(b *testing.B) {
		b.ReportMetric(float64(len(raw)), "json-B")
		for range b.N {
			var n corev1.Node
			if err := json.Unmarshal(raw, &n); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("copy-interned", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			_, _ = watchCopy(nd)
		}
	})
	b.Run("copy-cloned", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			_ = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nd.Name, UID: nd.UID, ResourceVersion: nd.ResourceVersion,
				Labels: maps.Clone(nd.Labels), Annotations: maps.Clone(nd.Annotations)}}
		}
	})
}
