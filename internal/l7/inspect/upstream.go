package inspect

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/internal/egress"
)

// upstream is a tunnel's way out: the connection the gate dialled, used
// first, then new ones through the guarded dialer when the transport
// needs more (an HTTP/1.1 upstream behind an h2 client, a closed
// keep-alive). Each tunnel has its own transport, so connections are
// never shared between sandbox processes or destinations.
type upstream struct {
	in        *Inspector
	t         *egress.Tunnel
	transport *http.Transport
	// serial carries an HTTP/1.x client's simple requests, falling back
	// to transport for the rest.
	serial *serial
	mu     sync.Mutex
	first  net.Conn
}

func newUpstream(in *Inspector, t *egress.Tunnel, scheme string) *upstream {
	u := &upstream{in: in, t: t, first: t.Up}
	roots := in.roots()
	u.transport = &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return u.dial(ctx)
		},
		TLSClientConfig:       &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
		// Accept-Encoding and the body pass through as the client sent
		// and the server answered them.
		DisableCompression: true,
	}
	u.serial = &serial{u: u, fallback: u.transport}
	if scheme == "https" {
		host, _, _ := net.SplitHostPort(t.Request.Target())
		u.serial.tls = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12, ServerName: host, NextProtos: []string{"http/1.1"}}
	}
	return u
}

// dial returns the gate's connection the first time, then new ones
// through the guarded dialer.
func (u *upstream) dial(ctx context.Context) (net.Conn, error) {
	u.mu.Lock()
	c := u.first
	u.first = nil
	u.mu.Unlock()
	if c != nil {
		return c, nil
	}
	return u.in.Dialer.Dial(ctx, u.t.Request, u.t.Decision.AllowedIPs)
}

func (in *Inspector) roots() *x509.CertPool {
	if in.RootCAs == nil {
		return nil
	}
	return in.RootCAs()
}

// close drops idle upstream connections and the first one if it was
// never used.
func (u *upstream) close() {
	u.serial.close()
	u.transport.CloseIdleConnections()
	u.mu.Lock()
	if u.first != nil {
		u.first.Close()
		u.first = nil
	}
	u.mu.Unlock()
}
