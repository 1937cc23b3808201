package gate

import "net"

// Replay returns c reading prefix first: bytes a listener read ahead while
// deciding (a peeked opening, a request head) that the next stage must see.
func Replay(c net.Conn, prefix []byte) net.Conn {
	if len(prefix) == 0 {
		return c
	}
	return &replayed{Conn: c, prefix: append([]byte(nil), prefix...)}
}

type replayed struct {
	net.Conn
	prefix []byte
}

func (p *replayed) Read(b []byte) (int, error) {
	if len(p.prefix) > 0 {
		n := copy(b, p.prefix)
		p.prefix = p.prefix[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}

func (p *replayed) CloseWrite() error {
	if cw, ok := p.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Unwatched, Skipped and Raw let the relay splice what is written to the
// client (relay.Watched): only reads are replayed.
func (p *replayed) Unwatched() int64 { return -1 }
func (p *replayed) Skipped(int64)    {}
func (p *replayed) Raw() net.Conn    { return p.Conn }
