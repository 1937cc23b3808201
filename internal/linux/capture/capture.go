//go:build linux

// Package capture builds the sandbox side of proxy-mode networking: inside
// the sandbox's own network namespace it adds a capture link, routes
// everything to it, installs nftables rules that send DNS and TCP to
// corral's listeners and drop the rest, and creates those listeners as
// sockets of this namespace. The sandbox's init runs Setup (as
// root of its namespaces, before dropping privileges) and hands the sockets
// to the supervisor, which serves them from the host namespaces.
//
// Nothing here touches the host: the veth pair has both ends in the
// sandbox's namespace, so there is no forwarding and no host firewall rule,
// and everything disappears with the namespace.
package capture

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/netclass"
)

// Config holds the ports of the listeners.
type Config struct {
	DNSPort, TransparentPort, HTTPProxyPort, SOCKSPort uint16
}

// DefaultConfig is the conventional port layout.
var DefaultConfig = Config{DNSPort: 53, TransparentPort: 15001, HTTPProxyPort: 3128, SOCKSPort: 1080}

// Addr is the capture address the sandbox sees: the resolv.conf nameserver
// and the host part of the proxy variables. It is the only IPv4 address in
// the namespace besides loopback.
var Addr = netclass.CaptureAddr

// Addr6 is given to the capture link only so that IPv6 connect() has a
// source address and a route; nothing listens on it.
var Addr6 = netip.MustParseAddr("fd00:c0ff::1")

// Names of the capture link's two ends.
const (
	LinkName = "corral0"
	PeerName = "corral1"
)

func (c Config) validate() error {
	ports := map[string]uint16{"DNS": c.DNSPort, "transparent": c.TransparentPort, "HTTP proxy": c.HTTPProxyPort, "SOCKS": c.SOCKSPort}
	seen := map[uint16]string{}
	for name, p := range ports {
		if p == 0 {
			return fmt.Errorf("capture: %s port is 0", name)
		}
		// DNS and transparent share 127.0.0.1/TCP, the proxies share the
		// capture address, and the proxy ports are exempt from the
		// transparent redirect; equal ports would collide or loop.
		if other, dup := seen[p]; dup {
			return fmt.Errorf("capture: %s and %s ports are both %d", other, name, p)
		}
		seen[p] = name
	}
	return nil
}

// Setup configures the calling process's network namespace for capture and
// returns the listening sockets. It expects a fresh namespace with only lo,
// already up, and must run with CAP_NET_ADMIN there. A failure leaves the
// namespace half configured; the caller abandons the sandbox, and the
// namespace dies with it.
func Setup(cfg Config) (*Listeners, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	v6, why := ipv6Available()
	if err := setupLink(v6); err != nil {
		return nil, err
	}
	if err := installRules(cfg); err != nil {
		return nil, err
	}
	l, err := listen(cfg, v6)
	if err != nil {
		return nil, err
	}
	l.NoIPv6Reason = why
	return l, nil
}

// ipv6Available reports whether the namespace can carry IPv6 and, if not,
// why. Without it IPv6 connect() fails with ENETUNREACH, which is the
// fail-closed outcome anyway.
func ipv6Available() (bool, string) {
	// /proc/sys/net shows the sysctls of the reader's network namespace.
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		return false, "kernel has no IPv6 (/proc/sys/net/ipv6 missing)"
	}
	b, err := os.ReadFile("/proc/sys/net/ipv6/conf/lo/disable_ipv6")
	if err != nil {
		return false, "cannot read lo's disable_ipv6: " + err.Error()
	}
	if strings.TrimSpace(string(b)) != "0" {
		return false, "IPv6 is disabled on lo"
	}
	return true, ""
}

func setupLink(v6 bool) error {
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: LinkName}, PeerName: PeerName}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("capture: create veth %s/%s: %w", LinkName, PeerName, err)
	}
	link, err := netlink.LinkByName(LinkName)
	if err != nil {
		return fmt.Errorf("capture: find %s: %w", LinkName, err)
	}
	peer, err := netlink.LinkByName(PeerName)
	if err != nil {
		return fmt.Errorf("capture: find %s: %w", PeerName, err)
	}
	if v6 {
		// A namespace may inherit disable_ipv6=1 for new devices; the
		// capture link needs IPv6 for the v6 address and route.
		p := "/proc/sys/net/ipv6/conf/" + LinkName + "/disable_ipv6"
		if err := os.WriteFile(p, []byte("0"), 0); err != nil {
			return fmt.Errorf("capture: enable IPv6 on %s: %w", LinkName, err)
		}
	}
	// The peer must be up too, or the link has no carrier.
	for _, l := range []netlink.Link{link, peer} {
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("capture: bring up %s: %w", l.Attrs().Name, err)
		}
	}
	addrs := []netip.Addr{Addr}
	if v6 {
		addrs = append(addrs, Addr6)
	}
	for _, a := range addrs {
		bits := a.BitLen()
		na := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, bits)}}
		if a.Is6() {
			// Without NODAD the address stays tentative for a second or
			// two and cannot be used as a source or bound.
			na.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrAdd(link, na); err != nil {
			return fmt.Errorf("capture: add %s to %s: %w", a, LinkName, err)
		}
		// A default route through the capture link makes connect() to any
		// address succeed in routing and so reach the OUTPUT hook, where
		// the rules decide. The source is pinned to the capture address so
		// the supervisor always sees the same client address family.
		zero, scope := net.IPv4zero, netlink.SCOPE_LINK
		if a.Is6() {
			// IPv6 routes carry no scope; `ip -6 route` uses universe.
			zero, scope = net.IPv6zero, netlink.SCOPE_UNIVERSE
		}
		r := &netlink.Route{
			LinkIndex: link.Attrs().Index,
			Scope:     scope,
			Dst:       &net.IPNet{IP: zero, Mask: net.CIDRMask(0, bits)},
			Src:       a.AsSlice(),
		}
		if err := netlink.RouteAdd(r); err != nil {
			return fmt.Errorf("capture: add default route via %s (%s): %w", LinkName, a, err)
		}
	}
	return nil
}
