package janitor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/faultline/faultline/internal/testenv"
)

var testLog = slog.New(slog.NewTextHandler(io.Discard, nil))

func bmcSecret(ns, name, user, pass string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Data: map[string][]byte{"username": []byte(user), "password": []byte(pass)}}
}

func bmcNode(name, addr, uuid string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{AnnotationBMC: addr}}}
	n.Status.NodeInfo.SystemUUID = uuid
	return n
}

// waitPower polls the emulator until the system's PowerState is want.
func waitPower(t *testing.T, s *testenv.Sushy, uuid, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	last := ""
	for time.Now().Before(deadline) {
		ps, err := s.PowerState(context.Background(), uuid)
		if err == nil && ps == want {
			return
		}
		last = ps
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("system %s PowerState %q, want %q within %v", uuid, last, want, within)
}

// waitResets waits until the emulator accepted n reset requests for the
// system.
func waitResets(t *testing.T, s *testenv.Sushy, uuid string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.Resets(uuid) != n {
		if time.Now().After(deadline) {
			t.Fatalf("system %s: %d resets accepted, want %d", uuid, s.Resets(uuid), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRedfishEmulator: the provider against sushy-tools' emulator over
// TLS with a configured CA and basic auth: a reboot resets the emulated
// system, which comes back On; two systems behind one BMC are told
// apart by the node's system UUID; wrong credentials, an unreachable BMC,
// a missing Secret and an untrusted certificate end with their reasons.
func TestRedfishEmulator(t *testing.T) {
	ca := testenv.NewCA(t, "", "bmc")
	systems := []testenv.SushySystem{
		{UUID: "11111111-0000-4000-8000-000000000001", Name: "gpu-1"},
		{UUID: "11111111-0000-4000-8000-000000000002", Name: "gpu-2"},
	}
	s := testenv.StartSushy(t, testenv.SushyOptions{Systems: systems, Username: "admin", Password: "s3cret", TLS: ca})
	cfg := DefaultConfig().Redfish
	cfg.CAFile = ca.File
	rf, err := NewRedfish(cfg, testLog)
	if err != nil {
		t.Fatal(err)
	}
	kube := fake.NewClientset(bmcSecret("faultline", "bmc-credentials", "admin", "s3cret"),
		bmcSecret("faultline", "wrong", "admin", "nope"))
	ctx := context.Background()

	// Reboot of gpu-2 (picked by system UUID among two).
	n2 := bmcNode("gpu-2", s.URL, systems[1].UUID)
	if err := rf.Reboot(ctx, Target{Node: n2, Kube: kube}, Graceful); err != nil {
		t.Fatalf("reboot: %v", err)
	}
	waitResets(t, s, systems[1].UUID, 1)
	if n := s.Resets(systems[0].UUID); n != 0 {
		t.Fatalf("the other system got %d resets: the wrong system was reset", n)
	}
	waitPower(t, s, systems[1].UUID, "On", 20*time.Second)

	// Forced, with the system named in the annotation.
	n1 := bmcNode("gpu-1", s.URL+s.SystemPath(systems[0].UUID), "")
	if err := rf.Reboot(ctx, Target{Node: n1, Kube: kube}, Force); err != nil {
		t.Fatalf("force reboot: %v", err)
	}
	waitResets(t, s, systems[0].UUID, 1)

	// Terminate: ForceOff leaves it Off.
	waitPower(t, s, systems[0].UUID, "On", 20*time.Second)
	if err := rf.Terminate(ctx, Target{Node: n1, Kube: kube}); err != nil {
		t.Fatalf("terminate: %v", err)
	}
	waitPower(t, s, systems[0].UUID, "Off", 20*time.Second)

	bad := func(n *corev1.Node, ann map[string]string) *corev1.Node {
		n = n.DeepCopy()
		for k, v := range ann {
			n.Annotations[k] = v
		}
		return n
	}
	untrusted, _ := NewRedfish(DefaultConfig().Redfish, testLog)
	for _, tc := range []struct {
		name   string
		p      *Redfish
		node   *corev1.Node
		reason string
	}{
		{"wrong credentials", rf, bad(n2, map[string]string{AnnotationBMCSecret: "wrong"}), ReasonBMCAuthFailed},
		{"no secret", rf, bad(n2, map[string]string{AnnotationBMCSecret: "absent"}), ReasonNoBMCCredentials},
		{"unreachable", rf, bad(n2, map[string]string{AnnotationBMC: "https://127.0.0.1:1"}), ReasonBMCUnreachable},
		{"no annotation", rf, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, ReasonNoBMC},
		{"untrusted certificate", untrusted, n2, ReasonBMCUnreachable},
		{"system not found", rf, bad(n2, map[string]string{AnnotationBMC: s.URL + "/redfish/v1/Systems/nope"}), ReasonSystemNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Reboot(ctx, Target{Node: tc.node, Kube: kube}, Graceful)
			var pe *ProviderError
			if !errors.As(err, &pe) || pe.Reason != tc.reason {
				t.Fatalf("err %v, want reason %s", err, tc.reason)
			}
		})
	}
}
