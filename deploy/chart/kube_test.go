package chart

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"

	"github.com/faultline/faultline/internal/testenv"
)

// TestDryRunOnAPIServer applies every manifest of each value set to the
// test env's real kube-apiserver with server-side apply and dry-run: the
// apiserver validates each object against its schema (and the chart's
// CRDs), admission included, and stores nothing.
func TestDryRunOnAPIServer(t *testing.T) {
	helm := testenv.Helm(t)
	k := testenv.StartKube(t, testenv.KubeOptions{})
	k.ApplyCRDs(t, filepath.Join(Dir(), "crds", "*.yaml"))
	// ServiceMonitor (Prometheus Operator) and cert-manager's kinds are the
	// user's operators'; stand-ins let their objects be dry-run applied.
	k.ApplyCRDs(t, filepath.Join("testdata", "stub-crds", "*.yaml"))
	ctx := context.Background()
	for _, ns := range []string{namespace, "faultline-events"} {
		if _, err := k.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	dyn, err := dynamic.NewForConfig(k.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(k.Client().Discovery()))
	for set, file := range ValueSets() {
		t.Run(set, func(t *testing.T) {
			objs, err := Render(ctx, helm, t.TempDir(), release, namespace, []string{file})
			if err != nil {
				t.Fatal(err)
			}
			kinds := map[string]int{}
			for _, o := range objs {
				gvk := o.GroupVersionKind()
				m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
				if err != nil {
					t.Errorf("%s %s: %v", gvk, o.GetName(), err)
					continue
				}
				ri := dyn.Resource(m.Resource)
				var r dynamic.ResourceInterface = ri
				if m.Scope.Name() == "namespace" {
					ns := o.GetNamespace()
					if ns == "" {
						t.Errorf("%s %s: namespaced, but rendered without a namespace", gvk.Kind, o.GetName())
						ns = namespace
					}
					r = ri.Namespace(ns)
				}
				if _, err := r.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: "faultline-chart-test", DryRun: []string{metav1.DryRunAll}, Force: true}); err != nil {
					t.Errorf("%s %s/%s: %v", gvk.Kind, o.GetNamespace(), o.GetName(), err)
				}
				kinds[gvk.Kind]++
			}
			t.Logf("%s: %d objects dry-run applied: %v", set, len(objs), kinds)
			// Nothing was stored.
			if ds, _ := k.Client().AppsV1().Deployments(namespace).List(ctx, metav1.ListOptions{}); len(ds.Items) != 0 {
				t.Errorf("dry-run stored %d Deployments", len(ds.Items))
			}
		})
	}
}

// TestInstallOnKWOK installs the chart with `helm install` onto the real
// apiserver with kube-controller-manager (deployment, replicaset,
// daemonset controllers, and node lifecycle, which lifts the not-ready
// taint a new node is created with once KWOK reports it Ready), kube-scheduler and KWOK's fake nodes (2 GPU
// nodes, 1 CPU node): every Deployment becomes Available and the agent
// DaemonSet runs on the GPU nodes only. The images are never pulled: KWOK
// fakes the kubelets.
func TestInstallOnKWOK(t *testing.T) {
	helm := testenv.Helm(t)
	k := testenv.StartKube(t, testenv.KubeOptions{
		ControllerManager: true,
		Controllers:       "deployment,replicaset,daemonset,nodelifecycle,serviceaccount,disruption",
		Scheduler:         true,
		KWOK:              true,
	})
	ctx := context.Background()
	cs := k.Client()
	gpuNodes := []string{"gpu-node-0", "gpu-node-1"}
	for _, n := range append(slices.Clone(gpuNodes), "cpu-node-0") {
		createNode(t, cs, n, strings.HasPrefix(n, "gpu"))
	}
	began := time.Now()
	out, err := Helm(ctx, helm, t.TempDir(), "install", release, Dir(), "--namespace", namespace, "--create-namespace",
		"--kubeconfig", k.Kubeconfig(), "-f", ValueSets()["default"], "--set", "kube.localCluster=gpu-east", "--timeout", "3m")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("helm install: %s", strings.TrimSpace(string(out)))
	// The chart's CRDs were installed from crds/.
	if _, err := k.Client().Discovery().ServerResourcesForGroupVersion("janitor.dgxc.nvidia.com/v1alpha1"); err != nil {
		t.Errorf("chart CRDs: %v", err)
	}
	waitInstalled(ctx, t, cs, namespace, "faultline", began, gpuNodes,
		[]string{"gateway", "store", "correlate", "quarantine", "drain", "remediate", "conformance", "preflight"})

	// The secure set beside it, in its own namespace: every role (janitor
	// too), cert-manager Certificates and ServiceMonitors (their operators'
	// CRDs stood in for), a second agent DaemonSet on another metrics port.
	k.ApplyCRDs(t, filepath.Join("testdata", "stub-crds", "*.yaml"))
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "faultline-events"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	began = time.Now()
	out, err = Helm(ctx, helm, t.TempDir(), "install", "fleet", Dir(), "--namespace", "fleet", "--create-namespace",
		"--kubeconfig", k.Kubeconfig(), "-f", ValueSets()["secure"], "--set", "agent.metricsPort=2113", "--timeout", "3m")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	waitInstalled(ctx, t, cs, "fleet", "fleet-faultline", began, gpuNodes,
		[]string{"gateway", "store", "correlate", "quarantine", "drain", "remediate", "conformance", "janitor", "preflight"})
}

// waitInstalled waits until every Deployment of the release is Available
// and its agent DaemonSet runs on exactly the GPU nodes.
func waitInstalled(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, fullname string, began time.Time, gpuNodes, components []string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		pending := notReady(ctx, t, cs, ns, fullname, gpuNodes, components)
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			pods, _ := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			var ps []string
			for _, p := range pods.Items {
				why := ""
				for _, c := range p.Status.Conditions {
					if c.Status != corev1.ConditionTrue {
						why += fmt.Sprintf(" %s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message)
					}
				}
				ps = append(ps, fmt.Sprintf("%s on %q: %s%s", p.Name, p.Spec.NodeName, p.Status.Phase, why))
			}
			t.Fatalf("after %s not ready: %s\npods: %s", time.Since(began).Round(time.Second), strings.Join(pending, "; "), strings.Join(ps, "; "))
		}
		time.Sleep(time.Second)
	}
	t.Logf("%s: every Deployment (%d) Available and the DaemonSet on both GPU nodes %s after helm install began", ns, len(components), time.Since(began).Round(100*time.Millisecond))
	// The DaemonSet's pods are on the GPU nodes, one each.
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=agent"})
	if err != nil {
		t.Fatal(err)
	}
	var on []string
	for _, p := range pods.Items {
		on = append(on, p.Spec.NodeName)
	}
	slices.Sort(on)
	if !slices.Equal(on, gpuNodes) {
		t.Errorf("agent pods on %q, want %q", on, gpuNodes)
	}
}

// notReady lists what is not yet there: Deployments not Available, the
// agent DaemonSet not ready on every GPU node.
func notReady(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, fullname string, gpuNodes, components []string) []string {
	t.Helper()
	var out []string
	ds, err := cs.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return []string{err.Error()}
	}
	var names []string
	for _, d := range ds.Items {
		names = append(names, d.Name)
	}
	for _, c := range components {
		if !slices.Contains(names, fullname+"-"+c) {
			out = append(out, "no Deployment "+fullname+"-"+c)
		}
	}
	for _, d := range ds.Items {
		if !available(d) {
			out = append(out, fmt.Sprintf("Deployment %s not Available (%d/%d ready)", d.Name, d.Status.ReadyReplicas, d.Status.Replicas))
		}
	}
	dss, err := cs.AppsV1().DaemonSets(ns).Get(ctx, fullname+"-agent", metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		out = append(out, "no DaemonSet "+fullname+"-agent")
	case err != nil:
		out = append(out, err.Error())
	case dss.Status.DesiredNumberScheduled != int32(len(gpuNodes)) || dss.Status.NumberReady != int32(len(gpuNodes)):
		out = append(out, fmt.Sprintf("DaemonSet %s-agent: %d desired, %d ready, want %d", fullname, dss.Status.DesiredNumberScheduled, dss.Status.NumberReady, len(gpuNodes)))
	}
	return out
}

func available(d appsv1.Deployment) bool {
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable && c.Status == corev1.ConditionTrue {
			return d.Status.ReadyReplicas > 0
		}
	}
	return false
}

// createNode makes a KWOK node (kwok manages every node here): GPU nodes
// carry the GPU Operator's label the agent's nodeSelector uses.
func createNode(t *testing.T, cs kubernetes.Interface, name string, gpu bool) {
	t.Helper()
	labels := map[string]string{"kubernetes.io/hostname": name, "type": "kwok"}
	if gpu {
		labels["nvidia.com/gpu.present"] = "true"
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"}},
		Status:     corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
	if _, err := cs.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
