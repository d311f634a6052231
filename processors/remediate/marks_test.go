package remediate

import (
	"testing"

	"github.com/faultline/faultline/processors/janitor"
)

// TestJanitorMarkNames: remediate reads the janitor's record of a signal
// by name (never through its package): the names agree.
func TestJanitorMarkNames(t *testing.T) {
	if annotationJanitorState != janitor.AnnotationState {
		t.Fatalf("remediate reads %q; the janitor writes %q", annotationJanitorState, janitor.AnnotationState)
	}
}
