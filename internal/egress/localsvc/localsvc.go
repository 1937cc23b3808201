// Package localsvc serves a name the supervisor answers itself inside the
// sandbox (policy.local, inference.local) with an http.Handler: plain HTTP,
// or HTTPS with a leaf of the sandbox's CA, which the workload already
// trusts. HTTP/1.1 keep-alive and HTTP/2 are both spoken.
package localsvc

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/gate"
	"github.com/corral-sandbox/corral/internal/l7/ca"
	"github.com/corral-sandbox/corral/internal/l7/httpconn"
)

const (
	// firstByteTimeout bounds the wait for a client's first byte, which
	// says whether it speaks TLS.
	firstByteTimeout = 30 * time.Second
	handshakeTimeout = 10 * time.Second
	idleTimeout      = 5 * time.Minute
	tlsHandshake     = 0x16
)

// Service answers one name.
type Service struct {
	Name    string
	Handler http.Handler
	// CA mints the name's certificate for HTTPS.
	CA  *ca.CA
	Log *slog.Logger
}

var _ egress.LocalService = (*Service)(nil)

// ServeConn implements egress.LocalService.
func (s *Service) ServeConn(ctx context.Context, client net.Conn, r egress.Request) {
	defer client.Close()
	c, err := s.open(client)
	if err != nil {
		s.log().Debug("local service connection failed", "service", s.Name, "err", err)
		return
	}
	if err := httpconn.Serve(egress.WithRequest(ctx, r), c, s.Handler, idleTimeout, s.log()); err != nil {
		s.log().Debug("local service connection ended", "service", s.Name, "err", err)
	}
}

// open reads the first byte: TLS gets the handshake, anything else is
// plain HTTP.
func (s *Service) open(client net.Conn) (net.Conn, error) {
	var first [1]byte
	client.SetReadDeadline(time.Now().Add(firstByteTimeout))
	if _, err := client.Read(first[:]); err != nil {
		return nil, err
	}
	client.SetReadDeadline(time.Time{})
	c := gate.Replay(client, first[:])
	if first[0] != tlsHandshake {
		return c, nil
	}
	leaf, err := s.CA.Leaf(s.Name)
	if err != nil {
		return nil, err
	}
	tc := tls.Server(c, &tls.Config{
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2", "http/1.1"},
		Certificates: []tls.Certificate{*leaf},
	})
	hctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		return nil, err
	}
	return tc, nil
}

func (s *Service) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}
