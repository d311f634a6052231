// Package connlimit bounds the connections a listener accepts: in all and
// per client address, so that one client cannot hold every connection a
// server can afford (slowloris).
package connlimit

import (
	"net"
	"sync"
)

// limitListener closes, as soon as they are accepted, connections past a
// total and past a number per client address (0: no limit); refused is
// told of each connection it closed, its client address and whether the
// total was the limit.
type limitListener struct {
	net.Listener
	total, perAddr int
	refused        func(addr string, total bool)

	mu     sync.Mutex
	n      int
	byAddr map[string]int
}

// Listener returns ln accepting at most total connections at once and
// perAddr per client address (ClientAddr; 0: no limit), refused told of
// each it closes; ln itself when neither is set.
func Listener(ln net.Listener, total, perAddr int, refused func(addr string, total bool)) net.Listener {
	if total <= 0 && perAddr <= 0 {
		return ln
	}
	return &limitListener{Listener: ln, total: total, perAddr: perAddr, refused: refused, byAddr: map[string]int{}}
}

// Accept returns the next connection within the limits.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := ClientAddr(c.RemoteAddr())
		l.mu.Lock()
		overTotal := l.total > 0 && l.n >= l.total
		if overTotal || (l.perAddr > 0 && addr != "" && l.byAddr[addr] >= l.perAddr) {
			l.mu.Unlock()
			_ = c.Close()
			if l.refused != nil {
				l.refused(addr, overTotal)
			}
			continue
		}
		l.n++
		if addr != "" {
			l.byAddr[addr]++
		}
		l.mu.Unlock()
		return &limitedConn{Conn: c, l: l, addr: addr}, nil
	}
}

func (l *limitListener) done(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n--
	if addr == "" {
		return
	}
	if l.byAddr[addr] <= 1 {
		delete(l.byAddr, addr)
	} else {
		l.byAddr[addr]--
	}
}

// ClientAddr is the IP of a TCP peer, or for IPv6 its /64 (a host is
// given a /64 and picks its addresses in it: counted per /128, one client
// had as many addresses as it liked); "" for other kinds of peer (a unix
// socket's have no address of their own).
func ClientAddr(a net.Addr) string {
	t, ok := a.(*net.TCPAddr)
	switch {
	case !ok:
		return ""
	case t.IP.To4() != nil:
		return t.IP.String()
	}
	return t.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

type limitedConn struct {
	net.Conn
	l    *limitListener
	addr string
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.done(c.addr) })
	return err
}
