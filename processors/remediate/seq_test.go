package remediate

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestNextSeq(t *testing.T) {
	// res is a resource with the given faultline.io/seq ("": from before
	// the annotation).
	res := func(seq string) unstructured.Unstructured {
		var u unstructured.Unstructured
		if seq != "" {
			u.SetAnnotations(map[string]string{AnnotationSeq: seq})
		}
		return u
	}
	for _, tc := range []struct {
		name  string
		items []string // oldest first
		want  int
	}{
		{"none", nil, 1},
		{"before the annotation: by place", []string{"", ""}, 3},
		{"pruned: after the newest", []string{"7"}, 8},
		{"mixed", []string{"", "4", "5"}, 6},
		{"unreadable counts by place", []string{"x", "0"}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var items []unstructured.Unstructured
			for _, s := range tc.items {
				items = append(items, res(s))
			}
			if got := nextSeq(items); got != tc.want {
				t.Fatalf("nextSeq(%q) = %d, want %d", tc.items, got, tc.want)
			}
		})
	}
}
