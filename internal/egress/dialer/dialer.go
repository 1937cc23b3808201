// Package dialer is the supervisor's only way out: it resolves a name with
// the host's (or the configured upstream) resolver, refuses internal
// addresses unless allowed_ips cover them, and connects to the checked
// address itself, so nothing resolves the name a second time between the
// check and the connect (no DNS rebinding window).
package dialer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/netclass"
)

// DefaultTimeout bounds each connection attempt made by a Dialer from New.
const DefaultTimeout = 10 * time.Second

// Dialer implements egress.Dialer.
type Dialer struct {
	// Resolver resolves request hosts; nil means net.DefaultResolver.
	Resolver *net.Resolver
	// Timeout bounds each connection attempt; zero means only ctx does.
	Timeout time.Duration

	// dial replaces the real connect in tests, which cannot reach the
	// addresses whose allow decision they check.
	dial func(ctx context.Context, addr netip.AddrPort) (net.Conn, error)

	mu    sync.Mutex
	cache map[string]cached

	// Local lists the host's own addresses; nil means its interfaces'.
	Local   func() ([]netip.Addr, error)
	localMu sync.Mutex
	local   map[netip.Addr]bool
	localAt time.Time
}

var _ egress.Dialer = (*Dialer)(nil)

// New returns a Dialer using the system resolver, or, when upstreamDNS is
// set ("HOST:PORT", port 53 if omitted), Go's resolver talking only to that
// server. Go's resolver already retries truncated UDP answers over TCP; the
// Dial hook just points both at the one server.
func New(upstreamDNS string) *Dialer {
	d := &Dialer{Resolver: net.DefaultResolver, Timeout: DefaultTimeout}
	if upstreamDNS == "" {
		return d
	}
	server := upstreamDNS
	if _, _, err := net.SplitHostPort(server); err != nil {
		server = net.JoinHostPort(strings.Trim(server, "[]"), "53")
	}
	d.Resolver = &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var nd net.Dialer
			return nd.DialContext(ctx, network, server)
		},
	}
	return d
}

// Dial connects to r's destination. Every candidate address is classified;
// an internal one survives only when a prefix in allowed contains it, and
// never when netclass.NeverAllowed says so. Survivors are tried in resolver
// order. A refusal is a *egress.DenyError.
func (d *Dialer) Dial(ctx context.Context, r egress.Request, allowed []netip.Prefix) (net.Conn, error) {
	allowed = normalizePrefixes(allowed)
	return d.connect(ctx, r, func(ip netip.Addr) string {
		if d.self(ip) {
			// Listening on all interfaces makes a host service reachable
			// at every address of the host, not only loopback.
			return fmt.Sprintf("%s (this host's own address, never allowed)", ip)
		}
		return check(ip, allowed)
	})
}

// Backend connects to an inference route's backend. The operator names it
// explicitly in a route, which no workload can write, so the loopback,
// private and own addresses a local model server listens on are allowed,
// for that route only; metadata, link-local and corral's own synthetic
// and capture addresses stay refused.
func (d *Dialer) Backend(ctx context.Context, r egress.Request) (net.Conn, error) {
	return d.connect(ctx, r, func(ip netip.Addr) string {
		switch class, internal := netclass.Classify(ip); {
		case !internal, class == netclass.ClassLoopback, class == netclass.ClassPrivate,
			class == netclass.ClassULA, class == netclass.ClassCGNAT:
			return ""
		default:
			return fmt.Sprintf("%s (%s, never a backend)", ip, class)
		}
	})
}

// connect dials the first of r's addresses that refuse (a reason, or "")
// lets through.
func (d *Dialer) connect(ctx context.Context, r egress.Request, refuse func(netip.Addr) string) (net.Conn, error) {
	cands, err := d.candidates(ctx, r)
	if err != nil {
		return nil, err
	}
	var ok []netip.Addr
	var refused []string
	for _, ip := range cands {
		if why := refuse(ip); why != "" {
			refused = append(refused, why)
			continue
		}
		ok = append(ok, ip)
	}
	if len(ok) == 0 {
		detail := strings.Join(refused, ", ")
		if r.Host != "" {
			detail = r.Host + " resolves to " + detail
		} else {
			detail += " is an internal address"
		}
		return nil, &egress.DenyError{Request: r, Decision: egress.Decision{Reason: egress.ReasonInternalAddress, Detail: detail}}
	}

	dial := d.dial
	if dial == nil {
		dial = func(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
			return connectTCP(ctx, addr, d.Timeout)
		}
	}
	var errs []error
	for _, ip := range ok {
		c, err := dial(ctx, netip.AddrPortFrom(ip, r.Port))
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("connect %s: %w", r.Target(), errors.Join(errs...))
}

// candidates returns the addresses r may stand for, IPv4-mapped forms
// unmapped (so they dial as the IPv4 they are) and duplicates dropped.
func (d *Dialer) candidates(ctx context.Context, r egress.Request) ([]netip.Addr, error) {
	deny := func(detail string) *egress.DenyError {
		return &egress.DenyError{Request: r, Decision: egress.Decision{Reason: egress.ReasonResolve, Detail: detail}}
	}
	var raw []netip.Addr
	switch {
	case r.Host != "":
		if ip, err := netip.ParseAddr(r.Host); err == nil {
			raw = []netip.Addr{ip}
			break
		}
		addrs, err := d.lookup(ctx, r.Host)
		if err != nil {
			de := deny(fmt.Sprintf("resolve %s: %v", r.Host, err))
			de.Decision.Reason = egress.UpstreamReason(err, egress.ReasonResolve)
			return nil, de
		}
		raw = addrs
	case r.IP.IsValid():
		raw = []netip.Addr{r.IP}
	default:
		return nil, deny("request names neither a host nor an address")
	}

	out := make([]netip.Addr, 0, len(raw))
	seen := make(map[netip.Addr]bool, len(raw))
	for _, ip := range raw {
		ip = ip.Unmap().WithZone("")
		if !ip.IsValid() || seen[ip] {
			continue
		}
		seen[ip] = true
		out = append(out, ip)
	}
	if len(out) == 0 {
		return nil, deny(fmt.Sprintf("%s has no addresses", r.Target()))
	}
	return out, nil
}

// cacheTTL is how long a resolution is reused. Short, so DNS changes reach
// the sandbox quickly; long enough that a tool opening many connections to
// one host pays for one lookup. Cached addresses are classified again on
// every dial, so the cache cannot carry an internal address past the check.
const (
	cacheTTL     = 10 * time.Second
	cacheEntries = 4096
)

type cached struct {
	addrs   []netip.Addr
	expires time.Time
}

// lookup resolves host through the resolver, reusing recent answers.
func (d *Dialer) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	// Rooted, so resolv.conf search domains cannot turn an allowed name
	// into a different one.
	name := strings.TrimSuffix(host, ".") + "."
	now := time.Now()
	d.mu.Lock()
	if c, ok := d.cache[name]; ok && now.Before(c.expires) {
		d.mu.Unlock()
		return c.addrs, nil
	}
	d.mu.Unlock()
	res := d.Resolver
	if res == nil {
		res = net.DefaultResolver
	}
	addrs, err := res.LookupNetIP(ctx, "ip", name)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	if d.cache == nil || len(d.cache) >= cacheEntries {
		d.cache = map[string]cached{}
	}
	d.cache[name] = cached{addrs: addrs, expires: now.Add(cacheTTL)}
	d.mu.Unlock()
	return addrs, nil
}

// localTTL is how long the host's address list is reused; addresses
// change rarely, and a new one is picked up within this time.
const localTTL = 5 * time.Second

// self reports whether ip is one of the host's own addresses. If they
// cannot be listed, every address counts as the host's: fail closed.
func (d *Dialer) self(ip netip.Addr) bool {
	d.localMu.Lock()
	defer d.localMu.Unlock()
	if d.local == nil || time.Since(d.localAt) > localTTL {
		list := d.Local
		if list == nil {
			list = interfaceAddrs
		}
		addrs, err := list()
		if err != nil {
			return true
		}
		d.local = make(map[netip.Addr]bool, len(addrs))
		for _, a := range addrs {
			d.local[a.Unmap().WithZone("")] = true
		}
		d.localAt = time.Now()
	}
	return d.local[ip.Unmap().WithZone("")]
}

func interfaceAddrs() ([]netip.Addr, error) {
	nets, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, n := range nets {
		if ipn, ok := n.(*net.IPNet); ok {
			if a, ok := netip.AddrFromSlice(ipn.IP); ok {
				out = append(out, a)
			}
		}
	}
	return out, nil
}

// check returns why ip is refused, or "" if it may be dialled. A
// translated form (NAT64, 6to4) must be covered both as written and as the
// IPv4 address it leads to, since allowing one says nothing about the
// other.
func check(ip netip.Addr, allowed []netip.Prefix) string {
	class, internal := netclass.Classify(ip)
	if !internal {
		return ""
	}
	if netclass.NeverAllowed(class) {
		return fmt.Sprintf("%s (%s, never allowed)", ip, class)
	}
	if !covered(ip, allowed) {
		return fmt.Sprintf("%s (%s)", ip, class)
	}
	if v4, ok := netclass.EmbeddedIPv4(ip); ok {
		if _, inner := netclass.Classify(v4); inner && !covered(v4, allowed) {
			return fmt.Sprintf("%s (%s)", ip, class)
		}
	}
	return ""
}

func covered(ip netip.Addr, allowed []netip.Prefix) bool {
	for _, p := range allowed {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// normalizePrefixes rewrites IPv4-mapped prefixes (::ffff:10.0.0.0/104) as
// the IPv4 prefixes they mean, because candidates are unmapped before the
// check and would otherwise never match them.
func normalizePrefixes(in []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(in))
	for _, p := range in {
		if !p.IsValid() {
			continue
		}
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out
}
