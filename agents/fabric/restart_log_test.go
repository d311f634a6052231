package fabric

import (
	"path/filepath"
	"testing"
	"time"
)

const (
	fmStartLine = "[Oct 28 2024 10:00:01] [INFO] [tid 1] Fabric Manager version 550.127.05 is running with the following configuration options"
	sxid20034   = "[Oct 28 2024 10:29:00] [ERROR] [tid 9] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:07:00.0 physical id 2 port 46"
	sxid12028   = "[Oct 28 2024 10:29:00] [ERROR] [tid 9] detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id 00000000:06:00.0 physical id 1 port 33"
)

// restartNode is an HGX H100 node with a state file, started on this boot
// (09:50) with FM's start line in its log.
func restartNode(t *testing.T) *node {
	t.Helper()
	state := filepath.Join(t.TempDir(), "fabric-state.json")
	n := h100Node(t, func(c *Config) { c.StateFile = state })
	n.healthy()
	n.write("proc/sys/kernel/random/boot_id", "6f7a1c2e-0000-4000-8000-000000000001\n")
	n.write("proc/stat", "cpu  1 2 3 4\nbtime 1730109000\n") // 2024-10-28 09:50:00 UTC
	n.write("fabricmanager.log", fmStartLine+"\n")
	n.restart()
	return n
}

// restart starts the check again from its state file (the agent
// restarted).
func (n *node) restart() {
	n.t.Helper()
	c, err := New(n.c.cfg)
	if err != nil {
		n.t.Fatal(err)
	}
	n.c = c
}

// TestRestartSameSecond: FM's log prints whole seconds, and SXids come in
// bursts: a line written after the last poll, in the second of the last
// line the previous run read, is new after a restart, not taken for one
// that run evaluated.
func TestRestartSameSecond(t *testing.T) {
	n := restartNode(t)
	n.appendLog("fabricmanager.log", sxid20034)
	if got := shorts(n.poll(0)); got != "FabricManagerNVSwitchError:SXID-20034:fatal@0000:07:00.0" {
		t.Fatalf("first run: %q", got)
	}
	n.appendLog("fabricmanager.log", sxid12028)
	n.restart()
	if got := shorts(n.poll(30 * time.Second)); got != "FabricManagerNVSwitchError:SXID-12028:nonfatal@0000:06:00.0" {
		t.Fatalf("after the restart: %q, want the SXid 12028 written in the same second, and only it", got)
	}
	if got := shorts(n.poll(30 * time.Second)); got != "" {
		t.Fatalf("reported again: %q", got)
	}
}
