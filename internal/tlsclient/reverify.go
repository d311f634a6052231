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

// ReverifyEvery is how often the open connections made with a CA file are
// verified again against it, as the gateway does its clients'
// (gateway.PeerCertsEvery): a CA removed from the file (distrusted) ends
// the connections whose server it signed within this long, where they
// would have lasted until the server or a network error closed them.
const ReverifyEvery = 5 * time.Second

// reverifyEvery is ReverifyEvery; tests shorten it.
var reverifyEvery = ReverifyEvery

// Reverifier verifies the open TLS connections made with a CA file again
// every ReverifyEvery, while there are any (no goroutine otherwise), and
// closes those the file no longer verifies. Dialer uses one; the agent's
// gRPC credentials to the gateway another.
type Reverifier struct {
	cas   *certfile.Pool
	key   string // the CA file's config key, for the warning
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	conns   map[*verifiedConn]struct{}
	running bool
}

// NewReverifier returns the Reverifier of the CA file cas, which the config
// key names in its warnings (e.g. "kafka.tls.ca_file").
func NewReverifier(cas *certfile.Pool, key string, log *slog.Logger) *Reverifier {
	if log == nil {
		log = slog.Default()
	}
	return &Reverifier{cas: cas, key: key, log: log, every: reverifyEvery, now: time.Now}
}

// verifiedConn is a TLS connection made with the CA file, with what it
// was verified with.
type verifiedConn struct {
	net.Conn
	open     *Reverifier
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
	inner := c.Conn
	if tc, ok := inner.(*tls.Conn); ok {
		inner = tc.NetConn()
	}
	sc, ok := inner.(syscall.Conn)
	if !ok {
		return nil, syscall.EINVAL
	}
	return sc.SyscallConn()
}

// Track returns conn, a TLS connection whose handshake with the server
// name verified (server_name, else the host dialed) gave st, as one the
// Reverifier closes once the CA file no longer verifies it. It is
// verified again at the next check.
func (o *Reverifier) Track(conn net.Conn, st tls.ConnectionState, name string) net.Conn {
	c := &verifiedConn{Conn: conn, open: o, name: name, chain: st.PeerCertificates}
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

func (o *Reverifier) forget(c *verifiedConn) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.conns, c)
}

// run checks the open connections every o.every until there are none.
func (o *Reverifier) run() {
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
func (o *Reverifier) check(conns []*verifiedConn, now time.Time) {
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
		o.log.Warn("closing a connection whose server certificate "+o.key+" no longer verifies (the CA file changed, or the certificate expired); the client dials again",
			"server", c.RemoteAddr().String(), "subject", c.chain[0].Subject.String(), "err", err)
		o.forget(c)
		go c.Conn.Close() // a TLS close_notify may wait on a stuck write
	}
}
