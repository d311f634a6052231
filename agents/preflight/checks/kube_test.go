package checks_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/faultline/faultline/agents/preflight/checks"
	"github.com/faultline/faultline/agents/preflight/internal/preflighttest"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// checkKubeconfig sets up a real API server as a cluster with
// deploy/rbac/preflight.yaml applied, and returns a kubeconfig holding a
// token of the ServiceAccount "trainer" in "training": the identity an
// injected check container has.
func checkKubeconfig(t *testing.T) (string, kubernetes.Interface) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: not starting a real kube-apiserver")
	}
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	admin := kube.Client()
	ctx := context.Background()
	for _, ns := range []string{"faultline", "training"} {
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		must(t, err)
	}
	preflighttest.Apply(t, admin, "../../../deploy/rbac/preflight.yaml")
	_, err := admin.CoreV1().ServiceAccounts("training").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "trainer"}}, metav1.CreateOptions{})
	must(t, err)
	tok, err := admin.CoreV1().ServiceAccounts("training").CreateToken(ctx, "trainer",
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}, metav1.CreateOptions{})
	must(t, err)
	rc := kube.RESTConfig()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData, CertificateAuthority: rc.CAFile}
	kc.AuthInfos["trainer"] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "trainer"}
	kc.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	must(t, clientcmd.WriteToFile(*kc, path))
	return path, admin
}

func ptr[T any](v T) *T { return &v }

// TestKubeTopologyAndEvents: with API access as a pod's ServiceAccount
// bound to the faultline-preflight-check ClusterRole, an NCCL check picks
// the built-in topology of the node's instance-type label, and a failed
// check leaves a Warning Event on its pod; the pod's own NCCL_TOPO_FILE
// wins; with topology_fallback off, an unknown instance type is a
// configuration error.
func TestKubeTopologyAndEvents(t *testing.T) {
	kubeconfig, admin := checkKubeconfig(t)
	h := newHarness(t)
	ctx := context.Background()
	topoDir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(topoDir, "aws-p5.48xlarge.xml"), []byte("<system version=\"1\"/>\n"), 0o644))
	node := func(name, itype string) {
		_, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{"node.kubernetes.io/instance-type": itype}}}, metav1.CreateOptions{})
		must(t, err)
		h.node = name
	}
	env := map[string]string{"STANDIN_NVIDIA_SMI_OUT": ownData("nvidia-smi-uuids.txt"), "STANDIN_ALL_REDUCE_PERF_OUT": ncclData("h100-single-node.log")}
	flags := []string{"--kube.kubeconfig=" + kubeconfig, "--kube.events=true", "--nccl.topology-dir=" + topoDir}

	t.Run("instance-type topology, Warning Event on the pod", func(t *testing.T) {
		node("p5-node-1", "p5.48xlarge")
		r := h.run(checks.NCCLLoopback, env, append(flags, "--nccl.loopback-threshold-gbps=500")...)
		if r.code != checks.ExitFail {
			t.Fatalf("exit %d\n%s", r.code, r.stderr)
		}
		if want := "NCCL_TOPO_FILE=" + filepath.Join(topoDir, "aws-p5.48xlarge.xml"); !strings.Contains(r.args, want) {
			t.Errorf("all_reduce_perf ran with %q, want %s", r.args, want)
		}
		ev := h.events(r.node, 1)[0]
		if ev.GetMetadata()["preflight.faultline.io/nccl-topology"] != "instance-type:p5.48xlarge" || ev.GetRecommendedAction() != datamodels.RecommendedAction_CONTACT_SUPPORT {
			t.Errorf("event %v", ev)
		}
		var got []corev1.Event
		deadline := time.Now().Add(10 * time.Second)
		for len(got) == 0 && time.Now().Before(deadline) {
			l, err := admin.CoreV1().Events("training").List(ctx, metav1.ListOptions{})
			must(t, err)
			got = l.Items
		}
		if len(got) != 1 {
			t.Fatalf("%d Events in training", len(got))
		}
		e := got[0]
		if e.Type != corev1.EventTypeWarning || e.Reason != "PreflightCheckFailed" || e.InvolvedObject.Name != "trainer-0" ||
			e.InvolvedObject.FieldPath != "spec.initContainers{preflight-nccl-loopback}" || !strings.HasPrefix(e.Message, "nccl-loopback: ") ||
			e.Source.Host != "p5-node-1" {
			t.Errorf("Event %+v", e)
		}
	})

	t.Run("the pod's own NCCL_TOPO_FILE wins", func(t *testing.T) {
		node("p5-node-2", "p5.48xlarge")
		h.environ = []string{"NCCL_TOPO_FILE=/etc/nccl/topo/custom.xml"}
		defer func() { h.environ = nil }()
		r := h.run(checks.NCCLLoopback, env, flags...)
		if r.code != checks.ExitPass || !strings.Contains(r.args, "NCCL_TOPO_FILE=/etc/nccl/topo/custom.xml") {
			t.Fatalf("exit %d, args %q\n%s", r.code, r.args, r.stderr)
		}
		if ev := h.events(r.node, 1)[0]; ev.GetMetadata()["preflight.faultline.io/nccl-topology"] != "pod:/etc/nccl/topo/custom.xml" {
			t.Errorf("event %v", ev)
		}
	})

	t.Run("unknown instance type without fallback", func(t *testing.T) {
		node("odd-node", "m5.large")
		r := h.run(checks.NCCLLoopback, env, append(flags, "--nccl.topology-fallback=false")...)
		if r.code != checks.ExitConfig || !strings.Contains(r.stderr, `nccl.topology_fallback: false, and no NCCL topology for instance type \"m5.large\"`) {
			t.Fatalf("exit %d\n%s", r.code, r.stderr)
		}
		if r.args != "" && strings.Contains(r.args, "all_reduce_perf") {
			t.Errorf("all_reduce_perf ran: %q", r.args)
		}
	})

	t.Run("unknown instance type with fallback: NCCL detects", func(t *testing.T) {
		node("odd-node-2", "m5.large")
		r := h.run(checks.NCCLLoopback, env, flags...)
		if r.code != checks.ExitPass || strings.Contains(r.args, "NCCL_TOPO_FILE=/") {
			t.Fatalf("exit %d, args %q\n%s", r.code, r.args, r.stderr)
		}
		if ev := h.events(r.node, 1)[0]; ev.GetMetadata()["preflight.faultline.io/nccl-topology"] != "nccl-auto" {
			t.Errorf("event %v", ev)
		}
	})
}
