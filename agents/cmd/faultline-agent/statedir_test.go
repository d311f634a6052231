package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/faultline/faultline/deploy/chart"
	"github.com/faultline/faultline/internal/testenv"
)

// TestNonRootAgentOwnsItsStateDir: the chart's agent without a check that
// needs root runs as 65532, its state in a host path the kubelet creates
// owned by root (mode 0755). Acting as the kubelet — the host path made,
// the DaemonSet's init containers run with their args — and then starting
// the agent as the DaemonSet's user with the chart's config: the agent
// runs and keeps its spool there, on a fresh node and on one whose state
// a root agent left (before the chart switched it to non-root). Before,
// no init container gave the directory to the agent, and it exited at
// start: "spool dir: mkdir …/spool: permission denied". It also knows its
// machine: the system UUID, root's alone in sysfs, copied by another init
// container (before, a non-root agent stamped no machine on its events).
func TestNonRootAgentOwnsItsStateDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: acts as the kubelet, then runs the agent as another user")
	}
	helm := testenv.Helm(t)
	objs, err := chart.Render(context.Background(), helm, t.TempDir(), "faultline", "faultline", []string{chart.ValueSets()["default"]},
		"--set", "agent.checks={csp}", "--set", "agent.podResources=false")
	if err != nil {
		t.Fatal(err)
	}
	ds := chart.Find(objs, "DaemonSet", "faultline-agent")
	uid, gid := number(ds.Object, "spec", "template", "spec", "securityContext", "runAsUser"), number(ds.Object, "spec", "template", "spec", "securityContext", "runAsGroup")
	if uid <= 0 || gid < 0 {
		t.Fatal("the agent with only csp runs as root; this test is about the non-root agent")
	}
	inits, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "initContainers")
	conf, _, _ := unstructured.NestedString(chart.Find(objs, "ConfigMap", "faultline-agent").Object, "data", "config.toml")
	groups, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "securityContext", "supplementalGroups")
	var supplementary []uint32
	for _, g := range groups {
		n, err := strconv.ParseUint(fmt.Sprint(g), 10, 32)
		if err != nil {
			t.Fatalf("supplementalGroups %v: %v", groups, err)
		}
		supplementary = append(supplementary, uint32(n))
	}
	const stateMount, machineMount, relayMount, machine = "/var/lib/faultline-agent", "/var/run/faultline-machine", "/run/faultline-agent", "4c4c4544-0042-3510-8052-b4c04f4d3732"
	if !strings.Contains(conf, stateMount) {
		t.Fatalf("the agent's config keeps nothing under %s:\n%s", stateMount, conf)
	}

	for _, tc := range []struct {
		name string
		// node lays out the host path as the kubelet (and a root agent
		// before) left it.
		node func(t *testing.T, state string)
	}{
		{"fresh node", func(t *testing.T, state string) {}},
		{"state left by a root agent", func(t *testing.T, state string) {
			if err := os.MkdirAll(filepath.Join(state, "spool"), 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(state, "spool", "0000000000000001.seg"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Everything the agent's user must reach lies under a 0755
			// directory (t.TempDir is 0700).
			root, err := os.MkdirTemp("", "faultline-agent-node-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(root) })
			if err := os.Chmod(root, 0o755); err != nil {
				t.Fatal(err)
			}
			state := filepath.Join(root, "state")
			if err := os.Mkdir(state, 0o755); err != nil { // the kubelet's DirectoryOrCreate: root, 0755
				t.Fatal(err)
			}
			tc.node(t, state)
			// The relay socket's directory, as the kubelet makes it
			// (DirectoryOrCreate: root, 0755), not the host's /run.
			relay := filepath.Join(root, "relay")
			if err := os.Mkdir(relay, 0o755); err != nil {
				t.Fatal(err)
			}
			// The node's sysfs: product_uuid is root's, mode 0400.
			sys, machineDir := filepath.Join(root, "sys"), filepath.Join(root, "machine")
			for _, d := range []string{filepath.Join(sys, filepath.Dir(productUUID)), machineDir} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(sys, productUUID), []byte(machine+"\n"), 0o400); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(machineDir, 0o777); err != nil { // an emptyDir
				t.Fatal(err)
			}
			paths := strings.NewReplacer(stateMount, state, machineMount, machineDir, relayMount, relay, "--sysfs=/sys", "--sysfs="+sys)
			for _, ic := range inits {
				c := ic.(map[string]any)
				if u := number(c, "securityContext", "runAsUser"); u != 0 {
					t.Fatalf("init container %v runs as %d; giving the host path away takes root", c["name"], u)
				}
				args, _, _ := unstructured.NestedStringSlice(c, "args")
				for i := range args {
					args[i] = paths.Replace(args[i])
				}
				var out bytes.Buffer
				if err := dispatch(context.Background(), args, &out, &out); err != nil {
					t.Fatalf("init container %v %q: %v\n%s", c["name"], args, err, out.String())
				}
			}
			token := filepath.Join(root, "token")
			if err := os.WriteFile(token, []byte("agent-token\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			c := paths.Replace(conf)
			c = strings.ReplaceAll(c, "/var/run/secrets/faultline/token", token)
			cfgPath := filepath.Join(root, "config.toml")
			if err := os.WriteFile(cfgPath, []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
			// The agent as the DaemonSet's user: this test binary, copied
			// where that user may run it.
			self, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			bin := filepath.Join(root, "agent.test")
			b, err := os.ReadFile(self)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(bin, b, 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(bin, "-test.run=^TestHelperAgentRun$")
			cmd.Env = append(os.Environ(), "FAULTLINE_AGENT_HELPER_ARGS=run --config "+cfgPath+" --metrics-addr 127.0.0.1:0", "NODE_NAME=gpu-node-0")
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: supplementary}}
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			select {
			case err := <-exited:
				t.Fatalf("the agent as %d:%d exited at start (%v):\n%s", uid, gid, err, lastLines(out.String(), 5))
			case <-time.After(3 * time.Second):
			}
			_ = cmd.Process.Kill()
			<-exited
			fi, err := os.Stat(filepath.Join(state, "spool"))
			if err != nil {
				t.Fatalf("no spool: %v", err)
			}
			if st := fi.Sys().(*syscall.Stat_t); int64(st.Uid) != uid {
				t.Errorf("spool owned by %d, want %d", st.Uid, uid)
			}
			if !strings.Contains(out.String(), `"machine":"`+machine+`"`) {
				t.Errorf("the agent as %d:%d does not know its machine %s:\n%s", uid, gid, machine, lastLines(out.String(), 5))
			}
		})
	}
}

// TestHelperAgentRun runs the agent command of FAULTLINE_AGENT_HELPER_ARGS
// (TestNonRootAgentOwnsItsStateDir's child process); skipped otherwise.
func TestHelperAgentRun(t *testing.T) {
	args := os.Getenv("FAULTLINE_AGENT_HELPER_ARGS")
	if args == "" {
		t.Skip("helper process only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dispatch(ctx, strings.Fields(args), io.Discard, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "faultline-agent:", err)
		os.Exit(1)
	}
}

// number is the whole number at path in o (-1: none).
func number(o map[string]any, path ...string) int64 {
	v, ok, _ := unstructured.NestedFieldNoCopy(o, path...)
	if !ok {
		return -1
	}
	n, err := strconv.ParseInt(fmt.Sprint(v), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
