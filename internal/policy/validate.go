package policy

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/internal/netclass"
)

// Problem is one thing wrong with a policy (or worth a warning).
type Problem struct {
	Path    string // dotted field path, e.g. network_policies.github.endpoints[0].host
	Message string // what is wrong
	Fix     string // how to fix it
}

// String formats the problem as "path: message — fix".
func (p Problem) String() string {
	return p.Path + ": " + p.Message + " — " + p.Fix
}

// ValidationError carries every problem found, not just the first, so that
// a user can fix a policy in one round trip.
type ValidationError struct {
	Problems []Problem
}

func (e *ValidationError) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// Validate checks the policy and returns a *ValidationError listing every
// problem, or nil. It does not apply defaults; Parse does that first.
func (p *Policy) Validate() error {
	r := p.check()
	if len(r.errs) == 0 {
		return nil
	}
	return &ValidationError{Problems: r.errs}
}

// Warnings returns the policy's non-fatal problems (unknown HTTP methods,
// L7 rules that cannot take effect, ...). They are recomputed on each call
// rather than stored, so they always match the policy as it is now and stay
// out of the hash and the serialized form.
func (p *Policy) Warnings() []Problem {
	return p.check().warns
}

type report struct {
	errs, warns []Problem
	// compiled collects what the network and secrets checks parsed.
	compiled *Compiled
}

func (r *report) errorf(path, fix, format string, args ...any) {
	r.errs = append(r.errs, Problem{Path: path, Message: fmt.Sprintf(format, args...), Fix: fix})
}

func (r *report) warnf(path, fix, format string, args ...any) {
	r.warns = append(r.warns, Problem{Path: path, Message: fmt.Sprintf(format, args...), Fix: fix})
}

// checks run in order; each appends to the report and none stops the others.
var checks = slices.Concat([]func(p *Policy, r *report){
	checkVersion,
	checkEnums,
	checkFilesystem,
	checkProcess,
	checkLimits,
}, compiledChecks)

// compiledChecks validate the sections that Compile compiles, filling in
// the report's Compiled as they go; secrets come last, as they read the
// compiled endpoints.
var compiledChecks = []func(p *Policy, r *report){
	checkNetworkMode,
	checkNetworkPolicies,
	checkNetworkAllow,
	checkSecrets,
	checkInference,
}

// checkInference validates the model routes, whose own checks name the
// route and field, and compiles them.
func checkInference(p *Policy, r *report) {
	if p.Inference == nil {
		return
	}
	if err := p.Inference.Validate(); err != nil {
		for _, e := range strings.Split(err.Error(), "\n") {
			r.errorf("inference", "each route needs name, base_url and protocols, and takes its key from api_key: {from_env: NAME} or {from_file: PATH}", "%s", e)
		}
		return
	}
	if p.NetworkMode() != ModeProxy && len(p.Inference.Routes) > 0 {
		r.warnf("inference", "use network.mode: proxy (or add a network rule) to serve inference.local", "inference.local is served only in proxy mode")
	}
	r.compiled.Inference = *p.Inference
}

func (p *Policy) check() *report {
	r := &report{compiled: &Compiled{Policy: p}}
	for _, c := range checks {
		c(p, r)
	}
	return r
}

func checkVersion(p *Policy, r *report) {
	switch p.Version {
	case SchemaVersion:
	case 0:
		r.errorf("version", `add "version: 1" at the top of the file`, "missing")
	default:
		r.errorf("version", `set "version: 1"`, "unsupported version %d", p.Version)
	}
}

func checkEnum(r *report, path, value string, allowEmpty bool, allowed ...string) {
	if (value == "" && allowEmpty) || slices.Contains(allowed, value) {
		return
	}
	fix := "use one of: " + strings.Join(allowed, ", ")
	if allowEmpty {
		fix += " (or leave it out)"
	}
	if s := suggest(value, allowed); s != "" {
		fix = fmt.Sprintf("did you mean %q? (%s)", s, fix)
	}
	r.errorf(path, fix, "unknown value %q", value)
}

func checkEnums(p *Policy, r *report) {
	checkEnum(r, "extends", p.Extends, true, ExtendsDefault, ExtendsNone)
	checkEnum(r, "sandbox", p.Sandbox, true, SandboxEnabled, SandboxDisabled)
	checkEnum(r, "landlock.compatibility", p.Landlock.Compatibility, true, LandlockBestEffort, LandlockHardRequirement)
	checkEnum(r, "network.mode", p.Network.Mode, true, ModeBlock, ModeProxy, ModeAllow)
	checkEnum(r, "seccomp", p.Seccomp, true, SeccompDefault, SeccompRelaxed)
	checkEnum(r, "state", p.State, true, StateEphemeral, StateScratch)
	if p.Sandbox == SandboxDisabled {
		r.warnf("sandbox", "remove it to run the command sandboxed", "disabled: the command runs without any confinement")
	}
}

// checkPath validates an absolute path (or glob). It returns "" when the
// path is fine.
func checkPath(p string) (msg, fix string) {
	switch {
	case p == "":
		return "empty path", "give an absolute path such as /usr, or remove the entry"
	case strings.ContainsRune(p, 0):
		return fmt.Sprintf("path %q contains a NUL byte", p), "remove the NUL byte"
	case !filepath.IsAbs(p):
		return fmt.Sprintf("path %q is not absolute", p), fmt.Sprintf("write it as an absolute path starting with /, e.g. %q", "/"+strings.TrimLeft(filepath.Clean(p), "./"))
	case slices.Contains(strings.Split(p, "/"), ".."):
		return fmt.Sprintf("path %q contains a \"..\" component", p), fmt.Sprintf("write the resolved path %q", filepath.Clean(p))
	case filepath.Clean(p) != p:
		return fmt.Sprintf("path %q is not in clean form", p), fmt.Sprintf("write it as %q", filepath.Clean(p))
	}
	return "", ""
}

func checkFilesystem(p *Policy, r *report) {
	fs := p.FilesystemPolicy
	readOnly := map[string]bool{}
	for i, path := range fs.ReadOnly {
		if msg, fix := checkPath(path); msg != "" {
			r.errorf(fmt.Sprintf("filesystem_policy.read_only[%d]", i), fix, "%s", msg)
		}
		readOnly[path] = true
	}
	for i, path := range fs.ReadWrite {
		at := fmt.Sprintf("filesystem_policy.read_write[%d]", i)
		if msg, fix := checkPath(path); msg != "" {
			r.errorf(at, fix, "%s", msg)
		} else if path == "/" {
			r.errorf(at, "list only the directories the agent needs to write", "the root directory cannot be writable")
		}
		if readOnly[path] {
			r.errorf(at, "keep it in one list; read_write already allows reading", "%q is also listed in read_only", path)
		}
	}
	for i, entry := range fs.Home {
		if msg, fix := checkHomeEntry(entry); msg != "" {
			r.errorf(fmt.Sprintf("filesystem_policy.home[%d]", i), fix, "%s", msg)
		}
	}
	if n := len(fs.ReadOnly) + len(fs.ReadWrite); n > MaxPaths {
		r.errorf("filesystem_policy", "list common parent directories instead of individual paths",
			"%d paths in read_only and read_write, more than the limit of %d", n, MaxPaths)
	}
	if n := len(fs.Home); n > MaxPaths {
		r.errorf("filesystem_policy.home", "list common parent directories instead of individual files",
			"%d entries, more than the limit of %d", n, MaxPaths)
	}
}

// checkHomeEntry validates a path relative to the home directory. It must
// stay below the home: the entry names one dotfile, never the whole home.
func checkHomeEntry(e string) (msg, fix string) {
	clean := filepath.Clean(e)
	switch {
	case e == "":
		return "empty path", "give a path relative to your home such as .gitconfig, or remove the entry"
	case strings.ContainsRune(e, 0):
		return fmt.Sprintf("path %q contains a NUL byte", e), "remove the NUL byte"
	case strings.HasPrefix(e, "~"):
		return fmt.Sprintf("path %q starts with ~", e), fmt.Sprintf("entries are relative to your home already: write %q", strings.TrimLeft(strings.TrimPrefix(e, "~"), "/"))
	case filepath.IsAbs(e):
		return fmt.Sprintf("path %q is absolute", e), "write it relative to your home (e.g. .gitconfig), or list an absolute path in read_only"
	case slices.Contains(strings.Split(e, "/"), ".."):
		return fmt.Sprintf("path %q contains a \"..\" component", e), "name a file or directory below your home; list other paths in read_only"
	case clean == ".":
		return "the whole home directory cannot be listed", "list the files and directories the agent needs, e.g. .gitconfig"
	case clean != e:
		return fmt.Sprintf("path %q is not in clean form", e), fmt.Sprintf("write it as %q", clean)
	}
	return "", ""
}

var accountName = regexp.MustCompile(`^[a-z_][a-z0-9_-]*[$]?$`)

func checkProcess(p *Policy, r *report) {
	checkAccount(r, "process.run_as_user", p.Process.RunAsUser, "user", "uid", "1000")
	checkAccount(r, "process.run_as_group", p.Process.RunAsGroup, "group", "gid", "1000")
}

func checkAccount(r *report, path, v, kind, idKind, example string) {
	if v == "" {
		return
	}
	if v == "root" || (isDigits(v) && strings.Trim(v, "0") == "") {
		r.errorf(path, fmt.Sprintf("use an unprivileged %s such as %q", kind, example), "must not be root")
		return
	}
	if isDigits(v) {
		// 4294967295 is (uid_t)-1, which the kernel treats as "no change".
		if n, err := strconv.ParseUint(v, 10, 32); err != nil || n > math.MaxUint32-1 {
			r.errorf(path, "use a number from 1 to 4294967294", "%s %s is out of range", idKind, v)
		}
		return
	}
	if len(v) > 32 || !accountName.MatchString(v) {
		r.errorf(path, fmt.Sprintf("use a lowercase %s name (letters, digits, _ and -, at most 32 characters) or a numeric %s", kind, idKind),
			"invalid %s name %q", kind, v)
	}
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func checkLimits(p *Policy, r *report) {
	l := p.Limits
	if l.Memory != "" {
		n, err := ParseSize(l.Memory)
		switch {
		case err != nil:
			r.errorf("limits.memory", `write a number with a unit, e.g. "512MiB" or "4GiB"`, "%v", err)
		case n < MinMemoryBytes:
			r.errorf("limits.memory", `raise it to at least "16MiB"`, "%q is below the minimum of 16 MiB", l.Memory)
		}
	}
	checkCount(r, "limits.pids", l.Pids, MaxPids, "allow at least 1 process, or remove the limit", "the kernel maximum")
	if l.CPU != nil {
		switch c := *l.CPU; {
		case math.IsNaN(c) || c <= 0:
			r.errorf("limits.cpu", "give a number of cores such as 1 or 0.5, or remove the limit", "%v is not greater than 0", c)
		case c > MaxCPU:
			r.errorf("limits.cpu", "use at most 1024", "%v cores exceed the maximum of %d", c, MaxCPU)
		}
	}
	checkCount(r, "limits.connections", l.Connections, MaxConnections,
		"allow at least 1 connection, or remove the limit for the default of 1024", "the maximum")
	if l.Walltime != "" {
		d, err := time.ParseDuration(l.Walltime)
		switch {
		case err != nil:
			r.errorf("limits.walltime", `write a duration with a unit, e.g. "30m" or "2h"`, "cannot parse duration %q", l.Walltime)
		case d < MinWalltime:
			r.errorf("limits.walltime", `use at least "1s"`, "%q is shorter than 1s", l.Walltime)
		}
	}
}

// checkCount checks an optional count that must lie in 1..most.
func checkCount(r *report, field string, n *int, most int, atLeastOne, mostName string) {
	switch {
	case n == nil:
	case *n < 1:
		r.errorf(field, atLeastOne, "%d is below 1", *n)
	case *n > most:
		r.errorf(field, fmt.Sprintf("use at most %d", most), "%d exceeds %s of %d", *n, mostName, most)
	}
}

func checkNetworkMode(p *Policy, r *report) {
	rules := len(p.NetworkPolicies) + len(p.Network.Allow)
	switch p.Network.Mode {
	case ModeBlock:
		if rules > 0 {
			r.errorf("network.mode", "remove network.mode to get proxy mode, or remove the network rules",
				"block contradicts the network_policies and network.allow rules")
		}
	case ModeAllow:
		if rules > 0 {
			r.warnf("network.mode", "use mode: proxy to enforce the rules, or remove them",
				"allow ignores network_policies and network.allow")
		}
	}
}

func checkNetworkPolicies(p *Policy, r *report) {
	for _, key := range slices.Sorted(maps.Keys(p.NetworkPolicies)) {
		np := p.NetworkPolicies[key]
		at := joinPath("network_policies", key)
		if key == "" {
			r.errorf(at, "give the policy a name", "empty policy name")
		}
		if key == AllowPolicyName || np.Name == AllowPolicyName {
			r.errorf(at, "choose another name", "the name %q is reserved for the network.allow short form", AllowPolicyName)
		}
		if len(np.Endpoints) == 0 {
			r.warnf(at, "add endpoints or remove the policy", "no endpoints, so the policy allows nothing")
		}
		g := Grant{Key: key, Name: cmp.Or(np.Name, key)}
		for i, ep := range np.Endpoints {
			g.Targets = checkEndpoint(r, g.Targets, i, fmt.Sprintf("%s.endpoints[%d]", at, i), ep)
		}
		for i, b := range np.Binaries {
			bat := fmt.Sprintf("%s.binaries[%d].path", at, i)
			if b.Path == "" {
				r.errorf(bat, "give an absolute path or glob such as /usr/bin/curl", "missing")
				continue
			}
			if msg, fix := checkPath(b.Path); msg != "" {
				r.errorf(bat, fix, "%s", msg)
				continue
			}
			paths, err := binaryPaths(b.Path)
			if err != nil {
				r.errorf(bat, "use * to match within a path segment and ** across segments", "%v", err)
			}
			for _, s := range paths {
				if !slices.Contains(g.Binaries, s) {
					g.Binaries = append(g.Binaries, s)
				}
			}
		}
		r.compileGrant(g)
	}
}

// checkEndpoint validates the endpoint and, when it is valid, appends its
// compiled form to targets.
func checkEndpoint(r *report, targets []Target, i int, at string, ep Endpoint) []Target {
	before := len(r.errs)
	checkEndpointFields(r, at, ep)
	if len(r.errs) > before {
		return targets
	}
	t, err := compileTarget(i, at, ep)
	if err != nil {
		r.errorf(at, "report this policy to corral's developers: validation accepted what the compiler refuses", "%v", err)
		return targets
	}
	return append(targets, t)
}

func checkEndpointFields(r *report, at string, ep Endpoint) {
	if ep.Host == "" && len(ep.AllowedIPs) == 0 {
		r.errorf(at, `add host: api.example.com or allowed_ips: ["10.0.0.0/8"]`, "needs host or allowed_ips")
	}
	if ep.Host != "" {
		if msg, fix := checkHost(ep.Host); msg != "" {
			r.errorf(at+".host", fix, "%s", msg)
		}
	}
	for i, s := range ep.AllowedIPs {
		if _, msg, fix := parseIPRange(s); msg != "" {
			r.errorf(fmt.Sprintf("%s.allowed_ips[%d]", at, i), fix, "%s", msg)
		}
	}
	if ep.Port == 0 && len(ep.Ports) == 0 {
		r.errorf(at, "add port: 443 or ports: [80, 443]", "no port")
	}
	if ep.Port != 0 && !validPort(ep.Port) {
		r.errorf(at+".port", "use a port from 1 to 65535", "port %d is out of range", ep.Port)
	}
	for i, n := range ep.Ports {
		if !validPort(n) {
			r.errorf(fmt.Sprintf("%s.ports[%d]", at, i), "use a port from 1 to 65535", "port %d is out of range", n)
		}
	}
	checkEnum(r, at+".protocol", ep.Protocol, true, ProtocolREST)
	checkEnum(r, at+".tls", ep.TLS, true, TLSTerminate, TLSPassthrough, TLSSkip)
	checkEnum(r, at+".enforcement", ep.Enforcement, true, EnforcementEnforce, EnforcementAudit)
	checkEnum(r, at+".access", ep.Access, true, AccessReadOnly, AccessReadWrite, AccessFull)
	checkL7(r, at, ep)
}

func validPort(n int) bool { return n >= 1 && n <= 65535 }

// checkL7 follows OpenShell's L7 validation: contradictions and rule sets
// that would deny everything are errors; rules that cannot take effect are
// warnings.
func checkL7(r *report, at string, ep Endpoint) {
	if ep.Rules != nil && ep.Access != "" {
		r.errorf(at, "keep one of them; access is shorthand for a set of rules", "rules and access are both set")
	}
	if ep.Protocol != "" && ep.Rules == nil && ep.Access == "" {
		r.errorf(at+".protocol", "add access: read-only (or read-write, full) or a rules list", "protocol %q needs rules or access", ep.Protocol)
	}
	if ep.TLS == TLSTerminate && ep.Protocol == "" {
		r.errorf(at+".tls", "add protocol: rest, or remove tls: terminate", "terminate needs a protocol")
	}
	if ep.Rules != nil && len(ep.Rules) == 0 {
		r.errorf(at+".rules", "add rules, use access instead, or remove rules", "an empty rules list would deny every request")
	}
	if ep.Protocol == "" && (ep.Rules != nil || ep.Access != "" || len(ep.DenyRules) > 0) {
		r.warnf(at, "add protocol: rest", "L7 rules have no effect without protocol")
	}
	// Unset tls terminates what looks like TLS; only the explicit opt-outs
	// leave HTTPS requests unchecked.
	if ep.Protocol == ProtocolREST && (ep.TLS == TLSPassthrough || ep.TLS == TLSSkip) && slices.Contains(ep.PortList(), 443) {
		r.warnf(at+".tls", "use tls: terminate (or leave tls unset)", "protocol rest on port 443 with tls: %s cannot inspect encrypted requests", ep.TLS)
	}
	checkPathSelector(r, at, ep)
	for i, rule := range ep.Rules {
		checkMatch(r, fmt.Sprintf("%s.rules[%d].allow", at, i), rule.Allow)
	}
	for i, m := range ep.DenyRules {
		checkMatch(r, fmt.Sprintf("%s.deny_rules[%d]", at, i), m)
	}
}

var knownMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE", "*"}

func checkMatch(r *report, at string, m L7Match) {
	switch {
	case m.Method == "":
		r.errorf(at+".method", "use an HTTP method such as GET, or * for any", "missing")
	case !slices.Contains(knownMethods, strings.ToUpper(m.Method)):
		r.warnf(at+".method", "use one of: "+strings.Join(knownMethods, ", "), "unknown HTTP method %q", m.Method)
	}
	switch {
	case m.Path == "":
		r.errorf(at+".path", `use a glob such as "/repos/**", or "**" for any path`, "missing")
	case !strings.HasPrefix(m.Path, "/") && m.Path != "*" && m.Path != "**":
		r.errorf(at+".path", fmt.Sprintf("write it as %q", "/"+m.Path), "path %q does not start with /", m.Path)
	default:
		if msg, fix := checkGlob(m.Path, false); msg != "" {
			r.errorf(at+".path", fix, "%s", msg)
		}
	}
	checkQuery(r, at+".query", m.Query)
}

// checkNetworkAllow validates the short form and compiles it into a grant
// for any binary, named AllowPolicyName.
func checkNetworkAllow(p *Policy, r *report) {
	g := Grant{Key: AllowPolicyName, Name: AllowPolicyName}
	for i, s := range p.Network.Allow {
		at := fmt.Sprintf("network.allow[%d]", i)
		ep, msg, fix := parseAllow(s)
		if msg != "" {
			r.errorf(at, fix, "%s", msg)
			continue
		}
		g.Targets = checkEndpoint(r, g.Targets, len(g.Targets), at, ep)
	}
	if len(g.Targets) > 0 {
		r.compileGrant(g)
	}
}

var hostLabel = regexp.MustCompile(`^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?$`)

// checkHost validates a host name or pattern. Wildcards are limited to the
// leftmost label and must leave at least a registrable-looking domain
// (two labels) to their right, so that a pattern cannot cover a TLD.
func checkHost(h string) (msg, fix string) {
	h = strings.ToLower(h)
	const unrestricted = "name the domain, e.g. *.example.com; use network.mode: allow for unrestricted access"
	switch {
	case len(h) > 253:
		return "host name is longer than 253 characters", "shorten it"
	case strings.Contains(h, "://"):
		return fmt.Sprintf("%q is a URL, not a host", h), "write only the host name, e.g. api.example.com"
	case strings.Contains(h, "/"):
		return fmt.Sprintf("%q contains a path", h), "write only the host name; restrict paths with rules"
	case strings.Contains(h, ":"):
		if _, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
			return fmt.Sprintf("%q is an IPv6 address", h), "list IP addresses in allowed_ips"
		}
		return fmt.Sprintf("%q contains a port", h), "write the port in port: or ports:"
	case h == "*" || h == "**":
		return fmt.Sprintf("%q matches every host", h), unrestricted
	case h == "localhost" || strings.HasSuffix(h, ".localhost"):
		return fmt.Sprintf("%q is a loopback name", h), forbiddenFix
	case strings.HasSuffix(h, "."):
		return fmt.Sprintf("%q ends with a dot", h), fmt.Sprintf("write it as %q", strings.TrimRight(h, "."))
	}
	if a, err := netip.ParseAddr(h); err == nil {
		if r, ok := netclass.NeverAllowedIn(netip.PrefixFrom(a, a.BitLen())); ok {
			class, why := neverAllowed(r)
			return fmt.Sprintf("%q is a %s address %s", h, class, why), forbiddenFix
		}
		return "", ""
	}
	if strings.Trim(h, "0123456789.") == "" {
		return fmt.Sprintf("%q is not a valid IPv4 address", h), "fix the address, or list it in allowed_ips"
	}
	labels := strings.Split(h, ".")
	for i, l := range labels {
		switch {
		case l == "":
			return fmt.Sprintf("%q has an empty label", h), "remove the extra dot"
		case len(l) > 63:
			return fmt.Sprintf("%q has a label longer than 63 characters", h), "shorten the label"
		case strings.Contains(l, "*"):
			if i != 0 {
				return fmt.Sprintf("%q has a wildcard outside the leftmost label", h), "use a wildcard only in the first label, e.g. *.example.com"
			}
			if l != "**" && strings.Contains(l, "**") {
				return fmt.Sprintf("%q uses ** inside a label", h), "use **. as the whole first label, or a single * inside it"
			}
			if len(labels) < 3 {
				return fmt.Sprintf("%q covers a whole top-level domain", h), unrestricted
			}
			if l != "*" && l != "**" && !hostLabel.MatchString(strings.ReplaceAll(l, "*", "x")) {
				return fmt.Sprintf("%q has invalid characters in %q", h, l), "use letters, digits, hyphens and dots"
			}
		case !hostLabel.MatchString(l):
			return fmt.Sprintf("%q has invalid characters in %q", h, l), "use letters, digits, hyphens and dots; labels cannot start or end with a hyphen"
		}
	}
	return "", ""
}

const forbiddenFix = "list only the ranges you need; loopback, link-local, cloud metadata and corral's own synthetic and capture addresses are never reachable from the sandbox"

// neverAllowed returns the class of r as users read it, and the block it
// covers with why the dialer refuses those addresses whatever the policy
// says.
func neverAllowed(r netclass.Range) (class, why string) {
	block := r.Prefix.String()
	if r.Form != "" {
		block = fmt.Sprintf("%s, the %s form of %s", r.Prefix, r.Form, r.Of)
	}
	return strings.ReplaceAll(string(r.Class), "_", "-"),
		fmt.Sprintf("(%s); corral never connects to those, whatever allowed_ips say: %s", block, netclass.Reason(r.Class))
}

// parseIPRange parses an IP or CIDR and rejects any that overlaps addresses
// the dialer never connects to: the entry would promise what the dialer
// refuses, and a wide one (0.0.0.0/0) reads as if it opened them.
func parseIPRange(s string) (p netip.Prefix, msg, fix string) {
	const example = `write it like "10.0.0.0/8" or "192.0.2.10"`
	var err error
	if strings.Contains(s, "/") {
		p, err = netip.ParsePrefix(s)
	} else {
		var a netip.Addr
		if a, err = netip.ParseAddr(s); err == nil {
			if a.Zone() != "" {
				return p, fmt.Sprintf("%q has an IPv6 zone", s), "remove the %zone suffix"
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
	}
	if err != nil {
		return p, fmt.Sprintf("%q is not an IP address or CIDR", s), example
	}
	if m := p.Masked(); m != p {
		return p, fmt.Sprintf("%q has bits set after the /%d prefix", s, p.Bits()), fmt.Sprintf("write it as %q", m.String())
	}
	if r, ok := netclass.NeverAllowedIn(p); ok {
		class, why := neverAllowed(r)
		return p, fmt.Sprintf("%q includes %s addresses %s", s, class, why), forbiddenFix
	}
	return p, "", ""
}
