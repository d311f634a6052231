package injection

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
)

// KubeClaims resolves pod resource claims through resource.k8s.io/v1:
// from informer caches of the watched namespaces (so admission does not
// wait on the API), falling back to a GET for a claim created just before
// its pod.
type KubeClaims struct {
	kc        kubernetes.Interface
	claims    map[string]resourcelisters.ResourceClaimNamespaceLister
	templates map[string]resourcelisters.ResourceClaimTemplateNamespaceLister
}

// NewKubeClaims starts informers for ResourceClaims and
// ResourceClaimTemplates in namespaces and waits for them to sync.
func NewKubeClaims(ctx context.Context, kc kubernetes.Interface, namespaces []string) (*KubeClaims, error) {
	k := &KubeClaims{kc: kc, claims: map[string]resourcelisters.ResourceClaimNamespaceLister{},
		templates: map[string]resourcelisters.ResourceClaimTemplateNamespaceLister{}}
	for _, ns := range namespaces {
		f := informers.NewSharedInformerFactoryWithOptions(kc, 10*time.Minute, informers.WithNamespace(ns))
		k.claims[ns] = f.Resource().V1().ResourceClaims().Lister().ResourceClaims(ns)
		k.templates[ns] = f.Resource().V1().ResourceClaimTemplates().Lister().ResourceClaimTemplates(ns)
		f.Start(ctx.Done())
		for t, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return nil, fmt.Errorf("DRA informer %v in namespace %s did not sync (is resource.k8s.io/v1 served, and may this service account list it?)", t, ns)
			}
		}
	}
	return k, nil
}

// DeviceClasses implements ClaimResolver.
func (k *KubeClaims) DeviceClasses(ctx context.Context, ns string, c corev1.PodResourceClaim) ([]string, error) {
	switch {
	case c.ResourceClaimName != nil && *c.ResourceClaimName != "":
		name := *c.ResourceClaimName
		var claim *resourcev1.ResourceClaim
		var err error
		if l, ok := k.claims[ns]; ok {
			claim, err = l.Get(name)
		}
		if claim == nil {
			claim, err = k.kc.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
		}
		if err != nil {
			if apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("ResourceClaim %s/%s not found", ns, name)
			}
			return nil, fmt.Errorf("ResourceClaim %s/%s: %w", ns, name, err)
		}
		return classes(claim.Spec.Devices.Requests), nil
	case c.ResourceClaimTemplateName != nil && *c.ResourceClaimTemplateName != "":
		name := *c.ResourceClaimTemplateName
		var tmpl *resourcev1.ResourceClaimTemplate
		var err error
		if l, ok := k.templates[ns]; ok {
			tmpl, err = l.Get(name)
		}
		if tmpl == nil {
			tmpl, err = k.kc.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, name, metav1.GetOptions{})
		}
		if err != nil {
			if apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("ResourceClaimTemplate %s/%s not found", ns, name)
			}
			return nil, fmt.Errorf("ResourceClaimTemplate %s/%s: %w", ns, name, err)
		}
		return classes(tmpl.Spec.Spec.Devices.Requests), nil
	}
	return nil, fmt.Errorf("names neither a ResourceClaim nor a ResourceClaimTemplate")
}

// classes lists the device classes of a claim's requests (exactly and
// every firstAvailable alternative).
func classes(reqs []resourcev1.DeviceRequest) []string {
	var out []string
	for _, r := range reqs {
		if r.Exactly != nil && r.Exactly.DeviceClassName != "" {
			out = append(out, r.Exactly.DeviceClassName)
		}
		for _, s := range r.FirstAvailable {
			if s.DeviceClassName != "" {
				out = append(out, s.DeviceClassName)
			}
		}
	}
	return out
}
