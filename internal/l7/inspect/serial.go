package inspect

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"sync"
	"time"
)

// serial forwards the simple requests of an HTTP/1.x client over one
// upstream HTTP/1.1 connection, on the handler's own goroutine. The
// Transport hands every request to a writer goroutine and every response
// back from a reader goroutine (or, over h2, a stream goroutine and the
// connection's reader); on a busy machine those wake-ups were most of an
// inspected request's added latency. A client on HTTP/1.x sends its next
// request only after the previous response, so one connection used in
// turn serves it.
//
// Only requests that cannot lose anything to this are taken: safe
// methods without a body, no upgrade, no Expect. Everything else, and
// every request while the connection is in use, goes to the Transport,
// which dials its own connections through the same guarded dialer.
type serial struct {
	u        *upstream
	fallback http.RoundTripper
	// tls configures the upstream handshake; nil for plain HTTP.
	tls *tls.Config

	mu       sync.Mutex
	busy     bool
	disabled bool // after a failed handshake, or once the connection ends
	conn     net.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
}

// max1xx bounds the informational responses before the final one, as the
// Transport does.
const max1xx = 5

func (s *serial) RoundTrip(req *http.Request) (*http.Response, error) {
	if !s.takes(req) || !s.acquire() {
		return s.fallback.RoundTrip(req)
	}
	resp, err := s.roundTrip(req)
	if errors.Is(err, errUpstreamTLS) {
		s.mu.Lock()
		s.disabled = true
		s.busy = false
		s.mu.Unlock()
		return s.fallback.RoundTrip(req)
	}
	return resp, err
}

// takes reports whether req is one the serial path may forward.
func (s *serial) takes(req *http.Request) bool {
	if req.ProtoMajor != 1 || (req.Body != nil && req.Body != http.NoBody) || req.ContentLength > 0 {
		return false
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
	default:
		return false
	}
	return req.Header.Get("Upgrade") == "" && req.Header.Get("Expect") == ""
}

func (s *serial) acquire() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy || s.disabled {
		return false
	}
	s.busy = true
	return true
}

// release ends a request; the connection is kept for the next one only if
// the exchange left it at a response boundary.
func (s *serial) release(keep bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if (!keep || s.disabled) && s.conn != nil {
		s.conn.Close()
		s.conn = nil
	}
	s.busy = false
}

// errUpstreamTLS is a failed TLS handshake with the upstream; the serial
// path then leaves the connection's requests to the Transport.
var errUpstreamTLS = errors.New("upstream TLS handshake offering HTTP/1.1 failed")

func (s *serial) roundTrip(req *http.Request) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		reused := s.conn != nil
		if !reused {
			if err := s.connect(req.Context()); err != nil {
				if !errors.Is(err, errUpstreamTLS) {
					s.release(false)
				}
				return nil, err
			}
		}
		resp, err := s.exchange(req)
		if err == nil {
			return resp, nil
		}
		var stale staleConn
		if errors.As(err, &stale) && reused && attempt == 0 {
			// The server closed the kept connection between requests;
			// these methods are safe to send again.
			s.conn.Close()
			s.conn = nil
			continue
		}
		s.release(false)
		return nil, err
	}
}

// staleConn is a kept connection that ended before any response byte.
type staleConn struct{ error }

func (e staleConn) Unwrap() error { return e.error }

// connect takes the gate's connection, or dials another through the
// guarded dialer, and completes TLS offering HTTP/1.1 only.
func (s *serial) connect(ctx context.Context) error {
	c, err := s.u.dial(ctx)
	if err != nil {
		return err
	}
	if s.tls != nil {
		tc := tls.Client(c, s.tls)
		hctx, cancel := context.WithTimeout(ctx, upstreamHandshakeTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			// Whatever the cause (an upstream that speaks only h2, or a
			// certificate that does not verify), the Transport tries
			// again the way it always has, and reports its own error.
			c.Close()
			return fmt.Errorf("%w: %w", errUpstreamTLS, err)
		}
		c = tc
	}
	s.conn = c
	s.br = bufio.NewReaderSize(c, 16<<10)
	s.bw = bufio.NewWriterSize(c, 4<<10)
	return nil
}

// upstreamHandshakeTimeout matches the Transport's TLSHandshakeTimeout.
const upstreamHandshakeTimeout = 10 * time.Second

func (s *serial) exchange(req *http.Request) (*http.Response, error) {
	conn := s.conn
	// A client that goes away ends the exchange, as with the Transport.
	stop := context.AfterFunc(req.Context(), func() { conn.SetDeadline(time.Unix(1, 0)) })
	if err := req.Write(s.bw); err != nil {
		stop()
		return nil, staleConn{err}
	}
	if err := s.bw.Flush(); err != nil {
		stop()
		return nil, staleConn{err}
	}
	if _, err := s.br.Peek(1); err != nil {
		stop()
		if req.Context().Err() != nil {
			return nil, req.Context().Err()
		}
		return nil, staleConn{err}
	}
	trace := httptrace.ContextClientTrace(req.Context())
	for n := 0; ; n++ {
		resp, err := http.ReadResponse(s.br, req)
		if err != nil {
			stop()
			return nil, err
		}
		code := resp.StatusCode
		if code == http.StatusSwitchingProtocols {
			stop()
			return nil, errors.New("upstream switched protocols without an upgrade request")
		}
		if code >= 100 && code < 200 {
			if n == max1xx {
				stop()
				return nil, errors.New("upstream sent too many 1xx responses")
			}
			if trace != nil && trace.Got1xxResponse != nil {
				if err := trace.Got1xxResponse(code, textproto.MIMEHeader(resp.Header)); err != nil {
					stop()
					return nil, err
				}
			}
			continue
		}
		keep := !resp.Close && !req.Close
		if resp.Body == http.NoBody {
			s.release(stop() && keep)
			return resp, nil
		}
		resp.Body = &serialBody{s: s, rc: resp.Body, keep: keep, stop: stop}
		return resp, nil
	}
}

// serialBody hands the connection back once the response is read to its
// end, and drops it if the body is closed before.
type serialBody struct {
	s    *serial
	rc   io.ReadCloser
	keep bool
	stop func() bool
	once sync.Once
}

func (b *serialBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.done(b.keep)
	}
	return n, err
}

func (b *serialBody) Close() error {
	err := b.rc.Close()
	b.done(false)
	return err
}

func (b *serialBody) done(keep bool) {
	b.once.Do(func() {
		// A cancellation that fired has poisoned the deadline.
		b.s.release(b.stop() && keep)
	})
}

// close drops the kept connection.
func (s *serial) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil && !s.busy {
		s.conn.Close()
		s.conn = nil
	}
	s.disabled = true
}
