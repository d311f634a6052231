package webhook

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestCARotationTwoReplicas: two replicas share the self-signed Secret,
// each refreshing and publishing the caBundle in turn (5 minutes apart),
// across two CA rotations. At every step each replica's serving
// certificate verifies against the published caBundle. Before, the
// replica that rotated the CA published it alone while the other served
// a certificate of the old CA until its next resync (about half of the
// pod CREATEs refused), and a replica that read the Secret just before
// the rotation put the old CA back over the new one.
func TestCARotationTwoReplicas(t *testing.T) {
	ctx := context.Background()
	kc := fake.NewClientset()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := DefaultConfig()
	cfg.Webhook.URL = "https://127.0.0.1/mutate-pod"
	cfg.TLS = TLSConfig{Mode: "self-signed", SecretName: "tls", Validity: 100 * time.Hour, RenewBefore: 10 * time.Hour}
	start := time.Now()
	now := start
	mk := func() *selfSigned {
		s, err := newSelfSigned(kc, "faultline", cfg.TLS, cfg.Webhook, log)
		if err != nil {
			t.Fatal(err)
		}
		s.now = func() time.Time { return now }
		return s
	}
	a, b := mk(), mk()
	refresh := func(s *selfSigned) {
		t.Helper()
		if err := s.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	publish := func(s *selfSigned) {
		t.Helper()
		if _, err := ensureConfiguration(ctx, kc, &cfg, s.CABundle); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string) {
		t.Helper()
		bundle := caBundleOf(ctx, kc, &cfg)
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(bundle) {
			t.Fatalf("%s: no CA published", when)
		}
		if n := countPEM(bundle); n > 2 {
			t.Errorf("%s: %d CAs published, want the current one and at most the previous", when, n)
		}
		for name, s := range map[string]*selfSigned{"a": a, "b": b} {
			c, err := s.GetCertificate(nil)
			if err != nil {
				t.Fatal(err)
			}
			leaf, err := x509.ParseCertificate(c.Certificate[0])
			if err != nil {
				t.Fatal(err)
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "faultline-preflight.faultline.svc", CurrentTime: now}); err != nil {
				t.Fatalf("%s (%v in): replica %s's serving certificate does not verify against the published caBundle: %v", when, now.Sub(start), name, err)
			}
		}
	}
	// Renewals (and with them the CA's rotations, once it would not
	// outlive a new certificate: past 900h) are when it matters. Around
	// each, in turn: one replica's resync reads the Secret a minute
	// before it is due, the other's renews (and rotates) it and
	// publishes, then the first publishes what it read; 5 minutes later
	// its next resync catches up.
	refresh(b)
	publish(b)
	refresh(a)
	publish(a)
	check("started")
	rotations, last := 0, caOf(t, kc)
	for i := 0; now.Sub(start) < 2500*time.Hour; i++ {
		first, second := a, b
		if i%2 == 1 {
			first, second = b, a
		}
		due := certOf(t, kc).NotAfter.Add(-cfg.TLS.RenewBefore)
		now = due.Add(-time.Minute)
		refresh(first)
		now = due.Add(4 * time.Minute)
		refresh(second)
		publish(second)
		check("renewed")
		publish(first)
		check("the other published what it read before")
		now = now.Add(5 * time.Minute)
		refresh(first)
		publish(first)
		check("the other refreshed")
		if ca := caOf(t, kc); !ca.Equal(last) {
			rotations, last = rotations+1, ca
		}
	}
	if rotations < 2 {
		t.Fatalf("%d CA rotations, want 2", rotations)
	}
}

func certOf(t *testing.T, kc *fake.Clientset) *x509.Certificate {
	t.Helper()
	return secretCert(t, kc, corev1.TLSCertKey)
}

func caOf(t *testing.T, kc *fake.Clientset) *x509.Certificate {
	t.Helper()
	return secretCert(t, kc, keyCACert)
}

func secretCert(t *testing.T, kc *fake.Clientset, key string) *x509.Certificate {
	t.Helper()
	sec, err := kc.CoreV1().Secrets("faultline").Get(context.Background(), "tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := parseCert(sec.Data[key])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func countPEM(b []byte) int {
	n := 0
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			return n
		}
		n++
	}
}
