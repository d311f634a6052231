package janitor

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/faultline/faultline/agents/localaction"
	"github.com/faultline/faultline/schemas/events"
)

// TestJanitorLocal is the node-local provider end to end: a real
// kube-apiserver, the agent's local action endpoint (agents/localaction)
// served over HTTP with stand-in executables for systemctl and
// nvidia-smi (they log their arguments). A GPUReset of two GPUs runs the
// reset command once per GPU and completes GPUResetSucceeded; a
// RebootNode runs the reboot command (the test then gives the node a new
// boot ID, as the rebooted node's kubelet would) and completes; a failing
// reset ends Complete=True with the agent's reason; a reset that outlasts
// the janitor's request timeout is polled for and succeeds; a request
// signed with a key the agents do not hold, and one that reaches the
// agent of another node, end AgentAuthFailed and run nothing.
func TestJanitorLocal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	dir := t.TempDir()
	log := filepath.Join(dir, "calls.log")
	signingKey, verifyKey := writeKeyPair(t, dir, "janitor")
	acfg := localaction.DefaultConfig()
	acfg.Listen, acfg.VerifyKeyFile = "127.0.0.1:0", verifyKey
	for _, name := range []string{"systemctl", "nvidia-smi"} {
		script := "#!/bin/sh\necho \"" + name + " $*\" >> " + log + "\ncase \"$*\" in *GPU-dead*) echo 'GPU is busy' >&2; exit 3;; *GPU-51ee*) sleep 2;; *GPU-5107*) sleep 5;; esac\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	acfg.RebootCommand = []string{filepath.Join(dir, "systemctl"), "reboot"}
	acfg.GPUResetCommand = []string{filepath.Join(dir, "nvidia-smi"), "-r", "-i", "{uuid}"}
	// Each node has its own agent, which knows its node's name.
	agents := map[string]string{}
	startAgent := func(node string) string {
		t.Helper()
		c := acfg
		c.StateFile = filepath.Join(dir, node+"-state.json")
		srvAgent, err := localaction.New(c, node, testLog, nil)
		if err != nil {
			t.Fatal(err)
		}
		srvAgent.AnswerWait = 200 * time.Millisecond
		agent := httptest.NewServer(srvAgent.Handler())
		t.Cleanup(agent.Close)
		agents[node] = strings.TrimPrefix(agent.URL, "http://")
		return agents[node]
	}

	cfg := e.config()
	cfg.Local.SigningKeyFile = signingKey
	cfg.Local.Timeout = time.Second // shorter than the slow reset
	// The janitor's resource client can be made to fail its next
	// SignalSent status write.
	failSignalSent := &failWrite{match: `"SignalSent"`}
	rc := e.kc.RESTConfig()
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { failSignalSent.rt = rt; return failSignalSent }
	flaky, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	e.dyn = flaky
	j, rec := e.janitor(cfg, false, nil)
	run(t, j)
	ctx := context.Background()
	// localNode creates a node whose agent is at addr (default its own).
	localNode := func(name string, addr ...string) {
		t.Helper()
		if len(addr) == 0 {
			addr = append(addr, startAgent(name))
		}
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels:      map[string]string{events.LabelQuarantined: "true", labelDrain: "succeeded", AnnotationProvider: ProviderLocal},
			Annotations: map[string]string{AnnotationAgent: addr[0]}}}
		if _, err := e.kube.CoreV1().Nodes().Create(ctx, booted(n), metav1.CreateOptions{}); err != nil { // with its status, as aws_test's nodes
			t.Fatal(err)
		}
	}
	calls := func() string { b, _ := os.ReadFile(log); return string(b) }
	reset := func(name, node string, gpus ...string) {
		t.Helper()
		sel := []any{}
		for _, g := range gpus {
			sel = append(sel, g)
		}
		o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": Group + "/v1alpha1", "kind": "GPUReset",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"nodeName": node, "selector": map[string]any{"uuids": sel}}}}
		if _, err := e.dyn.Resource(kindGPUReset.GVR).Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("GPUReset", func(t *testing.T) {
		localNode("gpu-l1")
		g1, g2 := "GPU-"+uuid.NewString(), "GPU-"+uuid.NewString()
		reset("reset-l1", "gpu-l1", g1, g2)
		o := e.wait(kindGPUReset, "reset-l1", 30*time.Second)
		if got := condOf(o, CondComplete); got != "True/"+ReasonGPUResetSucceeded {
			t.Fatalf("Complete %s; status %v", got, o.Object["status"])
		}
		for _, g := range []string{g1, g2} {
			if n := strings.Count(calls(), "nvidia-smi -r -i "+g); n != 1 {
				t.Fatalf("reset of %s ran %d times:\n%s", g, n, calls())
			}
		}
		rec.expect(t, "gpu-l1", []string{"gpu_reset/succeeded"})
	})

	t.Run("GPUResetFails", func(t *testing.T) {
		localNode("gpu-l2")
		reset("reset-l2", "gpu-l2", "GPU-dead0000-0000-0000-0000-000000000000")
		o := e.wait(kindGPUReset, "reset-l2", 30*time.Second)
		if got := condOf(o, CondComplete); got != "True/CommandFailed" {
			t.Fatalf("Complete %s; status %v", got, o.Object["status"])
		}
	})

	t.Run("SlowGPUReset", func(t *testing.T) {
		localNode("gpu-l5")
		g := "GPU-51ee0000-0000-0000-0000-000000000000"
		reset("reset-l5", "gpu-l5", g)
		o := e.wait(kindGPUReset, "reset-l5", 30*time.Second)
		if got := condOf(o, CondComplete); got != "True/"+ReasonGPUResetSucceeded || strings.Count(calls(), "nvidia-smi -r -i "+g) != 1 {
			t.Fatalf("Complete %s; status %v\n%s", got, o.Object["status"], calls())
		}
		rec.expect(t, "gpu-l5", []string{"gpu_reset/in_progress", "gpu_reset/succeeded"})
	})

	// The node deleted while its GPUs reset: the reset ends NodeNotFound
	// (it has no agent to ask any more) and the janitor goes on — it
	// asked the agent of a nil node, and crashed, at every restart.
	t.Run("NodeGoneDuringReset", func(t *testing.T) {
		localNode("gpu-l7")
		reset("reset-l7", "gpu-l7", "GPU-51070000-0000-0000-0000-000000000000")
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			o, err := e.dyn.Resource(kindGPUReset.GVR).Get(ctx, "reset-l7", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if condIs(o, CondResetJobCreated, "True") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the reset is not running: status %v", o.Object["status"])
			}
		}
		if err := e.kube.CoreV1().Nodes().Delete(ctx, "gpu-l7", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		o := e.wait(kindGPUReset, "reset-l7", 30*time.Second)
		if got := condOf(o, CondComplete); got != "True/"+ReasonNodeNotFound {
			t.Fatalf("Complete %s; status %v", got, o.Object["status"])
		}
		rec.expect(t, "gpu-l7", []string{"gpu_reset/in_progress", "gpu_reset/failed"})
	})

	t.Run("Reboot", func(t *testing.T) {
		localNode("gpu-l3")
		e.create(kindReboot, "reboot-l3", "gpu-l3", false)
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(calls(), "systemctl reboot") && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		e.m.setNode(ctx, "gpu-l3", corev1.ConditionTrue, uuid.NewString()) // the node is back
		o := e.wait(kindReboot, "reboot-l3", 30*time.Second)
		if condOf(o, CondNodeReady) != "True/Succeeded" || strings.Count(calls(), "systemctl reboot") != 1 {
			t.Fatalf("status %v\n%s", o.Object["status"], calls())
		}
	})

	// The signal went out, writing SignalSent failed: the janitor writes
	// it at its next look and follows the reboot to the end (it waited
	// for ever, holding the rack's slot).
	t.Run("SignalSentNotWritten", func(t *testing.T) {
		localNode("gpu-l6")
		failSignalSent.armed.Store(true)
		e.create(kindReboot, "reboot-l6", "gpu-l6", false)
		deadline := time.Now().Add(20 * time.Second)
		for strings.Count(calls(), "systemctl reboot") < 2 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		e.m.setNode(ctx, "gpu-l6", corev1.ConditionTrue, uuid.NewString())
		o := e.wait(kindReboot, "reboot-l6", 30*time.Second)
		if failSignalSent.armed.Load() || condOf(o, CondSignalSent) != "True/Succeeded" || condOf(o, CondNodeReady) != "True/Succeeded" || strings.Count(calls(), "systemctl reboot") != 2 {
			t.Fatalf("write failed %v; status %v\n%s", !failSignalSent.armed.Load(), o.Object["status"], calls())
		}
	})

	// A request that reaches the agent of another node (the annotation
	// pointed there) is refused by it: the request names gpu-l8.
	t.Run("AgentOfAnotherNode", func(t *testing.T) {
		before := calls()
		localNode("gpu-l8", agents["gpu-l1"])
		reset("reset-l8", "gpu-l8", "GPU-"+uuid.NewString())
		o := e.wait(kindGPUReset, "reset-l8", 30*time.Second)
		msg := fmt.Sprint(o.Object["status"])
		if got := condOf(o, CondComplete); got != "True/"+ReasonAgentAuthFailed || !strings.Contains(msg, `WrongNode node: the request is for node "gpu-l8", this agent is node "gpu-l1"`) || calls() != before {
			t.Fatalf("Complete %s; status %s\nran %q", got, msg, strings.TrimPrefix(calls(), before))
		}
	})

	// The janitor's key is one the agents do not hold.
	t.Run("WrongKey", func(t *testing.T) {
		before := calls()
		other, _ := writeKeyPair(t, t.TempDir(), "other")
		b, err := os.ReadFile(other)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(signingKey, b, 0o600); err != nil {
			t.Fatal(err)
		}
		localNode("gpu-l4")
		reset("reset-l4", "gpu-l4", "GPU-"+uuid.NewString())
		o := e.wait(kindGPUReset, "reset-l4", 30*time.Second)
		if got := condOf(o, CondComplete); got != "True/"+ReasonAgentAuthFailed || calls() != before {
			t.Fatalf("Complete %s; ran %q", got, strings.TrimPrefix(calls(), before))
		}
	})
}

// failWrite fails the next status PATCH whose body holds match, once
// armed, as an apiserver that went away would.
type failWrite struct {
	rt    http.RoundTripper
	match string
	armed atomic.Bool
}

func (f *failWrite) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPatch && strings.HasSuffix(r.URL.Path, "/status") && r.GetBody != nil && f.armed.Load() {
		body, err := r.GetBody()
		if err != nil {
			return nil, err
		}
		b, _ := io.ReadAll(body)
		if strings.Contains(string(b), f.match) && f.armed.CompareAndSwap(true, false) {
			return nil, errors.New("injected: connection reset by the apiserver")
		}
	}
	return f.rt.RoundTrip(r)
}

// writeKeyPair writes an Ed25519 key pair as OpenSSL would: dir/name.key
// (PEM PRIVATE KEY, 0600) and dir/name.pub (PEM PUBLIC KEY).
func writeKeyPair(t *testing.T, dir, name string) (private, public string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	pp, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	private, public = filepath.Join(dir, name+".key"), filepath.Join(dir, name+".pub")
	if err := os.WriteFile(private, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(public, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pp}), 0o644); err != nil {
		t.Fatal(err)
	}
	return private, public
}
