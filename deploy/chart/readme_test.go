package chart

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/faultline/faultline/internal/testenv"
)

// TestREADMEInstallCommands: the `helm install` commands and the one-line
// value sets of the repository README's "Install on a cluster" render
// (schema and templates), so the documentation cannot drift from the chart.
func TestREADMEInstallCommands(t *testing.T) {
	helm := testenv.Helm(t)
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Install on a cluster\n")
	if !ok {
		t.Fatal("README has no Install on a cluster section")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	type cmd struct {
		name string
		args []string
	}
	var cmds []cmd
	// helm install commands in the sh blocks (continuation lines joined).
	joined := strings.ReplaceAll(sec, "\\\n", " ")
	for _, line := range strings.Split(joined, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "helm install ") {
			continue
		}
		f := strings.Fields(line)
		var args []string
		for i := 0; i < len(f); i++ {
			if f[i] == "--set" && i+1 < len(f) {
				args = append(args, "--set", f[i+1])
				i++
			}
		}
		cmds = append(cmds, cmd{"helm install #" + string(rune('1'+len(cmds))), args})
	}
	// The one-line table: `--set …` after the default tokens.
	row := regexp.MustCompile("(?m)^\\| ([^|]+) \\| ([^|]+) \\| `--set ([^`]+)`")
	for _, m := range row.FindAllStringSubmatch(sec, -1) {
		cmds = append(cmds, cmd{m[1] + " / " + m[2], []string{"-f", ValueSets()["default"], "--set", m[3]}})
	}
	if len(cmds) < 8 {
		t.Fatalf("found %d install commands in the README section, want the walk-through, the agent-only one and 6 one-liners", len(cmds))
	}
	for _, c := range cmds {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"template", "faultline", Dir(), "-n", "faultline"}, c.args...)
			out, err := Helm(context.Background(), helm, t.TempDir(), args...)
			if err != nil {
				t.Fatalf("%v", err)
			}
			if _, err := Parse(out); err != nil {
				t.Fatal(err)
			}
		})
	}
}
