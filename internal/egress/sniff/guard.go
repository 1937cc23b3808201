package sniff

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
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
//
// When the opening is an HTTP/1 request, so is every later request on the
// connection, and each one is checked too: a keep-alive connection to an
// allowed site could otherwise carry a request for another site served at
// the same address (domain fronting). Requests are then read with net/http
// and written on re-serialised; after a protocol upgrade (WebSocket) the
// rest passes as it is.
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
	// requests carries the re-serialised requests of an HTTP connection.
	requests *io.PipeReader
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
		if kind == KindHTTP {
			pr, pw := io.Pipe()
			g.requests = pr
			opening := buf
			g.pending = nil
			go func() { pw.CloseWithError(forwardRequests(g.Conn, opening, pw, g.check)) }()
		}
	}
	if g.requests != nil {
		return g.requests.Read(p)
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

// SetReadDeadline applies to the raw connection until it is read request by
// request; the request reader then waits for the client as long as it
// takes, and idleness shows on the other direction.
func (g *guarded) SetReadDeadline(t time.Time) error {
	if g.requests != nil {
		return nil
	}
	return g.Conn.SetReadDeadline(t)
}

// Close also ends the request reader, which may be blocked handing on a
// request nobody will read.
func (g *guarded) Close() error {
	if g.requests != nil {
		g.requests.Close()
	}
	return g.Conn.Close()
}

// maxHead bounds one request head; the body that follows is not limited.
const maxHead = 64 << 10

// forwardRequests reads c's requests (opening holds the first bytes),
// checks each one's Host and writes it to w. It returns io.EOF when the
// client has no more requests, or the reason it stopped.
func forwardRequests(c net.Conn, opening []byte, w io.Writer, check func(kind, name string, err error) error) error {
	head := &io.LimitedReader{R: c}
	br := bufio.NewReader(io.MultiReader(bytes.NewReader(opening), head))
	for {
		head.N = maxHead
		req, err := http.ReadRequest(br)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return io.EOF
			}
			return fmt.Errorf("reading a request on a checked HTTP connection: %w", err)
		}
		head.N = math.MaxInt64
		host := req.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if err := check(KindHTTP, strings.Trim(host, "[]"), nil); err != nil {
			return err
		}
		if _, ok := req.Header["User-Agent"]; !ok {
			// net/http would otherwise add its own.
			req.Header["User-Agent"] = []string{""}
		}
		upgrade := req.Header.Get("Upgrade") != ""
		if err := req.Write(w); err != nil {
			return err
		}
		if upgrade {
			_, err := io.Copy(w, br)
			if err == nil {
				err = io.EOF
			}
			return err
		}
	}
}
