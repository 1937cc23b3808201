package dialer

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/corral-sandbox/corral/internal/egress"
)

func prefixes(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(s))
	for i, p := range s {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

// recorder stands in for the network: it records the addresses the Dialer
// tries and hands back one end of a pipe.
type recorder struct {
	mu    sync.Mutex
	tried []string
	fail  map[string]bool
}

func (rec *recorder) dial(_ context.Context, addr netip.AddrPort) (net.Conn, error) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	address := addr.String()
	rec.tried = append(rec.tried, address)
	if rec.fail[address] {
		return nil, errors.New("connection refused")
	}
	c, s := net.Pipe()
	s.Close()
	return c, nil
}

func wantDeny(t *testing.T, err error, reason string) *egress.DenyError {
	t.Helper()
	de, ok := egress.AsDeny(err)
	if !ok {
		t.Fatalf("want DenyError %s, got %v", reason, err)
	}
	if de.Decision.Reason != reason {
		t.Fatalf("reason %q, want %q (%v)", de.Decision.Reason, reason, err)
	}
	return de
}

func TestLoopbackListenerNeverReachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	port := uint16(l.Addr().(*net.TCPAddr).Port)
	d := &Dialer{Timeout: time.Second}
	everything := prefixes("127.0.0.0/8", "0.0.0.0/0", "::/0", "::ffff:0:0/96")
	for _, ip := range []string{"127.0.0.1", "::ffff:127.0.0.1", "0.0.0.0", "::1", "::"} {
		r := egress.Request{IP: netip.MustParseAddr(ip), Port: port}
		c, err := d.Dial(context.Background(), r, everything)
		if c != nil {
			c.Close()
		}
		de := wantDeny(t, err, egress.ReasonInternalAddress)
		if !strings.Contains(de.Decision.Detail, "never allowed") {
			t.Errorf("%s: detail %q", ip, de.Decision.Detail)
		}
	}
	select {
	case <-accepted:
		t.Fatal("the loopback listener accepted a connection")
	case <-time.After(100 * time.Millisecond):
	}
}

func TestLiteralAddressDecisions(t *testing.T) {
	for _, tc := range []struct {
		ip      string
		allowed []netip.Prefix
		deny    bool
	}{
		{"10.1.2.3", nil, true},
		{"10.1.2.3", prefixes("10.2.0.0/16"), true},
		{"10.1.2.3", prefixes("10.1.0.0/16"), false},
		{"::ffff:10.1.2.3", prefixes("10.1.0.0/16"), false},
		{"10.1.2.3", prefixes("::ffff:10.1.0.0/112"), false},
		{"100.64.1.1", nil, true},
		{"100.64.1.1", prefixes("100.64.0.0/10"), false},
		{"fd12::1", nil, true},
		{"fd12::1", prefixes("fd12::/16"), false},
		{"169.254.169.254", prefixes("169.254.0.0/16"), true},
		{"fd00:ec2::254", prefixes("fd00::/8"), true},
		{"fe80::1", prefixes("fe80::/10"), true},
		{"198.18.0.5", prefixes("198.18.0.0/15"), true},
		{"64:ff9b::a9fe:a9fe", prefixes("::/0", "0.0.0.0/0"), true},
		// A NAT64 form needs both itself and its IPv4 destination allowed.
		{"64:ff9b::10.1.2.3", prefixes("64:ff9b::/96"), true},
		{"64:ff9b::10.1.2.3", prefixes("10.0.0.0/8"), true},
		{"64:ff9b::10.1.2.3", prefixes("64:ff9b::/96", "10.0.0.0/8"), false},
		{"203.0.113.7", nil, false},
		{"8.8.8.8", nil, false},
		{"2606:4700::1111", nil, false},
	} {
		rec := &recorder{}
		d := &Dialer{dial: rec.dial}
		r := egress.Request{IP: netip.MustParseAddr(tc.ip), Port: 5432}
		c, err := d.Dial(context.Background(), r, tc.allowed)
		if tc.deny {
			wantDeny(t, err, egress.ReasonInternalAddress)
			if len(rec.tried) != 0 {
				t.Errorf("%s: denied but dialled %v", tc.ip, rec.tried)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s allowed=%v: %v", tc.ip, tc.allowed, err)
			continue
		}
		c.Close()
		want := netip.AddrPortFrom(netip.MustParseAddr(tc.ip).Unmap(), 5432).String()
		if len(rec.tried) != 1 || rec.tried[0] != want {
			t.Errorf("%s: dialled %v, want [%s]", tc.ip, rec.tried, want)
		}
	}
}

func TestDeniedPrivateAddressDetail(t *testing.T) {
	d := &Dialer{}
	_, err := d.Dial(context.Background(), egress.Request{IP: netip.MustParseAddr("10.0.0.5"), Port: 443}, nil)
	de := wantDeny(t, err, egress.ReasonInternalAddress)
	if de.Decision.Detail != "10.0.0.5 (private) is an internal address" {
		t.Errorf("detail %q", de.Decision.Detail)
	}
}

// upstream is an in-process authoritative server standing in for
// --upstream-dns; it counts the questions it receives.
type upstream struct {
	mu      sync.Mutex
	queries map[string]int
	zone    map[string][]string
}

func (u *upstream) ServeDNS(w mdns.ResponseWriter, q *mdns.Msg) {
	m := new(mdns.Msg)
	m.SetReply(q)
	qs := q.Question[0]
	u.mu.Lock()
	u.queries[strings.ToLower(qs.Name)+" "+mdns.Type(qs.Qtype).String()]++
	u.mu.Unlock()
	addrs, ok := u.zone[strings.ToLower(qs.Name)]
	if !ok {
		m.Rcode = mdns.RcodeNameError
	}
	for _, s := range addrs {
		ip := netip.MustParseAddr(s)
		hdr := mdns.RR_Header{Name: qs.Name, Class: mdns.ClassINET, Ttl: 60}
		switch {
		case ip.Is4() && qs.Qtype == mdns.TypeA:
			hdr.Rrtype = mdns.TypeA
			m.Answer = append(m.Answer, &mdns.A{Hdr: hdr, A: ip.AsSlice()})
		case ip.Is6() && qs.Qtype == mdns.TypeAAAA:
			hdr.Rrtype = mdns.TypeAAAA
			m.Answer = append(m.Answer, &mdns.AAAA{Hdr: hdr, AAAA: ip.AsSlice()})
		}
	}
	_ = w.WriteMsg(m)
}

func startUpstream(t *testing.T, zone map[string][]string) (*upstream, string) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{queries: map[string]int{}, zone: zone}
	srv := &mdns.Server{PacketConn: pc, Handler: u}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go func() { _ = srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() { _ = srv.Shutdown() })
	return u, pc.LocalAddr().String()
}

func TestResolutionThroughUpstream(t *testing.T) {
	u, addr := startUpstream(t, map[string][]string{
		"private.test.":  {"10.1.2.3"},
		"public.test.":   {"203.0.113.7"},
		"mixed.test.":    {"127.0.0.1", "203.0.113.8"},
		"loop.test.":     {"127.0.0.2", "::1"},
		"metadata.test.": {"169.254.169.254"},
		"mapped.test.":   {"::ffff:10.9.9.9"},
		"nat64.test.":    {"64:ff9b::a9fe:a9fe"},
		"empty.test.":    {},
	})
	ctx := context.Background()

	type result struct {
		reason string   // "" = allowed
		tried  []string // addresses dialled when allowed
		detail string
	}
	for _, tc := range []struct {
		host    string
		allowed []netip.Prefix
		want    result
	}{
		{"public.test", nil, result{tried: []string{"203.0.113.7:443"}}},
		{"PUBLIC.test.", nil, result{tried: []string{"203.0.113.7:443"}}},
		{"private.test", nil, result{reason: egress.ReasonInternalAddress, detail: "private.test resolves to 10.1.2.3 (private)"}},
		{"private.test", prefixes("10.1.0.0/16"), result{tried: []string{"10.1.2.3:443"}}},
		{"mixed.test", nil, result{tried: []string{"203.0.113.8:443"}}},
		{"loop.test", prefixes("0.0.0.0/0", "::/0"), result{reason: egress.ReasonInternalAddress}},
		{"metadata.test", prefixes("169.254.0.0/16"), result{reason: egress.ReasonInternalAddress, detail: "metadata.test resolves to 169.254.169.254 (metadata, never allowed)"}},
		{"mapped.test", nil, result{reason: egress.ReasonInternalAddress, detail: "mapped.test resolves to 10.9.9.9 (private)"}},
		{"mapped.test", prefixes("10.9.0.0/16"), result{tried: []string{"10.9.9.9:443"}}},
		{"nat64.test", prefixes("::/0", "0.0.0.0/0"), result{reason: egress.ReasonInternalAddress}},
		{"nowhere.test", nil, result{reason: egress.ReasonResolve}},
		{"empty.test", nil, result{reason: egress.ReasonResolve}},
	} {
		rec := &recorder{}
		d := New(addr)
		d.dial = rec.dial
		c, err := d.Dial(ctx, egress.Request{Host: tc.host, Port: 443}, tc.allowed)
		if tc.want.reason != "" {
			de, ok := egress.AsDeny(err)
			if !ok || de.Decision.Reason != tc.want.reason {
				t.Errorf("%s: want %s, got %v", tc.host, tc.want.reason, err)
				continue
			}
			if tc.want.detail != "" && de.Decision.Detail != tc.want.detail {
				t.Errorf("%s: detail %q, want %q", tc.host, de.Decision.Detail, tc.want.detail)
			}
			if len(rec.tried) != 0 {
				t.Errorf("%s: denied but dialled %v", tc.host, rec.tried)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.host, err)
			continue
		}
		c.Close()
		if strings.Join(rec.tried, ",") != strings.Join(tc.want.tried, ",") {
			t.Errorf("%s: dialled %v, want %v", tc.host, rec.tried, tc.want.tried)
		}
	}

	u.mu.Lock()
	defer u.mu.Unlock()
	// One A and one AAAA per lookup, and the name is never looked up
	// again at connect time: the checked literal is what gets dialled.
	if n := u.queries["public.test. A"]; n != 2 {
		t.Errorf("public.test A asked %d times, want 2 (two lookups)", n)
	}
	for q := range u.queries {
		if strings.Contains(q, ".test.") && !strings.HasSuffix(q, ". A") && !strings.HasSuffix(q, ". AAAA") {
			t.Errorf("unexpected query %q", q)
		}
	}
}

func TestCandidatesTriedInOrder(t *testing.T) {
	_, addr := startUpstream(t, map[string][]string{"multi.test.": {"203.0.113.1", "203.0.113.2"}})
	rec := &recorder{fail: map[string]bool{"203.0.113.1:80": true}}
	d := New(addr)
	d.dial = rec.dial
	c, err := d.Dial(context.Background(), egress.Request{Host: "multi.test", Port: 80}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if len(rec.tried) != 2 {
		t.Fatalf("tried %v", rec.tried)
	}

	rec = &recorder{fail: map[string]bool{"203.0.113.1:80": true, "203.0.113.2:80": true}}
	d.dial = rec.dial
	_, err = d.Dial(context.Background(), egress.Request{Host: "multi.test", Port: 80}, nil)
	if err == nil {
		t.Fatal("want an error when every candidate fails")
	}
	if _, ok := egress.AsDeny(err); ok {
		t.Errorf("connect failure reported as a deny: %v", err)
	}
}

func TestResolveFailureIsDeny(t *testing.T) {
	// Nothing listens on this port, so every lookup fails.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	pc.Close()
	d := New(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = d.Dial(ctx, egress.Request{Host: "any.test", Port: 443}, nil)
	wantDeny(t, err, egress.ReasonResolve)

	_, err = (&Dialer{}).Dial(ctx, egress.Request{Port: 443}, nil)
	wantDeny(t, err, egress.ReasonResolve)
}

func TestNew(t *testing.T) {
	if d := New(""); d.Resolver != net.DefaultResolver || d.Timeout != DefaultTimeout {
		t.Errorf("New(\"\") = %+v", d)
	}
	if d := New("192.0.2.53"); d.Resolver == net.DefaultResolver || !d.Resolver.PreferGo || d.Resolver.Dial == nil {
		t.Errorf("New(upstream) resolver %+v", d.Resolver)
	}
}

// A service listening on all interfaces is reachable at every address of
// the host, so the host's own public addresses are refused like loopback,
// whatever allowed_ips says.
func TestHostOwnAddressRefused(t *testing.T) {
	rec := &recorder{}
	own := netip.MustParseAddr("203.0.113.77")
	d := &Dialer{dial: rec.dial, Local: func() ([]netip.Addr, error) { return []netip.Addr{own}, nil }}
	r := egress.Request{IP: own, Port: 22}
	_, err := d.Dial(context.Background(), r, prefixes("203.0.113.0/24"))
	wantDeny(t, err, egress.ReasonInternalAddress)
	if len(rec.tried) != 0 {
		t.Fatalf("dialled the host's own address: %v", rec.tried)
	}
	// Another public address is still fine.
	c, err := d.Dial(context.Background(), egress.Request{IP: netip.MustParseAddr("203.0.113.78"), Port: 22}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	// Failing to list the host's addresses fails closed.
	d = &Dialer{dial: rec.dial, Local: func() ([]netip.Addr, error) { return nil, errors.New("no netlink") }}
	_, err = d.Dial(context.Background(), egress.Request{IP: netip.MustParseAddr("203.0.113.78"), Port: 22}, nil)
	wantDeny(t, err, egress.ReasonInternalAddress)
}

// An inference route's backend may be a model server on this host's
// loopback, which no policy can open; metadata and link-local addresses
// stay refused even there.
func TestBackendAllowsLoopbackNotMetadata(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	port := uint16(l.Addr().(*net.TCPAddr).Port)
	d := &Dialer{Timeout: time.Second}
	c, err := d.Backend(context.Background(), egress.Request{IP: netip.MustParseAddr("127.0.0.1"), Port: port})
	if err != nil {
		t.Fatalf("a route's loopback backend: %v", err)
	}
	c.Close()
	for _, ip := range []string{"169.254.169.254", "fe80::1", "198.18.0.5", "::ffff:169.254.169.254"} {
		c, err := d.Backend(context.Background(), egress.Request{IP: netip.MustParseAddr(ip), Port: 80})
		if c != nil {
			c.Close()
		}
		wantDeny(t, err, egress.ReasonInternalAddress)
	}
}
