package quarantine

import (
	"os"
	"testing"

	"github.com/faultline/faultline/internal/testenv"
)

// TestMain runs four of the package's parallel tests at once: most of
// their time is waiting on the apiserver, the broker and the breaker's
// windows, and four at a time took 75 s where two (GOMAXPROCS on the CI
// machine) took 104 s, with about the same CPU time (2026-12-06).
func TestMain(m *testing.M) {
	testenv.WaitBound(4)
	os.Exit(m.Run())
}
