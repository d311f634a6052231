package nic

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/faultline/faultline/agents/nic/nictest"
	"github.com/faultline/faultline/agents/topology"
)

var writeTree = flag.String("write-tree", "", "write the 34-device synthetic tree (sys/, gpu_metadata.json, route, boot_id) into this directory and exit the test")

// BenchmarkPoll34 is one steady-state poll of the 34-device system (18 PFs,
// 16 VFs): list devices, read state/phys_state/operstate and 4 counters of
// the 18 monitored ports, evaluate, persist when changed.
func BenchmarkPoll34(b *testing.B) {
	e := setupFull(b, nictest.System34())
	c := e.check()
	ctx := context.Background()
	if _, err := c.Check(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Check(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// TestWriteSynthTree writes the benchmark's tree for the process
// measurement in agents/README.md; skipped unless -write-tree is given.
func TestWriteSynthTree(t *testing.T) {
	if *writeTree == "" {
		t.Skip("no -write-tree")
	}
	dir := *writeTree
	p := nictest.System34()
	tree, err := nictest.New(filepath.Join(dir, "sys"))
	if err != nil {
		t.Fatal(err)
	}
	tree.FullCounters = true
	if err := p.Build(tree); err != nil {
		t.Fatal(err)
	}
	if err := topology.WriteFile(filepath.Join(dir, "gpu_metadata.json"), p.Metadata); err != nil {
		t.Fatal(err)
	}
	if _, err := nictest.WriteRoute(filepath.Join(dir, "route"), ""); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "boot_id"), []byte("synthetic-boot\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}
