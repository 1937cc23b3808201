// Package dns is the sandbox's only resolver. It answers A queries for names
// some policy allows with a synthetic address from a Pool and NXDOMAIN for
// every other name. It has no upstream at all: a name the workload asks
// about never leaves the supervisor, so DNS cannot carry data out of the
// sandbox, and a later connection to a synthetic address names its
// destination exactly.
package dns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/plan"
)

const (
	// TTL of synthetic answers. Short, so a policy reload that withdraws a
	// name takes effect in clients' caches soon.
	TTL = 30

	headerLen = 12
	// ednsSize is the UDP payload we advertise: the DNS flag day value,
	// which avoids fragmentation; our answers are far smaller anyway.
	ednsSize = 1232

	tcpIdle     = 10 * time.Second
	tcpWrite    = 5 * time.Second
	maxTCPConns = 128
)

// Server answers the sandbox's DNS queries. The zero value denies every name
// (no Decider) and cannot answer A queries (no Pool); it is safe for
// concurrent use once serving.
type Server struct {
	Decider egress.Decider
	Audit   *audit.Logger
	Log     *slog.Logger
	Pool    *Pool
	// Learn gives every valid name a synthetic address (network.learn):
	// the name still leaves the supervisor only when a connection to it
	// is made, and the gate decides that connection.
	Learn bool
	// Self is the sandbox's hostname, answered with plan.HostnameAddr (A)
	// or nothing (other types) as its /etc/hosts has it: tools look their
	// own name up (git, Java, Python's getfqdn), and the AAAA query the
	// file cannot answer would otherwise be a denied name, with a policy
	// draft proposed for it.
	Self string

	once      sync.Once
	denied    *eventLimiter
	exhausted everyN
}

// hostnameIP is plan.HostnameAddr as the answer to the sandbox's own name.
var hostnameIP = net.ParseIP(plan.HostnameAddr).To4()

func (s *Server) init() {
	s.once.Do(func() { s.denied = newEventLimiter() })
}

func (s *Server) log() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

// ServeUDP answers queries arriving on pc until ctx is done, then returns
// nil. It owns pc and closes it. Queries are answered one at a time on
// purpose: answering takes microseconds and never waits on the network, so
// a flood costs one goroutine, not one per packet.
func (s *Server) ServeUDP(ctx context.Context, pc net.PacketConn) error {
	s.init()
	stop := context.AfterFunc(ctx, func() { pc.Close() })
	defer stop()
	defer pc.Close()

	buf := make([]byte, mdns.MaxMsgSize)
	var backoff time.Duration
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if transient(err) {
				backoff = sleep(ctx, backoff)
				continue
			}
			return fmt.Errorf("dns: read udp: %w", err)
		}
		backoff = 0
		resp := s.respond(buf[:n], addrPort(addr), true)
		if resp == nil {
			continue
		}
		if _, err := pc.WriteTo(resp, addr); err != nil && ctx.Err() == nil {
			s.log().Debug("dns: udp reply failed", "client", addr.String(), "err", err)
		}
	}
}

// ServeTCP answers queries on connections accepted from l until ctx is
// done, then closes every connection and returns nil. It owns l.
func (s *Server) ServeTCP(ctx context.Context, l net.Listener) error {
	s.init()
	var (
		mu     sync.Mutex
		conns  = make(map[net.Conn]struct{})
		closed bool
		wg     sync.WaitGroup
	)
	shutdown := func() {
		l.Close()
		mu.Lock()
		closed = true
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	}
	stop := context.AfterFunc(ctx, shutdown)
	defer func() {
		stop()
		shutdown()
		wg.Wait()
	}()

	sem := make(chan struct{}, maxTCPConns)
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if transient(err) {
				backoff = sleep(ctx, backoff)
				continue
			}
			return fmt.Errorf("dns: accept tcp: %w", err)
		}
		backoff = 0
		select {
		case sem <- struct{}{}:
		default:
			// Refusing beats queueing: idle connections held open by the
			// workload must not starve the resolver; clients retry.
			s.log().Debug("dns: too many tcp clients", "client", c.RemoteAddr().String())
			c.Close()
			continue
		}
		mu.Lock()
		if closed {
			mu.Unlock()
			c.Close()
			<-sem
			continue
		}
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer func() {
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
				c.Close()
				<-sem
				wg.Done()
			}()
			s.serveConn(c)
		}()
	}
}

// serveConn handles RFC 7766 framing: any number of length-prefixed
// queries, answered in order, until the client goes idle.
func (s *Server) serveConn(c net.Conn) {
	src := addrPort(c.RemoteAddr())
	var lenBuf [2]byte
	for {
		if err := c.SetReadDeadline(time.Now().Add(tcpIdle)); err != nil {
			return
		}
		if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
			return
		}
		msg := make([]byte, binary.BigEndian.Uint16(lenBuf[:]))
		if _, err := io.ReadFull(c, msg); err != nil {
			return
		}
		resp := s.respond(msg, src, false)
		if resp == nil {
			// Nothing sensible to say, and the stream may be out of sync.
			return
		}
		out := make([]byte, 2+len(resp))
		binary.BigEndian.PutUint16(out, uint16(len(resp)))
		copy(out[2:], resp)
		if err := c.SetWriteDeadline(time.Now().Add(tcpWrite)); err != nil {
			return
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// respond is handle with a last line of defence: a bug in message parsing
// must cost one SERVFAIL, not the sandbox's resolver.
func (s *Server) respond(req []byte, src netip.AddrPort, udp bool) (resp []byte) {
	defer func() {
		if r := recover(); r != nil {
			s.log().Error("dns: panic answering query", "client", src.String(), "panic", fmt.Sprint(r))
			resp = headerOnly(req, mdns.RcodeServerFailure)
		}
	}()
	return s.handle(req, src, udp)
}

// handle turns one wire-format query into a wire-format reply, or nil when
// the message deserves no reply.
func (s *Server) handle(req []byte, src netip.AddrPort, udp bool) []byte {
	s.init()
	if len(req) < headerLen {
		return nil
	}
	if req[2]&0x80 != 0 {
		// Never answer a response: two resolvers could be made to
		// bounce packets at each other forever.
		return nil
	}
	var q mdns.Msg
	if err := q.Unpack(req); err != nil {
		return headerOnly(req, mdns.RcodeFormatError)
	}
	r := s.answer(&q, src)

	size := mdns.MaxMsgSize
	if udp {
		size = mdns.MinMsgSize
		if opt := q.IsEdns0(); opt != nil {
			size = max(size, min(int(opt.UDPSize()), ednsSize))
		}
	}
	r.Truncate(size)
	out, err := r.Pack()
	if err != nil {
		s.log().Error("dns: pack reply", "client", src.String(), "err", err)
		return headerOnly(req, mdns.RcodeServerFailure)
	}
	return out
}

// answer decides the reply to a parsed query.
func (s *Server) answer(q *mdns.Msg, src netip.AddrPort) *mdns.Msg {
	r := &mdns.Msg{MsgHdr: mdns.MsgHdr{
		Id:                 q.Id,
		Response:           true,
		Opcode:             q.Opcode,
		RecursionDesired:   q.RecursionDesired,
		RecursionAvailable: true,
		CheckingDisabled:   q.CheckingDisabled,
	}}
	if q.Opcode != mdns.OpcodeQuery {
		r.Rcode = mdns.RcodeNotImplemented
		return r
	}
	if len(q.Question) != 1 || len(q.Answer) != 0 || len(q.Ns) != 0 {
		r.Rcode = mdns.RcodeFormatError
		return r
	}
	r.Question = []mdns.Question{q.Question[0]}

	opts := 0
	for _, rr := range q.Extra {
		if rr.Header().Rrtype == mdns.TypeOPT {
			opts++
		}
	}
	if opts > 1 {
		r.Rcode = mdns.RcodeFormatError
		return r
	}
	if opt := q.IsEdns0(); opt != nil {
		r.SetEdns0(ednsSize, false)
		if opt.Version() != 0 {
			r.Rcode = mdns.RcodeBadVers
			return r
		}
	}

	qs := q.Question[0]
	if qs.Qclass != mdns.ClassINET {
		r.Rcode = mdns.RcodeRefused
		return r
	}
	name := normalize(qs.Name)
	if !validHostname(name) {
		s.deny(qs, name, src, "invalid_name")
		r.Rcode = mdns.RcodeNameError
		return r
	}

	if s.Self != "" && name == normalize(s.Self) {
		if qs.Qtype == mdns.TypeA {
			r.Answer = []mdns.RR{&mdns.A{
				Hdr: mdns.RR_Header{Name: qs.Name, Rrtype: mdns.TypeA, Class: mdns.ClassINET, Ttl: TTL},
				A:   hostnameIP,
			}}
		}
		return r
	}

	if ip, ok := reverseIPv4(name); ok && s.Pool != nil && s.Pool.Prefix().Contains(ip) {
		host, found := s.Pool.Lookup(ip)
		switch {
		case !found:
			r.Rcode = mdns.RcodeNameError
		case qs.Qtype == mdns.TypePTR:
			r.Answer = []mdns.RR{&mdns.PTR{
				Hdr: mdns.RR_Header{Name: qs.Name, Rrtype: mdns.TypePTR, Class: mdns.ClassINET, Ttl: TTL},
				Ptr: mdns.Fqdn(host),
			}}
		}
		return r
	}

	if s.Decider == nil || !s.Learn && !s.Decider.NameAllowed(name) {
		s.deny(qs, name, src, "not_allowed")
		r.Rcode = mdns.RcodeNameError
		return r
	}

	// Only A gets an answer: AAAA stays empty so clients fall back to IPv4
	// synthetic addresses, and every other type is empty because this
	// server never asks anyone else.
	if qs.Qtype != mdns.TypeA {
		return r
	}
	var (
		ip netip.Addr
		ok bool
	)
	if s.Pool != nil {
		ip, ok = s.Pool.Addr(name)
	}
	if !ok {
		if n, say := s.exhausted.tick(); say {
			s.log().Warn("dns: synthetic address pool exhausted; answering SERVFAIL", "name", name, "times", n)
		}
		r.Rcode = mdns.RcodeServerFailure
		return r
	}
	r.Answer = []mdns.RR{&mdns.A{
		Hdr: mdns.RR_Header{Name: qs.Name, Rrtype: mdns.TypeA, Class: mdns.ClassINET, Ttl: TTL},
		A:   ip.AsSlice(),
	}}
	return r
}

func (s *Server) deny(qs mdns.Question, name string, src netip.AddrPort, reason string) {
	if name == "" {
		name = qs.Name
	}
	count, suppressed, ok := s.denied.allow(name)
	if !ok {
		return
	}
	qtype := mdns.Type(qs.Qtype).String()
	if s.Audit != nil {
		s.Audit.Log(audit.NetDNSDeniedEvent{Name: name, QType: qtype, Source: src.String(),
			Reason: reason, Count: count, Suppressed: suppressed})
	}
	s.log().Debug("dns: name denied", "name", name, "qtype", qtype, "source", src.String(), "reason", reason)
}

// headerOnly builds a reply carrying just req's id and opcode, for when the
// query cannot be parsed (or re-packed) far enough to echo its question.
func headerOnly(req []byte, rcode int) []byte {
	if len(req) < 4 {
		return nil
	}
	out := make([]byte, headerLen)
	copy(out, req[:2])
	out[2] = 0x80 | req[2]&0x78 // QR, opcode
	out[3] = byte(rcode & 0xf)
	return out
}

// validHostname accepts only the letters, digits, hyphens and underscores
// a real host or service name uses. Anything else (escaped dots, spaces,
// binary) could be read differently by the policy matcher and by the
// resolver the supervisor later asks, so it is refused outright.
func validHostname(name string) bool {
	if name == "" || len(name) > 253 {
		return false
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// reverseIPv4 parses d.c.b.a.in-addr.arpa.
func reverseIPv4(name string) (netip.Addr, bool) {
	rest, ok := strings.CutSuffix(name, ".in-addr.arpa")
	if !ok {
		return netip.Addr{}, false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 4 {
		return netip.Addr{}, false
	}
	var b [4]byte
	for i, p := range parts {
		if len(p) > 1 && p[0] == '0' {
			return netip.Addr{}, false
		}
		v, err := strconv.ParseUint(p, 10, 8)
		if err != nil {
			return netip.Addr{}, false
		}
		b[3-i] = byte(v)
	}
	return netip.AddrFrom4(b), true
}

func addrPort(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort()
	case *net.TCPAddr:
		return a.AddrPort()
	case nil:
		return netip.AddrPort{}
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}

// transient reports errors a serve loop should wait out rather than die
// on: running out of descriptors or buffers must not kill the resolver.
func transient(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EINTR)
}

func sleep(ctx context.Context, d time.Duration) time.Duration {
	d = min(max(2*d, 5*time.Millisecond), time.Second)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return d
}
