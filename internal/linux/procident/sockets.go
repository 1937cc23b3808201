//go:build linux

package procident

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// tcpListen is TCP_LISTEN in the st column of /proc/net/tcp.
const tcpListen = "0A"

// parseTuples reads the src/dst/sport/dport groups of an nf_conntrack line:
// the original direction first, then the reply.
func parseTuples(line string) [][2]netip.AddrPort {
	var out [][2]netip.AddrPort
	var srcA, dstA netip.Addr
	var sport uint64
	for _, f := range strings.Fields(line) {
		k, v, found := strings.Cut(f, "=")
		if !found {
			continue
		}
		switch k {
		case "src":
			srcA, _ = netip.ParseAddr(v)
		case "dst":
			dstA, _ = netip.ParseAddr(v)
		case "sport":
			sport, _ = strconv.ParseUint(v, 10, 16)
		case "dport":
			dport, _ := strconv.ParseUint(v, 10, 16)
			out = append(out, [2]netip.AddrPort{
				netip.AddrPortFrom(srcA, uint16(sport)), netip.AddrPortFrom(dstA, uint16(dport))})
		}
	}
	return out
}

// parseHexAddrPort decodes the kernel's "ADDR:PORT" notation: the address
// is printed as 32-bit words in host byte order (one word for IPv4, four
// for IPv6), the port as a plain hex number.
func parseHexAddrPort(s string) (netip.AddrPort, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("address %q: no port", s)
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("address %q: %w", s, err)
	}
	raw, err := hex.DecodeString(a)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("address %q: bad hex address", s)
	}
	// Each word was printed as a host-order integer, i.e. most significant
	// digit first; turning it back into memory order restores the network
	// byte order of the address.
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(raw[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr, uint16(port)), nil
}
