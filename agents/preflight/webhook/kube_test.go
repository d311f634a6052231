package webhook_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/faultline/faultline/agents/preflight/checks"
	"github.com/faultline/faultline/agents/preflight/coordination"
	"github.com/faultline/faultline/agents/preflight/gang"
	"github.com/faultline/faultline/agents/preflight/injection"
	"github.com/faultline/faultline/agents/preflight/internal/preflighttest"
	"github.com/faultline/faultline/agents/preflight/webhook"
	"github.com/faultline/faultline/internal/testenv"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// applyRBAC creates the objects of deploy/rbac/preflight.yaml.
func applyRBAC(t *testing.T, k kubernetes.Interface) {
	t.Helper()
	preflighttest.Apply(t, k, "../../../deploy/rbac/preflight.yaml")
}

// volcanoCRD installs a minimal PodGroup CRD (scheduling.volcano.sh/v1beta1)
// so the volcano method can read a real object's spec.minMember.
func volcanoCRD(t *testing.T, rc *rest.Config) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(rc)
	must(t, err)
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "podgroups.scheduling.volcano.sh"},
		"spec": map[string]any{
			"group": "scheduling.volcano.sh", "scope": "Namespaced",
			"names": map[string]any{"plural": "podgroups", "singular": "podgroup", "kind": "PodGroup", "listKind": "PodGroupList"},
			"versions": []any{map[string]any{"name": "v1beta1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
		}}}
	_, err = dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}).
		Create(context.Background(), crd, metav1.CreateOptions{})
	must(t, err)
	gvr := schema.GroupVersionResource{Group: "scheduling.volcano.sh", Version: "v1beta1", Resource: "podgroups"}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := dyn.Resource(gvr).Namespace("training").List(context.Background(), metav1.ListOptions{})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("volcano CRD not served: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func ptr[T any](v T) *T { return &v }

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	p := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return p
}

// env is a real kube-apiserver with the webhook registered in it.
type env struct {
	t      *testing.T
	kube   *testenv.Kube
	admin  kubernetes.Interface
	dyn    dynamic.Interface
	cfg    webhook.Config
	srv    *webhook.Server
	url    string
	cancel context.CancelFunc
	done   chan error
}

func startEnv(t *testing.T) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: not starting a real kube-apiserver")
	}
	kube := testenv.StartKube(t, testenv.KubeOptions{})
	admin := kube.Client()
	ctx := context.Background()
	for _, ns := range []string{"faultline", "training", "other"} {
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		must(t, err)
	}
	applyRBAC(t, admin)
	volcanoCRD(t, kube.RESTConfig())

	// The webhook runs as its ServiceAccount with only the shipped RBAC.
	rc := kube.RESTConfig()
	rc.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:faultline:faultline-preflight"}
	sa, err := kubernetes.NewForConfig(rc)
	must(t, err)
	sadyn, err := dynamic.NewForConfig(rc)
	must(t, err)

	port := freePort(t)
	e := &env{t: t, kube: kube, admin: admin, url: fmt.Sprintf("https://127.0.0.1:%d/mutate-pod", port)}
	e.dyn, err = dynamic.NewForConfig(kube.RESTConfig())
	must(t, err)
	cfg := webhook.DefaultConfig()
	cfg.Webhook.Listen = fmt.Sprintf("127.0.0.1:%d", port)
	cfg.Webhook.URL = e.url
	cfg.Webhook.MetricsAddr = ""
	cfg.Webhook.Resync = time.Second
	cfg.TLS.IPAddresses = []string{"127.0.0.1"}
	cfg.Namespaces.Include = []string{"training"}
	cfg.GPU.DeviceClasses = []string{"gpu.example.com"}
	cfg.Network.DeviceClasses = []string{"rdma.example.com"}
	cfg.Gang.Methods = []string{"workloadRef", "volcano", "kueue", "labels"}
	cfg.Gang.IDLabel, cfg.Gang.SizeLabel = "example.com/gang-id", "example.com/gang-size"
	cfg.Checks = []injection.CheckSpec{{Name: checks.DCGMDiag}, {Name: checks.NCCLLoopback}, {Name: checks.NCCLAllreduce}}
	cfg.Check.DCGM.DiagLevel = 2
	cfg.Check.Gateway.Addr = "gw.faultline.svc:50051"
	must(t, cfg.Validate())
	e.cfg = cfg
	srv, err := webhook.New(cfg, slog.New(slog.DiscardHandler), webhook.Options{Kube: sa, Dynamic: sadyn, Registry: prometheus.NewRegistry(), DrainDelay: 100 * time.Millisecond})
	must(t, err)
	e.srv = srv
	sctx, cancel := context.WithCancel(context.Background())
	e.cancel, e.done = cancel, make(chan error, 1)
	go func() { e.done <- srv.Run(sctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-e.done; err != nil {
			t.Errorf("webhook: %v", err)
		}
	})
	// Ready when the API server calls it: a GPU pod comes back injected.
	deadline := time.Now().Add(60 * time.Second)
	for {
		p := e.create(gpuPod("probe-", 1, 0))
		if len(p.Spec.InitContainers) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the API server never called the webhook")
		}
		time.Sleep(300 * time.Millisecond)
	}
	return e
}

// create creates a pod through the API and returns what was stored.
func (e *env) create(p *corev1.Pod) *corev1.Pod {
	e.t.Helper()
	out, err := e.admin.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	must(e.t, err)
	return out
}

func gpuPod(name string, gpus, nics int64) *corev1.Pod {
	res := corev1.ResourceList{}
	if gpus > 0 {
		res["nvidia.com/gpu"] = *resource.NewQuantity(gpus, resource.DecimalSI)
	}
	if nics > 0 {
		res["nvidia.com/mlnxnics"] = *resource.NewQuantity(nics, resource.DecimalSI)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "training"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "trainer:1",
			Resources: corev1.ResourceRequirements{Limits: res}}}}}
	if strings.HasSuffix(name, "-") {
		p.GenerateName = name
	} else {
		p.Name = name
	}
	return p
}

func initNames(p *corev1.Pod) []string {
	var out []string
	for _, c := range p.Spec.InitContainers {
		out = append(out, c.Name)
	}
	return out
}

func container(p *corev1.Pod, name string) *corev1.Container {
	for i := range p.Spec.InitContainers {
		if p.Spec.InitContainers[i].Name == name {
			return &p.Spec.InitContainers[i]
		}
	}
	return nil
}

func envOf(c *corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			m[e.Name] = "field:" + e.ValueFrom.FieldRef.FieldPath
		} else {
			m[e.Name] = e.Value
		}
	}
	return m
}

// TestWebhookInRealAPIServer: the webhook registered in a real
// kube-apiserver (it writes its own MutatingWebhookConfiguration, trusted
// through the caBundle of its self-signed CA) and pods created through the
// API, running as the ServiceAccount of deploy/rbac/preflight.yaml.
func TestWebhookInRealAPIServer(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()

	t.Run("configuration as configured, caBundle is the CA in the Secret", func(t *testing.T) {
		mwc, err := e.admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "faultline-preflight", metav1.GetOptions{})
		must(t, err)
		w := mwc.Webhooks[0]
		sec, err := e.admin.CoreV1().Secrets("faultline").Get(ctx, "faultline-preflight-webhook-tls", metav1.GetOptions{})
		must(t, err)
		if !bytes.Equal(w.ClientConfig.CABundle, sec.Data["ca.crt"]) || *w.FailurePolicy != "Fail" || *w.TimeoutSeconds != 5 ||
			*w.SideEffects != "None" || *w.ReinvocationPolicy != "IfNeeded" || *w.ClientConfig.URL != e.url {
			t.Fatalf("webhook %+v", w)
		}
		sel := w.NamespaceSelector.MatchExpressions
		if sel[0].Operator != "In" || !slices.Equal(sel[0].Values, []string{"training"}) || sel[1].Operator != "NotIn" ||
			!slices.Contains(sel[1].Values, "kube-system") || !slices.Contains(sel[1].Values, "faultline") {
			t.Fatalf("namespace selector %+v", sel)
		}
		// Cleared by someone else: the resync puts it back.
		mwc.Webhooks[0].ClientConfig.CABundle = nil
		_, err = e.admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, mwc, metav1.UpdateOptions{})
		must(t, err)
		deadline := time.Now().Add(20 * time.Second)
		for {
			mwc, err = e.admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "faultline-preflight", metav1.GetOptions{})
			must(t, err)
			if bytes.Equal(mwc.Webhooks[0].ClientConfig.CABundle, sec.Data["ca.crt"]) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("caBundle not restored")
			}
			time.Sleep(200 * time.Millisecond)
		}
	})

	t.Run("extended resources: largest GPU and NIC counts, NCCL check gets the NICs", func(t *testing.T) {
		p := gpuPod("er-1", 8, 4)
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "sidecar", Image: "side:1",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("2")}}})
		p.Spec.InitContainers = []corev1.Container{{Name: "user-init", Image: "init:1"}}
		got := e.create(p)
		if names := initNames(got); !slices.Equal(names, []string{"preflight-dcgm-diag", "preflight-nccl-loopback", "user-init"}) {
			t.Fatalf("init containers %v", names)
		}
		dcgm, loop := container(got, "preflight-dcgm-diag"), container(got, "preflight-nccl-loopback")
		if q := dcgm.Resources.Limits["nvidia.com/gpu"]; q.Value() != 8 {
			t.Errorf("dcgm GPUs %v", q)
		}
		if _, ok := dcgm.Resources.Limits["nvidia.com/mlnxnics"]; ok {
			t.Error("dcgm-diag got the NICs")
		}
		if q := loop.Resources.Limits["nvidia.com/mlnxnics"]; q.Value() != 4 {
			t.Errorf("loopback NICs %v", q)
		}
		if !slices.Equal(dcgm.Command, []string{"faultline-preflight"}) || !slices.Contains(dcgm.Args, "--dcgm.diag-level=2") ||
			dcgm.Args[0] != "check" || dcgm.Args[1] != "dcgm-diag" || !slices.Contains(dcgm.Args, "--gateway.addr=gw.faultline.svc:50051") {
			t.Errorf("dcgm command %v %v", dcgm.Command, dcgm.Args)
		}
		if ev := envOf(dcgm); ev["NODE_NAME"] != "field:spec.nodeName" || ev["POD_NAME"] != "field:metadata.name" {
			t.Errorf("env %v", ev)
		}
		if got.Annotations[injection.AnnotationInjected] != "preflight-dcgm-diag,preflight-nccl-loopback" ||
			!strings.Contains(got.Annotations[injection.AnnotationSkipped], "nccl-allreduce: not in a gang") {
			t.Errorf("annotations %v", got.Annotations)
		}
		vols := map[string]corev1.Volume{}
		for _, v := range got.Spec.Volumes {
			vols[v.Name] = v
		}
		if vols[injection.VolumeState].HostPath == nil || vols[injection.VolumeState].HostPath.Path != "/var/lib/faultline-preflight" ||
			vols[injection.VolumeToken].Secret == nil || vols[injection.VolumeToken].Secret.SecretName != "faultline-preflight-token" {
			t.Errorf("volumes %+v", got.Spec.Volumes)
		}
	})

	t.Run("no GPU, other namespace, system namespace: untouched", func(t *testing.T) {
		for _, p := range []*corev1.Pod{gpuPod("cpu-only", 0, 0), func() *corev1.Pod { p := gpuPod("other-ns", 8, 4); p.Namespace = "other"; return p }(),
			func() *corev1.Pod { p := gpuPod("sys-ns", 8, 4); p.Namespace = "kube-system"; return p }()} {
			got := e.create(p)
			if len(got.Spec.InitContainers) != 0 || len(got.Spec.Volumes) != 0 || got.Annotations[injection.AnnotationInjected] != "" {
				t.Errorf("%s/%s mutated: %v", got.Namespace, got.Name, initNames(got))
			}
		}
	})

	t.Run("no network devices: only dcgm-diag", func(t *testing.T) {
		got := e.create(gpuPod("no-nic", 4, 0))
		if names := initNames(got); !slices.Equal(names, []string{"preflight-dcgm-diag"}) {
			t.Fatalf("init containers %v", names)
		}
	})

	t.Run("the pod's own container of a check's name: created, that check left out", func(t *testing.T) {
		p := gpuPod("own-dcgm", 8, 4)
		p.Spec.InitContainers = []corev1.Container{{Name: "preflight-dcgm-diag", Image: "user/own:1"}}
		got := e.create(p) // two init containers of one name: the API server would refuse the pod
		if names := initNames(got); !slices.Equal(names, []string{"preflight-nccl-loopback", "preflight-dcgm-diag"}) {
			t.Fatalf("init containers %v", names)
		}
		if s := got.Annotations[injection.AnnotationSkipped]; !strings.Contains(s, "dcgm-diag: the pod already has a container named preflight-dcgm-diag") {
			t.Errorf("skipped %q", s)
		}
	})

	t.Run("DRA claims and claim templates by device class", func(t *testing.T) {
		rapi := e.admin.ResourceV1()
		_, err := rapi.ResourceClaimTemplates("training").Create(ctx, &resourcev1.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: "gpus"},
			Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
				Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.example.com"}}}}}},
		}, metav1.CreateOptions{})
		must(t, err)
		_, err = rapi.ResourceClaims("training").Create(ctx, &resourcev1.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "training-rdma"},
			Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
				Requests: []resourcev1.DeviceRequest{{Name: "nic", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "rdma.example.com"}}}}},
		}, metav1.CreateOptions{})
		must(t, err)
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "dra-1", Namespace: "training"},
			Spec: corev1.PodSpec{
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu-claim", ResourceClaimTemplateName: ptr("gpus")}, {Name: "rdma-claim", ResourceClaimName: ptr("training-rdma")}},
				Containers: []corev1.Container{{Name: "main", Image: "trainer:1", Resources: corev1.ResourceRequirements{
					Claims: []corev1.ResourceClaim{{Name: "gpu-claim"}, {Name: "rdma-claim"}}}}}}}
		got := e.create(p)
		claims := func(c *corev1.Container) []string {
			var out []string
			for _, cl := range c.Resources.Claims {
				out = append(out, cl.Name)
			}
			return out
		}
		if names := initNames(got); !slices.Equal(names, []string{"preflight-dcgm-diag", "preflight-nccl-loopback"}) {
			t.Fatalf("init containers %v", names)
		}
		if c := claims(container(got, "preflight-dcgm-diag")); !slices.Equal(c, []string{"gpu-claim"}) {
			t.Errorf("dcgm claims %v", c)
		}
		if c := claims(container(got, "preflight-nccl-loopback")); !slices.Equal(c, []string{"gpu-claim", "rdma-claim"}) {
			t.Errorf("loopback claims %v", c)
		}
		// A claim that does not exist: with failure_policy Fail the pod is
		// refused, with a message saying why.
		bad := p.DeepCopy()
		bad.Name = "dra-missing"
		bad.Spec.ResourceClaims[1].ResourceClaimName = ptr("no-such-claim")
		_, err = e.admin.CoreV1().Pods("training").Create(ctx, bad, metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), "cannot inject preflight checks") || !strings.Contains(err.Error(), "no-such-claim") {
			t.Fatalf("pod with a missing claim: %v", err)
		}
	})

	t.Run("NCCL env by glob, NCCL_TOPO_FILE with its volume, without one not copied", func(t *testing.T) {
		p := gpuPod("nccl-env", 8, 4)
		p.Spec.Volumes = []corev1.Volume{{Name: "topo", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "topology"}}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "topo", MountPath: "/topo"}}
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NCCL_IB_HCA", Value: "mlx5_0,mlx5_1"}, {Name: "UCX_TLS", Value: "rc"},
			{Name: "NCCL_TOPO_FILE", Value: "/topo/ndv5.xml"}, {Name: "OMPI_MCA_btl", Value: "^openib"}, {Name: "OTHER", Value: "x"}}
		got := e.create(p)
		loop, dcgm := container(got, "preflight-nccl-loopback"), container(got, "preflight-dcgm-diag")
		ev := envOf(loop)
		if ev["NCCL_IB_HCA"] != "mlx5_0,mlx5_1" || ev["UCX_TLS"] != "rc" || ev["NCCL_TOPO_FILE"] != "/topo/ndv5.xml" || ev["OMPI_MCA_btl"] != "^openib" || ev["OTHER"] != "" {
			t.Errorf("loopback env %v", ev)
		}
		if !slices.ContainsFunc(loop.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "topo" && m.MountPath == "/topo" }) {
			t.Errorf("topology mount missing: %+v", loop.VolumeMounts)
		}
		if ev := envOf(dcgm); ev["NCCL_IB_HCA"] != "" {
			t.Errorf("dcgm-diag got NCCL env %v", ev)
		}
		baked := gpuPod("nccl-baked", 8, 4)
		baked.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NCCL_TOPO_FILE", Value: "/opt/my/topo.xml"}, {Name: "NCCL_DEBUG", Value: "INFO"}}
		got = e.create(baked)
		if ev := envOf(container(got, "preflight-nccl-loopback")); ev["NCCL_TOPO_FILE"] != "" || ev["NCCL_DEBUG"] != "INFO" {
			t.Errorf("baked topology env %v", ev)
		}
	})

	t.Run("reinvocation: the stored pod yields no patch; a later change is picked up", func(t *testing.T) {
		stored := e.create(gpuPod("reinvoke", 8, 4))
		resp := e.review(stored)
		if !resp.Allowed || resp.Patch != nil {
			t.Fatalf("reinvocation on the stored pod: allowed=%v patch=%s", resp.Allowed, resp.Patch)
		}
		changed := stored.DeepCopy()
		changed.Spec.Containers[0].Env = append(changed.Spec.Containers[0].Env, corev1.EnvVar{Name: "NCCL_SOCKET_IFNAME", Value: "eth0"})
		resp = e.review(changed)
		if resp.Patch == nil || !strings.Contains(string(resp.Patch), "NCCL_SOCKET_IFNAME") {
			t.Fatalf("a change by another webhook was not picked up: %s", resp.Patch)
		}
		// The GPUs gone (another webhook moved them to DRA...): the
		// injection is taken back.
		nogpu := stored.DeepCopy()
		nogpu.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
		resp = e.review(nogpu)
		if resp.Patch == nil || !strings.Contains(string(resp.Patch), `"op":"remove","path":"/spec/initContainers/`) {
			t.Fatalf("stale injection not removed: %s", resp.Patch)
		}
	})

	t.Run("gangs: labels, Volcano, Kueue; ConfigMaps formed", func(t *testing.T) {
		mk := func(name string, labels, annotations map[string]string) *corev1.Pod {
			p := gpuPod(name, 8, 4)
			p.Labels, p.Annotations = labels, annotations
			return e.create(p)
		}
		lbl := map[string]string{"example.com/gang-id": "job1", "example.com/gang-size": "2"}
		b := mk("job1-b", lbl, nil)
		a := mk("job1-a", lbl, nil)
		for _, p := range []*corev1.Pod{a, b} {
			if p.Labels[gang.LabelGang] != "lbl-job1" || container(p, "preflight-nccl-allreduce") == nil {
				t.Fatalf("%s: gang label %q, init %v", p.Name, p.Labels[gang.LabelGang], initNames(p))
			}
			ar := container(p, "preflight-nccl-allreduce")
			if !slices.ContainsFunc(ar.VolumeMounts, func(m corev1.VolumeMount) bool {
				return m.Name == injection.VolumeGang && m.MountPath == "/etc/preflight"
			}) {
				t.Errorf("gang mount missing %+v", ar.VolumeMounts)
			}
			if !slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool {
				return v.ConfigMap != nil && v.ConfigMap.Name == "preflight-lbl-job1" && *v.ConfigMap.Optional
			}) {
				t.Errorf("gang volume missing %+v", p.Spec.Volumes)
			}
		}
		setIP(t, e.admin, b, "10.0.1.6")
		setIP(t, e.admin, a, "10.0.1.5")
		cm := waitConfigMap(t, e.admin, "preflight-lbl-job1", func(cm *corev1.ConfigMap) bool {
			return strings.Count(cm.Data[coordination.KeyPeers], "\n") == 2
		})
		if cm.Data[coordination.KeyExpected] != "2" || cm.Data[coordination.KeyMaster] != "10.0.1.5" ||
			cm.Data[coordination.KeyPeers] != "job1-a:10.0.1.5\njob1-b:10.0.1.6\n" || cm.Data[coordination.KeyGangID] != "lbl-job1" {
			t.Errorf("configmap %v", cm.Data)
		}
		if len(cm.OwnerReferences) != 2 || cm.OwnerReferences[0].Name != "job1-a" || cm.OwnerReferences[0].UID != a.UID {
			t.Errorf("owners %+v", cm.OwnerReferences)
		}

		// Volcano: the size comes from the PodGroup's spec.minMember.
		gvr := schema.GroupVersionResource{Group: "scheduling.volcano.sh", Version: "v1beta1", Resource: "podgroups"}
		_, err := e.dyn.Resource(gvr).Namespace("training").Create(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": map[string]any{"name": "pg-7"},
			"spec": map[string]any{"minMember": int64(3)}}}, metav1.CreateOptions{})
		must(t, err)
		v := mk("vc-0", nil, map[string]string{"scheduling.k8s.io/group-name": "pg-7"})
		setIP(t, e.admin, v, "10.0.2.1")
		cm = waitConfigMap(t, e.admin, "preflight-volcano-pg-7", func(cm *corev1.ConfigMap) bool {
			return cm.Data[coordination.KeyExpected] != "" && cm.Data[coordination.KeyPeers] != ""
		})
		if cm.Data[coordination.KeyExpected] != "3" || cm.Data[coordination.KeyPeers] != "vc-0:10.0.2.1\n" {
			t.Errorf("volcano configmap %v", cm.Data)
		}

		// Kueue: the pod-group total count.
		k := mk("kq-0", map[string]string{gang.KueuePodGroupLabel: "grp-1"}, map[string]string{gang.KueueTotalCountAnnot: "4"})
		setIP(t, e.admin, k, "10.0.3.1")
		cm = waitConfigMap(t, e.admin, "preflight-kueue-grp-1", func(cm *corev1.ConfigMap) bool { return cm.Data[coordination.KeyPeers] != "" })
		if cm.Data[coordination.KeyExpected] != "4" {
			t.Errorf("kueue configmap %v", cm.Data)
		}

		// A foreign ConfigMap with a gang's name is never touched.
		_, err = e.admin.CoreV1().ConfigMaps("training").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "preflight-lbl-mine"},
			Data: map[string]string{"owner": "someone"}}, metav1.CreateOptions{})
		must(t, err)
		m := mk("mine-0", map[string]string{"example.com/gang-id": "mine", "example.com/gang-size": "1"}, nil)
		setIP(t, e.admin, m, "10.0.4.1")
		time.Sleep(2 * time.Second)
		cm, err = e.admin.CoreV1().ConfigMaps("training").Get(ctx, "preflight-lbl-mine", metav1.GetOptions{})
		must(t, err)
		if len(cm.Data) != 1 || cm.Data["owner"] != "someone" {
			t.Errorf("foreign ConfigMap changed: %v", cm.Data)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		n := counter(t, e.srv.Registry(), "preflight_injection_total", "injected")
		if n < 5 {
			t.Errorf("preflight_injection_total{result=injected} = %v", n)
		}
		// The self-signed certificate, issued at start for tls.validity.
		expiry := time.Unix(int64(gauge(t, e.srv.Registry(), "preflight_webhook_certificate_expiry_timestamp_seconds")), 0)
		if want := time.Now().Add(e.cfg.TLS.Validity); expiry.Before(want.Add(-time.Hour)) || expiry.After(want) {
			t.Errorf("preflight_webhook_certificate_expiry_timestamp_seconds = %s, want about %s", expiry, want)
		}
	})
}

// gauge reads a gauge without labels from a registry.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	must(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}

// counter finds one series of a counter vector in a registry.
func counter(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	must(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{result=%q}", name, result)
	return 0
}

// setIP gives a pod its IP and its gang-wide check's init container (when
// it has one) the running state that makes it a peer.
func setIP(t *testing.T, k kubernetes.Interface, p *corev1.Pod, ip string) {
	t.Helper()
	inits := "[]"
	if c := container(p, gang.AllreduceContainer); c != nil {
		inits = fmt.Sprintf(`[{"name":%q,"image":%q,"imageID":"","ready":false,"restartCount":0,"state":{"running":{"startedAt":"2026-01-01T00:00:00Z"}}}]`, c.Name, c.Image)
	}
	patch := fmt.Sprintf(`{"status":{"podIP":%q,"podIPs":[{"ip":%q}],"phase":"Pending","initContainerStatuses":%s}}`, ip, ip, inits)
	_, err := k.CoreV1().Pods(p.Namespace).Patch(context.Background(), p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
	must(t, err)
}

func waitConfigMap(t *testing.T, k kubernetes.Interface, name string, ok func(*corev1.ConfigMap) bool) *corev1.ConfigMap {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		cm, err := k.CoreV1().ConfigMaps("training").Get(context.Background(), name, metav1.GetOptions{})
		if err == nil && ok(cm) {
			return cm
		}
		if time.Now().After(deadline) {
			t.Fatalf("ConfigMap %s not formed: %v %v", name, cm, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// review sends a pod to the webhook as the API server would on
// reinvocation and returns the response.
func (e *env) review(p *corev1.Pod) *admissionv1.AdmissionResponse {
	e.t.Helper()
	raw, err := json.Marshal(p)
	must(e.t, err)
	rev := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "rv-1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Namespace: p.Namespace, Name: p.Name,
			Operation: admissionv1.Create, Object: runtimeRaw(raw)}}
	body, _ := json.Marshal(rev)
	code, out := e.post("application/json", body)
	if code != 200 {
		e.t.Fatalf("status %d: %s", code, out)
	}
	var got admissionv1.AdmissionReview
	must(e.t, json.Unmarshal(out, &got))
	if got.Response == nil || got.Response.UID != "rv-1" {
		e.t.Fatalf("response %s", out)
	}
	return got.Response
}

// post sends a body to the webhook over TLS, trusting its CA.
func (e *env) post(contentType string, body []byte) (int, []byte) {
	e.t.Helper()
	mwc, err := e.admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), "faultline-preflight", metav1.GetOptions{})
	must(e.t, err)
	pool := x509Pool(e.t, mwc.Webhooks[0].ClientConfig.CABundle)
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := cl.Post(e.url, contentType, bytes.NewReader(body))
	must(e.t, err)
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// TestMalformedReviews: what is not an AdmissionReview gets a clear error.
func TestMalformedReviews(t *testing.T) {
	e := startEnv(t)
	for _, tc := range []struct {
		name, ct, body string
		code           int
		want           string
	}{
		{"garbage", "application/json", "{not json", 400, "malformed AdmissionReview"},
		{"wrong kind", "application/json", `{"apiVersion":"v1","kind":"Pod"}`, 400, `apiVersion "v1" kind "Pod", want admission.k8s.io/v1 AdmissionReview`},
		{"no request", "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, 400, "no request"},
		{"no uid", "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE"}}`, 400, "request.uid is empty"},
		{"content type", "text/plain", `{}`, 415, `Content-Type "text/plain" is not application/json`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := e.post(tc.ct, []byte(tc.body))
			if code != tc.code || !strings.Contains(string(out), tc.want) {
				t.Fatalf("%d %s, want %d %q", code, out, tc.code, tc.want)
			}
		})
	}
	// A request whose object is not a pod: denied, saying so.
	body := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","operation":"CREATE","namespace":"training",
	  "resource":{"version":"v1","resource":"pods"},"object":{"spec":{"containers":"not-a-list"}}}}`
	code, out := e.post("application/json", []byte(body))
	var rev admissionv1.AdmissionReview
	if code != 200 || json.Unmarshal(out, &rev) != nil || rev.Response.Allowed || !strings.Contains(rev.Response.Result.Message, "request.object is not a Pod") {
		t.Fatalf("%d %s", code, out)
	}
}
