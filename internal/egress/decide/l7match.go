package decide

import (
	"slices"

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

// matchRule: the method and path match, and every named query parameter is
// present with every one of its values matching one of the globs, so that
// a repeated parameter cannot smuggle a second, unchecked value.
func matchRule(r *policy.HTTPRule, h egress.HTTPRequest) bool {
	if r.Method != "*" && r.Method != h.Method {
		return false
	}
	if r.Path != nil && !r.Path.Match(h.Path) {
		return false
	}
	for name, globs := range r.Query {
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
			out[i].AllowRules = matchingIndexes(t.Rules, h)
			out[i].DenyRules = matchingIndexes(t.DenyRules, h)
		}
	}
	return out
}

func matchingIndexes(rules []policy.HTTPRule, h egress.HTTPRequest) []int {
	var out []int
	for i := range rules {
		if matchRule(&rules[i], h) {
			out = append(out, i)
		}
	}
	return out
}
