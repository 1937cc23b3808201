package netclass

import "net/netip"

// The addresses a proxy-mode sandbox is told about. Both lie in the
// benchmarking range 198.18.0.0/15 (RFC 2544), which no real destination
// uses and which Classify never allows, so nothing the sandbox learns can
// make the host dial them. The listener ports are capture.DefaultConfig.
var (
	// SyntheticPrefix is where the sandbox's DNS server takes the
	// addresses it answers for allowed names; a connection to one names
	// its host exactly.
	SyntheticPrefix = netip.MustParsePrefix("198.18.0.0/16")

	// CaptureAddr is the resolv.conf nameserver and the host part of the
	// proxy variables inside the sandbox. It lies outside SyntheticPrefix
	// so that no name is ever answered with it.
	CaptureAddr = netip.AddrFrom4([4]byte{198, 19, 255, 254})
)
