//go:build linux

package capture

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Names of the nftables objects Setup creates. `corral policy explain` and
// anyone debugging with `nft list ruleset` inside the sandbox see these.
const (
	TableName   = "corral"
	NATChain    = "capture"
	FilterChain = "egress"
)

// rule is one nftables rule in two forms: the text shown to people and the
// expressions sent to the kernel. Both come from the same table (ruleSet) so
// that what `policy explain` prints cannot drift from what Setup installs.
type rule struct {
	chain string
	text  string
	exprs []expr.Any
}

// The register every rule loads into. NFT_REG_1 is 16 bytes wide, enough for
// an IPv6 address or an interface name, so one register serves every match.
const reg = 1

// ipsDstNAT is IPS_DST_NAT from linux/netfilter/nf_conntrack_common.h: the
// connection's destination was rewritten. ct status is in host byte order.
const ipsDstNAT = 1 << 5

func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{p}},
	}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{p}},
	}
}

// dport matches the transport destination port; callers put an l4proto
// match first so the transport header is known to be TCP or UDP.
func dport(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: be16(p)},
	}
}

// ip4Daddr matches the IPv4 destination against a prefix.
func ip4Daddr(p netip.Prefix) []expr.Any {
	a := p.Masked().Addr().As4()
	e := []expr.Any{&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}}
	if p.Bits() < 32 {
		mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-p.Bits()))
		e = append(e, &expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4, Mask: mask, Xor: make([]byte, 4)})
	}
	return append(e, &expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: a[:]})
}

func ip6Daddr(a netip.Addr) []expr.Any {
	b := a.As16()
	return []expr.Any{
		&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 16},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: b[:]},
	}
}

// redirect rewrites the destination to the loopback address (for locally
// generated packets) and the given port.
func redirect(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: reg, Data: be16(p)},
		// Flags are set explicitly: some kernels let NFTA_REDIR_FLAGS
		// replace the PROTO_SPECIFIED flag implied by the register.
		&expr.Redir{RegisterProtoMin: reg, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
	}
}

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

func be16(p uint16) []byte { return binary.BigEndian.AppendUint16(nil, p) }

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// ruleSet is the capture policy, in order: loopback stays loopback, the
// explicit proxies are reached on the capture address as they are, DNS to
// any address goes to corral's resolver, all other TCP goes to the
// transparent listener, and the output filter drops whatever was not
// redirected.
func ruleSet(cfg Config) []rule {
	const (
		v4, v6   = unix.NFPROTO_IPV4, unix.NFPROTO_IPV6
		tcp, udp = unix.IPPROTO_TCP, unix.IPPROTO_UDP
	)
	loop4 := netip.MustParsePrefix("127.0.0.0/8")
	rs := []rule{
		// Loopback stays loopback: the workload's own local services,
		// and the listeners themselves once a packet has been redirected.
		{NATChain, "ip daddr 127.0.0.0/8 return",
			concat(nfproto(v4), ip4Daddr(loop4), []expr.Any{verdict(expr.VerdictReturn)})},
		{NATChain, "ip6 daddr ::1 return",
			concat(nfproto(v6), ip6Daddr(netip.IPv6Loopback()), []expr.Any{verdict(expr.VerdictReturn)})},
	}
	// The explicit proxies listen on the capture address itself; a client
	// configured through HTTP_PROXY/ALL_PROXY reaches them unchanged, so
	// the proxy sees the real client and no SO_ORIGINAL_DST is involved.
	for _, p := range []uint16{cfg.HTTPProxyPort, cfg.SOCKSPort} {
		rs = append(rs, rule{NATChain, fmt.Sprintf("ip daddr %s tcp dport %d return", Addr, p),
			concat(nfproto(v4), ip4Daddr(netip.PrefixFrom(Addr, 32)), l4proto(tcp), dport(p),
				[]expr.Any{verdict(expr.VerdictReturn)})})
	}
	rs = append(rs,
		// Every resolver address, including hard-coded ones like 8.8.8.8,
		// is answered by corral's DNS server.
		rule{NATChain, fmt.Sprintf("udp dport 53 redirect to :%d", cfg.DNSPort),
			concat(l4proto(udp), dport(53), redirect(cfg.DNSPort))},
		rule{NATChain, fmt.Sprintf("tcp dport 53 redirect to :%d", cfg.DNSPort),
			concat(l4proto(tcp), dport(53), redirect(cfg.DNSPort))},
		// All other TCP, IPv4 and IPv6, goes to the transparent listener,
		// which recovers the destination with SO_ORIGINAL_DST.
		rule{NATChain, fmt.Sprintf("meta l4proto tcp redirect to :%d", cfg.TransparentPort),
			concat(l4proto(tcp), redirect(cfg.TransparentPort))},
		// Traffic to the namespace's own addresses: loopback (the
		// workload's own local services) and the capture address (the
		// explicit proxies). Every other address is local too (the
		// capture routes them all to lo), so the addresses, not the
		// device, tell these apart.
		rule{FilterChain, "ip daddr 127.0.0.0/8 accept",
			concat(nfproto(v4), ip4Daddr(loop4), []expr.Any{verdict(expr.VerdictAccept)})},
		rule{FilterChain, fmt.Sprintf("ip daddr %s accept", Addr),
			concat(nfproto(v4), ip4Daddr(netip.PrefixFrom(Addr, 32)), []expr.Any{verdict(expr.VerdictAccept)})},
		rule{FilterChain, "ip6 daddr ::1 accept",
			concat(nfproto(v6), ip6Daddr(netip.IPv6Loopback()), []expr.Any{verdict(expr.VerdictAccept)})},
		rule{FilterChain, fmt.Sprintf("ip6 daddr %s accept", Addr6),
			concat(nfproto(v6), ip6Daddr(Addr6), []expr.Any{verdict(expr.VerdictAccept)})},
		// Traffic the capture chain redirected. Anything else (UDP other
		// than 53, ICMP, raw, SCTP, ...) meets the drop policy.
		rule{FilterChain, "ct status dnat accept",
			[]expr.Any{
				&expr.Ct{Key: expr.CtKeySTATUS, Register: reg},
				&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4,
					Mask: binary.NativeEndian.AppendUint32(nil, ipsDstNAT), Xor: make([]byte, 4)},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: reg, Data: make([]byte, 4)},
				verdict(expr.VerdictAccept),
			}},
	)
	return rs
}

// Rules returns the capture ruleset as nft(8) commands, for people: `corral
// policy explain` prints them, and `nft -f` would accept them.
func Rules(cfg Config) []string {
	out := []string{
		"add table inet " + TableName,
		fmt.Sprintf("add chain inet %s %s { type nat hook output priority -100; policy accept; }", TableName, NATChain),
		fmt.Sprintf("add chain inet %s %s { type filter hook output priority 0; policy drop; }", TableName, FilterChain),
	}
	for _, r := range ruleSet(cfg) {
		out = append(out, fmt.Sprintf("add rule inet %s %s %s", TableName, r.chain, r.text))
	}
	return out
}

// installRules sends the whole table in one netlink batch, which the kernel
// applies atomically: either all of the capture is in place or none of it.
func installRules(cfg Config) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("open nftables netlink socket: %w", err)
	}
	t := c.AddTable(&nftables.Table{Name: TableName, Family: nftables.TableFamilyINet})
	accept, drop := nftables.ChainPolicyAccept, nftables.ChainPolicyDrop
	chains := map[string]*nftables.Chain{
		NATChain: c.AddChain(&nftables.Chain{
			Name: NATChain, Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest, Policy: &accept,
		}),
		FilterChain: c.AddChain(&nftables.Chain{
			Name: FilterChain, Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &drop,
		}),
	}
	for _, r := range ruleSet(cfg) {
		c.AddRule(&nftables.Rule{Table: t, Chain: chains[r.chain], Exprs: r.exprs})
	}
	if err := c.Flush(); err != nil {
		// The usual cause is a kernel without the pieces (or, in a user
		// namespace, unable to autoload them as modules).
		return fmt.Errorf("install nftables table inet %s (kernel needs nf_tables, nft_chain_nat, nft_redir, nf_conntrack, nf_nat): %w", TableName, err)
	}
	return nil
}
