// Package certfile serves a TLS certificate from its files, re-read when
// they change: a certificate rotated in place (cert-manager renewing the
// Secret behind a volume, an operator replacing the files) is served from
// the next handshake on, without a restart.
package certfile

import (
	"crypto/tls"
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
	st := p.fileStamp()
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

// fileStamp identifies the files' current contents by modification time
// and size (two stats a handshake).
func (p *Pair) fileStamp() string {
	var s string
	for _, f := range []string{p.certFile, p.keyFile} {
		if st, err := os.Stat(f); err == nil {
			s += st.ModTime().String() + fmt.Sprint(st.Size())
		}
	}
	return s
}
