package decide

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
)

// endpoint is one compiled target as the Go index sees it.
type endpoint struct {
	// rank orders endpoints by policy name, key and index, the order the
	// rules see candidates in.
	rank     int
	grant    *policy.Grant
	binaries *binaryMatcher // the grant's
	target   *policy.Target
	// term is the endpoint's candidate object, built once and shared by
	// every input that names it.
	term *ast.Term
}

func byRank(a, b *endpoint) int { return a.rank - b.rank }

// state is one compiled policy: the prepared queries and the index that
// narrows each decision to the endpoints that can match, so that the cost
// of a decision does not grow with the number of endpoints.
type state struct {
	decision    *query
	nameAllowed *query // nil: the rules do not define it
	request     *query // nil: the rules do not define it
	// native is set for the baked-in rules, which are evaluated in Go
	// (native.go); OPA evaluates a user's rules.
	native bool
	// inspects is set when some endpoint has a protocol.
	inspects bool

	exact    map[string][]*endpoint     // exact host names
	exactIP  map[netip.Addr][]*endpoint // hosts written as IPs
	oneLabel map[string][]*endpoint     // by the pattern minus its first label
	anyDepth map[string][]*endpoint     // by the pattern minus its "**" label
	byIP     []*endpoint                // endpoints with allowed_ips
}

var (
	packagePath = ast.MustParseRef("data.corral.egress")
	// Rules run in the supervisor, outside the sandbox, on every
	// connection: network I/O there would be slow and would reach places
	// the sandbox itself may not.
	unsafeBuiltins = map[string]struct{}{"http.send": {}, "net.lookup_ip_addr": {}}
)

func build(c *policy.Compiled, rules []byte) (*state, error) {
	st := &state{
		exact:    map[string][]*endpoint{},
		exactIP:  map[netip.Addr][]*endpoint{},
		oneLabel: map[string][]*endpoint{},
		anyDepth: map[string][]*endpoint{},
		inspects: c.Inspects,
		native:   slices.Equal(rules, bakedRules),
	}
	data, err := st.index(c)
	if err != nil {
		return nil, err
	}
	if st.native {
		return st, nil
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
	compiler := ast.NewCompiler().WithUnsafeBuiltins(unsafeBuiltins)
	if compiler.Compile(map[string]*ast.Module{"policy.rego": mod}); compiler.Failed() {
		return nil, fmt.Errorf("policy rules: %w", compiler.Errors)
	}
	prepare := func(rule string) (*query, error) {
		q, err := prepareQuery(compiler, store, rule)
		if err != nil {
			return nil, fmt.Errorf("policy rules: %w", err)
		}
		return q, nil
	}
	if st.decision, err = prepare("decision"); err != nil {
		return nil, err
	}
	if definesRule(mod, "request_decision") {
		if st.request, err = prepare("request_decision"); err != nil {
			return nil, err
		}
	} else if st.inspects {
		return nil, errors.New("policy rules: the policy has protocol: rest endpoints but the rules define no request_decision; copy it from the baked-in rules (corral policy rules shows them)")
	}
	if definesRule(mod, "name_allowed") {
		if st.nameAllowed, err = prepare("name_allowed"); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// query is one rule of a user's rules, prepared for evaluation by OPA's
// evaluator itself: the rego package around it links OPA's bundle,
// planner and WebAssembly machinery too, whose package initialisation
// every corral start would pay for (`GODEBUG=inittrace=1 corral version`
// lists each package's).
type query struct {
	compiler *ast.Compiler
	qc       ast.QueryCompiler
	body     ast.Body
	store    storage.Store
	// result is the variable the rule's value is bound to, as the query
	// compiler renamed it.
	result ast.Var
}

// prepareQuery compiles "result = data.corral.egress.RULE".
func prepareQuery(compiler *ast.Compiler, store storage.Store, rule string) (*query, error) {
	const result = ast.Var("result")
	body := ast.NewBody(ast.Equality.Expr(ast.VarTerm(string(result)), ast.NewTerm(packagePath.Append(ast.StringTerm(rule)))))
	qc := compiler.QueryCompiler().WithUnsafeBuiltins(unsafeBuiltins)
	compiled, err := qc.Compile(body)
	if err != nil {
		return nil, err
	}
	q := &query{compiler: compiler, qc: qc, body: compiled, store: store, result: result}
	for renamed, original := range qc.RewrittenVars() {
		if original.Equal(result) {
			q.result = renamed
		}
	}
	return q, nil
}

func definesRule(mod *ast.Module, name string) bool {
	for _, r := range mod.Rules {
		if ref := r.Head.Ref(); len(ref) > 0 && ref[0].Equal(ast.VarTerm(name)) {
			return true
		}
	}
	return false
}

// index fills the Go index and, for rules evaluated by OPA, returns the
// data document, both from the same compiled targets so that they cannot
// disagree. The grants arrive in rank order (name, then key).
func (st *state) index(c *policy.Compiled) (*ast.Term, error) {
	out := ast.NewObjectWithCapacity(len(c.Grants))
	rank := 0
	for gi := range c.Grants {
		g := &c.Grants[gi]
		bins, err := newBinaryMatcher(g.Binaries)
		if err != nil {
			return nil, fmt.Errorf("network_policies.%s.binaries: %w", g.Key, err)
		}
		eps := make([]*ast.Term, len(g.Targets))
		for i := range g.Targets {
			eps[i] = st.endpoint(g, bins, &g.Targets[i], rank)
			rank++
		}
		if st.native {
			continue
		}
		out.Insert(ast.StringTerm(g.Key), ast.ObjectTerm(
			[2]*ast.Term{ast.StringTerm("name"), ast.StringTerm(g.Name)},
			[2]*ast.Term{ast.StringTerm("endpoints"), ast.ArrayTerm(eps...)},
			[2]*ast.Term{ast.StringTerm("binaries"), ast.ArrayTerm(stringTerms(g.Binaries)...)},
		))
	}
	return ast.NewTerm(out), nil
}

// endpoint indexes one target and, for OPA, returns its object in the
// data document.
func (st *state) endpoint(g *policy.Grant, bins *binaryMatcher, t *policy.Target, rank int) *ast.Term {
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
	if st.native {
		return nil
	}
	hostRegex := ""
	if t.Host.Host != "" {
		hostRegex = t.Host.Regexp.String()
	}
	cidrs := make([]*ast.Term, len(t.Prefixes))
	for i, p := range t.Prefixes {
		cidrs[i] = ast.StringTerm(p.String())
	}
	e.term = ast.ObjectTerm(
		[2]*ast.Term{keyPolicy, ast.StringTerm(g.Key)},
		[2]*ast.Term{keyEndpoint, ast.IntNumberTerm(t.Index)},
	)
	ports := make([]*ast.Term, len(t.Ports))
	for i, n := range t.Ports {
		ports[i] = ast.IntNumberTerm(n)
	}
	return ast.ObjectTerm(
		[2]*ast.Term{ast.StringTerm("host"), ast.StringTerm(t.Host.Host)},
		[2]*ast.Term{ast.StringTerm("host_regex"), ast.StringTerm(hostRegex)},
		[2]*ast.Term{ast.StringTerm("ports"), ast.ArrayTerm(ports...)},
		[2]*ast.Term{ast.StringTerm("allowed_ips"), ast.ArrayTerm(cidrs...)},
		[2]*ast.Term{ast.StringTerm("protocol"), ast.StringTerm(t.Protocol)},
		[2]*ast.Term{ast.StringTerm("tls"), ast.StringTerm(t.TLS)},
		[2]*ast.Term{ast.StringTerm("enforcement"), ast.StringTerm(t.Enforcement)},
		[2]*ast.Term{ast.StringTerm("path"), ast.StringTerm(t.SelectorGlob)},
		[2]*ast.Term{ast.StringTerm("rules"), ast.ArrayTerm(ruleTerms(t.Rules)...)},
		[2]*ast.Term{ast.StringTerm("deny_rules"), ast.ArrayTerm(ruleTerms(t.DenyRules)...)},
	)
}

func ruleTerms(rules []policy.HTTPRule) []*ast.Term {
	out := make([]*ast.Term, len(rules))
	for i, r := range rules {
		q := ast.NewObject()
		for name, globs := range r.QueryGlobs {
			q.Insert(ast.StringTerm(name), ast.ArrayTerm(stringTerms(globs)...))
		}
		out[i] = ast.ObjectTerm(
			[2]*ast.Term{ast.StringTerm("id"), ast.StringTerm(r.ID)},
			[2]*ast.Term{ast.StringTerm("method"), ast.StringTerm(r.Method)},
			[2]*ast.Term{ast.StringTerm("path"), ast.StringTerm(r.PathGlob)},
			[2]*ast.Term{ast.StringTerm("query"), ast.NewTerm(q)},
		)
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
