// Package netclass is corral's one table of address classes. It says which
// destinations are public, which are internal (refused unless allowed_ips
// cover them) and which no policy can open. The dialer classifies every
// address before it connects and policy loading checks every allowed_ips
// entry against the same table, so a policy that loads never promises a
// destination the dialer will refuse. The addresses corral itself uses
// inside the sandbox (SyntheticPrefix, CaptureAddr) live here too, because
// the table has to keep them unreachable from the host.
package netclass

import "net/netip"

// Class names a kind of address.
type Class string

// Address classes Classify reports.
const (
	ClassPublic        Class = "public"
	ClassDocumentation Class = "documentation"
	ClassLoopback      Class = "loopback"
	ClassPrivate       Class = "private"
	ClassCGNAT         Class = "cgnat"
	ClassLinkLocal     Class = "link_local"
	ClassMetadata      Class = "metadata"
	ClassUnspecified   Class = "unspecified"
	ClassMulticast     Class = "multicast"
	ClassBroadcast     Class = "broadcast"
	ClassBenchmark     Class = "benchmark"
	ClassIETFProtocol  Class = "ietf_protocol"
	ClassReserved      Class = "reserved"
	ClassULA           Class = "ula"
	ClassSiteLocal     Class = "site_local"
	ClassTeredo        Class = "teredo"
	ClassInvalid       Class = "invalid"
)

// never lists the classes no allowed_ips entry can open, with the reason
// policy errors give, in the order NeverAllowedIn reports them (the more
// telling class first where ranges nest, e.g. metadata inside link-local).
var never = []struct {
	class  Class
	reason string
}{
	{ClassLoopback, "they are this host's own services"},
	// Linux connects 0.0.0.0 and :: to the local host.
	{ClassUnspecified, "Linux connects them to this host itself"},
	{ClassMetadata, "they hand out the cloud instance's credentials"},
	{ClassLinkLocal, "they are the host's link neighbours, cloud metadata services among them"},
	// The synthetic DNS answers and the capture address only mean
	// something inside the sandbox; dialled from the host they would reach
	// whatever the host has there.
	{ClassBenchmark, "the range holds the sandbox's synthetic DNS answers and capture address, which mean something only inside the sandbox"},
}

// NeverAllowed reports whether class is refused whatever allowed_ips say.
func NeverAllowed(class Class) bool { return Reason(class) != "" }

// Reason says why class is never allowed, or returns "" when allowed_ips
// can open it.
func Reason(class Class) string {
	for _, n := range never {
		if n.class == class {
			return n.reason
		}
	}
	return ""
}

type classRange struct {
	prefix   netip.Prefix
	class    Class
	internal bool
}

func rng(p string, class Class, internal bool) classRange {
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
	// Holds SyntheticPrefix and CaptureAddr (plan_test.go checks).
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

// IPv6 forms that carry an IPv4 address, and the byte where it starts.
var (
	mapped    = embedding{netip.MustParsePrefix("::ffff:0.0.0.0/96"), 12, "IPv4-mapped"}
	nat64     = embedding{netip.MustParsePrefix("64:ff9b::/96"), 12, "NAT64"}
	sixToFour = embedding{netip.MustParsePrefix("2002::/16"), 2, "6to4"}
	v4Compat  = embedding{netip.MustParsePrefix("::/96"), 12, "IPv4-compatible"}
)

type embedding struct {
	prefix netip.Prefix
	at     int
	name   string
}

// embed returns the IPv6 prefix whose addresses carry the IPv4 ones in p.
func (e embedding) embed(p netip.Prefix) netip.Prefix {
	b := e.prefix.Addr().As16()
	v4 := p.Addr().As4()
	copy(b[e.at:], v4[:])
	return netip.PrefixFrom(netip.AddrFrom16(b), e.prefix.Bits()+p.Bits())
}

// Classify names the kind of address ip is and whether it is internal, i.e.
// refused unless allowed_ips covers it. IPv6 forms that embed an IPv4
// address (IPv4-mapped, NAT64 64:ff9b::/96, 6to4 2002::/16, deprecated
// IPv4-compatible ::/96) take the class of the embedded address when that
// one is internal: otherwise ::ffff:127.0.0.1 or 64:ff9b::a9fe:a9fe would
// be a way around the IPv4 checks.
func Classify(ip netip.Addr) (class Class, internal bool) {
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
	if v4, ok := EmbeddedIPv4(ip); ok {
		class, internal := lookup(v4Ranges, v4, ClassPublic, false)
		if internal {
			return class, true
		}
		if v4Compat.prefix.Contains(ip) {
			return ClassReserved, true
		}
		return ClassPublic, false
	}
	return lookup(v6Ranges, ip, ClassReserved, true)
}

func lookup(ranges []classRange, ip netip.Addr, class Class, internal bool) (Class, bool) {
	for _, cr := range ranges {
		if cr.prefix.Contains(ip) {
			return cr.class, cr.internal
		}
	}
	return class, internal
}

// EmbeddedIPv4 extracts the IPv4 address a translated IPv6 form (NAT64,
// 6to4, IPv4-compatible) carries. IPv4-mapped addresses are not handled
// here: callers unmap them first.
func EmbeddedIPv4(ip netip.Addr) (netip.Addr, bool) {
	if !ip.Is6() || ip.Is4In6() {
		return netip.Addr{}, false
	}
	b := ip.As16()
	switch {
	case nat64.prefix.Contains(ip), v4Compat.prefix.Contains(ip) && !ip.IsUnspecified() && !ip.IsLoopback():
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case sixToFour.prefix.Contains(ip):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}
