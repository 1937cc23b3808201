package sniff

import (
	"errors"
	"net"
	"time"
)

// Guard returns c with its opening held back until check has approved what
// it announces. Listeners that must dial before the client speaks (a
// CONNECT or SOCKS tunnel, a transparent connection whose client waited
// out Peek's timeout) use it so that waiting cannot smuggle a fronted name
// past the check: the server's bytes flow at once, the client's only after
// check returns nil. prefix holds bytes already read from c. check gets
// Continue's results; a non-nil return is handed to the reader instead of
// data.
func Guard(c net.Conn, prefix []byte, limit int, timeout time.Duration, check func(kind, name string, err error) error) net.Conn {
	return &guarded{Conn: c, pending: prefix, limit: limit, timeout: timeout, check: check}
}

type guarded struct {
	net.Conn
	pending []byte
	checked bool
	refused error
	limit   int
	timeout time.Duration
	check   func(kind, name string, err error) error
}

func (g *guarded) Read(p []byte) (int, error) {
	if g.refused != nil {
		return 0, g.refused
	}
	if !g.checked {
		buf := g.pending
		if len(buf) == 0 {
			// The first read waits as long as the caller's deadline allows:
			// only once the client starts does the quiet timeout apply.
			first := make([]byte, 2048)
			n, err := g.Conn.Read(first)
			if n == 0 {
				return 0, err
			}
			buf = first[:n]
		}
		kind, name, buf, err := Continue(g.Conn, buf, g.limit, g.timeout)
		if err != nil && !errors.Is(err, ErrMalformed) {
			return 0, err
		}
		if err := g.check(kind, name, err); err != nil {
			g.refused = err
			return 0, err
		}
		g.checked = true
		g.pending = buf
	}
	if len(g.pending) > 0 {
		n := copy(p, g.pending)
		g.pending = g.pending[n:]
		return n, nil
	}
	return g.Conn.Read(p)
}

// CloseWrite keeps half-close working through the wrapper.
func (g *guarded) CloseWrite() error {
	if cw, ok := g.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
