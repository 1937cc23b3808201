// Package inspect serves the connections whose endpoint asks for HTTP
// inspection (protocol: rest). It terminates the client's TLS with a leaf
// from the sandbox's CA, reads requests (an HTTP/1.1 client's simple ones
// inline, the rest with net/http's server, HTTP/1.1 or h2 as the client
// negotiates; see httpconn.ServeInline), decides each one with the
// same engine as connections, and forwards the allowed ones with
// net/http's transport, speaking whatever the upstream supports. Bodies
// stream both ways; a WebSocket upgrade the rules allow is relayed.
//
// Masked secrets are swapped here, and only on requests that leave over
// TLS to one of the secret's hosts, so a real value never crosses the
// network in clear and never reaches a host it was not meant for.
package inspect

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"net/http/httputil"
	"os"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/l7/ca"
	"github.com/corral-sandbox/corral/internal/l7/httpconn"
	"github.com/corral-sandbox/corral/internal/plan"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/reload"
)

const (
	// headTimeout bounds the wait for a client's first bytes.
	headTimeout = httpconn.HeadTimeout
	// handshakeTimeout bounds the client's TLS handshake.
	handshakeTimeout = 10 * time.Second
	// defaultIdle ends a keep-alive connection with no request in flight.
	defaultIdle = 5 * time.Minute
	// recordTLSHandshake is the first byte of every TLS connection.
	recordTLSHandshake = 0x16
)

// Inspector implements egress.Inspector.
type Inspector struct {
	// Policy gives the snapshot in force: each request is decided with
	// its decider and has its masked secrets swapped and scrubbed with its
	// secrets.
	Policy Snapshots
	CA     *ca.CA
	// Dialer opens further upstream connections for a tunnel (the gate
	// dialled the first), with the same SSRF checks.
	Dialer egress.Dialer
	// RootCAs returns the roots upstream servers are verified against; nil
	// (or a nil pool) means the system roots. It is called when a tunnel
	// first needs them, since loading the system roots costs tens of
	// milliseconds a sandbox that inspects nothing should not pay.
	// Verification is never skipped.
	RootCAs func() *x509.CertPool
	Audit   *audit.Logger
	Log     *slog.Logger
	// IdleTimeout ends a client connection with no request in flight;
	// defaultIdle if 0.
	IdleTimeout time.Duration
	// Advice, when set, names the pending policy chunk in refusals.
	Advice egress.Advice
}

var _ egress.Inspector = (*Inspector)(nil)

// Snapshots gives the policy snapshot in force (reload.Reloader).
type Snapshots interface {
	Current() *reload.Snapshot
}

// Inspect serves one allowed connection until it ends, or hands back a
// TLS connection to a passthrough endpoint (see egress.Inspector).
func (in *Inspector) Inspect(ctx context.Context, client net.Conn, t *egress.Tunnel, check func(kind, name string, err error) error) net.Conn {
	br := bufio.NewReader(client)
	client.SetReadDeadline(time.Now().Add(headTimeout))
	first, err := br.Peek(1)
	client.SetReadDeadline(time.Time{})
	if err != nil {
		client.Close()
		t.Up.Close()
		return nil
	}
	conn := &httpconn.BufferedConn{Conn: client, R: br}
	if first[0] == recordTLSHandshake && t.Decision.TLS == policy.TLSPassthrough {
		// Exempt from inspection, not from the connection's own checks:
		// the caller relays it through the guard of every tunnel.
		return conn
	}
	defer client.Close()
	if first[0] != recordTLSHandshake {
		in.serve(ctx, conn, t, "http")
		return nil
	}
	tc, err := in.terminate(ctx, conn, t, check)
	if err != nil {
		in.handshakeFailed(t, err)
		t.Up.Close()
		return nil
	}
	in.serve(ctx, tc, t, "https")
	return nil
}

// terminate completes the client's TLS handshake with a leaf for the host
// the gate allowed. A ClientHello naming another host is refused through
// check, which records the refusal like any other.
func (in *Inspector) terminate(ctx context.Context, c net.Conn, t *egress.Tunnel, check func(kind, name string, err error) error) (*tls.Conn, error) {
	r := t.Request
	name := r.Host
	if name == "" {
		name = r.IP.String()
	}
	leaf, err := in.CA.Leaf(name)
	if err != nil {
		return nil, err
	}
	helloSeen := false
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2", "http/1.1"},
		Certificates: []tls.Certificate{*leaf},
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			helloSeen = true
			// A literal-address tunnel was decided on the address; its
			// SNI names nothing the decision relied on.
			if r.Host == "" || hello.ServerName == "" {
				return nil, nil
			}
			if err := check("tls_sni", hello.ServerName, nil); err != nil {
				return nil, refusal{err}
			}
			return nil, nil
		},
	}
	tc := tls.Server(c, cfg)
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		if helloSeen {
			return nil, afterHello{err}
		}
		return nil, err
	}
	return tc, nil
}

// refusal is check's verdict on a ClientHello, which check has recorded.
type refusal struct{ error }

func (r refusal) Unwrap() error { return r.error }

// afterHello is a handshake that failed once the client had sent a
// ClientHello and been answered with the sandbox CA's leaf: what a client
// that does not trust that CA does, whatever alert (or none) it sends.
type afterHello struct{ error }

func (a afterHello) Unwrap() error { return a.error }

// handshakeFailed records a client's failed TLS handshake with its likely
// cause: a tool that keeps its own trust store (Java, a pinned CA bundle)
// rejects the sandbox CA's leaf and leaves nothing else to see, so the
// cause must be said where the user looks.
func (in *Inspector) handshakeFailed(t *egress.Tunnel, err error) {
	if errors.As(err, new(refusal)) {
		return
	}
	r := t.Request
	cause, hint := "tls_error", ""
	msg := err.Error()
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		cause = "handshake_timeout"
	case errors.As(err, new(afterHello)):
		cause, hint = "client_does_not_trust_sandbox_ca", "the client gave up after the sandbox CA's certificate; most likely it does not trust that CA"
	}
	next := "point the client at " + plan.CABundlePath + " (or " + plan.TrustStorePath + " for Java); inspection needs the client to trust the sandbox CA"
	if in.Audit != nil {
		in.Audit.Log(audit.TLSHandshakeFailedEvent{Via: r.Via, Host: r.Host, Port: r.Port,
			Binary: r.Identity.Binary, PID: r.Identity.PID, Cause: cause, Detail: msg, NextSteps: next})
	}
	if hint != "" {
		in.log().Warn("TLS handshake with the workload failed: "+hint, "target", r.Target(), "binary", r.Identity.Binary, "err", err, "fix", next)
		return
	}
	in.log().Debug("inspected TLS handshake failed", "target", r.Target(), "err", err)
}

// serve answers the requests of the one connection c and returns when
// the connection and every request on it have ended.
func (in *Inspector) serve(ctx context.Context, c net.Conn, t *egress.Tunnel, scheme string) {
	up := newUpstream(in, t, scheme)
	defer up.close()
	h := &handler{in: in, t: t, scheme: scheme, up: up}
	h.proxy = &httputil.ReverseProxy{
		Rewrite:        h.rewrite,
		ModifyResponse: h.response,
		Transport:      scrubTransport{h: h, rt: up.serial},
		// Zero: ReverseProxy still flushes every write of a streamed
		// response (SSE, or no Content-Length), and a sized one goes out
		// whole instead of a TLS record per write.
		FlushInterval: 0,
		ErrorHandler:  h.upstreamError,
		BufferPool:    copyBuffers,
		ErrorLog:      slog.NewLogLogger(in.log().Handler(), slog.LevelDebug),
	}
	idle := in.IdleTimeout
	if idle == 0 {
		idle = defaultIdle
	}
	if err := httpconn.ServeInline(ctx, c, h, idle, in.log()); err != nil {
		in.log().Debug("inspected connection ended", "target", t.Request.Target(), "err", err)
	}
	// A hijacked (upgraded) connection outlives Serve; its handler is
	// still relaying.
	h.active.close()
}

// copyBuffers are ReverseProxy's body copy buffers, shared by every
// connection: otherwise each response allocates its own 32 KiB.
var copyBuffers = &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte  { return *b.p.Get().(*[]byte) }
func (b *bufferPool) Put(x []byte) { b.p.Put(&x) }

func (in *Inspector) log() *slog.Logger {
	if in.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return in.Log
}
