package webhook

import (
	"context"
	"testing"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// TestConfigurationOwnedByClusterRole: with webhook.owner_cluster_role the
// configuration the server creates, or finds without it, is owned by that
// ClusterRole, so deleting the ClusterRole (helm uninstall) has the garbage
// collector delete it: left behind, it called a Service gone and, failing
// closed, refused every pod of the opted-in namespaces. While the
// ClusterRole cannot be read no configuration is created; without the
// key, or without manage_configuration, no owner is set.
func TestConfigurationOwnedByClusterRole(t *testing.T) {
	ctx := context.Background()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "fl-preflight-webhook", UID: types.UID("uid-1")}}
	want := metav1.OwnerReference{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole", Name: "fl-preflight-webhook", UID: "uid-1"}
	cfg := DefaultConfig()
	cfg.Webhook.OwnerClusterRole = role.Name
	get := func(t *testing.T, kc *fake.Clientset) *admissionregv1.MutatingWebhookConfiguration {
		t.Helper()
		mwc, err := kc.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, cfg.Webhook.ConfigurationName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return mwc
	}

	t.Run("created", func(t *testing.T) {
		kc := fake.NewClientset(role)
		if _, err := ensureConfiguration(ctx, kc, &cfg, fixedBundle("ca")); err != nil {
			t.Fatal(err)
		}
		if refs := get(t, kc).OwnerReferences; len(refs) != 1 || refs[0] != want {
			t.Errorf("owner references %+v, want %+v", refs, want)
		}
		// Again: nothing to change.
		if changed, err := ensureConfiguration(ctx, kc, &cfg, fixedBundle("ca")); err != nil || changed {
			t.Errorf("second ensure: changed %v, %v", changed, err)
		}
	})
	t.Run("an existing one without it, or with a stale UID", func(t *testing.T) {
		other := metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "uid-x"}
		stale := want
		stale.UID = "uid-0"
		for _, refs := range [][]metav1.OwnerReference{nil, {other, stale}} {
			old := &admissionregv1.MutatingWebhookConfiguration{
				ObjectMeta: metav1.ObjectMeta{Name: cfg.Webhook.ConfigurationName, OwnerReferences: refs},
				Webhooks:   []admissionregv1.MutatingWebhook{cfg.DesiredWebhook([]byte("ca"))},
			}
			kc := fake.NewClientset(role, old)
			if changed, err := ensureConfiguration(ctx, kc, &cfg, fixedBundle("ca")); err != nil || !changed {
				t.Fatalf("ensure: changed %v, %v", changed, err)
			}
			got := get(t, kc).OwnerReferences
			if got[len(got)-1] != want || len(refs) > 0 && (len(got) != 2 || got[0] != other) {
				t.Errorf("owner references %+v (before %+v), want ours in place of the stale one", got, refs)
			}
		}
	})
	t.Run("owner missing", func(t *testing.T) {
		kc := fake.NewClientset()
		if _, err := ensureConfiguration(ctx, kc, &cfg, fixedBundle("ca")); err == nil {
			t.Fatal("created a configuration without its owner")
		}
		if l, _ := kc.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{}); len(l.Items) != 0 {
			t.Errorf("configurations %v", l.Items)
		}
	})
	t.Run("no owner configured", func(t *testing.T) {
		c := DefaultConfig()
		kc := fake.NewClientset(role)
		if _, err := ensureConfiguration(ctx, kc, &c, fixedBundle("ca")); err != nil {
			t.Fatal(err)
		}
		if refs := get(t, kc).OwnerReferences; len(refs) != 0 {
			t.Errorf("owner references %+v, want none", refs)
		}
	})
}

// fixedBundle is a caBundle that ignores the one published.
func fixedBundle(ca string) func([]byte) []byte {
	return func([]byte) []byte { return []byte(ca) }
}
