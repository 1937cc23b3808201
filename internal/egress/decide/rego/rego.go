// Package rego evaluates a user's --policy-rules with OPA's evaluator, as
// package decide documents them (input, data and result documents).
// Importing it registers it with decide/userrules; the programs that do
// are the ones that carry OPA (see internal/fullbin).
package rego

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/topdown"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/decide/userrules"
	"github.com/corral-sandbox/corral/internal/policy"
)

func init() { userrules.Register(compile) }

var (
	packagePath = ast.MustParseRef("data.corral.egress")
	// Rules run in the supervisor, outside the sandbox, on every
	// connection: network I/O there would be slow and would reach places
	// the sandbox itself may not. Rules that call these do not compile.
	unsafeBuiltins = []string{"http.send", "net.lookup_ip_addr"}
)

// unsafeCall is the first call in mod to an unsafe built-in, or nil; the
// compiler, which does not know them, would call it an undefined function.
func unsafeCall(mod *ast.Module) *ast.Term {
	var found *ast.Term
	check := func(op *ast.Term) {
		if found == nil && slices.Contains(unsafeBuiltins, op.String()) {
			found = op
		}
	}
	ast.WalkExprs(mod, func(e *ast.Expr) bool {
		if e.IsCall() {
			check(e.OperatorTerm())
		}
		return false
	})
	ast.WalkTerms(mod, func(t *ast.Term) bool {
		if c, ok := t.Value.(ast.Call); ok && len(c) > 0 {
			check(c[0])
		}
		return false
	})
	return found
}

// capabilities are OPA's own less the unsafe built-ins.
func capabilities() *ast.Capabilities {
	caps := ast.CapabilitiesForThisVersion()
	caps.Builtins = slices.DeleteFunc(caps.Builtins, func(b *ast.Builtin) bool { return slices.Contains(unsafeBuiltins, b.Name) })
	return caps
}

// engine is one user's rules prepared over one policy.
type engine struct {
	decision    *query
	nameAllowed *query // nil: the rules do not define it
	request     *query // nil: the rules do not define it
	// terms are the endpoints' candidate objects, built once and shared by
	// every input that names them.
	terms map[*policy.Target]*ast.Term
}

func compile(c *policy.Compiled, rules []byte) (userrules.Engine, error) {
	e := &engine{terms: map[*policy.Target]*ast.Term{}}
	data := e.data(c)
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
	if op := unsafeCall(mod); op != nil {
		return nil, fmt.Errorf("policy rules: %v: %v is not available: rules run in the supervisor on every connection, so corral leaves out %s",
			op.Location, op, strings.Join(unsafeBuiltins, " and "))
	}
	compiler := ast.NewCompiler().WithCapabilities(capabilities())
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
	if e.decision, err = prepare("decision"); err != nil {
		return nil, err
	}
	if definesRule(mod, "request_decision") {
		if e.request, err = prepare("request_decision"); err != nil {
			return nil, err
		}
	}
	if definesRule(mod, "name_allowed") {
		if e.nameAllowed, err = prepare("name_allowed"); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// query is one rule prepared for evaluation by OPA's evaluator itself: the
// rego package around it links OPA's bundle, planner and WebAssembly
// machinery too.
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
	qc := compiler.QueryCompiler()
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

func (e *engine) DefinesRequest() bool { return e.request != nil }

func (e *engine) Decision(ctx context.Context, in userrules.Input, cands []userrules.Candidate) (egress.Decision, string, error) {
	c := make([]*ast.Term, len(cands))
	for i, x := range cands {
		c[i] = e.terms[x.Target]
	}
	v, err := eval(ctx, e.decision, inputTerms(in, c))
	if err != nil {
		return egress.Decision{}, "", err
	}
	return parseDecision(v)
}

func (e *engine) RequestDecision(ctx context.Context, in userrules.Input, cands []userrules.RequestCandidate, h egress.HTTPRequest) (egress.HTTPDecision, error) {
	if e.request == nil {
		return egress.HTTPDecision{}, errors.New("the policy rules define no request_decision")
	}
	obj := inputTerms(in, e.requestTerms(cands))
	obj.Insert(keyHTTP, httpTerm(h))
	v, err := eval(ctx, e.request, obj)
	if err != nil {
		return egress.HTTPDecision{}, err
	}
	return parseRequestDecision(v)
}

func (e *engine) NameAllowed(ctx context.Context, host string, cands []userrules.Candidate) (bool, bool) {
	if e.nameAllowed == nil {
		return false, false
	}
	c := make([]*ast.Term, len(cands))
	for i, x := range cands {
		c[i] = e.terms[x.Target]
	}
	v, err := eval(ctx, e.nameAllowed, inputTerms(userrules.Input{Host: host}, c))
	if err != nil {
		return false, true
	}
	b, ok := v.(ast.Boolean)
	return ok && bool(b), true
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

// data builds data.network_policies from the policy's grants, which
// arrive in rank order, and records each endpoint's candidate object.
func (e *engine) data(c *policy.Compiled) *ast.Term {
	out := ast.NewObjectWithCapacity(len(c.Grants))
	for gi := range c.Grants {
		g := &c.Grants[gi]
		eps := make([]*ast.Term, len(g.Targets))
		for i := range g.Targets {
			eps[i] = e.endpoint(g, &g.Targets[i])
		}
		out.Insert(ast.StringTerm(g.Key), ast.ObjectTerm(
			[2]*ast.Term{ast.StringTerm("name"), ast.StringTerm(g.Name)},
			[2]*ast.Term{ast.StringTerm("endpoints"), ast.ArrayTerm(eps...)},
			[2]*ast.Term{ast.StringTerm("binaries"), ast.ArrayTerm(stringTerms(g.Binaries)...)},
		))
	}
	return ast.NewTerm(out)
}

// endpoint returns one target's object in the data document.
func (e *engine) endpoint(g *policy.Grant, t *policy.Target) *ast.Term {
	hostRegex := ""
	if t.Host.Host != "" {
		hostRegex = t.Host.Regexp.String()
	}
	cidrs := make([]*ast.Term, len(t.Prefixes))
	for i, p := range t.Prefixes {
		cidrs[i] = ast.StringTerm(p.String())
	}
	e.terms[t] = ast.ObjectTerm(
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

// requestTerms are the candidates' objects in a request's input: the
// connection candidate plus what Go matched of its endpoint.
func (e *engine) requestTerms(cs []userrules.RequestCandidate) []*ast.Term {
	terms := make([]*ast.Term, len(cs))
	for i, c := range cs {
		obj := e.terms[c.Target].Value.(ast.Object).Copy()
		obj.Insert(keyApplies, ast.BooleanTerm(c.Applies))
		if c.Target.Protocol != "" {
			obj.Insert(keyAllowRules, intTerms(c.AllowRules))
			obj.Insert(keyDenyRules, intTerms(c.DenyRules))
		}
		terms[i] = ast.NewTerm(obj)
	}
	return terms
}

func intTerms(is []int) *ast.Term {
	out := make([]*ast.Term, len(is))
	for i, n := range is {
		out[i] = ast.IntNumberTerm(n)
	}
	return ast.ArrayTerm(out...)
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
	keyApplies     = ast.StringTerm("applies")
	keyAllowRules  = ast.StringTerm("matching_rules")
	keyDenyRules   = ast.StringTerm("matching_deny_rules")
)

func inputTerms(in userrules.Input, c []*ast.Term) ast.Object {
	id := in.Identity
	return ast.NewObject(
		[2]*ast.Term{keyNetwork, ast.ObjectTerm(
			[2]*ast.Term{keyHost, ast.StringTerm(in.Host)},
			[2]*ast.Term{keyIP, ast.StringTerm(in.IP)},
			[2]*ast.Term{keyPort, ast.IntNumberTerm(in.Port)},
		)},
		[2]*ast.Term{keyExec, ast.ObjectTerm(
			[2]*ast.Term{keyPath, ast.StringTerm(id.Binary)},
			[2]*ast.Term{keyAncestors, ast.ArrayTerm(stringTerms(id.Ancestors)...)},
			[2]*ast.Term{keyCmdline, ast.ArrayTerm(stringTerms(id.CmdlinePaths)...)},
			[2]*ast.Term{keyPaths, ast.ArrayTerm(stringTerms(userrules.ExecPaths(nil, id))...)},
		)},
		[2]*ast.Term{keyCandidates, ast.ArrayTerm(c...)},
	)
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

func stringTerms(ss []string) []*ast.Term {
	t := make([]*ast.Term, len(ss))
	for i, s := range ss {
		t[i] = ast.StringTerm(s)
	}
	return t
}
