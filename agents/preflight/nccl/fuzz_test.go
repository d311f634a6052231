package nccl

import (
	"strings"
	"testing"

	"github.com/faultline/faultline/internal/fuzzseed"
)

// FuzzParse: whatever a nccl-tests log printed, Parse does not panic and returns
// a result or an error that says something.
func FuzzParse(f *testing.F) {
	fuzzseed.AddFiles(f, "*.log")
	f.Fuzz(func(t *testing.T, s string) {
		res, err := Parse(strings.NewReader(s))
		fuzzseed.Parsed(t, res, err)
	})
}
