package tlsclient

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/faultline/faultline/internal/testenv"
)

// TestDialerFollowsTheCAFile: Dialer verifies the server against the CA
// file as it is at each dial — a server whose certificate a new CA signs is
// refused until the file holds that CA, then trusted without a new dialer
// — and against server_name, else the host dialed; with TLS off it is nil.
func TestDialerFollowsTheCAFile(t *testing.T) {
	oldCA, newCA := testenv.NewCA(t, "", "old"), testenv.NewCA(t, "", "new")
	oldCert, newCert := oldCA.Issue(t, "server", "127.0.0.1", "localhost").Cert, newCA.Issue(t, "server", "127.0.0.1", "localhost").Cert
	var served atomic.Pointer[tls.Certificate]
	served.Store(&oldCert)
	addr := serveTLS(t, &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return served.Load(), nil
	}}, func(c net.Conn) { _ = c.(*tls.Conn).Handshake(); c.Close() })
	_, port, _ := net.SplitHostPort(addr)

	caFile := filepath.Join(t.TempDir(), "ca.crt")
	testenv.Rotate(t, caFile, oldCA.File)
	dialer := func(c Config) Dial {
		t.Helper()
		d, err := c.Dialer("x.tls.", 5*time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	dialed := func(d Dial, host string) error {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := d(ctx, "tcp", net.JoinHostPort(host, port))
		if err == nil {
			conn.Close()
		}
		return err
	}
	d := dialer(Config{Enabled: true, CAFile: caFile})
	if err := dialed(d, "127.0.0.1"); err != nil {
		t.Fatalf("the old CA's server: %v", err)
	}
	served.Store(&newCert)
	if err := dialed(d, "127.0.0.1"); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("the new CA's server, the file holding the old CA: %v, want unknown authority", err)
	}
	testenv.Rotate(t, caFile, newCA.File)
	if err := dialed(d, "127.0.0.1"); err != nil {
		t.Fatalf("the new CA's server, the file holding it: %v", err)
	}
	if err := dialed(d, "localhost"); err != nil {
		t.Fatalf("by the name in its certificate: %v", err)
	}
	if err := dialed(dialer(Config{Enabled: true, CAFile: caFile, ServerName: "kafka.example.com"}), "127.0.0.1"); err == nil ||
		!strings.Contains(err.Error(), "kafka.example.com") {
		t.Fatalf("server_name not in its certificate: %v, want an error naming it", err)
	}
	if d := dialer(Config{}); d != nil {
		t.Fatal("TLS off: a dialer")
	}
	if _, err := (Config{Enabled: true, CAFile: filepath.Join(t.TempDir(), "absent")}).Dialer("x.tls.", time.Second, nil); err == nil ||
		!strings.Contains(err.Error(), "x.tls.ca_file") {
		t.Fatalf("absent CA file: %v, want an error naming the key", err)
	}
}

// serveTLS serves TLS with cfg on 127.0.0.1 until the test ends, each
// connection handed to serve on a goroutine of its own; it returns the
// address.
func serveTLS(t *testing.T, cfg *tls.Config, serve func(net.Conn)) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return ln.Addr().String()
}

// TestClientCertificateRotation: the client certificate presented is the
// pair in the files as they are at the handshake; a certificate written
// beside the old key (a rotation half done) presents the last pair that
// loaded, where reading both files at each handshake failed it.
func TestClientCertificateRotation(t *testing.T) {
	ca := testenv.NewCA(t, "", "tlsclient-test")
	old, renewed := ca.Issue(t, "store"), ca.Issue(t, "store")
	tc, err := Config{Enabled: true, CertFile: old.CertFile, KeyFile: old.KeyFile}.Build("kafka.tls.")
	if err != nil {
		t.Fatal(err)
	}
	presented := func() uint64 {
		t.Helper()
		c, err := tc.GetClientCertificate(&tls.CertificateRequestInfo{})
		if err != nil {
			t.Fatalf("client certificate: %v", err)
		}
		return c.Leaf.SerialNumber.Uint64()
	}
	serial := func(kp testenv.KeyPair) uint64 { return kp.Cert.Leaf.SerialNumber.Uint64() }
	if got := presented(); got != serial(old) {
		t.Fatalf("presented serial %d, want %d", got, serial(old))
	}
	testenv.Rotate(t, old.CertFile, renewed.CertFile)
	if got := presented(); got != serial(old) {
		t.Fatalf("half rotated: presented serial %d, want the old pair's %d", got, serial(old))
	}
	testenv.Rotate(t, old.KeyFile, renewed.KeyFile)
	if got := presented(); got != serial(renewed) {
		t.Fatalf("rotated: presented serial %d, want the renewed %d", got, serial(renewed))
	}
}
