package coordination

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// mergePatch sets data and ownerReferences, conditional on the
// resourceVersion read (a concurrent writer makes it a conflict). Keys of
// cur that want lacks (excluded, once no pod is) are deleted with a null:
// a merge patch leaves the keys it does not name.
func mergePatch(resourceVersion string, cur map[string]string, want *corev1.ConfigMap) ([]byte, error) {
	data := map[string]*string{}
	for k := range cur {
		data[k] = nil
	}
	for k, v := range want.Data {
		data[k] = &v
	}
	return json.Marshal(struct {
		Metadata struct {
			ResourceVersion string                  `json:"resourceVersion"`
			OwnerReferences []metav1.OwnerReference `json:"ownerReferences"`
			Labels          map[string]string       `json:"labels"`
		} `json:"metadata"`
		Data map[string]*string `json:"data"`
	}{
		Metadata: struct {
			ResourceVersion string                  `json:"resourceVersion"`
			OwnerReferences []metav1.OwnerReference `json:"ownerReferences"`
			Labels          map[string]string       `json:"labels"`
		}{resourceVersion, want.OwnerReferences, want.Labels},
		Data: data,
	})
}
