package tlsclient

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/faultline/faultline/internal/certfile"
)

// ReverifyEvery is how often a Dialer's open connections are verified
// again against its CA file, as the gateway does its clients'
// (gateway.PeerCertsEvery): a CA removed from ca_file (distrusted) ends
// the connections whose server it signed within this long, where they
// would have lasted until the server or a network error closed them.
const ReverifyEvery = 5 * time.Second

// reverifyEvery is ReverifyEvery; tests shorten it.
var reverifyEvery = ReverifyEvery

// openConns are the open connections of one Dialer, verified again every
// ReverifyEvery while there are any (no goroutine otherwise).
type openConns struct {
	cas    *certfile.Pool
	prefix string
	log    *slog.Logger
	every  time.Duration
	now    func() time.Time

	mu      sync.Mutex
	conns   map[*verifiedConn]struct{}
	running bool
}

// verifiedConn is a TLS connection a Dialer made, with what it was
// verified with.
type verifiedConn struct {
	*tls.Conn
	open     *openConns
	name     string // the name verified (server_name, else the host dialed)
	chain    []*x509.Certificate
	notAfter time.Time      // the chain's first expiry
	verified *x509.CertPool // the bundle it was last verified against
}

// Close forgets the connection and closes it.
func (c *verifiedConn) Close() error {
	c.open.forget(c)
	return c.Conn.Close()
}

// SyscallConn is the TCP connection's, for a driver that checks an idle
// connection's socket before reusing it (clickhouse-go does so for a
// *tls.Conn or a syscall.Conn, and skips any other).
func (c *verifiedConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.NetConn().(syscall.Conn)
	if !ok {
		return nil, syscall.EINVAL
	}
	return sc.SyscallConn()
}

// track wraps a connection just verified against pool.
func (o *openConns) track(conn *tls.Conn, name string, pool *x509.CertPool) net.Conn {
	c := &verifiedConn{Conn: conn, open: o, name: name, chain: conn.ConnectionState().PeerCertificates, verified: pool}
	for _, x := range c.chain {
		if c.notAfter.IsZero() || x.NotAfter.Before(c.notAfter) {
			c.notAfter = x.NotAfter
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.conns == nil {
		o.conns = map[*verifiedConn]struct{}{}
	}
	o.conns[c] = struct{}{}
	if !o.running {
		o.running = true
		go o.run()
	}
	return c
}

func (o *openConns) forget(c *verifiedConn) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.conns, c)
}

// run checks the open connections every o.every until there are none.
func (o *openConns) run() {
	t := time.NewTicker(o.every)
	defer t.Stop()
	for range t.C {
		o.mu.Lock()
		if len(o.conns) == 0 {
			o.running = false
			o.mu.Unlock()
			return
		}
		conns := make([]*verifiedConn, 0, len(o.conns))
		for c := range o.conns {
			conns = append(conns, c)
		}
		o.mu.Unlock()
		o.check(conns, o.now())
	}
}

// check closes each connection whose server certificate the CA file as it
// is now does not verify at now. A connection is verified again only when
// the bundle changed or its chain expired.
func (o *openConns) check(conns []*verifiedConn, now time.Time) {
	pool, err := o.cas.Get() // once loaded, the last good bundle
	if err != nil {
		return
	}
	for _, c := range conns {
		if len(c.chain) == 0 || (c.verified == pool && now.Before(c.notAfter)) {
			continue
		}
		inter := x509.NewCertPool()
		for _, x := range c.chain[1:] {
			inter.AddCert(x)
		}
		_, err := c.chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: c.name, CurrentTime: now})
		if err == nil {
			c.verified = pool
			continue
		}
		o.log.Warn("closing a connection whose server certificate "+o.prefix+"ca_file no longer verifies (the CA file changed, or the certificate expired); the client dials again",
			"server", c.RemoteAddr().String(), "subject", c.chain[0].Subject.String(), "err", err)
		o.forget(c)
		go c.Conn.Close() // a TLS close_notify may wait on a stuck write
	}
}
