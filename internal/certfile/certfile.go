// Package certfile serves a TLS certificate and a CA bundle from their
// files, re-read when they change: a certificate or CA rotated in place
// (cert-manager renewing the Secret behind a volume, an operator replacing
// the files) is used from the next handshake on, without a restart.
package certfile

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Pair is a certificate and key file pair. Its GetCertificate fits
// tls.Config.GetCertificate.
type Pair struct {
	certFile, keyFile string
	keys              string // the config keys naming the files, for errors

	mu    sync.Mutex
	cert  *tls.Certificate
	stamp string
}

// New returns the pair of certFile and keyFile, named in errors as keys
// (e.g. "gateway.tls_cert, gateway.tls_key"). Nothing is read yet: call
// GetCertificate(nil) to check the files at start.
func New(certFile, keyFile, keys string) *Pair {
	return &Pair{certFile: certFile, keyFile: keyFile, keys: keys}
}

// GetCertificate returns the pair as last loaded, loading it again when
// either file's modification time or size changed. While the files do not
// load (mid-rotation: a new certificate beside the old key), the last pair
// that did is served; with none yet, the error names the keys.
func (p *Pair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := fileStamp(p.certFile, p.keyFile)
	if p.cert != nil && st == p.stamp {
		return p.cert, nil
	}
	c, err := tls.LoadX509KeyPair(p.certFile, p.keyFile)
	if err != nil {
		if p.cert != nil {
			return p.cert, nil
		}
		return nil, fmt.Errorf("%s: %w", p.keys, err)
	}
	p.cert, p.stamp = &c, st
	return p.cert, nil
}

// ExpirySeconds is when the pair's certificate (as GetCertificate would
// serve it now) expires, in Unix seconds, for an expiry gauge: 0 for a nil
// pair (no certificate configured) or while none loads.
func (p *Pair) ExpirySeconds() float64 {
	if p == nil {
		return 0
	}
	c, err := p.GetCertificate(nil)
	if err != nil || c.Leaf == nil {
		return 0
	}
	return float64(c.Leaf.NotAfter.Unix())
}

// Pool is a CA bundle file. Its Get returns the bundle as a pool.
type Pool struct {
	file, key string

	mu    sync.Mutex
	pool  *x509.CertPool
	first time.Time // the earliest NotAfter of the pool's certificates
	stamp string
}

// NewPool returns the bundle in file, named in errors as key (e.g.
// "gateway.client_ca"). Nothing is read yet: call Get to check the file at
// start.
func NewPool(file, key string) *Pool {
	return &Pool{file: file, key: key}
}

// Get returns the pool as last loaded, loading it again when the file's
// modification time or size changed; the same pointer until then. While
// the file does not load, or holds no certificate, the last pool that did
// is returned; with none yet, the error names the key.
func (p *Pool) Get() (*x509.CertPool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := fileStamp(p.file)
	if p.pool != nil && st == p.stamp {
		return p.pool, nil
	}
	b, err := os.ReadFile(p.file)
	var (
		pool  *x509.CertPool
		first time.Time
	)
	if err == nil {
		if pool, first = parseBundle(b); pool == nil {
			err = fmt.Errorf("no PEM certificates in %s", p.file)
		}
	}
	if err != nil {
		if p.pool != nil {
			return p.pool, nil
		}
		return nil, fmt.Errorf("%s: %w", p.key, err)
	}
	p.pool, p.first, p.stamp = pool, first, st
	return p.pool, nil
}

// parseBundle is the pool of the certificates in a PEM bundle, as
// x509.CertPool.AppendCertsFromPEM reads it (CERTIFICATE blocks without
// headers; one that does not parse is skipped), and the earliest NotAfter
// among them; nil when none parses.
func parseBundle(b []byte) (*x509.CertPool, time.Time) {
	var (
		pool  *x509.CertPool
		first time.Time
	)
	for len(b) > 0 {
		var block *pem.Block
		if block, b = pem.Decode(b); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" || len(block.Headers) != 0 {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			continue
		}
		if pool == nil {
			pool = x509.NewCertPool()
		}
		pool.AddCert(c)
		if first.IsZero() || c.NotAfter.Before(first) {
			first = c.NotAfter
		}
	}
	return pool, first
}

// ExpirySeconds is when the first of the bundle's CA certificates (as Get
// would return it now) expires, in Unix seconds: 0 for a nil pool (no
// ca_file: the system roots) or while none loads.
func (p *Pool) ExpirySeconds() float64 {
	if p == nil {
		return 0
	}
	if _, err := p.Get(); err != nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return float64(p.first.Unix())
}

// CAExpiryGauge is faultline_tls_ca_expiry_timestamp_seconds{key}: expiry
// is the ExpirySeconds of the bundle the config key names.
func CAExpiryGauge(key string, expiry func() float64) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "faultline_tls_ca_expiry_timestamp_seconds",
		Help:        "When the first CA certificate in the bundle the config key names expires (Unix seconds; the file is re-read when it changes); 0 where the key is unset.",
		ConstLabels: prometheus.Labels{"key": key},
	}, expiry)
}

// fileStamp identifies the files' current contents by modification time
// and size (a stat each).
func fileStamp(files ...string) string {
	var s string
	for _, f := range files {
		if st, err := os.Stat(f); err == nil {
			s += st.ModTime().String() + fmt.Sprint(st.Size())
		}
	}
	return s
}
