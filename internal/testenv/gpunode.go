package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// GPUNode is a GPU node (named gpu-node-NNNNN) as a fleet's apiserver holds it: the labels that
// NVIDIA's GPU feature discovery (the "Generated Labels" of
// NVIDIA/gpu-feature-discovery's README), the GPU operator and node
// feature discovery put on it, the cloud's topology labels and the usual
// annotations, without status (WithKubeletStatus adds one): the memory
// benchmarks of the roles' node watches create fleets of them.
func GPUNode(i int) *corev1.Node {
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

// WithKubeletStatus gives n the status a kubelet reports: its four
// conditions, capacity, addresses, node info and 40 images (the kubelet
// reports up to 50, node-status-max-images).
func WithKubeletStatus(n *corev1.Node, i int) *corev1.Node {
	now := metav1.Now()
	for _, t := range []string{"MemoryPressure", "DiskPressure", "PIDPressure", "Ready"} {
		st := corev1.ConditionFalse
		if t == "Ready" {
			st = corev1.ConditionTrue
		}
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeConditionType(t), Status: st,
			Reason: "Kubelet" + t, Message: "kubelet reports " + t, LastHeartbeatTime: now, LastTransitionTime: now})
	}
	n.Status.Capacity = corev1.ResourceList{"cpu": resource.MustParse("192"), "memory": resource.MustParse("2Ti"), "nvidia.com/gpu": resource.MustParse("8"),
		"ephemeral-storage": resource.MustParse("28Ti"), "hugepages-1Gi": resource.MustParse("0"), "hugepages-2Mi": resource.MustParse("0"), "pods": resource.MustParse("110")}
	n.Status.Allocatable = n.Status.Capacity
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.0.%d.%d", i/250, i%250)},
		{Type: corev1.NodeHostName, Address: n.Name}, {Type: corev1.NodeInternalDNS, Address: fmt.Sprintf("ip-10-0-%d-%d.ec2.internal", i/250, i%250)}}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = 10250
	n.Status.NodeInfo = corev1.NodeSystemInfo{MachineID: fmt.Sprintf("%032x", i), SystemUUID: fmt.Sprintf("ec2%05x-0000-0000-0000-%012x", i, i), BootID: fmt.Sprintf("%08x-1111-2222-3333-%012x", i, i),
		KernelVersion: "5.15.0-1063-aws", OSImage: "Ubuntu 22.04.4 LTS", ContainerRuntimeVersion: "containerd://1.7.19", KubeletVersion: "v1.31.2", KubeProxyVersion: "v1.31.2",
		OperatingSystem: "linux", Architecture: "amd64"}
	for j := range 40 {
		n.Status.Images = append(n.Status.Images, corev1.ContainerImage{Names: []string{fmt.Sprintf("nvcr.io/nvidia/image-%d@sha256:%064x", j, j), fmt.Sprintf("nvcr.io/nvidia/image-%d:v1.%d", j, j)}, SizeBytes: int64(j) << 24})
	}
	return n
}

// StartNodeFleet starts a kube-apiserver holding n nodes, node(i) each
// (created 32 at a time), and returns a client of it with no rate limit:
// the fleet the node-watch memory benchmarks hold in a watch.
func StartNodeFleet(tb testing.TB, n int, node func(i int) *corev1.Node) kubernetes.Interface {
	tb.Helper()
	rc := StartKube(tb, KubeOptions{}).RESTConfig()
	rc.QPS, rc.Burst = -1, 0
	k, err := kubernetes.NewForConfig(rc)
	if err != nil {
		tb.Fatal(err)
	}
	var g errgroup.Group
	g.SetLimit(32)
	for i := range n {
		g.Go(func() error {
			_, err := k.CoreV1().Nodes().Create(context.Background(), node(i), metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		tb.Fatalf("testenv: create %d nodes: %v", n, err)
	}
	return k
}
