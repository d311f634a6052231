package clickhouse

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"

	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/internal/tlsclient"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestTLSConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    TLSConfig
		want string // error substring; "" = valid
	}{
		{"off", TLSConfig{}, ""},
		{"on, system roots", TLSConfig{Enabled: true}, ""},
		{"ca without tls", TLSConfig{CAFile: "/x"}, "clickhouse.tls.ca_file: set, but clickhouse.tls.enabled is false"},
		{"server name without tls", TLSConfig{ServerName: "x"}, "clickhouse.tls.server_name: set, but"},
		{"missing ca file", TLSConfig{Enabled: true, CAFile: "/does/not/exist"}, "clickhouse.tls.ca_file: open /does/not/exist"},
		{"cert without key", TLSConfig{Enabled: true, CertFile: "/x"}, "clickhouse.tls.key_file: required with clickhouse.tls.cert_file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Validate("clickhouse.tls.")
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestTLSOptions: an enabled TLS section reaches the driver's options.
func TestTLSOptions(t *testing.T) {
	c := DefaultConfig()
	c.TLS = TLSConfig{Enabled: true, ServerName: "ch.example"}
	o, err := c.options("faultline", discard())
	if err != nil {
		t.Fatal(err)
	}
	if o.TLS == nil || o.TLS.ServerName != "ch.example" || o.TLS.MinVersion == 0 {
		t.Fatalf("TLS options %+v", o.TLS)
	}
	c.TLS = TLSConfig{}
	if o, _ = c.options("faultline", discard()); o.TLS != nil {
		t.Fatal("TLS set while disabled")
	}
}

// TestTLSRealServer: clickhouse.tls reaches a real ClickHouse server's
// secure native port (the Debian 18.16 package, tcp_port_secure), verifying
// its certificate; a wrong CA and plaintext to the TLS port fail.
func TestTLSRealServer(t *testing.T) {
	srv := testenv.StartClickHouseTLS(t)
	ctx := context.Background()
	c := DefaultConfig()
	c.Addr = srv.SecureAddr
	c.DialTimeout = 5 * time.Second
	c.TLS = TLSConfig{Enabled: true, CAFile: srv.CA.File}
	if err := c.Validate("clickhouse."); err != nil {
		t.Fatal(err)
	}
	conn, err := Open(context.Background(), withDB(c, "default"), discard())
	if err != nil {
		t.Fatalf("TLS open: %v", err)
	}
	var one uint8
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 over TLS: %v %d", err, one)
	}
	conn.Close()

	other := testenv.NewCA(t, "", "other-ca")
	bad := c
	bad.TLS.CAFile = other.File
	if _, err := Open(ctx, withDB(bad, "default"), discard()); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("wrong CA: %v, want a certificate error", err)
	}
	plain := c
	plain.TLS = TLSConfig{}
	plain.DialTimeout = 2 * time.Second
	if _, err := Open(ctx, withDB(plain, "default"), discard()); err == nil {
		t.Error("plaintext to the TLS port: connected")
	}
}

func withDB(c Config, db string) Config {
	c.Database = db
	return c
}

// TestTLSRealServerFollowsTheCAFile: clickhouse.tls.ca_file is read again
// when it changes, so a CA bundle replaced in place is trusted by the next
// connection of the same pool (a real server's secure port). Before, the
// pool trusted the bundle it read at start until a restart. The server's
// CA taken out of the file again (distrusted), the pool's open connection
// is closed within tlsclient.ReverifyEvery and the next one refused;
// before, the pool kept using the connection it had.
func TestTLSRealServerFollowsTheCAFile(t *testing.T) {
	srv := testenv.StartClickHouseTLS(t)
	caFile, otherCA := filepath.Join(t.TempDir(), "ca.crt"), testenv.NewCA(t, "", "before-the-rotation")
	testenv.Rotate(t, caFile, otherCA.File)
	c := withDB(DefaultConfig(), "default")
	c.Addr, c.DialTimeout = srv.SecureAddr, 5*time.Second
	c.TLS = TLSConfig{Enabled: true, CAFile: caFile}
	opts, err := c.options("default", discard())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := ch.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ping := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return conn.Ping(ctx)
	}
	if err := ping(); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("ping with a CA that does not sign the server: %v, want unknown authority", err)
	}
	testenv.Rotate(t, caFile, srv.CA.File)
	if err := ping(); err != nil {
		t.Fatalf("ping once the server's CA is in the file: %v", err)
	}
	testenv.Rotate(t, caFile, otherCA.File)
	deadline := time.Now().Add(2*tlsclient.ReverifyEvery + 5*time.Second)
	for err := ping(); err == nil; err = ping() {
		if time.Now().After(deadline) {
			t.Fatal("still answering on the connection the CA file no longer verifies")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := ping(); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("ping after the server's CA left the file: %v, want unknown authority", err)
	}
}
