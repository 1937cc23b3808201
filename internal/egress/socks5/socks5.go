// Package socks5 is the explicit SOCKS5 proxy inside the sandbox: no
// authentication, CONNECT only, with remote DNS so a name reaches the gate
// as a name and is never resolved here.
package socks5

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/gate"
	"github.com/corral-sandbox/corral/internal/egress/sniff"
	"golang.org/x/sys/unix"
)

// HandshakeTimeout bounds the greeting and request.
const HandshakeTimeout = 10 * time.Second

const (
	version5 = 0x05

	methodNoAuth       = 0x00
	methodNoAcceptable = 0xff

	cmdConnect = 0x01

	atypIPv4   = 0x01
	atypDomain = 0x03
	atypIPv6   = 0x04
)

// Reply codes (RFC 1928 §6).
const (
	RepSucceeded          = 0x00
	RepGeneralFailure     = 0x01
	RepNotAllowed         = 0x02
	RepNetworkUnreachable = 0x03
	RepHostUnreachable    = 0x04
	RepConnectionRefused  = 0x05
	RepCommandUnsupported = 0x07
	RepAddressUnsupported = 0x08
)

// Server is the SOCKS5 listener.
type Server struct {
	Gate  *gate.Gate
	Names egress.Names
	Log   *slog.Logger
	// IdleTimeout ends a tunnel with no traffic either way; 0 never.
	IdleTimeout time.Duration
	// HTTP, when set, serves the connections that do not open with a
	// SOCKS5 greeting. corral puts socks5h:// in ALL_PROXY, and clients
	// that do not know that scheme take the address for an HTTP proxy
	// (Chromium does): they get one here instead of a reset.
	HTTP func(ctx context.Context, c net.Conn)
}

// Serve accepts on l until ctx is done or l is closed; both return nil.
// Open tunnels are closed when ctx is done.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	if s.Gate == nil {
		return errors.New("socks5: no gate")
	}
	return gate.Serve(ctx, l, s.log(), egress.ViaSOCKS5, s.Gate.Admission, s.handle, refuse)
}

// refuseTimeout bounds reading the request of a connection that is refused
// anyway: a slot for refusing is scarce, and a client that dawdles gets
// its reset instead of its reply.
const refuseTimeout = 2 * time.Second

// refuse answers a connection over the sandbox's limits with a general
// failure once the client has said what it wants, so it sees a SOCKS
// reply rather than a dropped connection.
func refuse(c net.Conn, _ string) {
	c.SetDeadline(time.Now().Add(refuseTimeout))
	if _, err := handshake(c); err == nil || errors.As(err, new(*replyError)) {
		writeReply(c, RepGeneralFailure)
	}
	c.Close()
}

// target is what a CONNECT request names: a host or an address, and a port.
type target struct {
	host string
	ip   netip.Addr
	port uint16
}

// replyError carries the reply code a failed handshake owes the client.
type replyError struct {
	code byte
	err  error
}

func (e *replyError) Error() string { return e.err.Error() }
func (e *replyError) Unwrap() error { return e.err }

// handshake negotiates the method and reads a CONNECT request from rw,
// answering the method selection itself. It reads exactly the bytes the
// protocol defines, so anything the client sends after the request stays
// in the connection for the tunnel. An error that owes the client a reply
// is a *replyError; others (EOF, a bad version) end the connection silently.
func handshake(rw io.ReadWriter) (target, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(rw, hdr[:]); err != nil {
		return target{}, fmt.Errorf("read greeting: %w", err)
	}
	if hdr[0] != version5 {
		return target{}, fmt.Errorf("greeting version %d", hdr[0])
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(rw, methods); err != nil {
		return target{}, fmt.Errorf("read methods: %w", err)
	}
	method := byte(methodNoAcceptable)
	for _, m := range methods {
		if m == methodNoAuth {
			method = methodNoAuth
		}
	}
	if _, err := rw.Write([]byte{version5, method}); err != nil {
		return target{}, err
	}
	if method == methodNoAcceptable {
		return target{}, errors.New("client offers no acceptable method")
	}

	var req [4]byte // VER CMD RSV ATYP
	if _, err := io.ReadFull(rw, req[:]); err != nil {
		return target{}, fmt.Errorf("read request: %w", err)
	}
	if req[0] != version5 {
		return target{}, fmt.Errorf("request version %d", req[0])
	}
	var t target
	switch req[3] {
	case atypIPv4:
		var a [4]byte
		if _, err := io.ReadFull(rw, a[:]); err != nil {
			return target{}, err
		}
		t.ip = netip.AddrFrom4(a)
	case atypIPv6:
		var a [16]byte
		if _, err := io.ReadFull(rw, a[:]); err != nil {
			return target{}, err
		}
		t.ip = netip.AddrFrom16(a).Unmap()
	case atypDomain:
		var n [1]byte
		if _, err := io.ReadFull(rw, n[:]); err != nil {
			return target{}, err
		}
		name := make([]byte, n[0])
		if _, err := io.ReadFull(rw, name); err != nil {
			return target{}, err
		}
		if err := t.setName(string(name)); err != nil {
			return target{}, &replyError{RepGeneralFailure, err}
		}
	default:
		return target{}, &replyError{RepAddressUnsupported, fmt.Errorf("address type %d", req[3])}
	}
	var port [2]byte
	if _, err := io.ReadFull(rw, port[:]); err != nil {
		return target{}, err
	}
	t.port = binary.BigEndian.Uint16(port[:])
	if req[1] != cmdConnect {
		return target{}, &replyError{RepCommandUnsupported, fmt.Errorf("command %d", req[1])}
	}
	if t.port == 0 {
		return target{}, &replyError{RepGeneralFailure, errors.New("port 0")}
	}
	return t, nil
}

// setName takes a domain-type address. Clients pass literals as domains
// too; an address is an address whichever way it arrives.
func (t *target) setName(name string) error {
	if ip, err := netip.ParseAddr(name); err == nil && ip.Zone() == "" {
		t.ip = ip.Unmap()
		return nil
	}
	host, err := sniff.Hostname(name)
	t.host = host
	return err
}

func (s *Server) handle(ctx context.Context, c net.Conn) {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()

	c.SetDeadline(time.Now().Add(HandshakeTimeout))
	if s.HTTP != nil {
		// SOCKS4 (first byte 4) is refused as before, silently.
		if first, err := peekByte(c); err == nil && first != version5 && first != 4 {
			c.SetDeadline(time.Time{})
			s.HTTP(ctx, c)
			return
		}
	}
	t, err := handshake(c)
	if err != nil {
		if re, ok := errors.AsType[*replyError](err); ok {
			writeReply(c, re.code)
		}
		s.log().Debug("socks5 handshake failed", "source", c.RemoteAddr().String(), "err", err)
		c.Close()
		return
	}

	r := egress.Request{Host: t.host, IP: t.ip, Port: t.port, Via: egress.ViaSOCKS5}
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		r.Source = a.AddrPort()
	}
	if r.Host == "" && s.Names != nil {
		if name, ok := s.Names.Lookup(r.IP); ok {
			r.Host, r.IP = name, netip.Addr{}
		}
	}
	tun, err := s.Gate.Connect(ctx, c, r)
	if err != nil {
		writeReply(c, refusalCode(err))
		c.Close()
		return
	}
	if err := writeReply(c, RepSucceeded); err != nil {
		c.Close()
		tun.Up.Close()
		return
	}
	c.SetDeadline(time.Time{})
	s.Gate.Carry(ctx, c, tun, nil, s.IdleTimeout)
}

// peekByte waits for the connection's first byte and returns it, leaving
// it unread: the connection then goes to whichever protocol it speaks as
// it is, still a *net.TCPConn for identification and splicing.
func peekByte(c net.Conn) (byte, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, errors.New("socks5: cannot peek at a connection without a descriptor")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var (
		b    [1]byte
		n    int
		rerr error
	)
	err = rc.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK)
		return rerr != unix.EAGAIN
	})
	switch {
	case err != nil:
		return 0, err
	case rerr != nil:
		return 0, rerr
	case n == 0:
		return 0, io.EOF
	}
	return b[0], nil
}

// refusalCode maps a gate refusal to the reply a SOCKS client can show:
// policy refusals are 0x02, failures to reach an allowed destination say
// why.
func refusalCode(err error) byte {
	de, ok := egress.AsDeny(err)
	if !ok {
		return RepGeneralFailure
	}
	switch de.Decision.Reason {
	case egress.ReasonResolve, egress.ReasonUpstreamTimeout:
		return RepHostUnreachable
	case egress.ReasonUpstream:
		// The gate keeps only the dial error's text.
		detail := de.Decision.Detail
		switch {
		case strings.Contains(detail, syscall.ECONNREFUSED.Error()):
			return RepConnectionRefused
		case strings.Contains(detail, syscall.ENETUNREACH.Error()):
			return RepNetworkUnreachable
		}
		return RepHostUnreachable
	}
	return RepNotAllowed
}

// writeReply sends a reply with bound address 0.0.0.0:0: the real one is
// on the host side and none of the sandbox's business.
func writeReply(c net.Conn, code byte) error {
	c.SetWriteDeadline(time.Now().Add(HandshakeTimeout))
	_, err := c.Write([]byte{version5, code, 0x00, atypIPv4, 0, 0, 0, 0, 0, 0})
	return err
}

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}
