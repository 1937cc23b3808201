package dns

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/corral-sandbox/corral/internal/audit"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/netclass"
	"github.com/corral-sandbox/corral/internal/plan"
)

// fakeDecider allows example.com and its subdomains and records every name
// it is asked about. Decide must never be called: the resolver only asks
// whether a name may be answered.
type fakeDecider struct {
	t     *testing.T
	mu    sync.Mutex
	asked []string
}

func (f *fakeDecider) Decide(context.Context, egress.Request) egress.Decision {
	f.t.Error("DNS server called Decide; it must only ask NameAllowed")
	return egress.Decision{}
}

func (f *fakeDecider) NameAllowed(host string) bool {
	f.mu.Lock()
	f.asked = append(f.asked, host)
	f.mu.Unlock()
	return host == "example.com" || strings.HasSuffix(host, ".example.com")
}

func (f *fakeDecider) names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.asked)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) events(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b.b.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

type harness struct {
	srv     *Server
	decider *fakeDecider
	audit   *syncBuffer
	udp     string
	tcp     string
}

func newServer(t *testing.T, prefix netip.Prefix) (*Server, *fakeDecider, *syncBuffer) {
	d := &fakeDecider{t: t}
	buf := &syncBuffer{}
	return &Server{Decider: d, Audit: audit.New(buf), Pool: NewPool(prefix), Self: "corral-0123abcd"}, d, buf
}

// start serves on real sockets on 127.0.0.1 and checks both loops stop
// cleanly when the test ends.
func start(t *testing.T, prefix netip.Prefix) *harness {
	t.Helper()
	srv, d, buf := newServer(t, prefix)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	go func() { errs <- srv.ServeUDP(ctx, pc) }()
	go func() { errs <- srv.ServeTCP(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			select {
			case err := <-errs:
				if err != nil {
					t.Errorf("serve returned %v after cancel", err)
				}
			case <-time.After(5 * time.Second):
				t.Error("serve did not return after cancel")
			}
		}
	})
	return &harness{srv: srv, decider: d, audit: buf, udp: pc.LocalAddr().String(), tcp: l.Addr().String()}
}

func (h *harness) addr(network string) string {
	if network == "tcp" {
		return h.tcp
	}
	return h.udp
}

func exchange(t *testing.T, network, addr, name string, qtype uint16) *mdns.Msg {
	t.Helper()
	m := new(mdns.Msg)
	m.SetQuestion(name, qtype)
	c := &mdns.Client{Net: network, Timeout: 3 * time.Second}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s query %s %s: %v", network, name, mdns.Type(qtype), err)
	}
	if r.Id != m.Id || !r.Response {
		t.Fatalf("reply id %d response=%v, want id %d response", r.Id, r.Response, m.Id)
	}
	return r
}

func transports(t *testing.T, f func(t *testing.T, network string)) {
	for _, n := range []string{"udp", "tcp"} {
		t.Run(n, func(t *testing.T) { f(t, n) })
	}
}

func aRecord(t *testing.T, r *mdns.Msg) netip.Addr {
	t.Helper()
	if r.Rcode != mdns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("want one answer with NOERROR, got %s", r)
	}
	a, ok := r.Answer[0].(*mdns.A)
	if !ok {
		t.Fatalf("answer is %T, want A", r.Answer[0])
	}
	if a.Hdr.Ttl != TTL || a.Hdr.Ttl > 60 {
		t.Errorf("TTL %d, want %d", a.Hdr.Ttl, TTL)
	}
	ip, _ := netip.AddrFromSlice(a.A)
	return ip.Unmap()
}

func TestAllowedNameGetsSyntheticA(t *testing.T) {
	h := start(t, netclass.SyntheticPrefix)
	transports(t, func(t *testing.T, network string) {
		r := exchange(t, network, h.addr(network), "API.Example.COM.", mdns.TypeA)
		ip := aRecord(t, r)
		if !netclass.SyntheticPrefix.Contains(ip) {
			t.Fatalf("address %v outside %v", ip, netclass.SyntheticPrefix)
		}
		// Echoing the client's spelling keeps 0x20-randomising stubs happy.
		if got := r.Answer[0].Header().Name; got != "API.Example.COM." {
			t.Errorf("answer name %q", got)
		}
		if host, ok := h.srv.Pool.Lookup(ip); !ok || host != "api.example.com" {
			t.Errorf("pool lookup %v = %q %v", ip, host, ok)
		}
	})
	if got := h.decider.names(); !slices.Equal(got, []string{"api.example.com", "api.example.com"}) {
		t.Errorf("decider asked %q", got)
	}
}

func TestStableAddresses(t *testing.T) {
	h := start(t, netclass.SyntheticPrefix)
	first := aRecord(t, exchange(t, "udp", h.udp, "a.example.com.", mdns.TypeA))
	other := aRecord(t, exchange(t, "udp", h.udp, "b.example.com.", mdns.TypeA))
	if first == other {
		t.Fatalf("two names share %v", first)
	}
	for _, tc := range []struct{ network, name string }{
		{"udp", "a.example.com."}, {"tcp", "a.example.com."}, {"udp", "A.EXAMPLE.COM."}, {"tcp", "a.Example.com."},
	} {
		if got := aRecord(t, exchange(t, tc.network, h.addr(tc.network), tc.name, mdns.TypeA)); got != first {
			t.Errorf("%s %s: %v, want %v", tc.network, tc.name, got, first)
		}
	}
	if n := h.srv.Pool.Len(); n != 2 {
		t.Errorf("pool holds %d names, want 2", n)
	}
}

func TestAAAAAndOtherTypesAreEmpty(t *testing.T) {
	h := start(t, netclass.SyntheticPrefix)
	transports(t, func(t *testing.T, network string) {
		for _, qt := range []uint16{mdns.TypeAAAA, mdns.TypeTXT, mdns.TypeMX, mdns.TypeHTTPS, mdns.TypeSVCB, mdns.TypeCNAME, mdns.TypeANY, mdns.TypeNS} {
			r := exchange(t, network, h.addr(network), "api.example.com.", qt)
			if r.Rcode != mdns.RcodeSuccess || len(r.Answer) != 0 || len(r.Ns) != 0 {
				t.Errorf("%s: want NOERROR with no records, got %s", mdns.Type(qt), r)
			}
		}
	})
	if n := h.srv.Pool.Len(); n != 0 {
		t.Errorf("non-A queries allocated %d addresses", n)
	}
}

// The sandbox's own hostname is answered as its /etc/hosts answers it,
// whatever the policy, without asking the policy and without an event.
func TestOwnHostname(t *testing.T) {
	h := start(t, netclass.SyntheticPrefix)
	transports(t, func(t *testing.T, network string) {
		for _, name := range []string{"corral-0123abcd.", "CORRAL-0123ABCD."} {
			if a := aRecord(t, exchange(t, network, h.addr(network), name, mdns.TypeA)); a != netip.MustParseAddr(plan.HostnameAddr) {
				t.Errorf("%s A: got %v, want %s", name, a, plan.HostnameAddr)
			}
			if r := exchange(t, network, h.addr(network), name, mdns.TypeAAAA); r.Rcode != mdns.RcodeSuccess || len(r.Answer) != 0 {
				t.Errorf("%s AAAA: want NOERROR with no records, got %s", name, r)
			}
		}
		// A name below it is any other name.
		if r := exchange(t, network, h.addr(network), "x.corral-0123abcd.", mdns.TypeA); r.Rcode != mdns.RcodeNameError {
			t.Errorf("a name below the hostname: want NXDOMAIN, got %s", r)
		}
	})
	if n := h.decider.names(); len(n) != 2 || n[0] != "x.corral-0123abcd" {
		t.Errorf("the policy was asked about %v; want only the name below the hostname, once per transport", n)
	}
	if ev := h.audit.events(t); len(ev) != 2 {
		t.Errorf("want the two refusals of the name below the hostname only, got %v", ev)
	}
}

func TestDeniedNameIsNXDOMAINAndAudited(t *testing.T) {
	h := start(t, netclass.SyntheticPrefix)
	transports(t, func(t *testing.T, network string) {
		for _, qt := range []uint16{mdns.TypeA, mdns.TypeAAAA, mdns.TypeTXT} {
			r := exchange(t, network, h.addr(network), "Secret-Data.EVIL.test.", qt)
			if r.Rcode != mdns.RcodeNameError || len(r.Answer) != 0 {
				t.Errorf("%s: want NXDOMAIN, got %s", mdns.Type(qt), r)
			}
		}
	})
	for _, n := range h.decider.names() {
		if n != "secret-data.evil.test" {
			t.Errorf("decider asked about %q", n)
		}
	}
	if n := h.srv.Pool.Len(); n != 0 {
		t.Errorf("denied name got a synthetic address (%d allocated)", n)
	}
	ev := h.audit.events(t)
	if len(ev) != 6 {
		t.Fatalf("want 6 audit events, got %d: %v", len(ev), ev)
	}
	for i, e := range ev {
		if e["event"] != audit.NetDNSDenied || e["name"] != "secret-data.evil.test" {
			t.Errorf("event %d: %v", i, e)
		}
		src, err := netip.ParseAddrPort(e["source"].(string))
		if err != nil || src.Addr() != netip.MustParseAddr("127.0.0.1") {
			t.Errorf("event %d source %v", i, e["source"])
		}
	}
	if ev[0]["qtype"] != "A" || ev[1]["qtype"] != "AAAA" || ev[2]["qtype"] != "TXT" {
		t.Errorf("qtypes %v %v %v", ev[0]["qtype"], ev[1]["qtype"], ev[2]["qtype"])
	}
}

func TestOddlySpelledNamesAreRefusedBeforePolicy(t *testing.T) {
	h := start(t, netclass.SyntheticPrefix)
	for _, name := range []string{`a\.b.example.com.`, `a\032b.example.com.`, `a\000.example.com.`, "."} {
		r := exchange(t, "udp", h.udp, name, mdns.TypeA)
		if r.Rcode != mdns.RcodeNameError {
			t.Errorf("%q: want NXDOMAIN, got %s", name, r)
		}
	}
	if got := h.decider.names(); len(got) != 0 {
		t.Errorf("policy asked about invalid names %q", got)
	}
}

func TestPTRForSyntheticAddresses(t *testing.T) {
	h := start(t, netclass.SyntheticPrefix)
	ip := aRecord(t, exchange(t, "udp", h.udp, "db.example.com.", mdns.TypeA))
	rev, err := mdns.ReverseAddr(ip.String())
	if err != nil {
		t.Fatal(err)
	}
	transports(t, func(t *testing.T, network string) {
		r := exchange(t, network, h.addr(network), rev, mdns.TypePTR)
		if r.Rcode != mdns.RcodeSuccess || len(r.Answer) != 1 {
			t.Fatalf("want one PTR, got %s", r)
		}
		if p, ok := r.Answer[0].(*mdns.PTR); !ok || p.Ptr != "db.example.com." {
			t.Errorf("PTR answer %v", r.Answer[0])
		}
		unknown, _ := mdns.ReverseAddr("198.18.200.7")
		if r := exchange(t, network, h.addr(network), unknown, mdns.TypePTR); r.Rcode != mdns.RcodeNameError {
			t.Errorf("unallocated synthetic address: want NXDOMAIN, got %s", r)
		}
		other, _ := mdns.ReverseAddr("10.0.0.1")
		if r := exchange(t, network, h.addr(network), other, mdns.TypePTR); r.Rcode != mdns.RcodeNameError {
			t.Errorf("non-synthetic reverse: want NXDOMAIN, got %s", r)
		}
	})
}

func TestPoolExhaustionIsSERVFAIL(t *testing.T) {
	// A /30 has exactly two usable addresses: .1 and .2.
	h := start(t, netip.MustParsePrefix("198.18.0.0/30"))
	got := map[netip.Addr]bool{}
	for _, n := range []string{"one.example.com.", "two.example.com."} {
		got[aRecord(t, exchange(t, "udp", h.udp, n, mdns.TypeA))] = true
	}
	if !got[netip.MustParseAddr("198.18.0.1")] || !got[netip.MustParseAddr("198.18.0.2")] {
		t.Fatalf("addresses %v", got)
	}
	transports(t, func(t *testing.T, network string) {
		if r := exchange(t, network, h.addr(network), "three.example.com.", mdns.TypeA); r.Rcode != mdns.RcodeServerFailure {
			t.Errorf("exhausted pool: want SERVFAIL, got %s", r)
		}
		// Names already handed out keep working.
		if ip := aRecord(t, exchange(t, network, h.addr(network), "one.example.com.", mdns.TypeA)); !got[ip] {
			t.Errorf("one.example.com moved to %v", ip)
		}
	})
}

func TestTCPPipelinedQueries(t *testing.T) {
	h := start(t, netclass.SyntheticPrefix)
	c, err := mdns.Dial("tcp", h.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i, name := range []string{"x.example.com.", "nope.test.", "x.example.com."} {
		m := new(mdns.Msg)
		m.SetQuestion(name, mdns.TypeA)
		if err := c.WriteMsg(m); err != nil {
			t.Fatal(err)
		}
		r, err := c.ReadMsg()
		if err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		if r.Id != m.Id {
			t.Errorf("query %d: id %d want %d", i, r.Id, m.Id)
		}
	}
}

func TestServeTCPClosesIdleClientsOnShutdown(t *testing.T) {
	srv, _, _ := newServer(t, netclass.SyntheticPrefix)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.ServeTCP(ctx, l) }()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Make sure the server has picked the connection up before cancelling.
	m := new(mdns.Msg)
	m.SetQuestion("x.example.com.", mdns.TypeA)
	dc := &mdns.Conn{Conn: c}
	if err := dc.WriteMsg(m); err != nil {
		t.Fatal(err)
	}
	if _, err := dc.ReadMsg(); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ServeTCP: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ServeTCP kept running with an idle client")
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("client connection still open after shutdown")
	}
}

func TestMalformedQueries(t *testing.T) {
	srv, d, _ := newServer(t, netclass.SyntheticPrefix)
	src := netip.MustParseAddrPort("127.0.0.1:5353")

	query := func(mut func(m *mdns.Msg)) []byte {
		m := new(mdns.Msg)
		m.SetQuestion("api.example.com.", mdns.TypeA)
		m.Id = 0xbeef
		if mut != nil {
			mut(m)
		}
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	parse := func(t *testing.T, b []byte) *mdns.Msg {
		t.Helper()
		if b == nil {
			t.Fatal("no reply")
		}
		var r mdns.Msg
		if err := r.Unpack(b); err != nil {
			t.Fatalf("reply does not parse: %v", err)
		}
		if !r.Response {
			t.Error("reply lacks QR")
		}
		return &r
	}

	t.Run("runt", func(t *testing.T) {
		for _, b := range [][]byte{nil, {1}, make([]byte, 11)} {
			if r := srv.handle(b, src, true); r != nil {
				t.Errorf("%x: replied %x", b, r)
			}
		}
	})
	t.Run("response is never answered", func(t *testing.T) {
		if r := srv.handle(query(func(m *mdns.Msg) { m.Response = true }), src, true); r != nil {
			t.Errorf("answered a response")
		}
	})
	t.Run("garbage body", func(t *testing.T) {
		b := []byte{0xbe, 0xef, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x3f, 'x'}
		r := parse(t, srv.handle(b, src, true))
		if r.Id != 0xbeef || r.Rcode != mdns.RcodeFormatError {
			t.Errorf("got %s", r)
		}
	})
	t.Run("two questions", func(t *testing.T) {
		r := parse(t, srv.handle(query(func(m *mdns.Msg) {
			m.Question = append(m.Question, mdns.Question{Name: "b.example.com.", Qtype: mdns.TypeA, Qclass: mdns.ClassINET})
		}), src, true))
		if r.Rcode != mdns.RcodeFormatError || len(r.Answer) != 0 {
			t.Errorf("got %s", r)
		}
	})
	t.Run("no question", func(t *testing.T) {
		r := parse(t, srv.handle(query(func(m *mdns.Msg) { m.Question = nil }), src, true))
		if r.Rcode != mdns.RcodeFormatError {
			t.Errorf("got %s", r)
		}
	})
	t.Run("opcode", func(t *testing.T) {
		for _, op := range []int{mdns.OpcodeNotify, mdns.OpcodeUpdate, mdns.OpcodeIQuery, mdns.OpcodeStatus} {
			r := parse(t, srv.handle(query(func(m *mdns.Msg) { m.Opcode = op }), src, true))
			if r.Rcode != mdns.RcodeNotImplemented || r.Opcode != op {
				t.Errorf("opcode %d: got %s", op, r)
			}
		}
	})
	t.Run("class", func(t *testing.T) {
		r := parse(t, srv.handle(query(func(m *mdns.Msg) { m.Question[0].Qclass = mdns.ClassCHAOS }), src, true))
		if r.Rcode != mdns.RcodeRefused {
			t.Errorf("got %s", r)
		}
	})
	t.Run("edns", func(t *testing.T) {
		r := parse(t, srv.handle(query(func(m *mdns.Msg) { m.SetEdns0(4096, true) }), src, true))
		opt := r.IsEdns0()
		if opt == nil || opt.UDPSize() != ednsSize || r.Rcode != mdns.RcodeSuccess || len(r.Answer) != 1 {
			t.Errorf("got %s", r)
		}
		r = parse(t, srv.handle(query(func(m *mdns.Msg) { m.SetEdns0(4096, false); m.IsEdns0().SetVersion(1) }), src, true))
		if r.Rcode != mdns.RcodeBadVers || r.IsEdns0() == nil {
			t.Errorf("EDNS version 1: got %s", r)
		}
		r = parse(t, srv.handle(query(func(m *mdns.Msg) { m.SetEdns0(4096, false); m.SetEdns0(4096, false) }), src, true))
		if r.Rcode != mdns.RcodeFormatError {
			t.Errorf("two OPT records: got %s", r)
		}
	})
	t.Run("udp reply to garbage over a socket", func(t *testing.T) {
		h := start(t, netclass.SyntheticPrefix)
		c, err := net.Dial("udp", h.udp)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte{0x12, 0x34, 0x01, 0x00, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 1, 2, 3}); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 512)
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		r := parse(t, buf[:n])
		if r.Id != 0x1234 || r.Rcode != mdns.RcodeFormatError {
			t.Errorf("got %s", r)
		}
	})
	// Only the well-formed EDNS query may reach the policy.
	if got := d.names(); !slices.Equal(got, []string{"api.example.com"}) {
		t.Errorf("policy consulted for malformed queries: %q", got)
	}
}

func TestDeniedEventsAreRateLimitedPerName(t *testing.T) {
	srv, _, buf := newServer(t, netclass.SyntheticPrefix)
	src := netip.MustParseAddrPort("127.0.0.1:5353")
	m := new(mdns.Msg)
	m.SetQuestion("flood.evil.test.", mdns.TypeA)
	q, _ := m.Pack()
	for i := range 1000 {
		var r mdns.Msg
		if err := r.Unpack(srv.handle(q, src, true)); err != nil || r.Rcode != mdns.RcodeNameError {
			t.Fatalf("query %d: %v %s", i, err, &r)
		}
	}
	ev := buf.events(t)
	// The first 10, then the 100th, 200th, ... 1000th.
	if len(ev) != 20 {
		t.Fatalf("want 20 events, got %d", len(ev))
	}
	if c := ev[19]["count"]; c != float64(1000) {
		t.Errorf("last event count %v", c)
	}
}

func TestEventLimiterGlobalBucket(t *testing.T) {
	l := newEventLimiter()
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	written := 0
	for i := range 500 {
		if _, _, ok := l.allow(fmt.Sprint("burst", i)); ok {
			written++
		}
	}
	if written != globalBurst {
		t.Fatalf("burst wrote %d, want %d", written, globalBurst)
	}
	now = now.Add(time.Second)
	_, suppressed, ok := l.allow("fresh")
	if !ok || suppressed != 300 {
		t.Fatalf("after refill: ok=%v suppressed=%d, want true 300", ok, suppressed)
	}
	for i := range globalPerSec * 2 {
		l.allow(fmt.Sprint("refill", i))
	}
	if _, s, ok := l.allow("later"); ok || s != 0 {
		t.Errorf("bucket should be empty again")
	}
}

func TestEventLimiterForgetsNamesWhenFull(t *testing.T) {
	l := newEventLimiter()
	l.now = func() time.Time { return time.Unix(0, 0) }
	for i := range perNameTracked * 3 {
		l.allow(fmt.Sprint(i))
	}
	if len(l.counts) > perNameTracked {
		t.Errorf("tracking %d names, bound is %d", len(l.counts), perNameTracked)
	}
}
