package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	"github.com/corral-sandbox/corral/internal/hostpattern"
	"github.com/corral-sandbox/corral/internal/inference"
	"github.com/gobwas/glob"
)

// Compiled is a policy's egress and secrets sections parsed once, by the
// same pass that validates them, into the typed form that the decision
// engine, the secrets, the inspector and the advisor read. No consumer
// parses a policy string again, so none can disagree with validation
// about what one means. A Compiled is immutable.
type Compiled struct {
	// Policy is the policy it was compiled from, for the sections read as
	// they are (mode, limits) and for hashing. Consumers must not modify it.
	Policy *Policy
	// SHA256 is Policy.SHA256(), computed once.
	SHA256 string
	// Grants are network_policies plus the network.allow short form (as
	// AllowPolicyName), ordered by name, then key: the order in which
	// decisions consider them.
	Grants []Grant
	// Secrets are the masked secrets' scopes, ordered by name.
	Secrets []SecretScope
	// Inspects is set when some target has a protocol.
	Inspects bool
	// Inference holds the model routes served at inference.local.
	Inference inference.Config
}

// Grant is one network policy: the binaries that may reach its targets.
type Grant struct {
	Key  string // the key in network_policies
	Name string // its name, else its key
	// Binaries are the binary paths and globs as written (cleaned) and,
	// where a symlink is involved, resolved; empty means any binary. A
	// glob uses only * (within a segment) and ** (across segments).
	Binaries []string
	Targets  []Target
}

// Target is one endpoint of a grant.
type Target struct {
	Index int // in the policy's endpoints (or network.allow entries)
	// Host is the host pattern; its Host is "" for an allowed_ips-only
	// endpoint.
	Host     hostpattern.Pattern
	Ports    []int // sorted, without duplicates
	Prefixes []netip.Prefix
	// Protocol, TLS and AllowEncodedSlash are as written; Enforcement has
	// its default applied.
	Protocol, TLS, Enforcement string
	AllowEncodedSlash          bool
	// Selector matches the paths the target's rules apply to; nil when it
	// has no path selector. SelectorGlob is its source ("**" for any).
	Selector     *glob.Pattern
	SelectorGlob string
	// Rules are the allow rules with an access preset expanded; DenyRules
	// the deny rules.
	Rules, DenyRules []HTTPRule
	// PathRule names, as the policy file spells it, the first selector or
	// rule that depends on how a path splits into segments ("" when none):
	// where there is none, an encoded slash cannot move a request past a
	// rule.
	PathRule string
}

// HTTPRule matches requests on an inspected connection.
type HTTPRule struct {
	// ID says where the rule came from: "access: read-only", "rules[2]",
	// "deny_rules[0]".
	ID     string
	Method string // upper case; "*" for any
	// PathGlob is the path glob with "any path" spelt "**"; Path is its
	// compiled form, nil for any path.
	PathGlob string
	Path     *glob.Pattern
	// Query holds, per parameter, the globs a value must match (one of
	// them): every value for an allow rule, any value for a deny rule (see
	// decide); QueryGlobs their sources.
	Query      map[string][]*glob.Pattern
	QueryGlobs map[string][]string
}

// SecretScope is where one masked secret's real value may go.
type SecretScope struct {
	Name    string // the variable the workload sees
	Source  Secret // from_env / from_file / from_gateway, for loading the value
	Hosts   []hostpattern.Pattern
	Headers []string // canonical, the default applied
}

// accessPresets are the methods an access level allows (as OpenShell
// expands them).
var accessPresets = map[string][]string{
	AccessReadOnly:  {"GET", "HEAD", "OPTIONS"},
	AccessReadWrite: {"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH"},
	AccessFull:      {"*"},
}

// Compile validates the policy's network and secrets sections and returns
// them compiled, or a *ValidationError listing every problem in them. It
// does not check the other sections; Validate does.
func (p *Policy) Compile() (*Compiled, error) {
	r := &report{compiled: &Compiled{Policy: p}}
	for _, c := range compiledChecks {
		c(p, r)
	}
	if len(r.errs) > 0 {
		return nil, &ValidationError{Problems: r.errs}
	}
	c := r.compiled
	slices.SortFunc(c.Grants, func(a, b Grant) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.Key, b.Key))
	})
	c.SHA256 = p.SHA256()
	return c, nil
}

// compileGrant adds a grant whose entries passed validation.
func (r *report) compileGrant(g Grant) {
	for _, t := range g.Targets {
		r.compiled.Inspects = r.compiled.Inspects || t.Protocol != ""
	}
	r.compiled.Grants = append(r.compiled.Grants, g)
}

// compileTarget turns an endpoint that passed validation into a target;
// an error here is a disagreement with validation and is reported as a
// problem, so it fails closed.
func compileTarget(i int, at string, ep Endpoint) (Target, error) {
	t := Target{
		Index:             i,
		Ports:             ep.PortList(),
		Protocol:          ep.Protocol,
		TLS:               ep.TLS,
		Enforcement:       cmp.Or(ep.Enforcement, EnforcementEnforce),
		AllowEncodedSlash: ep.AllowEncodedSlash,
		PathRule:          pathRule(at, ep),
	}
	if ep.Host != "" {
		pat, err := hostpattern.Compile(ep.Host)
		if err != nil {
			return t, fmt.Errorf("host: %w", err)
		}
		t.Host = pat
	}
	for _, s := range ep.AllowedIPs {
		pfx, msg, _ := parseIPRange(s)
		if msg != "" {
			return t, fmt.Errorf("allowed_ips: %s", msg)
		}
		t.Prefixes = append(t.Prefixes, pfx)
	}
	if ep.Path != "" {
		t.SelectorGlob = anyPath(ep.Path)
		g, err := glob.Compile(t.SelectorGlob, '/')
		if err != nil {
			return t, fmt.Errorf("path: %w", err)
		}
		t.Selector = g
	}
	for _, m := range accessPresets[ep.Access] {
		t.Rules = append(t.Rules, HTTPRule{ID: "access: " + ep.Access, Method: m, PathGlob: "**"})
	}
	for i, rule := range ep.Rules {
		hr, err := compileHTTPRule(fmt.Sprintf("rules[%d]", i), rule.Allow)
		if err != nil {
			return t, fmt.Errorf("rules[%d].allow: %w", i, err)
		}
		t.Rules = append(t.Rules, hr)
	}
	for i, m := range ep.DenyRules {
		hr, err := compileHTTPRule(fmt.Sprintf("deny_rules[%d]", i), m)
		if err != nil {
			return t, fmt.Errorf("deny_rules[%d]: %w", i, err)
		}
		t.DenyRules = append(t.DenyRules, hr)
	}
	return t, nil
}

func compileHTTPRule(id string, m L7Match) (HTTPRule, error) {
	hr := HTTPRule{ID: id, Method: strings.ToUpper(m.Method), PathGlob: anyPath(m.Path)}
	if hr.PathGlob != "**" {
		g, err := glob.Compile(hr.PathGlob, '/')
		if err != nil {
			return hr, fmt.Errorf("path: %w", err)
		}
		hr.Path = g
	}
	for name, v := range m.Query {
		globs, err := queryGlobList(name, v)
		if err != nil {
			return hr, err
		}
		if hr.Query == nil {
			hr.Query, hr.QueryGlobs = map[string][]*glob.Pattern{}, map[string][]string{}
		}
		for _, s := range globs {
			g, err := glob.Compile(s)
			if err != nil {
				return hr, fmt.Errorf("query %s: %w", name, err)
			}
			hr.Query[name] = append(hr.Query[name], g)
		}
		hr.QueryGlobs[name] = globs
	}
	return hr, nil
}

// queryGlobList turns the two matcher forms (a glob, or {any: [globs]})
// into one: a list of globs.
func queryGlobList(name string, v any) ([]string, error) {
	switch x := v.(type) {
	case string:
		return []string{x}, nil
	case map[string]any:
		list, ok := x[queryAny].([]any)
		if !ok || len(x) != 1 || len(list) == 0 {
			return nil, fmt.Errorf("%s: want a glob or {any: [globs]}", name)
		}
		out := make([]string, 0, len(list))
		for _, g := range list {
			s, ok := g.(string)
			if !ok {
				return nil, fmt.Errorf("%s: any holds %T, not a string", name, g)
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, fmt.Errorf("%s: want a glob or {any: [globs]}, not %T", name, v)
}

// pathRule names the endpoint's first path selector, rule or deny rule
// that matches on a path other than "any path" (access presets match any
// path); "" when there is none.
func pathRule(at string, ep Endpoint) string {
	structured := func(p string) bool {
		switch anyPath(p) {
		case "", "**", "/**":
			return false
		}
		return true
	}
	if structured(ep.Path) {
		return fmt.Sprintf("%s.path (%s)", at, ep.Path)
	}
	for j, r := range ep.Rules {
		if structured(r.Allow.Path) {
			return fmt.Sprintf("%s.rules[%d] (path %s)", at, j, r.Allow.Path)
		}
	}
	for j, r := range ep.DenyRules {
		if structured(r.Path) {
			return fmt.Sprintf("%s.deny_rules[%d] (path %s)", at, j, r.Path)
		}
	}
	return ""
}

// anyPath spells "any path" one way.
func anyPath(p string) string {
	if p == "*" {
		return "**"
	}
	return p
}

// binaryPaths returns the path as written and, when a symlink is involved,
// as resolved. The kernel reports resolved executables, while script paths
// from a command line are often the symlink (/usr/local/bin/claude), so both
// forms must match. A glob keeps its pattern; only its literal directory
// prefix is resolved.
func binaryPaths(p string) ([]string, error) {
	p = filepath.Clean(p)
	out := []string{p}
	star := strings.IndexByte(p, '*')
	if star < 0 {
		if r, err := filepath.EvalSymlinks(p); err == nil && r != p {
			out = append(out, r)
		}
		return out, nil
	}
	// A matcher would read these as glob syntax, which policy authors
	// writing paths do not expect.
	if strings.ContainsAny(p, "?[]{}\\") {
		return nil, fmt.Errorf("binary glob %q may only use * and **", p)
	}
	dir := p[:strings.LastIndexByte(p[:star], '/')]
	if dir != "" {
		if r, err := filepath.EvalSymlinks(dir); err == nil && r != dir {
			out = append(out, filepath.Join(r, p[len(dir):]))
		}
	}
	return out, nil
}
