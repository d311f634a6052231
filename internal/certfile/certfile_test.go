package certfile

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPair: the files are checked at the first call (the error names the
// keys), served, re-read once replaced, and the last good pair is kept
// while they do not load.
func TestPair(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	p := New(certFile, keyFile, "x.tls_cert, x.tls_key")
	if _, err := p.GetCertificate(nil); err == nil || !strings.Contains(err.Error(), "x.tls_cert, x.tls_key") {
		t.Fatalf("no files: %v, want an error naming the keys", err)
	}
	serial := func() int64 {
		t.Helper()
		c, err := p.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		x, _ := x509.ParseCertificate(c.Certificate[0])
		return x.SerialNumber.Int64()
	}
	for n := int64(1); n <= 2; n++ {
		time.Sleep(20 * time.Millisecond) // a distinct modification time
		write(t, certFile, keyFile, n)
		if got := serial(); got != n {
			t.Fatalf("serves certificate %d, want %d", got, n)
		}
	}
	time.Sleep(20 * time.Millisecond)
	if err := os.WriteFile(keyFile, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := serial(); got != 2 {
		t.Fatalf("mid-rotation: serves %d, want the last good one, 2", got)
	}
}

// write writes a self-signed certificate with serial n and its key.
func write(t *testing.T, certFile, keyFile string, n int64) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(n), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
}
