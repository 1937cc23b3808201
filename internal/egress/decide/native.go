package decide

import (
	"slices"
	"strings"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/gobwas/glob"
)

// The baked-in rules evaluated in Go. With the baked-in rules a decision
// is a pure function of the compiled policy and the request, and a Rego
// evaluation costs tens of microseconds where this costs well under one;
// OPA stays the engine for a user's --policy-rules, and the reference:
// TestNativeMatchesRego feeds random policies and requests to both and
// demands the same answer. Each function below names the rule it stands
// for in policy.rego.

// binaryMatcher is a grant's binaries: exact paths and globs (gobwas,
// "/" as separator, as glob.match(b, ["/"], p) compiles them).
type binaryMatcher struct {
	any   bool // the grant lists no binaries
	exact []string
	globs []*glob.Pattern
}

func newBinaryMatcher(bins []string) (*binaryMatcher, error) {
	m := &binaryMatcher{any: len(bins) == 0}
	for _, b := range bins {
		m.exact = append(m.exact, b)
		if strings.Contains(b, "*") {
			g, err := glob.Compile(b, '/')
			if err != nil {
				return nil, err
			}
			m.globs = append(m.globs, g)
		}
	}
	return m, nil
}

// allows is binary_allowed(patterns).
func (m *binaryMatcher) allows(paths []string) bool {
	if m.any {
		return true
	}
	for _, p := range paths {
		if slices.Contains(m.exact, p) {
			return true
		}
		for _, g := range m.globs {
			if g.Match(p) {
				return true
			}
		}
	}
	return false
}

// nativeDecision is decision: the first candidate whose grant's binaries
// allow the process decides; otherwise the first candidate's grant
// explains the refusal; without candidates nothing matched.
func nativeDecision(cands []*endpoint, paths []string) (egress.Decision, string) {
	for _, c := range cands {
		if c.binaries.allows(paths) {
			// Shared with the compiled policy, capped so that an append
			// copies: a decision costs no allocation.
			ips := c.target.Prefixes[:len(c.target.Prefixes):len(c.target.Prefixes)]
			return egress.Decision{Allow: true, Policy: c.grant.Name, AllowedIPs: ips}, c.grant.Key
		}
	}
	if len(cands) > 0 {
		return egress.Decision{Policy: cands[0].grant.Name, Reason: egress.ReasonBinary}, ""
	}
	return egress.Decision{Reason: egress.ReasonNoPolicy}, ""
}

// nativeRequestDecision is request_decision over candidates ordered as
// requestCandidates orders them.
func nativeRequestDecision(cands []requestCandidate, paths []string, h egress.HTTPRequest) egress.HTTPDecision {
	for _, c := range cands {
		if !c.e.binaries.allows(paths) {
			continue
		}
		name := c.e.grant.Name
		if c.class == selectorMisses {
			return egress.HTTPDecision{Policy: name, Reason: egress.ReasonL7NoEndpoint}
		}
		return l7Verdict(name, c.e.target, h)
	}
	d, _ := nativeDecision(endpoints(cands), paths)
	return egress.HTTPDecision{Policy: d.Policy, Reason: d.Reason}
}

// l7Verdict is l7_verdict: an endpoint without protocol allows every
// request; otherwise deny rules win over rules, and no matching rule
// denies.
func l7Verdict(name string, t *policy.Target, h egress.HTTPRequest) egress.HTTPDecision {
	if t.Protocol == "" {
		return egress.HTTPDecision{Allow: true, Policy: name}
	}
	audit := t.Enforcement == policy.EnforcementAudit
	if i := firstMatch(t.DenyRules, h, true); i >= 0 {
		return egress.HTTPDecision{Policy: name, Rule: t.DenyRules[i].ID, Reason: egress.ReasonL7DenyRule, Audit: audit}
	}
	if i := firstMatch(t.Rules, h, false); i >= 0 {
		return egress.HTTPDecision{Allow: true, Policy: name, Rule: t.Rules[i].ID, Audit: audit}
	}
	return egress.HTTPDecision{Policy: name, Reason: egress.ReasonL7NoRule, Audit: audit}
}

func firstMatch(rules []policy.HTTPRule, h egress.HTTPRequest, deny bool) int {
	for i := range rules {
		if matchRule(&rules[i], h, deny) {
			return i
		}
	}
	return -1
}

func endpoints(cs []requestCandidate) []*endpoint {
	out := make([]*endpoint, len(cs))
	for i, c := range cs {
		out[i] = c.e
	}
	return out
}
