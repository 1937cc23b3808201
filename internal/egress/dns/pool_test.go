package dns

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/corral-sandbox/corral/internal/netclass"
)

func TestPoolSkipsSpecialAddressesAndIsBounded(t *testing.T) {
	p := NewPool(netclass.SyntheticPrefix)
	seen := make(map[netip.Addr]bool)
	n := 0
	for {
		a, ok := p.Addr(fmt.Sprintf("h%d.example.com", n))
		if !ok {
			break
		}
		if seen[a] {
			t.Fatalf("%v handed out twice", a)
		}
		seen[a] = true
		if !netclass.SyntheticPrefix.Contains(a) {
			t.Fatalf("%v outside the prefix", a)
		}
		if b := a.As4(); b[3] == 0 || b[3] == 255 {
			t.Fatalf("handed out %v", a)
		}
		n++
	}
	// 256 /24s in a /16, 254 usable addresses each.
	if want := 256 * 254; n != want {
		t.Fatalf("pool gave %d addresses, want %d", n, want)
	}
	// Exhaustion never evicts: old names keep their address.
	if a, ok := p.Addr("h0.example.com"); !ok || a != netip.MustParseAddr("198.18.0.1") {
		t.Errorf("h0 = %v %v", a, ok)
	}
	if _, ok := p.Addr("new.example.com"); ok {
		t.Error("allocated past exhaustion")
	}
}

func TestPoolLookup(t *testing.T) {
	p := NewPool(netclass.SyntheticPrefix)
	a, ok := p.Addr("API.example.com.")
	if !ok {
		t.Fatal("no address")
	}
	if b, _ := p.Addr("api.example.com"); b != a {
		t.Errorf("case/trailing dot changed the address: %v vs %v", a, b)
	}
	for _, ip := range []netip.Addr{a, netip.AddrFrom16(a.As16())} {
		if h, ok := p.Lookup(ip); !ok || h != "api.example.com" {
			t.Errorf("Lookup(%v) = %q %v", ip, h, ok)
		}
	}
	if _, ok := p.Lookup(netip.MustParseAddr("198.18.9.9")); ok {
		t.Error("unallocated address resolved")
	}
}

func TestPoolSmallPrefixes(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		want   int
	}{
		{"198.18.0.0/32", 0}, {"198.18.0.0/31", 0}, {"198.18.0.0/30", 2}, {"198.18.0.0/24", 254}, {"198.18.0.77/23", 508},
	} {
		p := NewPool(netip.MustParsePrefix(tc.prefix))
		n := 0
		for ; ; n++ {
			if _, ok := p.Addr(fmt.Sprint(n)); !ok {
				break
			}
		}
		if n != tc.want {
			t.Errorf("%s: %d addresses, want %d", tc.prefix, n, tc.want)
		}
	}
}

func TestNewPoolRejectsIPv6(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("IPv6 prefix accepted")
		}
	}()
	NewPool(netip.MustParsePrefix("fd00::/64"))
}
