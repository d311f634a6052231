package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// HelmVersion is the helm CLI install.sh builds (component helm).
const HelmVersion = "v4.3.1"

// Helm returns the path of the helm CLI ($FAULTLINE_HELM, else the cache
// of HelmVersion). Like a server, a missing helm skips the test, or fails
// it in CI; under -short it skips.
func Helm(tb testing.TB) string {
	tb.Helper()
	path := os.Getenv("FAULTLINE_HELM")
	if path == "" {
		path = filepath.Join(CacheDir(), "helm", HelmVersion, "helm")
	}
	if !isExecutable(path) {
		missing(tb, "helm", "no helm at "+path)
	}
	Server(tb, "helm", nil)
	return path
}
