// Package topologytest holds what the agents' checks' tests share about
// their files.
package topologytest

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// StateDamage is one way a check's state file can be unusable (Alter
// makes it so, given the file a first run wrote) and what the check's
// warning names then ("" for none).
type StateDamage struct {
	Name  string
	Alter func(t *testing.T, path string)
	Warn  string
}

// StateDamages are the state files a check read through
// topology.ReadCapped with a cap of max bytes cannot use: larger than the
// cap (still valid JSON), corrupt (corrupt written over it), unreadable
// (a directory in its place), and missing — a first start, not warned
// about.
func StateDamages(max int, corrupt string) []StateDamage {
	return []StateDamage{
		{"larger than the cap", func(t *testing.T, path string) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			// Still valid JSON: only its size makes it unusable.
			if err := os.WriteFile(path, append(b, strings.Repeat(" ", max)...), 0o644); err != nil {
				t.Fatal(err)
			}
		}, fmt.Sprintf("larger than %d bytes", max)},
		{"corrupt", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte(corrupt), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "unexpected end of JSON input"},
		{"unreadable", func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(path, 0o755); err != nil { // read(2) fails: EISDIR
				t.Fatal(err)
			}
		}, "is a directory"},
		{"missing", func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}, ""},
	}
}
