package decide

import (
	"slices"
	"strings"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/decide/userrules"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/gobwas/glob"
)

// Glob matching of requests is Go's part of a request decision for the
// same reason host patterns are on connections: done in Rego it costs
// several times the rest of the decision. The globs are gobwas/glob, the
// library behind Rego's glob.match, compiled by policy with the same
// separators, so a rule means the same whichever side evaluates it.

// matchRule: the method and path match, and so does every named query
// parameter, read so as to err on the side of refusing. For an allow rule
// the parameter is present and every value matches one of the globs, so
// that a repeated parameter cannot smuggle a second, unchecked value. For
// a deny rule one value matching is enough: an upstream may act on
// whichever value it takes (Go the first, PHP the last).
func matchRule(r *policy.HTTPRule, h egress.HTTPRequest, deny bool) bool {
	if r.Method != "*" && r.Method != h.Method {
		return false
	}
	if r.Path != nil && !r.Path.Match(h.Path) {
		return false
	}
	for name, globs := range r.Query {
		if deny {
			if !someValue(h.Query, name, globs, true) {
				return false
			}
		} else if len(h.Query[name]) == 0 || someValue(h.Query, name, globs, false) {
			return false
		}
	}
	return true
}

// someValue reports whether some value of the parameter name matches one
// of the globs (matching) or matches none of them (!matching). The values
// are those of every name a framework may read as this parameter (see
// sameParam), so a deny rule is not dodged by another spelling, and an
// allow rule, which needs the exact name present, checks them all too.
func someValue(query map[string][]string, name string, globs []*glob.Pattern, matching bool) bool {
	for k, values := range query {
		if !sameParam(k, name) {
			continue
		}
		for _, v := range values {
			if matchAny(globs, v) == matching {
				return true
			}
		}
	}
	return false
}

// sameParam reports whether a framework may read the query name k as the
// parameter name: equal ignoring case (ASP.NET), once a list suffix is
// dropped from each (PHP, Rails and Express's qs read "name[]" and
// "name[0]" as name's values).
func sameParam(k, name string) bool {
	return strings.EqualFold(listBase(k), listBase(name))
}

// listBase is name without a trailing "[]" or "[digits]".
func listBase(name string) string {
	i := strings.LastIndexByte(name, '[')
	if i < 0 || !strings.HasSuffix(name, "]") || strings.Trim(name[i+1:len(name)-1], "0123456789") != "" {
		return name
	}
	return name[:i]
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
	switch sel := e.target.Selector; {
	case e.target.Protocol == "" || sel == nil:
		return selectorNone
	case sel.Match(h.Path):
		return selectorMatches
	}
	return selectorMisses
}

// requestCandidate is a connection candidate with how its path selector
// classes the request.
type requestCandidate struct {
	e     *endpoint
	class int
}

// requestCandidates orders a connection's candidates for a request: each
// policy's by selector class (stable, so rank order within a class).
func requestCandidates(cands []*endpoint, h egress.HTTPRequest) []requestCandidate {
	cs := make([]requestCandidate, len(cands))
	for i, e := range cands {
		cs[i] = requestCandidate{e, e.selectorClass(h)}
	}
	// Candidates arrive in rank order, so each policy's are contiguous;
	// reorder within each policy only, so the policy that decides is the
	// connection's.
	for start := 0; start < len(cs); {
		end := start + 1
		for end < len(cs) && cs[end].e.grant == cs[start].e.grant {
			end++
		}
		slices.SortStableFunc(cs[start:end], func(a, b requestCandidate) int { return a.class - b.class })
		start = end
	}
	return cs
}

// userRequestCandidates are cs as a user's rules receive them, with the
// rules of each endpoint that match h.
func userRequestCandidates(cs []requestCandidate, h egress.HTTPRequest) []userrules.RequestCandidate {
	out := make([]userrules.RequestCandidate, len(cs))
	for i, c := range cs {
		out[i] = userrules.RequestCandidate{
			Candidate: userrules.Candidate{Grant: c.e.grant, Target: c.e.target},
			Applies:   c.class != selectorMisses,
		}
		if t := c.e.target; t.Protocol != "" {
			out[i].AllowRules = matchingIndexes(t.Rules, h, false)
			out[i].DenyRules = matchingIndexes(t.DenyRules, h, true)
		}
	}
	return out
}

func matchingIndexes(rules []policy.HTTPRule, h egress.HTTPRequest, deny bool) []int {
	var out []int
	for i := range rules {
		if matchRule(&rules[i], h, deny) {
			out = append(out, i)
		}
	}
	return out
}
