// Package decide is the egress policy decision point: an embedded OPA engine
// evaluating Rego rules over a sandbox's network policies.
//
// # Division of work
//
// Go indexes the endpoints by host pattern and address and passes the
// endpoints whose destination and port match the request as candidates;
// the rules decide which binaries may use them, which policy answers and
// why a request is denied. Scanning every endpoint in Rego would cost time
// linear in the policy on each connection.
//
// # Rules
//
// The baked-in rules (policy.rego, package corral.egress, Rego v1 syntax)
// are replaced as a whole by a user's --policy-rules file, which must
// declare the same package. Decide evaluates data.corral.egress.decision.
// NameAllowed evaluates data.corral.egress.name_allowed when the rules
// define it (with port 0 and the candidates whose host pattern matches,
// whatever their ports); otherwise it reports whether any endpoint's host
// pattern matches. Rules may not call http.send or net.lookup_ip_addr: they
// run in the supervisor, outside the sandbox, on every connection.
//
// # Input document
//
//	{
//	  "network": {
//	    "host": "api.github.com", // lower-case, no trailing dot; "" for a literal IP
//	    "ip":   "",               // the literal destination when host is "", e.g. "10.1.2.3"
//	    "port": 443
//	  },
//	  "exec": {
//	    "path":          "/usr/bin/node",          // the connecting process's executable
//	    "ancestors":     ["/usr/bin/bash"],        // executables up to the sandbox init
//	    "cmdline_paths": ["/usr/local/bin/claude"], // absolute script paths from argv
//	    "paths":         ["/usr/bin/node", "/usr/bin/bash", "/usr/local/bin/claude"]
//	  },
//	  "candidates": [{"policy": "claude", "endpoint": 0}]
//	}
//
// exec.paths is path, ancestors and cmdline_paths together, without empty
// or repeated entries: the binding matches if any of them matches. It is
// empty for a process whose identity cannot be trusted (Identity.Untrusted),
// so no binding matches it.
// candidates names the endpoints (key in data.network_policies, index into
// its endpoints) that accept network.port and whose host pattern matches
// network.host, or, for a literal IP, whose host is that IP or whose
// allowed_ips contain it; they are ordered by policy name, then key, then
// index. Host patterns are exact names, "*.x.y" (exactly one label),
// "**.x.y" (one or more labels) or a "*" inside the first label
// ("api-*.x.y", within that label only), all case-insensitive and with
// any trailing dot ignored.
//
// # Data document
//
//	data.network_policies[key] = {
//	  "name": "github",                        // the policy's name, else its key
//	  "endpoints": [{
//	    "host":        "*.github.com",         // "" for an allowed_ips-only endpoint
//	    "host_regex":  "^[a-z0-9_-]+\\.github\\.com$", // the pattern as an anchored regex; "" without host
//	    "ports":       [443],
//	    "allowed_ips": ["10.0.0.0/8"]          // canonical CIDRs
//	  }],
//	  "binaries": ["/usr/bin/curl", "/opt/tools/**"] // [] = any binary
//	}
//
// Policies are the grants of policy.Compiled, so the
// network.allow short form appears as the policy "network.allow". Binary
// paths are listed as written and, where a symlink is involved, resolved
// (for a glob, its literal directory); "*" in a binary matches within one
// path segment and "**" across segments.
//
// Endpoints also carry their L7 settings, with access presets expanded
// into rules and query matchers as lists of globs:
//
//	"protocol": "rest", "tls": "", "enforcement": "enforce", "path": "/api/**",
//	"rules":      [{"id": "rules[0]", "method": "GET", "path": "/repos/**", "query": {"q": ["repo:*"]}}],
//	"deny_rules": [{"id": "deny_rules[0]", "method": "*", "path": "**", "query": {}}]
//
// # Result
//
//	decision = {"allow": bool, "policy": string, "key": string, "reason": string, "allowed_ips": [string]}
//
// allow is required; reason should be one of the egress.Reason constants
// when allow is false (no_matching_policy if empty); allowed_ips become
// Decision.AllowedIPs; key, the deciding policy's key, says which policy's
// protocol: rest endpoints make the connection inspected (matched by name
// when absent). Any evaluation error, an undefined decision or a value of
// another shape denies with egress.ReasonEngine.
//
// # Requests on inspected connections
//
// Each request is decided by data.corral.egress.request_decision, which a
// user's rules must define when the policy has protocol: rest endpoints.
// The input is the connection's, with the request added and each
// candidate extended by what Go matched (with gobwas/glob, the library
// behind glob.match, and the same separators):
//
//	"http": {"method": "GET", "path": "/repos/a/b", "query": {"page": ["2"]}},
//	"candidates": [{"policy": "gh", "endpoint": 0,
//	  "applies": true,             // its path selector matches, or it has none
//	  "matching_rules": [0, 3],    // indexes into its rules, in order
//	  "matching_deny_rules": []}]
//
// The path is decoded and normalised (l7/reqpath) and the method upper
// case. Within each policy, candidates whose selector matches come first,
// then those without one, then those whose selector does not match. The
// result is
//
//	request_decision = {"allow": bool, "policy": string, "rule": string, "reason": string, "enforcement": "enforce"|"audit"}
//
// # Evaluation
//
// The baked-in rules are evaluated in Go (native.go), rule for rule, with
// no OPA query prepared at all; OPA evaluates a user's rules. A property
// test holds the two to the same answers on random policies and requests.
package decide

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/hostpattern"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
)

//go:embed policy.rego
var bakedRules []byte

// BakedRules returns the built-in rules, for users writing their own.
func BakedRules() []byte { return slices.Clone(bakedRules) }

// Engine implements egress.Decider with an embedded OPA engine evaluating
// Rego rules over one compiled policy's data. It is immutable and safe for
// concurrent use; a reload prepares a new one (internal/reload).
type Engine struct {
	st *state
}

var (
	_ egress.Decider     = (*Engine)(nil)
	_ egress.HTTPDecider = (*Engine)(nil)
)

// New prepares c with rules, or with the baked-in rules when rules is nil.
func New(c *policy.Compiled, rules []byte) (*Engine, error) {
	if c == nil {
		return nil, errors.New("no policy")
	}
	if rules == nil {
		rules = bakedRules
	}
	st, err := build(c, rules)
	if err != nil {
		return nil, err
	}
	return &Engine{st: st}, nil
}

// Decide evaluates r against the engine's policy.
func (e *Engine) Decide(ctx context.Context, r egress.Request) egress.Decision {
	st := e.st
	host, addr := normaliseTarget(r)
	var buf [8]*endpoint
	cands := st.candidates(buf[:0], host, addr, r.Port)
	var (
		d   egress.Decision
		key string
	)
	if st.native {
		var paths [8]string
		d, key = nativeDecision(cands, execPaths(paths[:0], r.Identity))
	} else {
		v, err := eval(ctx, st.decision, input(host, addrString(addr), int(r.Port), r.Identity, cands))
		if err != nil {
			return engineError(err.Error())
		}
		if d, key, err = parseDecision(v); err != nil {
			return engineError(err.Error())
		}
	}
	if !d.Allow {
		d.Detail = denyDetail(d, r, host, addr)
		return d
	}
	// The deciding policy's endpoints for this destination say whether its
	// requests are inspected; rules that do not report the policy's key
	// are matched by name.
	// An encoded slash is accepted where an endpoint allows it, and where
	// no endpoint that could decide the request has a rule that depends on
	// path structure (npm's /@scope%2fname under access presets).
	pathRule := ""
	for _, c := range cands {
		// tls: skip exempts an endpoint from inspection altogether; its
		// traffic is carried like any other allowed connection's.
		t := c.target
		if t.Protocol == "" || t.TLS == policy.TLSSkip || !(c.grant.Key == key || key == "" && c.grant.Name == d.Policy) {
			continue
		}
		if !d.Inspect {
			d.Inspect, d.TLS = true, t.TLS
		}
		d.AllowEncodedSlash = d.AllowEncodedSlash || t.AllowEncodedSlash
		if pathRule == "" {
			pathRule = t.PathRule
		}
	}
	if d.AllowEncodedSlash || pathRule == "" {
		d.AllowEncodedSlash = d.Inspect
	} else {
		d.PathRule = pathRule
	}
	return d
}

// DecideHTTP evaluates one request of an inspected connection against the
// engine's policy: the connection's decision is taken again (the policy
// may have changed since it opened), then the request_decision rules.
func (e *Engine) DecideHTTP(ctx context.Context, r egress.Request, h egress.HTTPRequest) egress.HTTPDecision {
	st := e.st
	if !st.native && st.request == nil {
		return egress.HTTPDecision{Reason: egress.ReasonEngine, Detail: "the policy rules define no request_decision"}
	}
	host, addr := normaliseTarget(r)
	var buf [8]*endpoint
	cands := requestCandidates(st.candidates(buf[:0], host, addr, r.Port), h)
	var d egress.HTTPDecision
	if st.native {
		var paths [8]string
		d = nativeRequestDecision(cands, execPaths(paths[:0], r.Identity), h)
	} else {
		in := inputTerms(host, addrString(addr), int(r.Port), r.Identity, requestTerms(cands, h))
		in.Insert(keyHTTP, httpTerm(h))
		v, err := eval(ctx, st.request, in)
		if err != nil {
			return egress.HTTPDecision{Reason: egress.ReasonEngine, Detail: err.Error()}
		}
		if d, err = parseRequestDecision(v); err != nil {
			return egress.HTTPDecision{Reason: egress.ReasonEngine, Detail: err.Error()}
		}
	}
	if !d.Allow {
		d.Detail = requestDenyDetail(d, h)
	}
	return d
}

func httpTerm(h egress.HTTPRequest) *ast.Term {
	q := ast.NewObjectWithCapacity(len(h.Query))
	for name, vals := range h.Query {
		q.Insert(ast.StringTerm(name), ast.ArrayTerm(stringTerms(vals)...))
	}
	return ast.ObjectTerm(
		[2]*ast.Term{keyMethod, ast.StringTerm(h.Method)},
		[2]*ast.Term{keyPath, ast.StringTerm(h.Path)},
		[2]*ast.Term{keyQuery, ast.NewTerm(q)},
	)
}

// parseRequestDecision accepts only the documented shape of
// request_decision.
func parseRequestDecision(v ast.Value) (egress.HTTPDecision, error) {
	var d egress.HTTPDecision
	obj, ok := v.(ast.Object)
	if !ok {
		return d, fmt.Errorf("request_decision is %v, not an object", ast.ValueName(v))
	}
	allow, ok := field(obj, keyAllow).(ast.Boolean)
	if !ok {
		return d, errors.New("request_decision.allow is not a boolean")
	}
	var policyName, rule, reason, enforcement ast.String
	for _, f := range []struct {
		key *ast.Term
		dst *ast.String
	}{{keyPolicy, &policyName}, {keyRule, &rule}, {keyReason, &reason}, {keyEnforcement, &enforcement}} {
		switch x := field(obj, f.key).(type) {
		case nil:
		case ast.String:
			*f.dst = x
		default:
			return d, fmt.Errorf("request_decision.%v is %v, not a string", f.key.Value, ast.ValueName(x))
		}
	}
	switch enforcement {
	case "", policy.EnforcementEnforce:
	case policy.EnforcementAudit:
		d.Audit = true
	default:
		return d, fmt.Errorf("request_decision.enforcement is %q", string(enforcement))
	}
	d.Allow, d.Policy, d.Rule = bool(allow), string(policyName), string(rule)
	if !d.Allow {
		d.Reason = string(reason)
		if d.Reason == "" {
			d.Reason = egress.ReasonL7NoRule
		}
	}
	return d, nil
}

func requestDenyDetail(d egress.HTTPDecision, h egress.HTTPRequest) string {
	req := h.Method + " " + h.Path
	switch d.Reason {
	case egress.ReasonL7DenyRule:
		return fmt.Sprintf("%s matches %s of policy %q", req, d.Rule, d.Policy)
	case egress.ReasonL7NoRule:
		return fmt.Sprintf("no rule of policy %q allows %s", d.Policy, req)
	case egress.ReasonL7NoEndpoint:
		return fmt.Sprintf("no endpoint of policy %q selects the path %s", d.Policy, h.Path)
	}
	return "denied by the policy rules"
}

// NameAllowed reports whether some endpoint's host pattern matches host,
// whatever the port or binary; DNS answers only such names.
func (e *Engine) NameAllowed(host string) bool {
	st := e.st
	host = normaliseHost(host)
	// An address is not a name: a resolver never needs to answer it, and an
	// endpoint written as an IP must not make its text resolvable.
	if _, err := netip.ParseAddr(host); host == "" || err == nil {
		return false
	}
	var buf [8]*endpoint
	cands := st.hostMatches(buf[:0], host)
	if st.nameAllowed == nil {
		return len(cands) > 0
	}
	slices.SortFunc(cands, byRank)
	v, err := eval(context.Background(), st.nameAllowed, input(host, "", 0, egress.Identity{}, cands))
	if err != nil {
		return false
	}
	b, ok := v.(ast.Boolean)
	return ok && bool(b)
}

// eval runs q with input in and returns the rule's value.
func eval(ctx context.Context, q *query, in ast.Value) (ast.Value, error) {
	txn, err := q.store.NewTransaction(ctx)
	if err != nil {
		return nil, fmt.Errorf("evaluating rules: %w", err)
	}
	defer q.store.Abort(ctx, txn)
	// Rules that run long stop when the connection asking is gone; the
	// cancel costs nothing until then.
	cancel := topdown.NewCancel()
	defer context.AfterFunc(ctx, cancel.Cancel)()
	rs, err := topdown.NewQuery(q.body).
		WithQueryCompiler(q.qc).
		WithCompiler(q.compiler).
		WithStore(q.store).
		WithTransaction(txn).
		WithInput(ast.NewTerm(in)).
		WithStrictBuiltinErrors(true).
		WithCancel(cancel).
		Run(ctx)
	if err != nil {
		return nil, fmt.Errorf("evaluating rules: %w", err)
	}
	if len(rs) != 1 || rs[0][q.result] == nil {
		return nil, errors.New("the rules produced no result")
	}
	return rs[0][q.result].Value, nil
}

func engineError(detail string) egress.Decision {
	return egress.Decision{Reason: egress.ReasonEngine, Detail: detail}
}

var normaliseHost = hostpattern.Normalise

// normaliseTarget returns the host name or, for a literal destination, the
// address, unmapped and without zone as allowed_ips are compared. A
// listener that put an address into Host still gets an address decision,
// so that allowed_ips cannot be sidestepped by spelling an IP as a name.
func normaliseTarget(r egress.Request) (host string, addr netip.Addr) {
	host = normaliseHost(r.Host)
	a := r.IP
	if host != "" {
		literal := strings.Trim(host, "[]")
		if !hostpattern.MayBeAddr(literal) {
			return host, netip.Addr{}
		}
		var err error
		if a, err = netip.ParseAddr(literal); err != nil {
			return host, netip.Addr{}
		}
	}
	if !a.IsValid() {
		return "", netip.Addr{}
	}
	return "", a.Unmap().WithZone("")
}

// addrString is an address as the rules and messages see it: "" for none.
func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// Keys are shared between inputs; OPA treats terms as immutable, as its own
// interned terms are.
var (
	keyNetwork     = ast.StringTerm("network")
	keyHost        = ast.StringTerm("host")
	keyIP          = ast.StringTerm("ip")
	keyPort        = ast.StringTerm("port")
	keyExec        = ast.StringTerm("exec")
	keyPath        = ast.StringTerm("path")
	keyAncestors   = ast.StringTerm("ancestors")
	keyCmdline     = ast.StringTerm("cmdline_paths")
	keyPaths       = ast.StringTerm("paths")
	keyCandidates  = ast.StringTerm("candidates")
	keyPolicy      = ast.StringTerm("policy")
	keyEndpoint    = ast.StringTerm("endpoint")
	keyAllow       = ast.StringTerm("allow")
	keyReason      = ast.StringTerm("reason")
	keyAllowedIPs  = ast.StringTerm("allowed_ips")
	keyKey         = ast.StringTerm("key")
	keyHTTP        = ast.StringTerm("http")
	keyMethod      = ast.StringTerm("method")
	keyQuery       = ast.StringTerm("query")
	keyRule        = ast.StringTerm("rule")
	keyEnforcement = ast.StringTerm("enforcement")
)

func input(host, ip string, port int, id egress.Identity, cands []*endpoint) ast.Value {
	c := make([]*ast.Term, len(cands))
	for i, x := range cands {
		c[i] = x.term
	}
	return inputTerms(host, ip, port, id, c)
}

func inputTerms(host, ip string, port int, id egress.Identity, c []*ast.Term) ast.Object {
	bin := ast.StringTerm(id.Binary)
	anc, cmd := stringTerms(id.Ancestors), stringTerms(id.CmdlinePaths)
	// paths shares its terms with the fields it is made of.
	paths := make([]*ast.Term, 0, 1+len(anc)+len(cmd))
	seen := make([]string, 0, cap(paths))
	for _, t := range slices.Concat([]*ast.Term{bin}, anc, cmd) {
		if s := string(t.Value.(ast.String)); s != "" && !slices.Contains(seen, s) && id.Untrusted == "" {
			seen = append(seen, s)
			paths = append(paths, t)
		}
	}
	return ast.NewObject(
		[2]*ast.Term{keyNetwork, ast.ObjectTerm(
			[2]*ast.Term{keyHost, ast.StringTerm(host)},
			[2]*ast.Term{keyIP, ast.StringTerm(ip)},
			[2]*ast.Term{keyPort, ast.IntNumberTerm(port)},
		)},
		[2]*ast.Term{keyExec, ast.ObjectTerm(
			[2]*ast.Term{keyPath, bin},
			[2]*ast.Term{keyAncestors, ast.ArrayTerm(anc...)},
			[2]*ast.Term{keyCmdline, ast.ArrayTerm(cmd...)},
			[2]*ast.Term{keyPaths, ast.ArrayTerm(paths...)},
		)},
		[2]*ast.Term{keyCandidates, ast.ArrayTerm(c...)},
	)
}

func stringTerms(ss []string) []*ast.Term {
	t := make([]*ast.Term, len(ss))
	for i, s := range ss {
		t[i] = ast.StringTerm(s)
	}
	return t
}

// parseDecision accepts only the documented shape, so that rules returning
// anything else deny instead of being half understood.
// The second result is the deciding policy's key in network_policies, if
// the rules report it.
func parseDecision(v ast.Value) (egress.Decision, string, error) {
	var d egress.Decision
	obj, ok := v.(ast.Object)
	if !ok {
		return d, "", fmt.Errorf("decision is %v, not an object", ast.ValueName(v))
	}
	allow, ok := field(obj, keyAllow).(ast.Boolean)
	if !ok {
		return d, "", errors.New("decision.allow is not a boolean")
	}
	var policyName, reason, key ast.String
	for _, f := range []struct {
		key *ast.Term
		dst *ast.String
	}{{keyPolicy, &policyName}, {keyReason, &reason}, {keyKey, &key}} {
		switch x := field(obj, f.key).(type) {
		case nil:
		case ast.String:
			*f.dst = x
		default:
			return d, "", fmt.Errorf("decision.%v is %v, not a string", f.key.Value, ast.ValueName(x))
		}
	}
	switch x := field(obj, keyAllowedIPs).(type) {
	case nil:
	case *ast.Array:
		for i := range x.Len() {
			s, ok := x.Elem(i).Value.(ast.String)
			if !ok {
				return d, "", errors.New("decision.allowed_ips holds a value that is not a string")
			}
			pfx, err := parsePrefix(string(s))
			if err != nil {
				return d, "", fmt.Errorf("decision.allowed_ips: %w", err)
			}
			d.AllowedIPs = append(d.AllowedIPs, pfx)
		}
	default:
		return d, "", fmt.Errorf("decision.allowed_ips is %v, not an array", ast.ValueName(x))
	}
	d.Allow, d.Policy = bool(allow), string(policyName)
	if !d.Allow {
		d.Reason = string(reason)
		if d.Reason == "" {
			d.Reason = egress.ReasonNoPolicy
		}
	}
	return d, string(key), nil
}

func field(obj ast.Object, key *ast.Term) ast.Value {
	if t := obj.Get(key); t != nil {
		return t.Value
	}
	return nil
}

func denyDetail(d egress.Decision, r egress.Request, host string, addr netip.Addr) string {
	target := host
	if target == "" {
		target = addrString(addr)
	}
	if strings.Contains(target, ":") {
		target = "[" + target + "]"
	}
	target = fmt.Sprintf("%s:%d", target, r.Port)
	switch d.Reason {
	case egress.ReasonNoPolicy:
		return "no network policy allows " + target
	case egress.ReasonBinary:
		return fmt.Sprintf("policy %q allows %s but not for %s", d.Policy, target, describeBinary(r.Identity))
	}
	return "denied by the policy rules"
}

func describeBinary(id egress.Identity) string {
	if id.Binary == "" {
		return "an unidentified process"
	}
	s := id.Binary
	if len(id.CmdlinePaths) > 0 {
		s += " (" + strings.Join(id.CmdlinePaths, ", ") + ")"
	}
	if id.Untrusted != "" {
		s += ", which is not the binary it claims: " + id.Untrusted
	}
	return s
}

// parsePrefix reads an allowed_ips entry of the rules' result: an address
// or a CIDR, which user rules may spell either way.
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
