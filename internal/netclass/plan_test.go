package netclass

import (
	"net/netip"
	"testing"
)

func TestPlanAddresses(t *testing.T) {
	if !SyntheticPrefix.Addr().Is4() || SyntheticPrefix != SyntheticPrefix.Masked() {
		t.Fatalf("synthetic prefix %s is not a masked IPv4 prefix", SyntheticPrefix)
	}
	// A name answered with the capture address would send the client's
	// connections to corral's own listeners instead of the name's host.
	if SyntheticPrefix.Contains(CaptureAddr) {
		t.Errorf("synthetic prefix %s contains the capture address %s", SyntheticPrefix, CaptureAddr)
	}
	last := SyntheticPrefix.Addr().As4()
	for i := SyntheticPrefix.Bits(); i < 32; i++ {
		last[i/8] |= 0x80 >> (i % 8)
	}
	for _, a := range []netip.Addr{SyntheticPrefix.Addr(), netip.AddrFrom4(last), CaptureAddr} {
		if class, _ := Classify(a); !NeverAllowed(class) {
			t.Errorf("%s is %s, which allowed_ips could open", a, class)
		}
	}
}
