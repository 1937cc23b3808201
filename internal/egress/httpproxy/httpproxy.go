// Package httpproxy is the explicit HTTP proxy inside the sandbox: CONNECT
// tunnels and absolute-URI forwarding of plain HTTP, each authorised by the
// gate, with policy refusals answered as 403 JSON the agent can act on.
package httpproxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/gate"
	"github.com/corral-sandbox/corral/internal/egress/sniff"
)

const (
	// HeaderTimeout bounds reading the request head.
	HeaderTimeout = 10 * time.Second
	// MaxHeaderBytes bounds the request head.
	MaxHeaderBytes = 64 << 10
	// replyTimeout bounds writing a refusal to a client that does not read.
	replyTimeout = 10 * time.Second
)

// Server is the explicit HTTP proxy.
type Server struct {
	Gate  *gate.Gate
	Names egress.Names
	Log   *slog.Logger
	// IdleTimeout ends a tunnel with no traffic either way; 0 never.
	IdleTimeout time.Duration
	// Advice, when set, names the pending policy chunk in refusals.
	Advice egress.Advice
}

// Serve accepts on l until ctx is done or l is closed; both return nil.
// Open tunnels are closed when ctx is done.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	if s.Gate == nil {
		return errors.New("httpproxy: no gate")
	}
	return gate.Serve(ctx, l, s.log(), "http_proxy", s.Gate.Admission, s.handle, s.refuseBusy)
}

// busyHeadTimeout bounds reading the head of a request that is refused
// anyway: refusing must not hold a descriptor for long.
const busyHeadTimeout = 2 * time.Second

// refuseBusy answers a connection over the sandbox's limits: 429 when the
// workload holds limits.connections already (its own doing; closing idle
// connections helps), 503 when the supervisor is short of descriptors.
// The head is read first so the client is reading when the answer comes.
func (s *Server) refuseBusy(c net.Conn, why string) {
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(busyHeadTimeout))
	if _, err := http.ReadRequest(bufio.NewReader(io.LimitReader(c, MaxHeaderBytes))); err != nil {
		gate.Reset(c)
		return
	}
	status := http.StatusTooManyRequests
	body := denyBody{Error: "too many connections from this sandbox", Reason: why,
		NextSteps: "close idle connections and retry, or ask the operator to raise limits.connections in the policy"}
	if why == egress.ReasonFDReserve {
		status = http.StatusServiceUnavailable
		body.Error = "corral is short of file descriptors"
		body.NextSteps = "retry later; the sandbox holds too many connections for the supervisor's RLIMIT_NOFILE"
	}
	s.writeJSON(c, status, why, body)
}

// ServeConn serves one connection accepted elsewhere (the SOCKS port, for
// clients that take it for an HTTP proxy).
func (s *Server) ServeConn(ctx context.Context, c net.Conn) { s.handle(ctx, c) }

func (s *Server) handle(ctx context.Context, c net.Conn) {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()

	c.SetReadDeadline(time.Now().Add(HeaderTimeout))
	// net/http.ReadRequest has no size limit of its own; the limit is
	// lifted once the head is read so bodies and tunnels flow.
	lr := &io.LimitedReader{R: c, N: MaxHeaderBytes}
	// The bytes of the head (and what bufio read beyond it) are kept so an
	// inspected forward can hand the connection on exactly as it came.
	rec := &recorder{}
	br := bufio.NewReader(io.TeeReader(lr, rec))
	req, err := http.ReadRequest(br)
	rec.off = true
	if err != nil {
		status := http.StatusBadRequest
		if lr.N == 0 {
			status = http.StatusRequestHeaderFieldsTooLarge
		}
		s.log().Debug("http proxy bad request", "source", c.RemoteAddr().String(), "err", err)
		s.replyError(c, status, "cannot parse request")
		return
	}
	c.SetReadDeadline(time.Time{})
	lr.N = math.MaxInt64

	switch {
	case req.Method == http.MethodConnect:
		s.connect(ctx, c, br, req)
	case req.URL.IsAbs() && req.URL.Scheme == "http":
		s.forward(ctx, c, req, rec.b)
	default:
		s.replyError(c, http.StatusBadRequest, "expected CONNECT host:port or an absolute http:// URI")
	}
}

func (s *Server) connect(ctx context.Context, c net.Conn, br *bufio.Reader, req *http.Request) {
	host, port, err := net.SplitHostPort(req.Host)
	if err != nil {
		s.replyError(c, http.StatusBadRequest, "CONNECT target must be host:port")
		return
	}
	r, err := s.request(host, port, egress.ViaHTTPConnect, c)
	if err != nil {
		s.replyError(c, http.StatusBadRequest, err.Error())
		return
	}
	t, err := s.Gate.Connect(ctx, c, r)
	if err != nil {
		s.refuse(c, err)
		return
	}
	c.SetWriteDeadline(time.Now().Add(replyTimeout))
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		c.Close()
		t.Up.Close()
		return
	}
	c.SetWriteDeadline(time.Time{})
	// Bytes the client sent ahead of our 200 (a ClientHello, typically)
	// sit in br; they go upstream first, through the same check.
	ahead, _ := br.Peek(br.Buffered())
	s.Gate.Carry(ctx, c, t, ahead, s.IdleTimeout)
}

// forward sends one absolute-URI request upstream in origin form and
// streams the response back; Connection: close both ways keeps it to one
// request per connection, so every request meets the gate.
func (s *Server) forward(ctx context.Context, c net.Conn, req *http.Request, raw []byte) {
	defer c.Close()
	if req.URL.User != nil {
		s.replyError(c, http.StatusBadRequest, "credentials in the URL are not forwarded")
		return
	}
	port := req.URL.Port()
	if port == "" {
		port = "80"
	}
	r, err := s.request(req.URL.Hostname(), port, egress.ViaHTTPForward, c)
	if err != nil {
		s.replyError(c, http.StatusBadRequest, err.Error())
		return
	}
	t, err := s.Gate.Connect(ctx, c, r)
	if err != nil {
		s.refuse(c, err)
		return
	}
	if t.Decision.Inspect || t.Local != nil {
		// The inspector (or the supervisor's own service) reads the
		// request again from its raw bytes, and any that follow on the
		// connection.
		s.Gate.Carry(ctx, c, t, raw, s.IdleTimeout)
		return
	}
	up := t.Up
	defer up.Close()
	// Waiting for the response reads only from up, so shutdown must reach
	// it directly.
	stopUp := context.AfterFunc(ctx, func() { up.Close() })
	defer stopUp()

	removeHopByHop(req.Header)
	// Host comes from the URI (ReadRequest ignores a disagreeing Host
	// header for absolute-form requests), so the upstream sees the name
	// the gate approved, not a synthetic address standing for it.
	req.Host = req.URL.Host
	if r.Host != "" && !sniff.SameHost(r.Host, req.URL.Hostname()) {
		req.Host = r.Host
		if req.URL.Port() != "" {
			req.Host = net.JoinHostPort(r.Host, req.URL.Port())
		}
	}
	req.Close = true
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // keeps Request.Write from adding Go's
	}
	wrote := make(chan error, 1)
	go func() { wrote <- req.Write(up) }()

	resp, err := readFinalResponse(bufio.NewReader(up), req, c)
	if err != nil {
		s.log().Debug("http proxy upstream response failed", "target", r.Target(), "err", err)
		s.replyError(c, http.StatusBadGateway, "upstream did not answer with HTTP")
		up.Close()
		<-wrote
		return
	}
	defer resp.Body.Close()
	removeHopByHop(resp.Header)
	resp.Close = true
	if err := resp.Write(c); err != nil {
		s.log().Debug("http proxy response to client failed", "target", r.Target(), "err", err)
	}
	// Closing both ends a body upload the upstream stopped reading.
	c.Close()
	up.Close()
	<-wrote
}

// readFinalResponse passes interim 1xx responses (100 Continue) to the
// client and returns the final one.
func readFinalResponse(br *bufio.Reader, req *http.Request, client io.Writer) (*http.Response, error) {
	for {
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			resp.Body.Close()
			return nil, errors.New("upstream switched protocols on a request without Upgrade")
		}
		if resp.StatusCode >= 200 {
			return resp, nil
		}
		// Response.Write would add framing headers a 1xx must not carry.
		removeHopByHop(resp.Header)
		var b strings.Builder
		fmt.Fprintf(&b, "HTTP/1.1 %s\r\n", resp.Status)
		resp.Header.Write(&b)
		b.WriteString("\r\n")
		if _, err := io.WriteString(client, b.String()); err != nil {
			return nil, err
		}
	}
}

// hopByHop are the headers that describe one connection, not the message
// (RFC 9110 §7.6.1), plus the de-facto Proxy-Connection.
var hopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func removeHopByHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopByHop {
		h.Del(name)
	}
}

// request builds the gate's Request for the host and port a client
// named. A synthetic address stands for the name it was handed out for.
func (s *Server) request(host, port, via string, c net.Conn) (egress.Request, error) {
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return egress.Request{}, fmt.Errorf("invalid port %q", port)
	}
	r := egress.Request{Port: uint16(p), Via: via}
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		r.Source = a.AddrPort()
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return egress.Request{}, fmt.Errorf("zoned address %q", host)
		}
		ip = ip.Unmap()
		if s.Names != nil {
			if name, ok := s.Names.Lookup(ip); ok {
				r.Host = name
				return r, nil
			}
		}
		r.IP = ip
		return r, nil
	}
	if r.Host, err = sniff.Hostname(host); err != nil {
		return egress.Request{}, err
	}
	return r, nil
}

// denyBody is the 403 an agent reads to understand a refusal. Field names
// are part of corral's interface.
type denyBody struct {
	Error     string `json:"error"`
	Reason    string `json:"reason"`
	Host      string `json:"host"`
	Port      uint16 `json:"port"`
	Binary    string `json:"binary"`
	Policy    string `json:"policy"`
	NextSteps string `json:"next_steps"`
	// DraftChunk is the pending policy chunk that would allow this.
	DraftChunk string `json:"draft_chunk,omitempty"`
}

// refuse answers a failed gate.Connect: 403 for a policy refusal, 502 when
// the destination was allowed but could not be resolved or refused the
// connection, 504 when it did not answer in time, since the remedy
// differs.
func (s *Server) refuse(c net.Conn, err error) {
	defer c.Close()
	de, ok := egress.AsDeny(err)
	if !ok {
		s.replyError(c, http.StatusBadGateway, "upstream connection failed")
		return
	}
	r, d := de.Request, de.Decision
	host := r.Host
	if host == "" {
		host = r.IP.String()
	}
	body := denyBody{
		Error:  "connection denied by corral policy",
		Reason: d.Reason, Host: host, Port: r.Port,
		Binary: r.Identity.Binary, Policy: d.Policy,
	}
	status := http.StatusForbidden
	switch d.Reason {
	case egress.ReasonUpstream, egress.ReasonResolve, egress.ReasonUpstreamTimeout:
		// Clients that show only the status line (pip's "Cannot connect
		// to proxy") tell a dead or unknown host from a slow one by it.
		status = http.StatusBadGateway
		if d.Reason == egress.ReasonUpstreamTimeout {
			status = http.StatusGatewayTimeout
		}
		body.Error = "corral allowed the connection but could not reach the destination"
		body.NextSteps = "check that " + r.Target() + " exists and is reachable from the host; this is not a policy refusal"
	case egress.ReasonSNIMismatch, egress.ReasonHostMismatch:
		body.NextSteps = "send TLS SNI and the HTTP Host header for the same host the connection was opened to"
	case egress.ReasonIntegrity:
		body.NextSteps = "the binary changed since it was first trusted; ask the operator to review it and re-approve it"
	default:
		body.NextSteps = "ask the operator to add an endpoint for " + r.Target() +
			" to a network policy that lists this binary; denied requests are logged and can be approved with corral policy set"
		if s.Advice != nil && egress.Learnable(d.Reason) {
			var next []string
			body.DraftChunk, next = s.Advice.For(r)
			if len(next) > 0 {
				body.NextSteps = strings.Join(next, "; ")
			}
		}
	}
	s.writeJSON(c, status, d.Reason, body)
}

// writeJSON writes a refusal with its JSON body.
func (s *Server) writeJSON(c net.Conn, status int, reason string, body denyBody) {
	js, _ := json.Marshal(body)
	c.SetWriteDeadline(time.Now().Add(replyTimeout))
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nX-Corral-Policy: deny; reason=%s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), reason, len(js), js)
}

func (s *Server) replyError(c net.Conn, status int, msg string) {
	defer c.Close()
	c.SetWriteDeadline(time.Now().Add(replyTimeout))
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(msg)+1, msg+"\n")
}

// recorder keeps what passes through it until switched off.
type recorder struct {
	b   []byte
	off bool
}

func (r *recorder) Write(p []byte) (int, error) {
	if !r.off {
		r.b = append(r.b, p...)
	}
	return len(p), nil
}

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}
