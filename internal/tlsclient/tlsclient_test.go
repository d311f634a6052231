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
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return served.Load(), nil
	}})
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
			go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())

	caFile := filepath.Join(t.TempDir(), "ca.crt")
	testenv.Rotate(t, caFile, oldCA.File)
	dialer := func(c Config) Dial {
		t.Helper()
		d, err := c.Dialer("x.tls.", 5*time.Second)
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
	if _, err := (Config{Enabled: true, CAFile: filepath.Join(t.TempDir(), "absent")}).Dialer("x.tls.", time.Second); err == nil ||
		!strings.Contains(err.Error(), "x.tls.ca_file") {
		t.Fatalf("absent CA file: %v, want an error naming the key", err)
	}
}
