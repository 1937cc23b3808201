package decide

import (
	"fmt"
	"slices"
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

// Path selector classes, in the order a policy's candidates are offered to
// the rules for a request: a matching selector is more specific than none.
const (
	selectorMatches = iota
	selectorNone
	selectorMisses
)

func (e *endpoint) selectorClass(h egress.HTTPRequest) int {
	switch {
	case e.l7 == nil || e.l7.selector == nil:
		return selectorNone
	case e.l7.selector.Match(h.Path):
		return selectorMatches
	}
	return selectorMisses
}

// requestCandidates are the candidates' objects in a request's input: the
// connection candidate plus what Go matched of its endpoint, each policy's
// ordered by selector class (stable, so rank order within a class).
func requestCandidates(cands []*endpoint, h egress.HTTPRequest) []*ast.Term {
	type cand struct {
		e     *endpoint
		class int
	}
	cs := make([]cand, len(cands))
	for i, e := range cands {
		cs[i] = cand{e, e.selectorClass(h)}
	}
	// Candidates arrive in rank order, so each policy's are contiguous;
	// reorder within each policy only, so the policy that decides is the
	// connection's.
	for start := 0; start < len(cs); {
		end := start + 1
		for end < len(cs) && cs[end].e.key == cs[start].e.key {
			end++
		}
		slices.SortStableFunc(cs[start:end], func(a, b cand) int { return a.class - b.class })
		start = end
	}
	terms := make([]*ast.Term, len(cs))
	for i, c := range cs {
		obj := c.e.term.Value.(ast.Object).Copy()
		obj.Insert(keyApplies, ast.BooleanTerm(c.class != selectorMisses))
		if m := c.e.l7; m != nil {
			obj.Insert(keyAllowRules, matchingIndexes(m.rules, h))
			obj.Insert(keyDenyRules, matchingIndexes(m.deny, h))
		}
		terms[i] = ast.NewTerm(obj)
	}
	return terms
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
	keyApplies    = ast.StringTerm("applies")
	keyAllowRules = ast.StringTerm("matching_rules")
	keyDenyRules  = ast.StringTerm("matching_deny_rules")
)
