// Package fuzzseed holds what the fuzz targets of the agents' parsers
// share: their recorded outputs as seeds, and the least every parser owes
// any input.
package fuzzseed

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
