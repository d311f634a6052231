// Package fuzzseed holds what the fuzz targets of the agents' parsers and
// checks share: their recorded outputs as seeds, the least every parser
// owes any input, and the gateway's validation every event must pass.
package fuzzseed

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/validate"
)

// Gateway is the gateway's validation at its shipped limits
// (gateway.DefaultConfig: batches of 1,000, 5 minutes of future skew).
var Gateway = validate.Validator{MaxBatch: 1000, MaxFutureSkew: 5 * time.Minute}

// Stamped stamps evs as the agent stamps a check's events (its node name,
// validate.Clean at now) and fails step on any the gateway would refuse:
// the agent would drop it, its fault never reported.
func Stamped(t *testing.T, step string, evs []*datamodels.HealthEvent, now time.Time) {
	t.Helper()
	for _, ev := range evs {
		ev.NodeName = "gpu-node-1"
		validate.Clean(ev, now)
		if err := Gateway.Validate(ev, now); err != nil {
			t.Fatalf("%s: event the gateway would refuse (%v): %v", step, err, ev)
		}
	}
}

// AddFiles adds every file of testdata matching pattern as a seed, leaving
// out golden files and the fuzzer's own corpus.
func AddFiles(f *testing.F, pattern string) {
	f.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", pattern))
	if err != nil || len(files) == 0 {
		f.Fatalf("fuzzseed: no testdata/%s (%v)", pattern, err)
	}
	for _, p := range files {
		if strings.Contains(p, ".golden.") || strings.HasPrefix(p, filepath.Join("testdata", "fuzz")) {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
}

// Parsed fails the test unless a parse gave a result or an error that says
// something (a panic fails it on its own).
func Parsed[T any](t *testing.T, res *T, err error) {
	t.Helper()
	switch {
	case err != nil && err.Error() == "":
		t.Fatal("an error with no message")
	case err == nil && res == nil:
		t.Fatal("no result and no error")
	}
}
