package decide

import (
	"fmt"
	"strings"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/gobwas/glob"
	"github.com/open-policy-agent/opa/v1/ast"
)

// l7Matcher matches requests against one endpoint's path selector and
// rules. Glob matching is Go's part of a request decision for the same
// reason host patterns are on connections: done in Rego it costs several
// times the rest of the decision. The globs are gobwas/glob, the library
// behind Rego's glob.match, compiled with the same separators, so a rule
// means the same whichever side evaluates it.
type l7Matcher struct {
	selector    *glob.Pattern // nil: the endpoint has no path selector
	rules, deny []ruleMatcher
}

type ruleMatcher struct {
	method string        // upper case; "*" for any
	path   *glob.Pattern // nil: any path
	query  map[string][]*glob.Pattern
}

func compileL7(ep policy.Endpoint) (*l7Matcher, error) {
	m := &l7Matcher{}
	var err error
	if ep.Path != "" {
		if m.selector, err = compilePath(ep.Path); err != nil {
			return nil, fmt.Errorf("path: %w", err)
		}
		if m.selector == nil {
			m.selector = glob.MustCompile("**")
		}
	}
	if methods, ok := accessPresets[ep.Access]; ok {
		for _, meth := range methods {
			m.rules = append(m.rules, ruleMatcher{method: meth})
		}
	}
	for i, r := range ep.Rules {
		rm, err := compileRule(r.Allow)
		if err != nil {
			return nil, fmt.Errorf("rules[%d].allow: %w", i, err)
		}
		m.rules = append(m.rules, rm)
	}
	for i, r := range ep.DenyRules {
		rm, err := compileRule(r)
		if err != nil {
			return nil, fmt.Errorf("deny_rules[%d]: %w", i, err)
		}
		m.deny = append(m.deny, rm)
	}
	return m, nil
}

// compilePath returns nil for "any path".
func compilePath(p string) (*glob.Pattern, error) {
	if p = anyPath(p); p == "**" {
		return nil, nil
	}
	return glob.Compile(p, '/')
}

func compileRule(mt policy.L7Match) (ruleMatcher, error) {
	rm := ruleMatcher{method: strings.ToUpper(mt.Method)}
	var err error
	if rm.path, err = compilePath(mt.Path); err != nil {
		return rm, fmt.Errorf("path: %w", err)
	}
	for name, v := range mt.Query {
		globs, err := queryGlobList(name, v)
		if err != nil {
			return rm, err
		}
		for _, g := range globs {
			cg, err := glob.Compile(g)
			if err != nil {
				return rm, fmt.Errorf("query %s: %w", name, err)
			}
			if rm.query == nil {
				rm.query = map[string][]*glob.Pattern{}
			}
			rm.query[name] = append(rm.query[name], cg)
		}
	}
	return rm, nil
}

// match: the method and path match, and every named query parameter is
// present with every one of its values matching one of the globs, so that
// a repeated parameter cannot smuggle a second, unchecked value.
func (r ruleMatcher) match(h egress.HTTPRequest) bool {
	if r.method != "*" && r.method != h.Method {
		return false
	}
	if r.path != nil && !r.path.Match(h.Path) {
		return false
	}
	for name, globs := range r.query {
		values := h.Query[name]
		if len(values) == 0 {
			return false
		}
		for _, v := range values {
			if !matchAny(globs, v) {
				return false
			}
		}
	}
	return true
}

func matchAny(globs []*glob.Pattern, s string) bool {
	for _, g := range globs {
		if g.Match(s) {
			return true
		}
	}
	return false
}

// requestCandidate is a candidate's object in a request's input: the
// connection candidate plus what Go matched of its endpoint.
func (e *endpoint) requestCandidate(h egress.HTTPRequest) *ast.Term {
	obj := e.term.Value.(ast.Object).Copy()
	m := e.l7
	if m == nil {
		return ast.NewTerm(obj)
	}
	obj.Insert(keySelected, ast.BooleanTerm(m.selector != nil && m.selector.Match(h.Path)))
	obj.Insert(keyAllowRules, matchingIndexes(m.rules, h))
	obj.Insert(keyDenyRules, matchingIndexes(m.deny, h))
	return ast.NewTerm(obj)
}

func matchingIndexes(rules []ruleMatcher, h egress.HTTPRequest) *ast.Term {
	var out []*ast.Term
	for i, r := range rules {
		if r.match(h) {
			out = append(out, ast.IntNumberTerm(i))
		}
	}
	return ast.ArrayTerm(out...)
}

var (
	keySelected   = ast.StringTerm("selected")
	keyAllowRules = ast.StringTerm("matching_rules")
	keyDenyRules  = ast.StringTerm("matching_deny_rules")
)
