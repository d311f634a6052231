package janitor

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/faultline/faultline/internal/testenv"
)

// TestBMCLabelsTheNodeCannotWrite: on a real kube-apiserver with the
// NodeRestriction admission plugin, a node's
// kubelet — the test acts as system:node:gpu-la — may point its own
// faultline.io/bmc-address annotation at another node's system behind a
// BMC of the allowed networks with the same credential, but cannot set,
// change or remove its node-restriction.kubernetes.io/faultline-bmc-*
// labels. The janitor follows the labels: the RebootNode of gpu-la
// resets gpu-la's system, not gpu-lb's. Before, it followed the
// annotation: gpu-lb's machine was reset and gpu-la's reboot timed out.
func TestBMCLabelsTheNodeCannotWrite(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, 2, testenv.KubeOptions{APIServerArgs: []string{"--enable-admission-plugins=NodeRestriction"}})
	ctx := context.Background()
	// What the Node authorizer grants a kubelet on Node objects (RBAC
	// here: the harness's authorization mode); NodeRestriction then
	// limits it to its own Node and its labels as a kubelet's.
	if _, err := e.kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "test-kubelet"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch", "update"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "test-kubelet"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "test-kubelet"},
		Subjects: []rbacv1.Subject{{Kind: "Group", APIGroup: "rbac.authorization.k8s.io", Name: "system:nodes"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.node("gpu-la", sysID(0), true, nil)
	e.node("gpu-lb", sysID(1), true, nil)
	host, port, _ := strings.Cut(strings.TrimPrefix(e.bmc.URL, "https://"), ":")
	patch := func(k kubernetes.Interface, labels, annotations map[string]any) error {
		meta := map[string]any{}
		if labels != nil {
			meta["labels"] = labels
		}
		if annotations != nil {
			meta["annotations"] = annotations
		}
		b, _ := json.Marshal(map[string]any{"metadata": meta})
		_, err := k.CoreV1().Nodes().Patch(ctx, "gpu-la", types.MergePatchType, b, metav1.PatchOptions{})
		return err
	}
	// The administrator labels gpu-la with its BMC.
	if err := patch(e.kube, map[string]any{LabelBMCHost: host, LabelBMCPort: port, LabelBMCSystem: sysID(0)}, nil); err != nil {
		t.Fatal(err)
	}
	rc := e.kc.RESTConfig()
	rc.Impersonate.UserName, rc.Impersonate.Groups = "system:node:gpu-la", []string{"system:nodes", "system:authenticated"}
	kubelet, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	// The compromised node: its annotation is its own to edit …
	if err := patch(kubelet, nil, map[string]any{AnnotationBMC: e.bmc.URL + e.bmc.SystemPath(sysID(1))}); err != nil {
		t.Fatalf("the kubelet could not edit its own annotation: %v", err)
	}
	// … the labels are not: neither changed nor removed.
	for name, labels := range map[string]map[string]any{
		"changed": {LabelBMCSystem: sysID(1)},
		"removed": {LabelBMCHost: nil, LabelBMCPort: nil, LabelBMCSystem: nil},
	} {
		if err := patch(kubelet, labels, nil); !apierrors.IsForbidden(err) {
			t.Fatalf("the kubelet's labels %s: %v, want Forbidden (NodeRestriction)", name, err)
		}
	}

	cfg := e.config()
	cfg.RebootTimeout, cfg.ForceAfter = 30*time.Second, 0
	j, _ := e.janitor(cfg, false, nil)
	run(t, j)
	e.create(kindReboot, "reboot-la", "gpu-la", false)
	o := e.wait(kindReboot, "reboot-la", 90*time.Second)
	if a, b := e.bmc.Resets(sysID(0)), e.bmc.Resets(sysID(1)); a != 1 || b != 0 {
		t.Fatalf("gpu-la's system got %d resets, gpu-lb's %d: want 1 and 0 (status %v)", a, b, o.Object["status"])
	}
	if got := condOf(o, CondNodeReady); got != "True/Succeeded" {
		t.Fatalf("NodeReady %s, want True/Succeeded (status %v)", got, o.Object["status"])
	}
}
