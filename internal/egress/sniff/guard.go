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
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
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
// and written on re-serialised. Only a WebSocket upgrade the server
// accepted ends that: the caller must write the server's bytes to the
// client through the returned connection (relay.Relay does), which follows
// the responses to see the 101 (see forwardRequests).
func Guard(c net.Conn, prefix []byte, limit int, timeout time.Duration, check func(kind, name string, err error) error) net.Conn {
	g := &guarded{Conn: c, pending: prefix, limit: limit, timeout: timeout, check: check, verdict: make(chan bool, 1)}
	g.resp.outcome = func(accepted bool) { g.verdict <- accepted }
	return g
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

	// mu guards what the two directions share: the server's responses
	// and whether the connection is HTTP.
	mu sync.Mutex
	// watch is what the connection turned out to be: watchUnknown until
	// the opening is checked.
	watch watchState
	// early records server bytes that came before the opening was read:
	// no HTTP server answers before a request.
	early bool
	resp  responses
	// verdict carries, for the one WebSocket request awaiting its
	// response, whether the server accepted it.
	verdict chan bool
}

type watchState int

const (
	watchUnknown watchState = iota
	watchHTTP
	watchNone
)

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
		g.mu.Lock()
		g.watch = watchNone
		if kind == KindHTTP {
			g.watch = watchHTTP
			if g.early {
				g.resp.fail(errors.New("the server sent bytes before the first request"))
			}
		}
		g.mu.Unlock()
		if kind == KindHTTP {
			pr, pw := io.Pipe()
			g.requests = pr
			opening := buf
			g.pending = nil
			go func() { pw.CloseWithError(g.forwardRequests(opening, pw)) }()
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

// Write carries the server's bytes to the client and follows the
// responses among them.
func (g *guarded) Write(p []byte) (int, error) {
	n, err := g.Conn.Write(p)
	g.mu.Lock()
	switch g.watch {
	case watchUnknown:
		g.early = g.early || n > 0
	case watchHTTP:
		g.resp.feed(p[:n])
		if err != nil {
			// The rest never reached the client: nothing waiting will
			// be answered.
			g.resp.end()
		}
	}
	g.mu.Unlock()
	return n, err
}

// Unwatched is how many of the server's next bytes the guard need not see
// (relay.Watched): body bytes pass through the kernel, heads through
// Write. Until the opening is checked every byte must be seen.
func (g *guarded) Unwatched() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch g.watch {
	case watchHTTP:
		return g.resp.unwatched()
	case watchNone:
		return -1
	}
	return 0
}

// Skipped records n server bytes that reached the client without Write.
func (g *guarded) Skipped(n int64) {
	g.mu.Lock()
	if g.watch == watchHTTP {
		g.resp.skip(n)
	}
	g.mu.Unlock()
}

// Raw is the client connection Write writes to.
func (g *guarded) Raw() net.Conn { return g.Conn }

// CloseWrite keeps half-close working through the wrapper. The relay
// calls it when the server has finished, so nothing still waiting will be
// answered.
func (g *guarded) CloseWrite() error {
	g.serverDone()
	if cw, ok := g.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (g *guarded) serverDone() {
	g.mu.Lock()
	g.resp.end()
	g.mu.Unlock()
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
	g.serverDone()
	if g.requests != nil {
		g.requests.Close()
	}
	return g.Conn.Close()
}

// maxHead bounds one request head; the body that follows is not limited.
const maxHead = 64 << 10

// forwardRequests reads the client's requests (opening holds the first
// bytes), checks each one's Host and writes it to w. It returns io.EOF when
// the client has no more requests, or the reason it stopped.
//
// Only a WebSocket handshake the server accepted with 101 ends the
// parsing; the rest of the connection is then the WebSocket's and passes
// as it is. Until its response has arrived nothing after the handshake is
// read, so bytes pipelined behind it are parsed as requests, and checked,
// unless the server switched. Other upgrades (h2c, TLS/1.0, custom
// protocols) lose their Upgrade header and the request goes on as plain
// HTTP: RFC 9110 §7.8 lets a server ignore Upgrade, so clients that offer
// h2c (curl --http2) keep working, whereas what they would switch to is a
// stream of requests (h2c) or bytes no check here could read. A CONNECT
// inside the connection is refused: its 2xx would make the rest a tunnel.
func (g *guarded) forwardRequests(opening []byte, w io.Writer) error {
	head := &io.LimitedReader{R: g.Conn}
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
		if err := g.checkRequest(req); err != nil {
			return err
		}
		if _, ok := req.Header["User-Agent"]; !ok {
			// net/http would otherwise add its own.
			req.Header["User-Agent"] = []string{""}
		}
		ws := isWebSocketHandshake(req)
		if !ws {
			dropUpgrade(req.Header)
		}
		g.mu.Lock()
		g.resp.expect(exchange{method: req.Method, websocket: ws})
		g.mu.Unlock()
		if err := req.Write(w); err != nil {
			return err
		}
		if ws && <-g.verdict {
			_, err := io.Copy(w, br)
			if err == nil {
				err = io.EOF
			}
			return err
		}
	}
}

// checkRequest hands a later request's host to check, with the opening's
// rules: a request must name a host, and CONNECT is refused.
func (g *guarded) checkRequest(req *http.Request) error {
	var refusal error
	switch {
	case req.Method == http.MethodConnect:
		refusal = malformed("http", "CONNECT inside an HTTP connection")
	case req.URL.Opaque != "":
		// A target such as "a:b://h" parses as opaque, so the Host header
		// is the name checked, but net/http writes it on without its
		// scheme, as "b://h", which the server reads as naming host h.
		refusal = malformed("http", "request target is neither a path nor an absolute URL")
	case req.Host == "":
		refusal = malformed("http", "no Host header")
	case !validHost(req.Host):
		// net/http would write a cleaned, different (even empty) Host
		// than the name checked here.
		refusal = malformed("http", "invalid Host header")
	}
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if err := g.check(KindHTTP, strings.Trim(host, "[]"), refusal); err != nil {
		return err
	}
	return refusal
}

// isWebSocketHandshake reports whether req asks to switch to WebSocket in
// the only form RFC 6455 §4.1 allows: GET over HTTP/1.1, Upgrade exactly
// "websocket", Connection listing "upgrade".
func isWebSocketHandshake(req *http.Request) bool {
	up := req.Header.Values("Upgrade")
	return req.Method == http.MethodGet && req.ProtoMajor == 1 && req.ProtoMinor == 1 &&
		len(up) == 1 && strings.EqualFold(strings.TrimSpace(up[0]), "websocket") &&
		slices.ContainsFunc(req.Header.Values("Connection"), func(v string) bool { return hasToken(v, "upgrade") })
}

// dropUpgrade turns a request that offers some other protocol into a plain
// one: without Upgrade a server has nothing to switch to.
func dropUpgrade(h http.Header) {
	if _, ok := h["Upgrade"]; !ok {
		return
	}
	delete(h, "Upgrade")
	var kept []string
	for _, v := range h.Values("Connection") {
		for t := range strings.SplitSeq(v, ",") {
			if t = strings.Trim(t, " \t"); t != "" && !strings.EqualFold(t, "upgrade") {
				kept = append(kept, t)
			}
		}
	}
	delete(h, "Connection")
	if len(kept) > 0 {
		h["Connection"] = []string{strings.Join(kept, ", ")}
	}
}

// validHost reports whether h is a Host header net/http forwards as it
// is: valid header characters and, after a colon, a numeric port.
func validHost(h string) bool {
	if !httpguts.ValidHostHeader(h) || strings.ContainsAny(h, " \t/") {
		return false
	}
	if _, port, err := net.SplitHostPort(h); err == nil {
		for _, c := range port {
			if c < '0' || c > '9' {
				return false
			}
		}
	}
	return true
}
