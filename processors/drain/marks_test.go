package drain

import (
	"testing"

	"github.com/faultline/faultline/processors/quarantine"
)

// TestQuarantineMarkNames: the drain reads the quarantine role's mark by
// name (never through its package): the names agree.
func TestQuarantineMarkNames(t *testing.T) {
	if annotationQuarantinedAt != quarantine.AnnotationAt {
		t.Fatalf("drain reads %q; the quarantine role writes %q", annotationQuarantinedAt, quarantine.AnnotationAt)
	}
}
