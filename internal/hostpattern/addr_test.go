package hostpattern

import (
	"net/netip"
	"testing"
)

// MayBeAddr never turns away a host netip.ParseAddr accepts.
func TestMayBeAddr(t *testing.T) {
	for _, h := range []string{"1.2.3.4", "::1", "fe80::1%eth0", "::ffff:1.2.3.4", "2001:db8::1", "0.0.0.0"} {
		if _, err := netip.ParseAddr(h); err != nil {
			t.Fatalf("%s: %v", h, err)
		}
		if !MayBeAddr(h) {
			t.Errorf("MayBeAddr(%q) = false for an address", h)
		}
	}
	for _, h := range []string{"example.com", "1.2.3.4.example", "localhost", "1e100.net"} {
		if MayBeAddr(h) {
			t.Errorf("MayBeAddr(%q) = true for a name", h)
		}
	}
}
