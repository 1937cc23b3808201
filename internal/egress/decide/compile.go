package decide

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/corral-sandbox/corral/internal/egress/decide/userrules"
	"github.com/corral-sandbox/corral/internal/policy"
)

// endpoint is one compiled target as the Go index sees it.
type endpoint struct {
	// rank orders endpoints by policy name, key and index, the order the
	// rules see candidates in.
	rank     int
	grant    *policy.Grant
	binaries *binaryMatcher // the grant's
	target   *policy.Target
}

func byRank(a, b *endpoint) int { return a.rank - b.rank }

// state is one compiled policy: the index that narrows each decision to
// the endpoints that can match, so that the cost of a decision does not
// grow with the number of endpoints, and a user's rules if any.
type state struct {
	// rules evaluates a user's rules; nil for the baked-in rules, which
	// are evaluated in Go (native.go).
	rules userrules.Engine
	// inspects is set when some endpoint has a protocol.
	inspects bool

	exact    map[string][]*endpoint     // exact host names
	exactIP  map[netip.Addr][]*endpoint // hosts written as IPs
	oneLabel map[string][]*endpoint     // by the pattern minus its first label
	anyDepth map[string][]*endpoint     // by the pattern minus its "**" label
	byIP     []*endpoint                // endpoints with allowed_ips
}

func build(c *policy.Compiled, rules []byte) (*state, error) {
	st := &state{
		exact:    map[string][]*endpoint{},
		exactIP:  map[netip.Addr][]*endpoint{},
		oneLabel: map[string][]*endpoint{},
		anyDepth: map[string][]*endpoint{},
		inspects: c.Inspects,
	}
	if err := st.index(c); err != nil {
		return nil, err
	}
	if slices.Equal(rules, bakedRules) {
		return st, nil
	}
	var err error
	if st.rules, err = userrules.Compile(c, rules); err != nil {
		return nil, err
	}
	if st.inspects && !st.rules.DefinesRequest() {
		return nil, errors.New("policy rules: the policy has protocol: rest endpoints but the rules define no request_decision; copy it from the baked-in rules (corral policy rules shows them)")
	}
	return st, nil
}

// index fills the Go index. The grants arrive in rank order (name, then
// key), the order a user's rules see candidates in too.
func (st *state) index(c *policy.Compiled) error {
	rank := 0
	for gi := range c.Grants {
		g := &c.Grants[gi]
		bins, err := newBinaryMatcher(g.Binaries)
		if err != nil {
			return fmt.Errorf("network_policies.%s.binaries: %w", g.Key, err)
		}
		for i := range g.Targets {
			st.endpoint(g, bins, &g.Targets[i], rank)
			rank++
		}
	}
	return nil
}

// endpoint indexes one target.
func (st *state) endpoint(g *policy.Grant, bins *binaryMatcher, t *policy.Target, rank int) {
	e := &endpoint{rank: rank, grant: g, binaries: bins, target: t}
	switch pat := t.Host; {
	case pat.Host == "":
	case !pat.Wildcard():
		// hostpattern.Compile writes an address in canonical form, the
		// form a request's address is looked up in.
		if a, err := netip.ParseAddr(pat.Host); err == nil {
			st.exactIP[a] = append(st.exactIP[a], e)
		} else {
			st.exact[pat.Host] = append(st.exact[pat.Host], e)
		}
	case pat.AnyDepth:
		st.anyDepth[pat.Rest] = append(st.anyDepth[pat.Rest], e)
	default:
		st.oneLabel[pat.Rest] = append(st.oneLabel[pat.Rest], e)
	}
	if len(t.Prefixes) > 0 {
		st.byIP = append(st.byIP, e)
	}
}

// userCandidates are cands as a user's rules receive them.
func userCandidates(cands []*endpoint) []userrules.Candidate {
	out := make([]userrules.Candidate, len(cands))
	for i, e := range cands {
		out[i] = userrules.Candidate{Grant: e.grant, Target: e.target}
	}
	return out
}

// hostMatches appends to out the endpoints whose host pattern matches host.
func (st *state) hostMatches(out []*endpoint, host string) []*endpoint {
	out = append(out, st.exact[host]...)
	if i := strings.IndexByte(host, '.'); i >= 0 {
		for _, e := range st.oneLabel[host[i+1:]] {
			if e.target.Host.Regexp.MatchString(host) {
				out = append(out, e)
			}
		}
	}
	for i := 0; i < len(host); i++ {
		if host[i] != '.' {
			continue
		}
		for _, e := range st.anyDepth[host[i+1:]] {
			if e.target.Host.Regexp.MatchString(host) {
				out = append(out, e)
			}
		}
	}
	return out
}

// candidates appends to out the endpoints that accept the destination
// (a host name, or else an address) and port, in rank order. Decisions
// pass a buffer on their stack: one that allocates nothing touches no
// fresh memory, whose first use costs a page fault.
func (st *state) candidates(out []*endpoint, host string, addr netip.Addr, port uint16) []*endpoint {
	if host != "" {
		out = st.hostMatches(out, host)
	} else if addr.IsValid() {
		out = append(out, st.exactIP[addr]...)
		exact := len(out)
		for _, e := range st.byIP {
			if !slices.Contains(out[:exact], e) && slices.ContainsFunc(e.target.Prefixes, func(p netip.Prefix) bool { return p.Contains(addr) }) {
				out = append(out, e)
			}
		}
	}
	out = slices.DeleteFunc(out, func(e *endpoint) bool {
		_, found := slices.BinarySearch(e.target.Ports, int(port))
		return !found
	})
	slices.SortFunc(out, byRank)
	return out
}
