package clickhouse

import (
	"io"
	"log/slog"
	"strings"
	"testing"
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
		{"cert without key", TLSConfig{Enabled: true, CertFile: "/x"}, "clickhouse.tls.cert_file and clickhouse.tls.key_file: set both or neither"},
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
