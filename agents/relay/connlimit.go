package relay

import (
	"net"
	"sync"
)

// limitListener closes, as soon as they are accepted, connections past
// max (the gateway's limitListener, less its per-address count: a unix
// socket's clients have no address of their own); refused is told of
// each.
type limitListener struct {
	net.Listener
	max     int
	refused func()

	mu sync.Mutex
	n  int
}

// Accept returns the next connection within the limit.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		if l.n >= l.max {
			l.mu.Unlock()
			_ = c.Close()
			l.refused()
			continue
		}
		l.n++
		l.mu.Unlock()
		return &limitedConn{Conn: c, l: l}, nil
	}
}

type limitedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.n--
		c.l.mu.Unlock()
	})
	return err
}
