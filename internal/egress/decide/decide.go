// Package decide is the egress policy decision point: Rego rules over a
// sandbox's network policies, the built-in ones evaluated in Go and a
// user's by OPA.
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
// case. A rule's query matcher counts the values of every name a framework
// may read as the parameter (case aside, a "[]" or "[0]" list suffix): an
// allow rule matches when the exact name is present and all of them
// match, a deny rule when any of them does. Within each policy, candidates whose selector matches come first,
// then those without one, then those whose selector does not match. The
// result is
//
//	request_decision = {"allow": bool, "policy": string, "rule": string, "reason": string, "enforcement": "enforce"|"audit"}
//
// # Evaluation
//
// The baked-in rules are evaluated in Go (native.go), rule for rule, with
// no OPA query prepared at all; OPA evaluates a user's rules (package
// decide/rego, through decide/userrules, so that only the programs that
// link OPA pay for its initialisation). A property test holds the two to
// the same answers on random policies and requests.
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
	"github.com/corral-sandbox/corral/internal/egress/decide/userrules"
	"github.com/corral-sandbox/corral/internal/hostpattern"
	"github.com/corral-sandbox/corral/internal/policy"
)

//go:embed policy.rego
var bakedRules []byte

// BakedRules returns the built-in rules, for users writing their own.
func BakedRules() []byte { return slices.Clone(bakedRules) }

// Engine implements egress.Decider over one compiled policy with the
// baked-in rules or a user's. It is immutable and safe for
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
	if st.rules == nil {
		var paths [8]string
		d, key = nativeDecision(cands, userrules.ExecPaths(paths[:0], r.Identity))
	} else {
		var err error
		in := userrules.Input{Host: host, IP: addrString(addr), Port: int(r.Port), Identity: r.Identity}
		if d, key, err = st.rules.Decision(ctx, in, userCandidates(cands)); err != nil {
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
	if st.rules != nil && !st.rules.DefinesRequest() {
		return egress.HTTPDecision{Reason: egress.ReasonEngine, Detail: "the policy rules define no request_decision"}
	}
	host, addr := normaliseTarget(r)
	var buf [8]*endpoint
	cands := requestCandidates(st.candidates(buf[:0], host, addr, r.Port), h)
	var d egress.HTTPDecision
	if st.rules == nil {
		var paths [8]string
		d = nativeRequestDecision(cands, userrules.ExecPaths(paths[:0], r.Identity), h)
	} else {
		var err error
		in := userrules.Input{Host: host, IP: addrString(addr), Port: int(r.Port), Identity: r.Identity}
		if d, err = st.rules.RequestDecision(ctx, in, userRequestCandidates(cands, h), h); err != nil {
			return egress.HTTPDecision{Reason: egress.ReasonEngine, Detail: err.Error()}
		}
	}
	if !d.Allow {
		d.Detail = requestDenyDetail(d, h)
	}
	return d
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
	if st.rules == nil {
		return len(cands) > 0
	}
	slices.SortFunc(cands, byRank)
	allowed, defined := st.rules.NameAllowed(context.Background(), host, userCandidates(cands))
	if !defined {
		return len(cands) > 0
	}
	return allowed
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
