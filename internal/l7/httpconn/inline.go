package httpconn

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// inlineHeadBytes bounds a request head read inline; a longer one goes to
// net/http's server with the rest of the connection.
const inlineHeadBytes = 8 << 10

// ServeInline is Serve for a handler that answers simple requests without
// hijacking: HTTP/1.1 requests for GET, HEAD or OPTIONS with no body,
// Upgrade or Expect, in origin form, with one valid Host and valid
// headers are read and answered on the calling goroutine. net/http's
// server reads every request on a second goroutine, parked in a read to
// notice a client that goes away, and wakes and joins it after each one;
// on a busy machine those hand-offs were a large part of an inspected
// request's cost. Here only a request that outlasts watchAfter is
// watched so.
//
// A request head is parsed from a copy before any byte is consumed, so at
// the first request that is not simple (or an h2 client, or a head
// net/http would answer with an error) the connection, with that
// request's bytes still unread, goes to Serve for the rest of its life:
// whatever is not simple gets exactly net/http's handling.
func ServeInline(ctx context.Context, c net.Conn, h http.Handler, idle time.Duration, log *slog.Logger) error {
	var state *tls.ConnectionState
	if tc, ok := c.(*tls.Conn); ok {
		cs := tc.ConnectionState()
		if cs.NegotiatedProtocol != "" && cs.NegotiatedProtocol != "http/1.1" {
			return Serve(ctx, c, h, idle, log)
		}
		state = &cs
	}
	s := &inline{c: c, br: bufio.NewReaderSize(c, inlineHeadBytes), h: h, log: log, tls: state, remote: c.RemoteAddr().String()}
	s.w.bw = bufio.NewWriterSize(c, 4<<10)
	s.watch.s = s
	// ReverseProxy looks for a server under ServerContextKey (see
	// inlineServer); every request's context derives from this one.
	base := context.WithValue(ctx, http.ServerContextKey, inlineServer)
	handedOver := false
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer func() {
		stop()
		if !handedOver {
			c.Close()
		}
	}()
	for n := 0; ; n++ {
		// Between requests net/http's server waits for 4 bytes and ends
		// the connection silently without them; so does this. The
		// deadline then stays set while the request runs: re-arming it is
		// a timer change that can wake the runtime's poller, and nothing
		// reads the connection meanwhile but the watchdog, which clears it.
		wait, need := time.Now().Add(HeadTimeout), 1
		if n > 0 {
			wait, need = deadline(idle), 4
		}
		c.SetReadDeadline(wait)
		if _, err := s.br.Peek(need); err != nil {
			return nil
		}
		head, err := s.peekHead()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil
		}
		var req *http.Request
		if err == nil {
			req = s.simple(head)
		}
		if req == nil {
			// net/http's server answers a head cut short, too.
			c.SetReadDeadline(time.Time{})
			stop()
			handedOver = true
			return Serve(ctx, &BufferedConn{Conn: c, R: s.br}, h, idle, log)
		}
		s.br.Discard(len(head))
		rctx, cancel := context.WithCancel(base)
		keep := s.serve(req.WithContext(rctx), cancel)
		cancel()
		if !keep {
			return nil
		}
	}
}

// inlineServer is what requests served inline find under
// http.ServerContextKey. It serves nothing, but httputil.ReverseProxy
// aborts a response whose body fails mid-way (panics with
// http.ErrAbortHandler, so the client sees it cut) only under a server;
// without one it would end the response as if the body were whole.
var inlineServer = &http.Server{}

type inline struct {
	c      net.Conn
	br     *bufio.Reader
	h      http.Handler
	log    *slog.Logger
	tls    *tls.ConnectionState
	remote string
	w      writer
	watch  watch
	// src and parse read a head from its copy.
	src   bytes.Reader
	parse bufio.Reader
}

// peekHead returns the next request head, up to and including the empty
// line that ends it, without consuming it; a head not all read yet has
// HeadTimeout to arrive. A head that does not fit the buffer is returned
// whole-buffer with no error, for simple to refuse.
func (s *inline) peekHead() ([]byte, error) {
	for waited := false; ; waited = true {
		buf, _ := s.br.Peek(s.br.Buffered())
		if n := headEnd(buf); n > 0 {
			return buf[:n], nil
		}
		if len(buf) >= inlineHeadBytes {
			return buf, nil
		}
		if !waited {
			s.c.SetReadDeadline(time.Now().Add(HeadTimeout))
		}
		if _, err := s.br.Peek(len(buf) + 1); err != nil {
			return nil, err
		}
	}
}

// headEnd is the length of the head in b, through the first empty line
// (CRLF or bare LF, as textproto reads lines), or 0 if b holds none.
func headEnd(b []byte) int {
	for i := 0; i < len(b); {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return 0
		}
		i += j + 1
		switch {
		case i < len(b) && b[i] == '\n':
			return i + 1
		case i+1 < len(b) && b[i] == '\r' && b[i+1] == '\n':
			return i + 2
		}
	}
	return 0
}

// simple parses head and returns the request if it is one to serve
// inline, with the checks net/http's server makes before its handler.
func (s *inline) simple(head []byte) *http.Request {
	s.src.Reset(head)
	s.parse.Reset(&s.src)
	req, err := http.ReadRequest(&s.parse)
	if err != nil || s.parse.Buffered() != 0 || s.src.Len() != 0 {
		return nil
	}
	if req.ProtoMajor != 1 || req.ProtoMinor != 1 || req.Body != http.NoBody || !strings.HasPrefix(req.RequestURI, "/") {
		return nil
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
	default:
		return nil
	}
	if _, ok := req.Header["Upgrade"]; ok {
		return nil
	}
	if _, ok := req.Header["Expect"]; ok {
		return nil
	}
	// ReadRequest keeps the first Host in req.Host and drops the header,
	// so the lines are counted in the head itself.
	if hostLines(head) != 1 || !httpguts.ValidHostHeader(req.Host) {
		return nil
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return nil
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return nil
			}
		}
	}
	req.RemoteAddr = s.remote
	req.TLS = s.tls
	return req
}

// hostLines counts the head's header lines named Host.
func hostLines(head []byte) int {
	_, fields, _ := bytes.Cut(head, []byte("\n"))
	n := 0
	for line := range bytes.Lines(fields) {
		name, _, ok := bytes.Cut(line, []byte(":"))
		if ok && bytes.EqualFold(name, []byte("Host")) {
			n++
		}
	}
	return n
}

// serve answers one request and reports whether the connection may carry
// another. A handler that panics ends the connection with its response
// cut short, as net/http's server does. A request that runs long is
// cancelled if the client hangs up (watchdog).
func (s *inline) serve(req *http.Request, cancel context.CancelFunc) (keep bool) {
	s.watch.cancel = cancel
	dog.begin(&s.watch)
	defer dog.end(&s.watch)
	s.w.reset(req)
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				s.log.Error("http handler panicked", "err", p, "stack", string(debug.Stack()))
			}
			s.w.flush()
			keep = false
		}
	}()
	s.h.ServeHTTP(&s.w, req)
	return !s.w.finish()
}

// deadline is the end of an idle wait; none if idle is 0, as with
// net/http's server.
func deadline(idle time.Duration) time.Time {
	if idle == 0 {
		return time.Time{}
	}
	return time.Now().Add(idle)
}

// BufferedConn is a connection read through the reader that holds the
// bytes already read (or peeked) from it.
type BufferedConn struct {
	net.Conn
	R *bufio.Reader
}

func (c *BufferedConn) Read(b []byte) (int, error) { return c.R.Read(b) }

// CloseWrite half-closes the connection when it can, so a relay of it
// can pass on the end of one direction.
func (c *BufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
