package clickhouse

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"os"
)

// TLSConfig is TLS to ClickHouse's secure native port (tcp_port_secure,
// usually 9440; ClickHouse Cloud requires it).
type TLSConfig struct {
	// Enabled dials ClickHouse with TLS 1.2 or later, verifying its
	// certificate. Default false (plaintext).
	Enabled bool `toml:"enabled"`
	// CAFile is a PEM bundle of the CAs that sign the servers'
	// certificates. Default "": the system roots.
	CAFile string `toml:"ca_file"`
	// CertFile and KeyFile are a PEM client certificate and its key, for
	// servers that require one. Both or neither; read again at every
	// handshake. Default none.
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
	// ServerName is the name verified in the servers' certificates.
	// Default "": the host of the address dialed.
	ServerName string `toml:"server_name"`
}

// RegisterFlags adds the TLS keys' flags under prefix ("clickhouse.tls.").
func (c *TLSConfig) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.BoolVar(&c.Enabled, prefix+"enabled", c.Enabled, "dial ClickHouse with TLS (1.2 or later; the secure native port, usually 9440)")
	fs.StringVar(&c.CAFile, prefix+"ca-file", c.CAFile, "PEM CA bundle that signs the ClickHouse servers' certificates (default: system roots)")
	fs.StringVar(&c.CertFile, prefix+"cert-file", c.CertFile, "PEM client certificate for ClickHouse")
	fs.StringVar(&c.KeyFile, prefix+"key-file", c.KeyFile, "PEM private key of the ClickHouse client certificate")
	fs.StringVar(&c.ServerName, prefix+"server-name", c.ServerName, "name to verify in the ClickHouse servers' certificates (default: the host dialed)")
}

// Validate checks the keys against Enabled and that the files load.
func (c TLSConfig) Validate(prefix string) error {
	if !c.Enabled {
		for _, kv := range [][2]string{{"ca_file", c.CAFile}, {"cert_file", c.CertFile}, {"key_file", c.KeyFile}, {"server_name", c.ServerName}} {
			if kv[1] != "" {
				return fmt.Errorf("%s%s: set, but %senabled is false (TLS is off)", prefix, kv[0], prefix)
			}
		}
		return nil
	}
	_, err := c.Build(prefix)
	return err
}

// Build returns the tls.Config of c, nil when TLS is off.
func (c TLSConfig) Build(prefix string) (*tls.Config, error) {
	if !c.Enabled {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%sca_file: %w", prefix, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%sca_file: no PEM certificate in %s", prefix, c.CAFile)
		}
		tc.RootCAs = pool
	}
	switch {
	case c.CertFile == "" && c.KeyFile == "":
	case c.CertFile == "" || c.KeyFile == "":
		return nil, fmt.Errorf("%scert_file and %skey_file: set both or neither", prefix, prefix)
	default:
		if _, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile); err != nil {
			return nil, fmt.Errorf("%scert_file: %w", prefix, err)
		}
		certFile, keyFile := c.CertFile, c.KeyFile
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, fmt.Errorf("clickhouse client certificate: %w", err)
			}
			return &cert, nil
		}
	}
	return tc, nil
}
