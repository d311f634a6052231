package janitor

import (
	"os"
	"testing"

	"github.com/faultline/faultline/internal/testenv"
)

// TestMain gives the AWS SDK's default chain the test credentials moto and
// the tests' own EC2 endpoints take, once for the package: t.Setenv would
// keep the tests that talk to them from running in parallel, and the
// package's tests run in parallel because most of their time is waiting
// (reboot timeouts, BMC power states) on servers of their own: four at a
// time took 102 s where two (GOMAXPROCS on the CI machine) took 179 s, with
// the same CPU time (2026-12-06).
func TestMain(m *testing.M) {
	testenv.WaitBound(4)
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID":         "testing",
		"AWS_SECRET_ACCESS_KEY":     "testing",
		"AWS_EC2_METADATA_DISABLED": "true",
	} {
		os.Setenv(k, v)
	}
	os.Exit(m.Run())
}
