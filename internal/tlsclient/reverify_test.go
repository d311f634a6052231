package tlsclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/faultline/faultline/internal/syncbuf"
	"github.com/faultline/faultline/internal/testenv"
)

// TestDialerClosesWhatTheCAFileNoLongerVerifies: a connection the Dialer
// made stays open while the CA file still verifies its server — the file
// unchanged, or rewritten with the new CA beside the old one — and is
// closed, with a warning naming the key, once the file holds only a CA
// that did not sign the server's certificate (a CA distrusted). Before,
// it lasted until the server closed it. A connection whose certificate
// has expired is closed too. The connection keeps its socket reachable
// (syscall.Conn) for a driver's liveness check of idle connections.
func TestDialerClosesWhatTheCAFileNoLongerVerifies(t *testing.T) {
	reverifyEvery = 20 * time.Millisecond
	t.Cleanup(func() { reverifyEvery = ReverifyEvery })
	oldCA, newCA := testenv.NewCA(t, "", "old"), testenv.NewCA(t, "", "new")
	cert := oldCA.Issue(t, "server", "127.0.0.1").Cert
	addr := serveTLS(t, &tls.Config{Certificates: []tls.Certificate{cert}},
		func(c net.Conn) { _, _ = io.Copy(c, c); c.Close() }) // an echo until the client closes
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	testenv.Rotate(t, caFile, oldCA.File)
	// connect dials the server with a new Dialer of caFile, logging to w.
	connect := func(w io.Writer) net.Conn {
		t.Helper()
		dial, err := Config{Enabled: true, CAFile: caFile}.Dialer("kafka.tls.", 5*time.Second, slog.New(slog.NewTextHandler(w, nil)))
		if err != nil {
			t.Fatal(err)
		}
		conn, err := dial(context.Background(), "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	var logs syncbuf.Buffer
	conn := connect(&logs)
	if _, ok := conn.(syscall.Conn); !ok {
		t.Errorf("%T is not a syscall.Conn", conn)
	}
	echoes := func() bool {
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 4)
		if _, err := conn.Write([]byte("ping")); err != nil {
			return false
		}
		_, err := io.ReadFull(conn, buf)
		return err == nil && bytes.Equal(buf, []byte("ping"))
	}
	time.Sleep(100 * time.Millisecond) // several checks
	if !echoes() {
		t.Fatal("closed while the file holds the CA that signed the server")
	}
	both := filepath.Join(t.TempDir(), "both.crt")
	if err := os.WriteFile(both, slices.Concat(read(t, newCA.File), read(t, oldCA.File)), 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.Rotate(t, caFile, both)
	time.Sleep(100 * time.Millisecond)
	if !echoes() {
		t.Fatal("closed while the file holds the new CA beside the old one")
	}
	testenv.Rotate(t, caFile, newCA.File)
	deadline := time.Now().Add(5 * time.Second)
	for echoes() {
		if time.Now().After(deadline) {
			t.Fatal("still open 5 s after the file stopped holding the server's CA")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if l := logs.String(); !strings.Contains(l, "kafka.tls.ca_file no longer verifies") || !strings.Contains(l, "server=127.0.0.1") {
		t.Errorf("log %q, want a warning naming kafka.tls.ca_file and the server", l)
	}

	// A certificate past its end: closed at the next check whatever the
	// file (checked here by hand: a dialer whose checks are an hour apart).
	reverifyEvery = time.Hour
	testenv.Rotate(t, caFile, oldCA.File)
	vc := connect(io.Discard).(*verifiedConn)
	tracked := func() bool {
		vc.open.mu.Lock()
		defer vc.open.mu.Unlock()
		_, ok := vc.open.conns[vc]
		return ok
	}
	vc.open.check([]*verifiedConn{vc}, time.Now())
	if !tracked() {
		t.Fatal("forgotten while its certificate verifies")
	}
	vc.open.check([]*verifiedConn{vc}, vc.notAfter.Add(time.Second))
	if tracked() {
		t.Fatal("kept past its certificate's end")
	}
}

func read(t *testing.T, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
