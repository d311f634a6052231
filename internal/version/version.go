// Package version is the build's version and source revision, set at link
// time by `make build` and `make images`:
//
//	-ldflags "-X github.com/faultline/faultline/internal/version.Version=v0.3.0
//	          -X github.com/faultline/faultline/internal/version.Revision=<commit>"
//
// Every binary answers `--version` with String.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the release (a git tag, or "dev" for a plain go build).
var Version = "dev"

// Revision is the source commit; when the linker did not set it, the
// module's VCS stamp is used if there is one.
var Revision = ""

// String is "NAME VERSION (revision REV, GOVERSION OS/ARCH)".
func String(name string) string {
	rev := Revision
	if rev == "" {
		rev = "unknown"
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" {
					rev = s.Value
				}
			}
		}
	}
	return fmt.Sprintf("%s %s (revision %s, %s %s/%s)", name, Version, rev, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// Asked reports whether args ask for the version: the first argument is
// --version, -version or version.
func Asked(args []string) bool {
	return len(args) > 0 && (args[0] == "--version" || args[0] == "-version" || args[0] == "version")
}
