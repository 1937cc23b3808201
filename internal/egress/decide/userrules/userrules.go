// Package userrules is the seam between the decision index (package
// decide) and the engine that evaluates a user's --policy-rules (package
// decide/rego, OPA). The index and the built-in rules, evaluated in Go,
// are in every corral; OPA is linked only into the program that carries
// it, which registers itself here, because Go initialises every package a
// program links and OPA's initialisation alone is a sizeable part of each
// sandbox's start.
package userrules

import (
	"context"
	"errors"
	"slices"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/policy"
)

// Candidate is an endpoint of the policy that accepts the destination and
// port; candidates reach an Engine in rank order (policy name, key,
// endpoint index).
type Candidate struct {
	Grant  *policy.Grant
	Target *policy.Target
}

// RequestCandidate is a candidate for one request of an inspected
// connection, with what Go matched of it.
type RequestCandidate struct {
	Candidate
	// Applies is set when the endpoint's path selector matches the
	// request, or it has none.
	Applies bool
	// AllowRules and DenyRules index the target's rules and deny rules
	// that match the request, in order.
	AllowRules, DenyRules []int
}

// Input is the connection part of the input document.
type Input struct {
	Host, IP string // host "" for a literal IP; ip "" for a name
	Port     int
	Identity egress.Identity
}

// Engine evaluates one user's rules over one compiled policy. It must be
// safe for concurrent use; any error denies.
type Engine interface {
	// Decision evaluates data.corral.egress.decision; the string is the
	// deciding policy's key when the rules report it.
	Decision(ctx context.Context, in Input, cands []Candidate) (egress.Decision, string, error)
	// RequestDecision evaluates data.corral.egress.request_decision; only
	// called when DefinesRequest.
	RequestDecision(ctx context.Context, in Input, cands []RequestCandidate, h egress.HTTPRequest) (egress.HTTPDecision, error)
	DefinesRequest() bool
	// NameAllowed evaluates data.corral.egress.name_allowed for host with
	// the candidates whose host pattern matches it; defined is false when
	// the rules do not define it.
	NameAllowed(ctx context.Context, host string, cands []Candidate) (allowed, defined bool)
}

// Compiler prepares a user's rules (Rego source) for a compiled policy.
type Compiler func(c *policy.Compiled, rules []byte) (Engine, error)

var compiler Compiler

// Register makes c the engine for users' rules; the package providing
// it calls it from its init.
func Register(c Compiler) { compiler = c }

// Available reports whether this program carries an engine for users'
// rules.
func Available() bool { return compiler != nil }

// ErrUnavailable is returned by Compile in a program that carries no
// engine for users' rules.
var ErrUnavailable = errors.New("this corral program does not carry the engine for --policy-rules (OPA)")

// Compile prepares rules for c with the registered engine.
func Compile(c *policy.Compiled, rules []byte) (Engine, error) {
	if compiler == nil {
		return nil, ErrUnavailable
	}
	return compiler(c, rules)
}

// ExecPaths appends to out input.exec.paths: the executable, its
// ancestors and the scripts on its command line, without empty or repeated
// entries; none for a process whose identity cannot be trusted, so that no
// binary binding matches it.
func ExecPaths(out []string, id egress.Identity) []string {
	if id.Untrusted != "" {
		return out
	}
	add := func(s string) {
		if s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	add(id.Binary)
	for _, s := range id.Ancestors {
		add(s)
	}
	for _, s := range id.CmdlinePaths {
		add(s)
	}
	return out
}
