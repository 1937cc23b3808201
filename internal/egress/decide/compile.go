package decide

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
)

// endpoint is one endpoint as the Go index sees it.
type endpoint struct {
	// rank orders endpoints by policy name, key and index, the order the
	// rules see candidates in.
	rank     int
	ports    []int
	re       *regexp.Regexp // wildcard host patterns only
	prefixes []netip.Prefix
	// term is the endpoint's candidate object, built once and shared by
	// every input that names it.
	term *ast.Term
}

func byRank(a, b *endpoint) int { return a.rank - b.rank }

// state is one compiled policy: the prepared queries and the index that
// narrows each decision to the endpoints that can match, so that the cost
// of a decision does not grow with the number of endpoints.
type state struct {
	decision    rego.PreparedEvalQuery
	nameAllowed *rego.PreparedEvalQuery // nil: the rules do not define it

	exact    map[string][]*endpoint // exact host names and hosts written as IPs
	oneLabel map[string][]*endpoint // by the pattern minus its first label
	anyDepth map[string][]*endpoint // by the pattern minus its "**" label
	byIP     []*endpoint            // endpoints with allowed_ips
}

var (
	packagePath = ast.MustParseRef("data.corral.egress")
	// Rules run in the supervisor, outside the sandbox, on every
	// connection: network I/O there would be slow and would reach places
	// the sandbox itself may not.
	unsafeBuiltins = map[string]struct{}{"http.send": {}, "net.lookup_ip_addr": {}}
)

func build(p *policy.Policy, rules []byte) (*state, error) {
	st := &state{
		exact:    map[string][]*endpoint{},
		oneLabel: map[string][]*endpoint{},
		anyDepth: map[string][]*endpoint{},
	}
	data, err := st.index(p.EffectiveNetworkPolicies())
	if err != nil {
		return nil, err
	}
	mod, err := ast.ParseModuleWithOpts("policy.rego", string(rules), ast.ParserOptions{RegoVersion: ast.RegoV1})
	if err != nil {
		return nil, fmt.Errorf("policy rules: %w", err)
	}
	if !mod.Package.Path.Equal(packagePath) {
		return nil, fmt.Errorf("policy rules: package is %v, want corral.egress", mod.Package.Path)
	}
	// The store keeps AST values as they are, so evaluation reads data
	// without converting it on every decision.
	store := inmem.NewFromASTObject(ast.NewObject([2]*ast.Term{ast.StringTerm("network_policies"), data}))
	prepare := func(query string) (rego.PreparedEvalQuery, error) {
		q, err := rego.New(
			rego.Query(query),
			rego.ParsedModule(mod.Copy()),
			rego.Store(store),
			rego.StrictBuiltinErrors(true),
			rego.UnsafeBuiltins(unsafeBuiltins),
		).PrepareForEval(context.Background())
		if err != nil {
			return q, fmt.Errorf("policy rules: %w", err)
		}
		return q, nil
	}
	if st.decision, err = prepare("data.corral.egress.decision"); err != nil {
		return nil, err
	}
	if definesRule(mod, "name_allowed") {
		q, err := prepare("data.corral.egress.name_allowed")
		if err != nil {
			return nil, err
		}
		st.nameAllowed = &q
	}
	return st, nil
}

func definesRule(mod *ast.Module, name string) bool {
	for _, r := range mod.Rules {
		if ref := r.Head.Ref(); len(ref) > 0 && ref[0].Equal(ast.VarTerm(name)) {
			return true
		}
	}
	return false
}

// index fills the Go index and returns the data document, both from the
// same normalised endpoints so that they cannot disagree.
func (st *state) index(nps map[string]policy.NetworkPolicy) (*ast.Term, error) {
	type named struct{ key, name string }
	order := make([]named, 0, len(nps))
	for k, np := range nps {
		name := np.Name
		if name == "" {
			name = k
		}
		order = append(order, named{k, name})
	}
	slices.SortFunc(order, func(a, b named) int {
		if c := strings.Compare(a.name, b.name); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	out := ast.NewObjectWithCapacity(len(order))
	rank := 0
	for _, n := range order {
		np := nps[n.key]
		eps := make([]*ast.Term, len(np.Endpoints))
		for i, ep := range np.Endpoints {
			t, err := st.endpoint(n.key, i, rank, ep)
			if err != nil {
				return nil, fmt.Errorf("network_policies.%s.endpoints[%d]: %w", n.key, i, err)
			}
			eps[i] = t
			rank++
		}
		var bins []*ast.Term
		seen := map[string]bool{}
		for i, b := range np.Binaries {
			paths, err := binaryPaths(b.Path)
			if err != nil {
				return nil, fmt.Errorf("network_policies.%s.binaries[%d]: %w", n.key, i, err)
			}
			for _, s := range paths {
				if !seen[s] {
					seen[s] = true
					bins = append(bins, ast.StringTerm(s))
				}
			}
		}
		out.Insert(ast.StringTerm(n.key), ast.ObjectTerm(
			[2]*ast.Term{ast.StringTerm("name"), ast.StringTerm(n.name)},
			[2]*ast.Term{ast.StringTerm("endpoints"), ast.ArrayTerm(eps...)},
			[2]*ast.Term{ast.StringTerm("binaries"), ast.ArrayTerm(bins...)},
		))
	}
	return ast.NewTerm(out), nil
}

func (st *state) endpoint(key string, i, rank int, ep policy.Endpoint) (*ast.Term, error) {
	e := &endpoint{
		rank:  rank,
		ports: ep.PortList(),
		term: ast.ObjectTerm(
			[2]*ast.Term{keyPolicy, ast.StringTerm(key)},
			[2]*ast.Term{keyEndpoint, ast.IntNumberTerm(i)},
		),
	}
	host, hostRegex := "", ""
	if ep.Host != "" {
		h, re, b, err := compileHost(ep.Host)
		if err != nil {
			return nil, err
		}
		host, hostRegex = h, re.String()
		switch {
		case b.rest == "":
			st.exact[h] = append(st.exact[h], e)
		case b.anyDepth:
			e.re = re
			st.anyDepth[b.rest] = append(st.anyDepth[b.rest], e)
		default:
			e.re = re
			st.oneLabel[b.rest] = append(st.oneLabel[b.rest], e)
		}
	}
	cidrs := make([]*ast.Term, 0, len(ep.AllowedIPs))
	for _, s := range ep.AllowedIPs {
		pfx, err := parsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("allowed_ips: %w", err)
		}
		e.prefixes = append(e.prefixes, pfx)
		cidrs = append(cidrs, ast.StringTerm(pfx.String()))
	}
	if len(e.prefixes) > 0 {
		st.byIP = append(st.byIP, e)
	}
	ports := make([]*ast.Term, 0, len(e.ports))
	for _, n := range e.ports {
		if n < 1 || n > 65535 {
			return nil, fmt.Errorf("port %d is out of range", n)
		}
		ports = append(ports, ast.IntNumberTerm(n))
	}
	return ast.ObjectTerm(
		[2]*ast.Term{ast.StringTerm("host"), ast.StringTerm(host)},
		[2]*ast.Term{ast.StringTerm("host_regex"), ast.StringTerm(hostRegex)},
		[2]*ast.Term{ast.StringTerm("ports"), ast.ArrayTerm(ports...)},
		[2]*ast.Term{ast.StringTerm("allowed_ips"), ast.ArrayTerm(cidrs...)},
	), nil
}

type bucket struct {
	anyDepth bool
	rest     string
}

// A wildcard stands for label characters only, so a name carrying other
// bytes (from a forged SNI or Host header) can never match a pattern.
const labelChars = `[a-z0-9_-]`

var patternChars = regexp.MustCompile(`^[a-z0-9_.*-]+$`)

// compileHost normalises a host pattern and returns it as an anchored
// regular expression (for rules that match hosts themselves) and, for a
// wildcard, the index bucket; exact names have an empty bucket.rest.
// Patterns that would match every name or a whole TLD are refused even if
// validation was skipped, since the engine is the last line of defence.
func compileHost(h string) (string, *regexp.Regexp, bucket, error) {
	h = normaliseHost(h)
	if a, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		h = a.Unmap().WithZone("").String()
		return h, regexp.MustCompile("^" + regexp.QuoteMeta(h) + "$"), bucket{}, nil
	}
	if !patternChars.MatchString(h) {
		return "", nil, bucket{}, fmt.Errorf("host %q has characters a host name cannot contain", h)
	}
	labels := strings.Split(h, ".")
	if slices.Contains(labels, "") {
		return "", nil, bucket{}, fmt.Errorf("host %q has an empty label", h)
	}
	if !strings.Contains(h, "*") {
		return h, regexp.MustCompile("^" + regexp.QuoteMeta(h) + "$"), bucket{}, nil
	}
	first, rest := labels[0], strings.Join(labels[1:], ".")
	switch {
	case strings.Contains(rest, "*"):
		return "", nil, bucket{}, fmt.Errorf("host %q has a wildcard outside the first label", h)
	case len(labels) < 3:
		return "", nil, bucket{}, fmt.Errorf("host %q covers a whole top-level domain", h)
	case first == "**":
		re := regexp.MustCompile(`^` + labelChars + `+(?:\.` + labelChars + `+)*\.` + regexp.QuoteMeta(rest) + `$`)
		return h, re, bucket{anyDepth: true, rest: rest}, nil
	case strings.Contains(first, "**"):
		return "", nil, bucket{}, fmt.Errorf("host %q uses ** inside a label", h)
	}
	var expr string
	if first == "*" {
		expr = labelChars + `+`
	} else {
		parts := strings.Split(first, "*")
		for i, s := range parts {
			parts[i] = regexp.QuoteMeta(s)
		}
		expr = strings.Join(parts, labelChars+`*`)
	}
	re := regexp.MustCompile(`^` + expr + `\.` + regexp.QuoteMeta(rest) + `$`)
	return h, re, bucket{rest: rest}, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.WithZone("")
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// binaryPaths returns the path as written and, when a symlink is involved,
// as resolved. The kernel reports resolved executables, while script paths
// from a command line are often the symlink (/usr/local/bin/claude), so both
// forms must match. A glob keeps its pattern; only its literal directory
// prefix is resolved.
func binaryPaths(p string) ([]string, error) {
	if !filepath.IsAbs(p) {
		return nil, fmt.Errorf("binary path %q is not absolute", p)
	}
	p = filepath.Clean(p)
	out := []string{p}
	star := strings.IndexByte(p, '*')
	if star < 0 {
		if r, err := filepath.EvalSymlinks(p); err == nil && r != p {
			out = append(out, r)
		}
		return out, nil
	}
	// Rego's glob.match would read these as glob syntax, which policy
	// authors writing paths do not expect.
	if strings.ContainsAny(p, "?[]{}\\") {
		return nil, fmt.Errorf("binary glob %q may only use * and **", p)
	}
	dir := p[:strings.LastIndexByte(p[:star], '/')]
	if dir != "" {
		if r, err := filepath.EvalSymlinks(dir); err == nil && r != dir {
			out = append(out, filepath.Join(r, p[len(dir):]))
		}
	}
	return out, nil
}

// hostMatches returns the endpoints whose host pattern matches host.
func (st *state) hostMatches(host string) []*endpoint {
	out := slices.Clone(st.exact[host])
	if i := strings.IndexByte(host, '.'); i >= 0 {
		for _, e := range st.oneLabel[host[i+1:]] {
			if e.re.MatchString(host) {
				out = append(out, e)
			}
		}
	}
	for i := 0; i < len(host); i++ {
		if host[i] != '.' {
			continue
		}
		for _, e := range st.anyDepth[host[i+1:]] {
			if e.re.MatchString(host) {
				out = append(out, e)
			}
		}
	}
	return out
}

// candidates returns the endpoints that accept the destination and port,
// in rank order.
func (st *state) candidates(host, ip string, port uint16) []*endpoint {
	var out []*endpoint
	if host != "" {
		out = st.hostMatches(host)
	} else if a, err := netip.ParseAddr(ip); err == nil {
		out = slices.Clone(st.exact[ip])
		for _, e := range st.byIP {
			if !slices.Contains(out, e) && slices.ContainsFunc(e.prefixes, func(p netip.Prefix) bool { return p.Contains(a) }) {
				out = append(out, e)
			}
		}
	}
	out = slices.DeleteFunc(out, func(e *endpoint) bool {
		_, found := slices.BinarySearch(e.ports, int(port))
		return !found
	})
	slices.SortFunc(out, byRank)
	return out
}
