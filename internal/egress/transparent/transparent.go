// Package transparent serves connections that nftables redirected from
// their real destination: it recovers that destination, reads what the
// client's first bytes claim, and lets the gate decide before relaying.
package transparent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/gate"
	"github.com/corral-sandbox/corral/internal/egress/sniff"
	"github.com/corral-sandbox/corral/internal/linux/capture"
)

// Server is the transparent listener.
type Server struct {
	Gate  *gate.Gate
	Names egress.Names
	Log   *slog.Logger
	// PeekTimeout is how long a silent client is waited for before its
	// protocol is taken to be server-first; sniff.DefaultTimeout if 0.
	PeekTimeout time.Duration
	// IdleTimeout ends a tunnel with no traffic either way; 0 never.
	IdleTimeout time.Duration
	// OriginalDst recovers the pre-NAT destination; capture.ConnOriginalDst
	// if nil. Tests substitute it to run without nftables.
	OriginalDst func(*net.TCPConn) (netip.AddrPort, error)
}

// Serve accepts on l until ctx is done or l is closed; both return nil.
// Open tunnels are closed when ctx is done.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	if s.Gate == nil {
		return errors.New("transparent: no gate")
	}
	return gate.Serve(ctx, l, s.log(), egress.ViaTransparent, s.Gate.Admission, s.handle, refuse)
}

// refuse answers a connection over the sandbox's limits with the only
// refusal raw TCP has.
func refuse(c net.Conn, _ string) { gate.Reset(c) }

func (s *Server) handle(ctx context.Context, conn net.Conn) {
	c, ok := conn.(*net.TCPConn)
	if !ok {
		conn.Close()
		return
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()

	origDst := s.OriginalDst
	if origDst == nil {
		origDst = func(c *net.TCPConn) (netip.AddrPort, error) { return capture.ConnOriginalDst(c) }
	}
	dst, err := origDst(c)
	if err != nil {
		// Without a destination there is nothing to decide on; this is a
		// direct connection to the listener or broken capture rules.
		s.log().Warn("transparent connection without original destination", "source", c.RemoteAddr().String(), "err", err)
		gate.Reset(c)
		return
	}
	r := egress.Request{Port: dst.Port(), Via: egress.ViaTransparent, Source: remoteAddrPort(c)}
	ip := dst.Addr().Unmap()
	if s.Names != nil {
		if host, ok := s.Names.Lookup(ip); ok {
			r.Host = host
		}
	}
	if r.Host == "" {
		r.IP = ip
	}

	// A literal address names no host a claim could contradict, so only
	// named destinations pay for the peek.
	var opening []byte
	if r.Host != "" {
		var kind, name string
		kind, name, opening, err = sniff.Peek(c, sniff.DefaultMax, s.PeekTimeout)
		if err != nil && !errors.Is(err, sniff.ErrMalformed) {
			s.log().Debug("transparent client failed before deciding", "source", r.Source.String(), "err", err)
			gate.Reset(c)
			return
		}
		if claim := sniff.Claim(kind, name, err); claim != "" {
			r.Sniffed, r.SniffedKind = claim, kind
		}
	}

	t, err := s.Gate.Connect(ctx, c, r)
	if err != nil {
		// The gate has recorded the refusal; an RST is the only reason a
		// raw TCP client can be shown.
		gate.Reset(c)
		return
	}
	// The gate replays the opening it has seen (checking it again is a
	// formality) and checks what the client sends later: a first opening
	// when it waited out Peek (a server-first protocol, or a client hoping
	// to send a fronted name unchecked), every later request of a plain
	// HTTP connection.
	s.Gate.Carry(ctx, c, t, opening, s.IdleTimeout)
}

func remoteAddrPort(c net.Conn) netip.AddrPort {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort()
	}
	return netip.AddrPort{}
}

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}
