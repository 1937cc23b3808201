//go:build linux

// Package capture builds the sandbox side of proxy-mode networking: inside
// the sandbox's own network namespace it makes every address local (routed
// to lo), installs nftables rules that send DNS and TCP to corral's
// listeners and drop the rest, and creates those listeners as sockets of
// this namespace. As root the supervisor runs Setup on a thread of its own
// that joined the new namespace (internal/linux/netthread); rootless,
// the init runs it (as root of its namespaces, before dropping privileges)
// and hands the sockets over. The supervisor serves them from the host
// namespaces.
//
// Nothing here touches the host: the namespace has no device but lo, so
// nothing can leave it except through the listeners, and everything
// disappears with the namespace. (A veth pair with both ends inside did
// the routing before; creating it, and deleting it when the namespace goes,
// cost each start milliseconds.)
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
	"github.com/corral-sandbox/corral/internal/plan"
)

// Config holds the ports of the listeners.
type Config struct {
	DNSPort, TransparentPort, HTTPProxyPort, SOCKSPort uint16
}

// DefaultConfig is the conventional port layout.
var DefaultConfig = Config{DNSPort: 53, TransparentPort: 15001, HTTPProxyPort: 3128, SOCKSPort: 1080}

// ConfigOf is the port layout a plan's capture asks for.
func ConfigOf(c *plan.Capture) Config {
	return Config{DNSPort: c.DNSPort, TransparentPort: c.TransparentPort, HTTPProxyPort: c.HTTPProxyPort, SOCKSPort: c.SOCKSPort}
}

// Addr is the capture address the sandbox sees: the resolv.conf nameserver
// and the host part of the proxy variables. It is the only IPv4 address in
// the namespace besides loopback.
var Addr = netclass.CaptureAddr

// Addr6 is the IPv6 source address of the sandbox's connections, the
// counterpart of Addr; nothing listens on it.
var Addr6 = netip.MustParseAddr("fd00:c0ff::1")

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
	if err := routeAllToLoopback(v6); err != nil {
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

// routeAllToLoopback puts the capture addresses on lo and makes every
// other address local as well (a "local" default route in the local
// table), so that connect() to any address succeeds in routing and so
// reaches the OUTPUT hook, where the rules decide. The routes prefer the
// capture addresses as source, so the supervisor always sees the same
// client address in each family.
func routeAllToLoopback(v6 bool) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("capture: find lo: %w", err)
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
		if err := netlink.AddrAdd(lo, na); err != nil {
			return fmt.Errorf("capture: add %s to lo: %w", a, err)
		}
		zero := net.IPv4zero
		if a.Is6() {
			zero = net.IPv6zero
		}
		r := &netlink.Route{
			LinkIndex: lo.Attrs().Index,
			Type:      unix.RTN_LOCAL,
			Table:     unix.RT_TABLE_LOCAL,
			Scope:     netlink.SCOPE_HOST,
			Dst:       &net.IPNet{IP: zero, Mask: net.CIDRMask(0, bits)},
			Src:       a.AsSlice(),
		}
		if err := netlink.RouteAdd(r); err != nil {
			return fmt.Errorf("capture: route every address to lo (source %s): %w", a, err)
		}
	}
	return nil
}
