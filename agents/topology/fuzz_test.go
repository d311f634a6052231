package topology

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParse: whatever the tool printed, the parser does not panic, and it
// returns either a result or an error that says something.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.txt"))
	for _, p := range files {
		if strings.Contains(p, ".golden.") {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Fuzz(func(t *testing.T, s string) {
		res, err := Parse(strings.NewReader(s))
		switch {
		case err != nil && err.Error() == "":
			t.Fatal("an error with no message")
		case err == nil && res == nil:
			t.Fatal("no result and no error")
		}
	})
}
