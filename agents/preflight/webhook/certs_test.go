package webhook

import (
	"bytes"
	"context"
	"crypto/x509"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// The self-signed mode's renewal logic, against client-go's fake clientset
// (the real API server path, Secret creation and the caBundle patch, is in
// kube_test.go).
func TestSelfSignedRenewal(t *testing.T) {
	ctx := context.Background()
	kc := fake.NewClientset()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := TLSConfig{SecretName: "tls", Validity: 100 * time.Hour, RenewBefore: 10 * time.Hour, IPAddresses: []string{"127.0.0.1"}}
	svc := ServerConfig{ServiceName: "faultline-preflight"}
	now := time.Now()
	mk := func(c TLSConfig) *selfSigned {
		s, err := newSelfSigned(kc, "faultline", c, svc, log)
		if err != nil {
			t.Fatal(err)
		}
		s.now = func() time.Time { return now }
		return s
	}
	leaf := func(s *selfSigned) *x509.Certificate {
		c, err := s.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		x, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	verify := func(s *selfSigned, at time.Time) {
		t.Helper()
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(s.CABundle(nil)) {
			t.Fatal("no CA in the bundle")
		}
		if _, err := leaf(s).Verify(x509.VerifyOptions{Roots: pool, DNSName: "faultline-preflight.faultline.svc", CurrentTime: at}); err != nil {
			t.Fatalf("serving certificate does not verify against the caBundle: %v", err)
		}
	}

	a := mk(cfg)
	if _, err := a.GetCertificate(nil); err == nil {
		t.Fatal("a certificate before the first Refresh")
	}
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	verify(a, now)
	first := leaf(a)
	if first.IPAddresses[0].String() != "127.0.0.1" {
		t.Errorf("ip addresses %v", first.IPAddresses)
	}

	// A second replica reads the same Secret: same certificate, same CA.
	b := mk(cfg)
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if leaf(b).SerialNumber.Cmp(first.SerialNumber) != 0 || !bytes.Equal(a.CABundle(nil), b.CABundle(nil)) {
		t.Fatal("second replica issued its own certificate")
	}

	// Within renew_before of expiry: a new certificate from the same CA.
	now = now.Add(95 * time.Hour)
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	renewed := leaf(a)
	if renewed.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("not renewed near expiry")
	}
	if !bytes.Equal(a.CABundle(nil), b.CABundle(nil)) {
		t.Fatal("renewal changed the CA while it was still valid")
	}
	verify(a, now)
	sec, err := kc.CoreV1().Secrets("faultline").Get(ctx, "tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The other replica picks the renewed certificate up from the Secret.
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if leaf(b).SerialNumber.Cmp(renewed.SerialNumber) != 0 {
		t.Fatal("second replica did not load the renewed certificate")
	}

	// A name added to the configuration: reissued.
	c2 := cfg
	c2.DNSNames = []string{"preflight.example.com"}
	d := mk(c2)
	if err := d.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if leaf(d).SerialNumber.Cmp(renewed.SerialNumber) == 0 {
		t.Fatal("not reissued for a new DNS name")
	}

	// A corrupted Secret: reissued, not an error.
	sec, _ = kc.CoreV1().Secrets("faultline").Get(ctx, "tls", metav1.GetOptions{})
	sec.Data[corev1.TLSCertKey] = []byte("garbage")
	if _, err := kc.CoreV1().Secrets("faultline").Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	verify(a, now)

	// Issued by a replica whose clock ran 30 days ahead: the others (and
	// it, once its clock is right) reissue it and a new CA, rather than
	// serve what the API server refuses until then.
	real := now
	now = now.Add(30 * 24 * time.Hour)
	if _, err := kc.CoreV1().Secrets("faultline").Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "tls", Namespace: "faultline"}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	now = real
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	verify(b, now)
	if bytes.Equal(a.CABundle(nil), b.CABundle(nil)) {
		t.Fatal("the CA issued by the clock ahead kept")
	}

	// Past the CA's own validity (10 x validity): a new CA.
	oldCA := a.CABundle(nil)
	now = now.Add(1000 * time.Hour)
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(oldCA, a.CABundle(nil)) {
		t.Fatal("expired CA kept")
	}
	verify(a, now)
}

// The files mode re-reads a certificate an issuer replaced, and keeps the
// old one while the files are mid-rotation.
func TestFileCertsReload(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	src, err := newSelfSigned(fake.NewClientset(), "faultline", TLSConfig{SecretName: "x", Validity: 100 * time.Hour, RenewBefore: time.Hour}, ServerConfig{ServiceName: "s"}, log)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, caKey, err := newCA(time.Now(), time.Hour*1000)
	if err != nil {
		t.Fatal(err)
	}
	write := func() string {
		t.Helper()
		c, k, err := src.issue(caPEM, caKey)
		if err != nil {
			t.Fatal(err)
		}
		for p, b := range map[string][]byte{"tls.crt": c, "tls.key": k, "ca.crt": caPEM} {
			if err := os.WriteFile(filepath.Join(dir, p), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		x, _ := parseCert(c)
		return x.SerialNumber.String()
	}
	f := newFileCerts(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt"))
	if err := f.Refresh(context.Background()); err == nil {
		t.Fatal("no error without the files")
	}
	one := write()
	if err := f.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	serial := func() string {
		c, err := f.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		x, _ := x509.ParseCertificate(c.Certificate[0])
		return x.SerialNumber.String()
	}
	if serial() != one || !bytes.Equal(f.CABundle(nil), caPEM) {
		t.Fatal("files not served")
	}
	time.Sleep(20 * time.Millisecond) // a distinct modification time
	two := write()
	if serial() != two {
		t.Fatal("replaced certificate not re-read")
	}
	// Mid-rotation: the key file is unreadable, the old pair is kept.
	time.Sleep(20 * time.Millisecond)
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if serial() != two {
		t.Fatal("old certificate not kept mid-rotation")
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.Refresh(context.Background()); err == nil {
		t.Fatal("unreadable ca_file accepted")
	}
	// The caBundle is the CA as checked, not the file as it is now (half
	// rewritten: an empty caBundle would fail every admission).
	if !bytes.Equal(f.CABundle(nil), caPEM) {
		t.Fatalf("caBundle %q, want the CA the last good refresh read", f.CABundle(nil))
	}
}
