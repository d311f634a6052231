package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzLoadConfig: whatever a config file holds, `faultline gateway` and
// `faultline process` refuse it with a message or load a config that
// validates; loading never panics (a role would crash-loop without saying
// which key is wrong). Seeds: every TOML example of the binary's config in
// the documentation.
func FuzzLoadConfig(f *testing.F) {
	for file, text := range docs(f) {
		for _, m := range tomlBlock.FindAllStringSubmatch(text, -1) {
			if !strings.HasPrefix(file, "agents") && !strings.Contains(m[1], "[[rule-sets]]") && !strings.Contains(m[1], "[[rules]]") {
				f.Add(m[1])
			}
		}
	}
	f.Add("[kafka]\nbrokers = []\nlinger = 5\n[gateway]\nmax_batch = -1\n[processors]\nroles = [\"nope\"]\n")
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, file string) {
		path := filepath.Join(dir, "faultline.toml")
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		for name, load := range map[string]func([]string, io.Writer) (Config, error){"gateway": loadGatewayConfig, "process": loadProcessConfig} {
			if _, err := load([]string{"--config", path}, io.Discard); err != nil && err.Error() == "" {
				t.Fatalf("%s: refused with no message", name)
			}
		}
	})
}
