package netclass

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

func TestNeverAllowedIn(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		class  Class  // "" when the prefix holds no never-allowed address
		block  string // the block reported
	}{
		{"127.0.0.1/32", ClassLoopback, "127.0.0.0/8"},
		{"127.0.0.0/8", ClassLoopback, "127.0.0.0/8"},
		{"0.0.0.0/0", ClassLoopback, "127.0.0.0/8"},
		{"120.0.0.0/5", ClassLoopback, "127.0.0.0/8"},
		{"0.0.0.0/32", ClassUnspecified, "0.0.0.0/8"},
		{"169.254.169.254/32", ClassMetadata, "169.254.169.254/32"},
		{"169.254.0.0/16", ClassMetadata, "169.254.169.254/32"},
		{"169.254.1.0/24", ClassLinkLocal, "169.254.0.0/16"},
		{"100.100.100.200/32", ClassMetadata, "100.100.100.200/32"},
		{"192.0.0.192/32", ClassMetadata, "192.0.0.192/32"},
		{"198.18.1.1/32", ClassBenchmark, "198.18.0.0/15"},
		{"198.19.255.254/32", ClassBenchmark, "198.18.0.0/15"},
		{"198.0.0.0/8", ClassBenchmark, "198.18.0.0/15"},
		{"::1/128", ClassLoopback, "::1/128"},
		{"::/128", ClassUnspecified, "::/128"},
		{"fe80::/64", ClassLinkLocal, "fe80::/10"},
		{"fd00:ec2::254/128", ClassMetadata, "fd00:ec2::254/128"},
		{"fd00::/8", ClassMetadata, "fd00:ec2::254/128"},
		// Wide private ranges hold cloud metadata addresses.
		{"100.64.0.0/10", ClassMetadata, "100.100.100.200/32"},
		{"192.0.0.0/24", ClassMetadata, "192.0.0.192/32"},
		{"::ffff:127.0.0.1/128", ClassLoopback, "::ffff:127.0.0.0/104"},
		{"::ffff:0.0.0.0/96", ClassLoopback, "::ffff:127.0.0.0/104"},
		{"64:ff9b::a9fe:a9fe/128", ClassMetadata, "64:ff9b::a9fe:a9fe/128"},
		{"64:ff9b::/96", ClassLoopback, "64:ff9b::7f00:0/104"},
		{"64:ff9b::c612:101/128", ClassBenchmark, "64:ff9b::c612:0/111"},
		{"2002:7f00:1::/48", ClassLoopback, "2002:7f00::/24"},
		{"2002:a9fe:a9fe::/48", ClassMetadata, "2002:a9fe:a9fe::/48"},
		{"::127.0.0.1/128", ClassLoopback, "::7f00:0/104"},
		{"::/0", ClassLoopback, "::1/128"},
		{"2000::/3", ClassLoopback, "2002:7f00::/24"},

		{"203.0.113.0/24", "", ""},
		{"10.0.0.0/8", "", ""},
		{"100.64.0.0/11", "", ""},
		{"fd12::/16", "", ""},
		{"198.20.0.0/14", "", ""},
		{"2001:db8::/32", "", ""},
		{"64:ff9b::a00:0/104", "", ""},
		{"::ffff:10.0.0.0/104", "", ""},
		{"2002:a00::/24", "", ""},
		// Teredo and local-use NAT64 are internal but not decoded, so
		// allowed_ips may open them.
		{"2001::/32", "", ""},
		{"64:ff9b:1::/48", "", ""},
	} {
		r, ok := NeverAllowedIn(netip.MustParsePrefix(tc.prefix))
		if ok != (tc.class != "") || r.Class != tc.class || (ok && r.Prefix.String() != tc.block) {
			t.Errorf("NeverAllowedIn(%s) = %v %s %v; want %v %s %s", tc.prefix, ok, r.Class, r.Prefix, tc.class != "", tc.class, tc.block)
		}
		if ok && !NeverAllowed(r.Class) {
			t.Errorf("NeverAllowedIn(%s) reported allowable class %s", tc.prefix, r.Class)
		}
	}
}

func TestNeverAllowedInNamesTheIPv4Block(t *testing.T) {
	r, ok := NeverAllowedIn(netip.MustParsePrefix("64:ff9b::a9fe:a9fe/128"))
	if !ok || r.Form != "NAT64" || r.Of != netip.MustParsePrefix("169.254.169.254/32") {
		t.Errorf("got %+v", r)
	}
	if r, _ := NeverAllowedIn(netip.MustParsePrefix("127.0.0.1/32")); r.Form != "" || r.Of.IsValid() {
		t.Errorf("plain IPv4 block reported as a translated form: %+v", r)
	}
}

// NeverAllowedIn must agree with the dialer's per-address check on every
// address, else a policy could load that the dialer refuses (or the other
// way round).
func TestNeverAllowedInAgreesWithClassify(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	var bases []netip.Prefix
	for _, cr := range append(append([]classRange{}, v4Ranges...), v6Ranges...) {
		bases = append(bases, cr.prefix)
	}
	for _, r := range neverRanges {
		bases = append(bases, r.Prefix)
	}
	for _, e := range []embedding{mapped, nat64, sixToFour, v4Compat} {
		bases = append(bases, e.prefix)
	}
	bases = append(bases, netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0"))
	for i := 0; i < 200000; i++ {
		base := bases[rnd.IntN(len(bases))]
		ip := randomIn(rnd, base)
		class, internal := Classify(ip)
		never := internal && NeverAllowed(class)
		r, ok := NeverAllowedIn(netip.PrefixFrom(ip, ip.BitLen()))
		if ok != never || (ok && r.Class != class) {
			t.Fatalf("%s: Classify says %s (never allowed: %v), NeverAllowedIn says %v %+v", ip, class, never, ok, r)
		}
	}
}

// randomIn returns an address of p, its host bits random.
func randomIn(rnd *rand.Rand, p netip.Prefix) netip.Addr {
	b := p.Addr().As16()
	first := 0
	if p.Addr().Is4() {
		first = 96
	}
	for bit := first + p.Bits(); bit < 128; bit++ {
		if rnd.IntN(2) == 1 {
			b[bit/8] |= 0x80 >> (bit % 8)
		} else {
			b[bit/8] &^= 0x80 >> (bit % 8)
		}
	}
	a := netip.AddrFrom16(b)
	if p.Addr().Is4() {
		a = a.Unmap()
	}
	return a
}
