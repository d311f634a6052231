package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority generated for a test: ECDSA P-256, valid
// for a day. Its certificate is in the PEM file File.
type CA struct {
	// File is the CA certificate, PEM.
	File string
	// Cert is the CA certificate.
	Cert *x509.Certificate

	key    *ecdsa.PrivateKey
	dir    string
	serial atomic.Int64
}

// NewCA generates a CA whose files go to dir (a test's TempDir when dir is
// empty).
func NewCA(tb testing.TB, dir, name string) *CA {
	tb.Helper()
	if dir == "" {
		dir = tb.TempDir()
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("testenv: CA key: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"faultline testenv"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("testenv: CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	ca := &CA{Cert: cert, key: key, dir: dir, File: filepath.Join(dir, safeName(name)+"-ca.pem")}
	ca.serial.Store(1)
	writeFile(tb, ca.File, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	return ca
}

// Pool returns a cert pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// KeyPair is a certificate issued by a CA and its key, as PEM files.
type KeyPair struct {
	// CertFile is the certificate, PEM.
	CertFile string
	// KeyFile is the private key, PEM PKCS#8 (what Kafka's PEM key
	// stores read).
	KeyFile string
	// Cert is the certificate and key for crypto/tls.
	Cert tls.Certificate
}

// Issue issues a certificate for cn, usable by servers and clients, valid
// for the given hosts (IP addresses or DNS names).
func (ca *CA) Issue(tb testing.TB, cn string, hosts ...string) KeyPair {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("testenv: key: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial.Add(1)),
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"faultline testenv"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatalf("testenv: certificate for %s: %v", cn, err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8})
	base := filepath.Join(ca.dir, safeName(cn))
	if _, err := os.Stat(base + ".pem"); err == nil {
		base += "-" + tmpl.SerialNumber.String()
	}
	kp := KeyPair{CertFile: base + ".pem", KeyFile: base + "-key.pem"}
	writeFile(tb, kp.CertFile, certPEM, 0o644)
	writeFile(tb, kp.KeyFile, keyPEM, 0o600)
	kp.Cert, err = tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	return kp
}

// safeName keeps letters, digits, '-' and '.' of s for a file name.
func safeName(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			b[i] = '_'
		}
	}
	return string(b)
}

// Rotate writes the file from over the file at path, as a certificate or
// CA bundle rotated in place is; its modification time differs from the
// one it replaces (what the readers that follow such a file compare).
func Rotate(tb testing.TB, path, from string) {
	tb.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	var was time.Time
	if st, err := os.Stat(path); err == nil {
		was = st.ModTime()
	}
	writeFile(tb, path, b, 0o600)
	if st, err := os.Stat(path); err == nil && !st.ModTime().After(was) {
		if err := os.Chtimes(path, time.Now(), was.Add(time.Millisecond)); err != nil {
			tb.Fatalf("testenv: %v", err)
		}
	}
}
