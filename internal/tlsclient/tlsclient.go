// Package tlsclient is the configuration of TLS to a server a binary dials
// (the Kafka brokers, ClickHouse): one set of keys — enabled, ca_file,
// cert_file, key_file, server_name — with the same flags, checks and
// errors wherever it is used.
package tlsclient

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/faultline/faultline/internal/certfile"
)

// Config is TLS to a server.
type Config struct {
	// Enabled dials the server with TLS 1.2 or later, verifying its
	// certificate. Default false (plaintext).
	Enabled bool `toml:"enabled"`
	// CAFile is a PEM bundle of the CAs that sign the server's
	// certificate, re-read by Dialer when it changes. Default "": the
	// system roots.
	CAFile string `toml:"ca_file"`
	// CertFile is a PEM client certificate (chain) presented to a server
	// that asks for one (mutual TLS). Re-read when it or KeyFile changes,
	// so a renewed certificate is used by new connections. Default "":
	// none.
	CertFile string `toml:"cert_file"`
	// KeyFile is CertFile's PEM private key; set with CertFile. Default "".
	KeyFile string `toml:"key_file"`
	// ServerName is the name verified in the server's certificate.
	// Default "": the host of the address dialed.
	ServerName string `toml:"server_name"`
}

// RegisterFlags adds the keys' flags under prefix ("kafka.tls."); peer
// names the server in the help ("the Kafka brokers").
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix, peer string) {
	fs.BoolVar(&c.Enabled, prefix+"enabled", c.Enabled, "dial "+peer+" with TLS (1.2 or later)")
	fs.StringVar(&c.CAFile, prefix+"ca-file", c.CAFile, "PEM CA bundle that signs the certificates of "+peer+" (default: system roots)")
	fs.StringVar(&c.CertFile, prefix+"cert-file", c.CertFile, "PEM client certificate for mutual TLS to "+peer)
	fs.StringVar(&c.KeyFile, prefix+"key-file", c.KeyFile, "PEM private key of the client certificate for "+peer)
	fs.StringVar(&c.ServerName, prefix+"server-name", c.ServerName, "name to verify in the certificates of "+peer+" (default: the host dialed)")
}

// Validate checks the keys against Enabled and that the files they name
// load; errors name the key under prefix.
func (c Config) Validate(prefix string) error {
	_, err := c.Build(prefix)
	return err
}

// Build returns the tls.Config of c, nil when TLS is off.
func (c Config) Build(prefix string) (*tls.Config, error) {
	tc, _, err := c.BuildWithCAs(prefix)
	return tc, err
}

// BuildWithCAs is Build, and the CA bundle it read (nil without ca_file)
// for a caller that follows the file at each connection (Dialer, the
// agent's gRPC credentials).
func (c Config) BuildWithCAs(prefix string) (*tls.Config, *certfile.Pool, error) {
	if !c.Enabled {
		for _, kv := range [][2]string{{"ca_file", c.CAFile}, {"cert_file", c.CertFile}, {"key_file", c.KeyFile}, {"server_name", c.ServerName}} {
			if kv[1] != "" {
				return nil, nil, fmt.Errorf("%s%s: set, but %senabled is false (TLS is off)", prefix, kv[0], prefix)
			}
		}
		return nil, nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	cas := c.CAs(prefix)
	if cas != nil {
		pool, err := cas.Get()
		if err != nil {
			return nil, nil, err
		}
		tc.RootCAs = pool
	}
	switch {
	case c.CertFile == "" && c.KeyFile == "":
	case c.CertFile == "":
		return nil, nil, fmt.Errorf("%scert_file: required with %skey_file", prefix, prefix)
	case c.KeyFile == "":
		return nil, nil, fmt.Errorf("%skey_file: required with %scert_file", prefix, prefix)
	default:
		pair := c.ClientCert(prefix)
		if _, err := pair.GetCertificate(nil); err != nil {
			return nil, nil, err
		}
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return pair.GetCertificate(nil) }
	}
	return tc, cas, nil
}

// ClientCert is the client certificate of c, re-read when its files
// change (a half-written rotation keeps the last pair that loaded); nil
// when c presents none (TLS off, or no cert_file).
func (c Config) ClientCert(prefix string) *certfile.Pair {
	if !c.Enabled || c.CertFile == "" {
		return nil
	}
	return certfile.New(c.CertFile, c.KeyFile, prefix+"cert_file, "+prefix+"key_file")
}

// CAs is the CA bundle of c, re-read when its file changes; nil when TLS
// is off or c trusts the system roots (no ca_file).
func (c Config) CAs(prefix string) *certfile.Pool {
	if !c.Enabled || c.CAFile == "" {
		return nil
	}
	return certfile.NewPool(c.CAFile, prefix+"ca_file")
}

// Dial dials addr over network with TLS.
type Dial func(ctx context.Context, network, addr string) (net.Conn, error)

// Dialer returns the dial function of c (nil when TLS is off): TLS as
// Build has it, with the CA bundle as it is at each dial, re-read when the
// file changes: a CA rotated in place (a Kafka operator's cluster CA
// renewed, the Secret updated under the pod) is trusted by the next
// connection, where Build's is trusted until a restart. The name verified
// is server_name, else the host dialed. timeout bounds the TCP connect.
// With a ca_file, the open connections are verified again every
// ReverifyEvery against the file as it is then, and one it no longer
// verifies is closed (logged to log): a CA removed from the file is
// trusted by no connection, not only by the next ones.
func (c Config) Dialer(prefix string, timeout time.Duration, log *slog.Logger) (Dial, error) {
	base, cas, err := c.BuildWithCAs(prefix)
	if err != nil || base == nil {
		return nil, err
	}
	nd := &net.Dialer{Timeout: timeout}
	var open *Reverifier // only for a ca_file: the system roots are not followed
	if cas != nil {
		open = NewReverifier(cas, prefix+"ca_file", log)
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		tc := base.Clone()
		if cas != nil {
			pool, err := cas.Get()
			if err != nil {
				return nil, err
			}
			tc.RootCAs = pool
		}
		if tc.ServerName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, fmt.Errorf("dial %s: %w", addr, err)
			}
			tc.ServerName = host
		}
		conn, err := (&tls.Dialer{NetDialer: nd, Config: tc}).DialContext(ctx, network, addr)
		if err != nil || open == nil {
			return conn, err
		}
		return open.Track(conn, conn.(*tls.Conn).ConnectionState(), tc.ServerName), nil
	}, nil
}
