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
	"slices"
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

// TestPool: the bundle is checked at the first call (the error names the
// key), re-read once replaced (a new pool, the same one until then), and
// the last good pool is kept while the file does not load or holds no
// certificate.
func TestPool(t *testing.T) {
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	p := NewPool(caFile, "x.client_ca")
	if _, err := p.Get(); err == nil || !strings.Contains(err.Error(), "x.client_ca") {
		t.Fatalf("no file: %v, want an error naming the key", err)
	}
	if err := os.WriteFile(caFile, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(); err == nil || !strings.Contains(err.Error(), "x.client_ca: no PEM certificates in "+caFile) {
		t.Fatalf("no certificate: %v, want an error naming the key and file", err)
	}
	var last *x509.CertPool
	for n := int64(1); n <= 2; n++ {
		time.Sleep(20 * time.Millisecond)
		write(t, caFile, filepath.Join(dir, "ca.key"), n)
		b, _ := os.ReadFile(caFile)
		want := x509.NewCertPool()
		want.AppendCertsFromPEM(b)
		pool, err := p.Get()
		if err != nil {
			t.Fatal(err)
		}
		if pool == last || !pool.Equal(want) {
			t.Fatalf("after writing CA %d the pool is not its certificate alone", n)
		}
		if again, _ := p.Get(); again != pool {
			t.Fatal("an unchanged file gave a new pool")
		}
		last = pool
	}
	for _, bad := range []string{"", "half"} {
		time.Sleep(20 * time.Millisecond)
		if err := os.WriteFile(caFile, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if pool, err := p.Get(); err != nil || pool != last {
			t.Fatalf("file %q: pool %p err %v, want the last good pool", bad, pool, err)
		}
	}
}

// TestPoolExpiry: the gauge's value is the earliest NotAfter in the
// bundle as Get has it: a CA kept beside its successor during a rotation
// counts, blocks that are not certificates do not, a half-written file
// keeps the last bundle's, and no bundle is 0.
func TestPoolExpiry(t *testing.T) {
	var none *Pool
	if got := none.ExpirySeconds(); got != 0 {
		t.Fatalf("no ca_file: %v, want 0", got)
	}
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	p := NewPool(caFile, "x.ca_file")
	if got := p.ExpirySeconds(); got != 0 {
		t.Fatalf("no file: %v, want 0", got)
	}
	now := time.Now().Truncate(time.Second)
	old, renewed := now.Add(24*time.Hour), now.Add(365*24*time.Hour)
	for _, tc := range []struct {
		name   string
		bundle []byte
		want   time.Time
	}{
		{"one CA", selfSigned(t, 1, old), old},
		{"the renewed CA before the old one", slices.Concat(selfSigned(t, 2, renewed), selfSigned(t, 1, old)), old},
		{"the renewed CA alone", selfSigned(t, 2, renewed), renewed},
		{"a key and a CA", slices.Concat(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: []byte("k")}), selfSigned(t, 3, old)), old},
		{"a block that does not parse and a CA", slices.Concat(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("junk")}), selfSigned(t, 4, renewed)), renewed},
		{"half-written", []byte("-----BEGIN CERT"), renewed},
	} {
		time.Sleep(20 * time.Millisecond) // a distinct modification time
		if err := os.WriteFile(caFile, tc.bundle, 0o600); err != nil {
			t.Fatal(err)
		}
		if got, want := p.ExpirySeconds(), float64(tc.want.Unix()); got != want {
			t.Errorf("%s: %v, want %v", tc.name, got, want)
		}
	}
}

// selfSigned is a PEM self-signed certificate with serial n that expires
// at notAfter.
func selfSigned(t *testing.T, n int64, notAfter time.Time) []byte {
	t.Helper()
	cert, _ := certAndKey(t, n, notAfter)
	return cert
}

// certAndKey is a PEM self-signed certificate with serial n that expires
// at notAfter, and its PEM key.
func certAndKey(t *testing.T, n int64, notAfter time.Time) (cert, key []byte) {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(n), NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(k)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// write writes a self-signed certificate with serial n and its key.
func write(t *testing.T, certFile, keyFile string, n int64) {
	t.Helper()
	cert, key := certAndKey(t, n, time.Now().Add(time.Hour))
	if err := os.WriteFile(certFile, cert, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
}
