package decide

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/corral-sandbox/corral/internal/hostpattern"
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
	// key and name are the endpoint's policy's; protocol and tls its L7
	// settings.
	key, name, protocol, tls string
	encodedSlash             bool
	// pathRule names the endpoint's first selector or rule that depends
	// on how the path splits into segments; where there is none, an
	// encoded slash cannot move a request past a rule.
	pathRule string
	// l7 matches requests for endpoints with a protocol.
	l7 *l7Matcher
}

func byRank(a, b *endpoint) int { return a.rank - b.rank }

// state is one compiled policy: the prepared queries and the index that
// narrows each decision to the endpoints that can match, so that the cost
// of a decision does not grow with the number of endpoints.
type state struct {
	decision    rego.PreparedEvalQuery
	nameAllowed *rego.PreparedEvalQuery // nil: the rules do not define it
	request     *rego.PreparedEvalQuery // nil: the rules do not define it
	// memo remembers request decisions; nil for user rules.
	memo *requestMemo
	// inspects is set when some endpoint has a protocol.
	inspects bool

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
	if definesRule(mod, "request_decision") {
		q, err := prepare("data.corral.egress.request_decision")
		if err != nil {
			return nil, err
		}
		st.request = &q
		if slices.Equal(rules, bakedRules) {
			st.memo = newRequestMemo()
		}
	} else if st.inspects {
		return nil, errors.New("policy rules: the policy has protocol: rest endpoints but the rules define no request_decision; copy it from the baked-in rules (corral policy rules shows them)")
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
			t, err := st.endpoint(n.key, n.name, i, rank, ep)
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

func (st *state) endpoint(key, name string, i, rank int, ep policy.Endpoint) (*ast.Term, error) {
	var matcher *l7Matcher
	if ep.Protocol != "" {
		st.inspects = true
		var err error
		if matcher, err = compileL7(ep); err != nil {
			return nil, err
		}
	}
	e := &endpoint{
		rank:         rank,
		ports:        ep.PortList(),
		key:          key,
		name:         name,
		protocol:     ep.Protocol,
		tls:          ep.TLS,
		encodedSlash: ep.AllowEncodedSlash,
		pathRule:     pathRule(key, i, ep),
		l7:           matcher,
		term: ast.ObjectTerm(
			[2]*ast.Term{keyPolicy, ast.StringTerm(key)},
			[2]*ast.Term{keyEndpoint, ast.IntNumberTerm(i)},
		),
	}
	host, hostRegex := "", ""
	if ep.Host != "" {
		pat, err := hostpattern.Compile(ep.Host)
		if err != nil {
			return nil, err
		}
		host, hostRegex = pat.Host, pat.Regexp.String()
		switch {
		case !pat.Wildcard():
			st.exact[pat.Host] = append(st.exact[pat.Host], e)
		case pat.AnyDepth:
			e.re = pat.Regexp
			st.anyDepth[pat.Rest] = append(st.anyDepth[pat.Rest], e)
		default:
			e.re = pat.Regexp
			st.oneLabel[pat.Rest] = append(st.oneLabel[pat.Rest], e)
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
	l7, err := l7Fields(ep)
	if err != nil {
		return nil, err
	}
	return ast.ObjectTerm(append([][2]*ast.Term{
		{ast.StringTerm("host"), ast.StringTerm(host)},
		{ast.StringTerm("host_regex"), ast.StringTerm(hostRegex)},
		{ast.StringTerm("ports"), ast.ArrayTerm(ports...)},
		{ast.StringTerm("allowed_ips"), ast.ArrayTerm(cidrs...)},
	}, l7...)...), nil
}

// accessPresets are the rules an access level stands for (as OpenShell
// expands them).
var accessPresets = map[string][]string{
	policy.AccessReadOnly:  {"GET", "HEAD", "OPTIONS"},
	policy.AccessReadWrite: {"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH"},
	policy.AccessFull:      {"*"},
}

// l7Fields returns the endpoint's L7 settings as the rules read them:
// access presets expanded into rules, each rule labelled with where it
// came from, query matchers as lists of globs.
func l7Fields(ep policy.Endpoint) ([][2]*ast.Term, error) {
	enforcement := ep.Enforcement
	if enforcement == "" {
		enforcement = policy.EnforcementEnforce
	}
	var rules, deny []*ast.Term
	if methods, ok := accessPresets[ep.Access]; ok {
		for _, m := range methods {
			rules = append(rules, matchTerm("access: "+ep.Access, m, "**", nil))
		}
	} else if ep.Access != "" {
		return nil, fmt.Errorf("unknown access %q", ep.Access)
	}
	for i, r := range ep.Rules {
		q, err := queryGlobs(r.Allow.Query)
		if err != nil {
			return nil, fmt.Errorf("rules[%d].allow.query: %w", i, err)
		}
		rules = append(rules, matchTerm(fmt.Sprintf("rules[%d]", i), r.Allow.Method, r.Allow.Path, q))
	}
	for i, m := range ep.DenyRules {
		q, err := queryGlobs(m.Query)
		if err != nil {
			return nil, fmt.Errorf("deny_rules[%d].query: %w", i, err)
		}
		deny = append(deny, matchTerm(fmt.Sprintf("deny_rules[%d]", i), m.Method, m.Path, q))
	}
	return [][2]*ast.Term{
		{ast.StringTerm("protocol"), ast.StringTerm(ep.Protocol)},
		{ast.StringTerm("tls"), ast.StringTerm(ep.TLS)},
		{ast.StringTerm("enforcement"), ast.StringTerm(enforcement)},
		{ast.StringTerm("path"), ast.StringTerm(anyPath(ep.Path))},
		{ast.StringTerm("rules"), ast.ArrayTerm(rules...)},
		{ast.StringTerm("deny_rules"), ast.ArrayTerm(deny...)},
	}, nil
}

// pathRule names, as the policy file spells it, the endpoint's first path
// selector, rule or deny rule that matches on a path other than "any
// path" (access presets match any path); "" when there is none.
func pathRule(key string, i int, ep policy.Endpoint) string {
	at := fmt.Sprintf("network_policies.%s.endpoints[%d]", key, i)
	structured := func(p string) bool {
		switch anyPath(p) {
		case "", "**", "/**":
			return false
		}
		return true
	}
	if structured(ep.Path) {
		return fmt.Sprintf("%s.path (%s)", at, ep.Path)
	}
	for j, r := range ep.Rules {
		if structured(r.Allow.Path) {
			return fmt.Sprintf("%s.rules[%d] (path %s)", at, j, r.Allow.Path)
		}
	}
	for j, r := range ep.DenyRules {
		if structured(r.Path) {
			return fmt.Sprintf("%s.deny_rules[%d] (path %s)", at, j, r.Path)
		}
	}
	return ""
}

// anyPath spells "any path" one way, so the rules need one test for it.
func anyPath(p string) string {
	if p == "*" {
		return "**"
	}
	return p
}

func matchTerm(id, method, path string, query *ast.Term) *ast.Term {
	if query == nil {
		query = ast.ObjectTerm()
	}
	return ast.ObjectTerm(
		[2]*ast.Term{ast.StringTerm("id"), ast.StringTerm(id)},
		[2]*ast.Term{ast.StringTerm("method"), ast.StringTerm(strings.ToUpper(method))},
		[2]*ast.Term{ast.StringTerm("path"), ast.StringTerm(anyPath(path))},
		[2]*ast.Term{ast.StringTerm("query"), query},
	)
}

// queryGlobs turns the two matcher forms (a glob, or {any: [globs]}) into
// one: a list of globs per parameter.
func queryGlobs(q map[string]any) (*ast.Term, error) {
	obj := ast.NewObject()
	for name, v := range q {
		globs, err := queryGlobList(name, v)
		if err != nil {
			return nil, err
		}
		obj.Insert(ast.StringTerm(name), ast.ArrayTerm(stringTerms(globs)...))
	}
	return ast.NewTerm(obj), nil
}

func queryGlobList(name string, v any) ([]string, error) {
	switch x := v.(type) {
	case string:
		return []string{x}, nil
	case map[string]any:
		list, ok := x["any"].([]any)
		if !ok || len(x) != 1 || len(list) == 0 {
			return nil, fmt.Errorf("%s: want a glob or {any: [globs]}", name)
		}
		out := make([]string, 0, len(list))
		for _, g := range list {
			s, ok := g.(string)
			if !ok {
				return nil, fmt.Errorf("%s: any holds %T, not a string", name, g)
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, fmt.Errorf("%s: want a glob or {any: [globs]}, not %T", name, v)
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
