package dialer

import (
	"net/netip"
)

// Address classes Classify reports.
const (
	ClassPublic        = "public"
	ClassDocumentation = "documentation"
	ClassLoopback      = "loopback"
	ClassPrivate       = "private"
	ClassCGNAT         = "cgnat"
	ClassLinkLocal     = "link_local"
	ClassMetadata      = "metadata"
	ClassUnspecified   = "unspecified"
	ClassMulticast     = "multicast"
	ClassBroadcast     = "broadcast"
	ClassBenchmark     = "benchmark"
	ClassIETFProtocol  = "ietf_protocol"
	ClassReserved      = "reserved"
	ClassULA           = "ula"
	ClassSiteLocal     = "site_local"
	ClassTeredo        = "teredo"
	ClassInvalid       = "invalid"
)

// neverAllowed are classes no allowed_ips entry can open. Loopback and
// unspecified reach the host's own services (Linux connects 0.0.0.0 and ::
// to the local host); link-local and metadata reach the cloud instance's
// credentials; benchmark is our own synthetic range, which only means
// something inside the sandbox and must never be dialled from the host.
var neverAllowed = map[string]bool{
	ClassLoopback:    true,
	ClassUnspecified: true,
	ClassLinkLocal:   true,
	ClassMetadata:    true,
	ClassBenchmark:   true,
}

// NeverAllowed reports whether class is refused whatever allowed_ips say,
// so policy loading can reject such entries up front.
func NeverAllowed(class string) bool { return neverAllowed[class] }

type classRange struct {
	prefix   netip.Prefix
	class    string
	internal bool
}

func rng(p, class string, internal bool) classRange {
	return classRange{netip.MustParsePrefix(p), class, internal}
}

// Most specific first: the first match wins.
var v4Ranges = []classRange{
	rng("0.0.0.0/8", ClassUnspecified, true),
	rng("127.0.0.0/8", ClassLoopback, true),
	rng("169.254.169.254/32", ClassMetadata, true), // AWS, GCP, Azure, …
	rng("169.254.0.0/16", ClassLinkLocal, true),
	rng("100.100.100.200/32", ClassMetadata, true), // Alibaba Cloud
	rng("100.64.0.0/10", ClassCGNAT, true),
	rng("10.0.0.0/8", ClassPrivate, true),
	rng("172.16.0.0/12", ClassPrivate, true),
	rng("192.168.0.0/16", ClassPrivate, true),
	rng("192.0.0.192/32", ClassMetadata, true), // Oracle Cloud
	rng("192.0.0.0/24", ClassIETFProtocol, true),
	rng("192.88.99.0/24", ClassReserved, true), // deprecated 6to4 relay anycast
	// Documentation ranges are where corral's own test internet lives,
	// and nothing private hides there, so they count as public.
	rng("192.0.2.0/24", ClassDocumentation, false),
	rng("198.51.100.0/24", ClassDocumentation, false),
	rng("203.0.113.0/24", ClassDocumentation, false),
	rng("198.18.0.0/15", ClassBenchmark, true),
	rng("224.0.0.0/4", ClassMulticast, true),
	rng("255.255.255.255/32", ClassBroadcast, true),
	rng("240.0.0.0/4", ClassReserved, true),
}

var v6Ranges = []classRange{
	rng("::/128", ClassUnspecified, true),
	rng("::1/128", ClassLoopback, true),
	rng("fd00:ec2::254/128", ClassMetadata, true), // AWS IPv6 IMDS
	rng("fe80::/10", ClassLinkLocal, true),
	rng("fec0::/10", ClassSiteLocal, true),
	rng("fc00::/7", ClassULA, true),
	rng("ff00::/8", ClassMulticast, true),
	rng("2001::/32", ClassTeredo, true),
	// IETF protocol assignments: benchmarking, ORCHID, AS112, …; none
	// is a destination an agent needs.
	rng("2001::/23", ClassIETFProtocol, true),
	rng("2001:db8::/32", ClassDocumentation, false),
	rng("3fff::/20", ClassDocumentation, false),
	// Only 2000::/3 is allocated for global unicast; everything else
	// (discard-only 100::/64, local-use NAT64 64:ff9b:1::/48, …) is not
	// somewhere an agent should be connecting.
	rng("2000::/3", ClassPublic, false),
}

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
	v4Compat  = netip.MustParsePrefix("::/96")
)

// Classify names the kind of address ip is and whether it is internal, i.e.
// refused unless allowed_ips covers it. IPv6 forms that embed an IPv4
// address (IPv4-mapped, NAT64 64:ff9b::/96, 6to4 2002::/16, deprecated
// IPv4-compatible ::/96) take the class of the embedded address when that
// one is internal: otherwise ::ffff:127.0.0.1 or 64:ff9b::a9fe:a9fe would
// be a way around the IPv4 checks.
func Classify(ip netip.Addr) (class string, internal bool) {
	ip = ip.WithZone("")
	if !ip.IsValid() {
		return ClassInvalid, true
	}
	if ip.Is4In6() {
		ip = ip.Unmap()
	}
	if ip.Is4() {
		return lookup(v4Ranges, ip, ClassPublic, false)
	}
	if ip.IsUnspecified() || ip.IsLoopback() {
		return lookup(v6Ranges, ip, ClassReserved, true)
	}
	if v4, ok := embeddedIPv4(ip); ok {
		class, internal := lookup(v4Ranges, v4, ClassPublic, false)
		if internal {
			return class, true
		}
		if v4Compat.Contains(ip) {
			return ClassReserved, true
		}
		return ClassPublic, false
	}
	return lookup(v6Ranges, ip, ClassReserved, true)
}

func lookup(ranges []classRange, ip netip.Addr, class string, internal bool) (string, bool) {
	for _, cr := range ranges {
		if cr.prefix.Contains(ip) {
			return cr.class, cr.internal
		}
	}
	return class, internal
}

// embeddedIPv4 extracts the IPv4 address a translated IPv6 form carries.
// IPv4-mapped addresses are not handled here: callers unmap them first.
func embeddedIPv4(ip netip.Addr) (netip.Addr, bool) {
	if !ip.Is6() || ip.Is4In6() {
		return netip.Addr{}, false
	}
	b := ip.As16()
	switch {
	case nat64.Contains(ip), v4Compat.Contains(ip) && !ip.IsUnspecified() && !ip.IsLoopback():
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case sixToFour.Contains(ip):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}
