package dns

import (
	"encoding/binary"
	"net/netip"
	"testing"

	mdns "github.com/miekg/dns"

	"github.com/corral-sandbox/corral/internal/audit"
)

func FuzzHandle(f *testing.F) {
	seed := func(name string, qtype uint16, mut func(*mdns.Msg)) {
		m := new(mdns.Msg)
		m.SetQuestion(name, qtype)
		if mut != nil {
			mut(m)
		}
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, true)
		f.Add(b, false)
	}
	seed("api.example.com.", mdns.TypeA, nil)
	seed("API.example.com.", mdns.TypeAAAA, func(m *mdns.Msg) { m.SetEdns0(4096, true) })
	seed("evil.test.", mdns.TypeTXT, nil)
	seed("1.0.18.198.in-addr.arpa.", mdns.TypePTR, nil)
	seed(`a\.b.example.com.`, mdns.TypeA, nil)
	seed("api.example.com.", mdns.TypeA, func(m *mdns.Msg) { m.Opcode = mdns.OpcodeUpdate })
	seed("api.example.com.", mdns.TypeA, func(m *mdns.Msg) { m.SetEdns0(512, false); m.IsEdns0().SetVersion(3) })
	f.Add([]byte{}, true)
	f.Add([]byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 0x0c, 0, 1, 0, 1}, true)

	// One server across iterations so the pool and limiter accumulate
	// state the way a long-lived sandbox's would.
	srv := &Server{Decider: &fakeDecider{t: nil}, Audit: audit.Discard(), Pool: NewPool(netip.MustParsePrefix("198.18.0.0/28"))}
	src := netip.MustParseAddrPort("127.0.0.1:5353")

	f.Fuzz(func(t *testing.T, req []byte, udp bool) {
		srv.Decider.(*fakeDecider).t = t
		resp := srv.handle(req, src, udp)
		if resp == nil {
			return
		}
		var r mdns.Msg
		if err := r.Unpack(resp); err != nil {
			t.Fatalf("reply %x to %x does not parse: %v", resp, req, err)
		}
		if !r.Response {
			t.Fatal("reply without QR")
		}
		if r.Id != binary.BigEndian.Uint16(req) {
			t.Fatalf("reply id %d, query id %d", r.Id, binary.BigEndian.Uint16(req))
		}
		if udp && len(resp) > ednsSize {
			t.Fatalf("%d-byte UDP reply", len(resp))
		}
		if len(r.Answer) > 1 {
			t.Fatalf("%d answers", len(r.Answer))
		}
	})
}
