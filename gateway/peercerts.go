package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"

	"github.com/faultline/faultline/internal/certfile"
)

// PeerCertsEvery is how often the gateway re-verifies the client
// certificates of its open connections (peerCerts).
const PeerCertsEvery = 5 * time.Second

// peerCerts holds the client certificate each open TLS connection was
// admitted with, and closes the connection once gateway.client_ca no
// longer verifies it: its CA removed from the bundle (a CA retired or
// compromised), or the certificate expired since the handshake. A
// handshake checks the bundle as it is then (followClientCAs); without
// this an agent's connection made before the change stayed trusted until
// it closed (gRPC: max_connection_age, 30m; a busy REST keep-alive
// connection: never).
type peerCerts struct {
	cas    *certfile.Pool
	log    *slog.Logger
	closed *prometheus.CounterVec // by door

	conns sync.Map // net.Conn → *peerConn; its verified is check's alone
}

// peerConn is an open connection's client certificate chain (nil: it gave
// none, a token caller), when the first certificate of it expires, and the
// bundle check last verified it against (nil: not yet; its handshake may
// have used the bundle before a change).
type peerConn struct {
	door     string
	chain    []*x509.Certificate
	notAfter time.Time
	verified *x509.CertPool
}

func newPeerCerts(cas *certfile.Pool, log *slog.Logger, closed *prometheus.CounterVec) *peerCerts {
	return &peerCerts{cas: cas, log: log, closed: closed}
}

// track records conn's client certificate chain, from its TLS state.
func (p *peerCerts) track(conn net.Conn, door string, st tls.ConnectionState) {
	pr := &peerConn{door: door, chain: st.PeerCertificates}
	for _, c := range pr.chain {
		if pr.notAfter.IsZero() || c.NotAfter.Before(pr.notAfter) {
			pr.notAfter = c.NotAfter
		}
	}
	p.conns.Store(conn, pr)
}

func (p *peerCerts) forget(conn net.Conn) { p.conns.Delete(conn) }

// run checks the open connections every PeerCertsEvery until ctx ends.
func (p *peerCerts) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			p.check(now)
		}
	}
}

// check (run's alone) closes each open connection whose certificate the
// bundle as it is now does not verify at now. A connection is verified
// once after it opens, then again when the bundle changes or its chain
// expires.
func (p *peerCerts) check(now time.Time) {
	pool, err := p.cas.Get() // once loaded, the last good bundle
	if err != nil {
		return
	}
	p.conns.Range(func(k, v any) bool {
		conn, pr := k.(net.Conn), v.(*peerConn)
		if pr.chain == nil || (pr.verified == pool && now.Before(pr.notAfter)) {
			return true
		}
		inter := x509.NewCertPool()
		for _, c := range pr.chain[1:] {
			inter.AddCert(c)
		}
		_, err := pr.chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		if err == nil {
			pr.verified = pool
			return true
		}
		p.conns.Delete(conn)
		p.closed.WithLabelValues(pr.door).Inc()
		p.log.Warn("gateway: closing a connection whose client certificate is no longer trusted (gateway.client_ca changed, or it expired)",
			"door", pr.door, "client", conn.RemoteAddr().String(), "subject", pr.chain[0].Subject.String(), "err", err)
		go conn.Close() // a TLS close_notify may wait on a stuck write
		return true
	})
}

// creds are gRPC transport credentials that track each connection's
// client certificate in p.
func (p *peerCerts) creds(c credentials.TransportCredentials, door string) credentials.TransportCredentials {
	return trackedCreds{TransportCredentials: c, peers: p, door: door}
}

type trackedCreds struct {
	credentials.TransportCredentials
	peers *peerCerts
	door  string
}

func (c trackedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return conn, info, err
	}
	if ti, ok := info.(credentials.TLSInfo); ok {
		conn = &trackedConn{Conn: conn, peers: c.peers}
		c.peers.track(conn, c.door, ti.State)
	}
	return conn, info, nil
}

func (c trackedCreds) Clone() credentials.TransportCredentials {
	return trackedCreds{TransportCredentials: c.TransportCredentials.Clone(), peers: c.peers, door: c.door}
}

// trackedConn forgets its certificate when it closes.
type trackedConn struct {
	net.Conn
	peers *peerCerts
}

func (c *trackedConn) Close() error {
	c.peers.forget(c)
	return c.Conn.Close()
}

// connState is an http.Server's ConnState: it tracks each TLS connection
// from its first request (its handshake done) until it closes.
func (p *peerCerts) connState(door string) func(net.Conn, http.ConnState) {
	return func(c net.Conn, st http.ConnState) {
		switch st {
		case http.StateActive:
			if _, ok := p.conns.Load(c); ok {
				return
			}
			if tc, ok := c.(*tls.Conn); ok {
				p.track(c, door, tc.ConnectionState())
			}
		case http.StateClosed, http.StateHijacked:
			p.forget(c)
		}
	}
}
