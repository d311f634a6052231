package webhook

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// NamespaceLabel is the label every namespace carries with its name.
const NamespaceLabel = "kubernetes.io/metadata.name"

// excluded returns the namespaces never mutated: the configured ones, the
// system ones and the webhook's own.
func (c *Config) excluded() []string {
	out := slices.Clone(c.Namespaces.Exclude)
	for _, ns := range append(slices.Clone(SystemNamespaces), c.Webhook.ServiceNamespace) {
		if !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	slices.Sort(out)
	return out
}

// DesiredWebhook is the webhook entry the configuration asks for
// (ADR-026's sketch): pod CREATE in the opted-in namespaces and never in
// the excluded ones, the configured failure policy and timeout, no side
// effects, reinvoked when a later webhook changes the pod.
func (c *Config) DesiredWebhook(caBundle []byte) admissionregv1.MutatingWebhook {
	fail := admissionregv1.FailurePolicyType(c.Webhook.FailurePolicy)
	none := admissionregv1.SideEffectClassNone
	timeout := int32(c.Webhook.Timeout.Seconds())
	reinvoke := admissionregv1.IfNeededReinvocationPolicy
	equivalent := admissionregv1.Equivalent
	scope := admissionregv1.NamespacedScope
	cc := admissionregv1.WebhookClientConfig{CABundle: caBundle}
	if c.Webhook.URL != "" {
		u := c.Webhook.URL
		cc.URL = &u
	} else {
		p := c.Webhook.Path
		port := int32(c.Webhook.ServicePort)
		cc.Service = &admissionregv1.ServiceReference{Name: c.Webhook.ServiceName, Namespace: c.Webhook.ServiceNamespace, Path: &p, Port: &port}
	}
	include := slices.Clone(c.Namespaces.Include)
	slices.Sort(include)
	return admissionregv1.MutatingWebhook{
		Name:         c.Webhook.Name,
		ClientConfig: cc,
		Rules: []admissionregv1.RuleWithOperations{{
			Operations: []admissionregv1.OperationType{admissionregv1.Create},
			Rule:       admissionregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}, Scope: &scope},
		}},
		NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: NamespaceLabel, Operator: metav1.LabelSelectorOpIn, Values: include},
			{Key: NamespaceLabel, Operator: metav1.LabelSelectorOpNotIn, Values: c.excluded()},
		}},
		ObjectSelector:          &metav1.LabelSelector{},
		FailurePolicy:           &fail,
		MatchPolicy:             &equivalent,
		SideEffects:             &none,
		TimeoutSeconds:          &timeout,
		AdmissionReviewVersions: []string{"v1"},
		ReinvocationPolicy:      &reinvoke,
	}
}

// owner is the ownerReference to webhook.owner_cluster_role, nil without
// one (or without manage_configuration).
func owner(ctx context.Context, kc kubernetes.Interface, cfg *Config) (*metav1.OwnerReference, error) {
	name := cfg.Webhook.OwnerClusterRole
	if name == "" || !cfg.Webhook.ManageConfiguration {
		return nil, nil
	}
	cr, err := kc.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("webhook.owner_cluster_role: get ClusterRole %s: %w", name, err)
	}
	return &metav1.OwnerReference{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole", Name: cr.Name, UID: cr.UID}, nil
}

// withOwner returns refs with ref in place of any other to the same
// ClusterRole (one deleted and made again has another UID).
func withOwner(refs []metav1.OwnerReference, ref metav1.OwnerReference) []metav1.OwnerReference {
	out := slices.Clone(refs)
	i := slices.IndexFunc(out, func(r metav1.OwnerReference) bool {
		return r.Kind == ref.Kind && r.Name == ref.Name && strings.HasPrefix(r.APIVersion, "rbac.authorization.k8s.io/")
	})
	if i < 0 {
		return append(out, ref)
	}
	out[i] = ref
	return out
}

// ensureConfiguration creates or corrects the MutatingWebhookConfiguration:
// with manage, the whole entry named webhook.name (other entries are left
// alone) and its owner (webhook.owner_cluster_role); without, only the
// caBundle of that entry. caBundle is given the one published (nil if
// none: the configuration or the entry is new); a nil caBundle keeps the
// one there (an external injector owns it). The update is conditional on
// the configuration read, so what caBundle merged is not lost to another
// replica's write in between.
func ensureConfiguration(ctx context.Context, kc kubernetes.Interface, cfg *Config, caBundle func(published []byte) []byte) (changed bool, err error) {
	api := kc.AdmissionregistrationV1().MutatingWebhookConfigurations()
	name := cfg.Webhook.ConfigurationName
	own, err := owner(ctx, kc, cfg)
	if err != nil {
		return false, err
	}
	cur, err := api.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if !cfg.Webhook.ManageConfiguration {
			return false, fmt.Errorf("webhook.configuration_name: MutatingWebhookConfiguration %q does not exist (and webhook.manage_configuration is false)", name)
		}
		want := &admissionregv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/managed-by": "faultline-preflight"}},
			Webhooks:   []admissionregv1.MutatingWebhook{cfg.DesiredWebhook(caBundle(nil))},
		}
		if own != nil {
			want.OwnerReferences = []metav1.OwnerReference{*own}
		}
		if _, err := api.Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return false, fmt.Errorf("create MutatingWebhookConfiguration %s: %w", name, err)
		}
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("get MutatingWebhookConfiguration %s: %w", name, err)
	}
	next := cur.DeepCopy()
	i := slices.IndexFunc(next.Webhooks, func(w admissionregv1.MutatingWebhook) bool { return w.Name == cfg.Webhook.Name })
	var published []byte
	if i >= 0 {
		published = next.Webhooks[i].ClientConfig.CABundle
	}
	bundle := caBundle(published)
	switch {
	case cfg.Webhook.ManageConfiguration:
		want := cfg.DesiredWebhook(bundle)
		if bundle == nil && i >= 0 {
			want.ClientConfig.CABundle = next.Webhooks[i].ClientConfig.CABundle
		}
		if i < 0 {
			next.Webhooks = append(next.Webhooks, want)
		} else {
			next.Webhooks[i] = want
		}
	case i < 0:
		return false, fmt.Errorf("webhook.name: MutatingWebhookConfiguration %s has no webhook %q", name, cfg.Webhook.Name)
	case bundle != nil:
		next.Webhooks[i].ClientConfig.CABundle = bundle
	}
	if own != nil {
		next.OwnerReferences = withOwner(next.OwnerReferences, *own)
	}
	if equality.Semantic.DeepEqual(cur.Webhooks, next.Webhooks) && equality.Semantic.DeepEqual(cur.OwnerReferences, next.OwnerReferences) {
		return false, nil
	}
	if _, err := api.Update(ctx, next, metav1.UpdateOptions{}); err != nil {
		return false, fmt.Errorf("update MutatingWebhookConfiguration %s: %w", name, err)
	}
	return true, nil
}

// caBundleOf returns the caBundle the configuration's entry holds.
func caBundleOf(ctx context.Context, kc kubernetes.Interface, cfg *Config) []byte {
	cur, err := kc.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, cfg.Webhook.ConfigurationName, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	for _, w := range cur.Webhooks {
		if w.Name == cfg.Webhook.Name {
			return bytes.Clone(w.ClientConfig.CABundle)
		}
	}
	return nil
}
