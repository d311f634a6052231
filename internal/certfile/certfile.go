// Package certfile serves a TLS certificate and a CA bundle from their
// files, re-read when they change: a certificate or CA rotated in place
// (cert-manager renewing the Secret behind a volume, an operator replacing
// the files) is used from the next handshake on, without a restart.
package certfile

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync"
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
	pool := x509.NewCertPool()
	if err == nil && !pool.AppendCertsFromPEM(b) {
		err = fmt.Errorf("no PEM certificates in %s", p.file)
	}
	if err != nil {
		if p.pool != nil {
			return p.pool, nil
		}
		return nil, fmt.Errorf("%s: %w", p.key, err)
	}
	p.pool, p.stamp = pool, st
	return p.pool, nil
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
