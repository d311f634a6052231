package topology

import (
	"strings"
	"testing"

	"github.com/faultline/faultline/internal/fuzzseed"
)

// FuzzParse: whatever nvidia-smi topo -m printed, Parse does not panic and returns
// a result or an error that says something.
func FuzzParse(f *testing.F) {
	fuzzseed.AddFiles(f, "*.txt")
	f.Fuzz(func(t *testing.T, s string) {
		res, err := Parse(strings.NewReader(s))
		fuzzseed.Parsed(t, res, err)
	})
}
