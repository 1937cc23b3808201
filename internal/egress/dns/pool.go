package dns

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
)

// Pool hands out one synthetic IPv4 address per name and remembers the
// mapping for the sandbox's whole life. Addresses are never reused: a
// long-lived connection or a client's DNS cache may still hold an old
// address, and reusing it would silently retarget that client at another
// host. The pool is therefore bounded by its prefix. It is safe for
// concurrent use.
type Pool struct {
	prefix netip.Prefix
	last   netip.Addr

	mu     sync.RWMutex
	byName map[string]netip.Addr
	byAddr map[netip.Addr]string
	next   netip.Addr // next candidate; invalid once the prefix is used up
}

// NewPool returns an empty pool over prefix, which must be IPv4; a sandbox
// uses netclass.SyntheticPrefix, which no real destination uses, so a
// connection to one of its addresses can only mean "the name our resolver
// handed out". A wrong prefix is a programming error, hence the panic
// rather than an error every caller would have to plumb for a constant.
func NewPool(prefix netip.Prefix) *Pool {
	if !prefix.IsValid() || !prefix.Addr().Is4() {
		panic(fmt.Sprintf("dns: synthetic pool needs an IPv4 prefix, got %v", prefix))
	}
	prefix = prefix.Masked()
	return &Pool{
		prefix: prefix,
		last:   lastAddr(prefix),
		byName: make(map[string]netip.Addr),
		byAddr: make(map[netip.Addr]string),
		next:   prefix.Addr(),
	}
}

// Prefix is the range the pool allocates from.
func (p *Pool) Prefix() netip.Prefix { return p.prefix }

// Addr returns host's synthetic address, allocating one on first use. It
// reports false when the pool is exhausted.
func (p *Pool) Addr(host string) (netip.Addr, bool) {
	host = normalize(host)
	p.mu.RLock()
	a, ok := p.byName[host]
	p.mu.RUnlock()
	if ok {
		return a, true
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if a, ok := p.byName[host]; ok {
		return a, true
	}
	for p.next.IsValid() && p.prefix.Contains(p.next) {
		a := p.next
		p.next = a.Next()
		if !p.usable(a) {
			continue
		}
		p.byName[host] = a
		p.byAddr[a] = host
		return a, true
	}
	p.next = netip.Addr{}
	return netip.Addr{}, false
}

// Lookup returns the name ip stands for. IPv4-mapped IPv6 forms are
// accepted because a dual-stack listener reports IPv4 peers that way.
func (p *Pool) Lookup(ip netip.Addr) (string, bool) {
	ip = ip.Unmap()
	p.mu.RLock()
	defer p.mu.RUnlock()
	h, ok := p.byAddr[ip]
	return h, ok
}

// Len is the number of names allocated so far.
func (p *Pool) Len() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.byName)
}

// usable skips the prefix's own network and broadcast addresses and every
// x.y.z.0 / x.y.z.255, which some stacks and tools still treat specially.
func (p *Pool) usable(a netip.Addr) bool {
	if a == p.prefix.Addr() || a == p.last {
		return false
	}
	b := a.As4()
	return b[3] != 0 && b[3] != 255
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().As4()
	hostBits := 32 - p.Bits()
	for i := 3; i >= 0 && hostBits > 0; i-- {
		n := min(hostBits, 8)
		b[i] |= byte(1<<n - 1)
		hostBits -= n
	}
	return netip.AddrFrom4(b)
}

// normalize is the one spelling of a name used for policy checks and the
// pool: DNS is case-insensitive and the root label is implicit.
func normalize(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}
