package dcgm

import (
	"strings"
	"testing"

	"github.com/faultline/faultline/internal/fuzzseed"
)

// FuzzParse: whatever dcgmi diag printed, Parse does not panic and returns
// a result or an error that says something.
func FuzzParse(f *testing.F) {
	fuzzseed.AddFiles(f, "*[tn]")
	f.Fuzz(func(t *testing.T, s string) {
		res, err := Parse(strings.NewReader(s), Options{})
		fuzzseed.Parsed(t, res, err)
	})
}
