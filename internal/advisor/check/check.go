// Package check validates a proposed policy chunk before anyone is asked
// to approve it, the advisor's and an agent's alike. A chunk passes only
// if it strictly adds network_policies entries, the merged policy loads
// like a user's file, the real decision engine allows the denied requests
// it answers and still refuses unrelated ones, it opens no address corral
// never connects to and no wildcard wider than the names denied. The
// result says what the chunk newly allows and whether a person should
// look twice (broad) or need not (narrow).
package check

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/corral-sandbox/corral/internal/advisor/propose"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/egress/decide"
	"github.com/corral-sandbox/corral/internal/hostpattern"
	"github.com/corral-sandbox/corral/internal/netclass"
	"github.com/corral-sandbox/corral/internal/policy"
	"github.com/corral-sandbox/corral/internal/yamlsafe"
	"gopkg.in/yaml.v3"
)

// Verdict is the outcome of a check.
type Verdict string

// Verdicts.
const (
	// Narrow: L7 method (and path) scope on named hosts for named,
	// non-interpreter binaries.
	Narrow Verdict = "narrow"
	// Broad: valid, but L4, audited, wildcard hosts, bare address ranges,
	// interpreters or any binary; flagged for a person.
	Broad Verdict = "broad"
	// Invalid: never offered.
	Invalid Verdict = "invalid"
)

// Summary is what a chunk newly allows: hosts × ports × binaries ×
// requests.
type Summary struct {
	// Hosts are host names and patterns, and the address ranges of
	// endpoints without a host.
	Hosts []string `json:"hosts"`
	Ports []int    `json:"ports"`
	// Binaries is empty when any binary may connect.
	Binaries []string `json:"binaries"`
	// Requests lists what may be sent: "any traffic" for L4, else
	// methods and path globs.
	Requests   []string `json:"requests"`
	AllowedIPs []string `json:"allowed_ips,omitempty"`
}

// String formats the summary on one line.
func (s Summary) String() string {
	bins := "any binary"
	if len(s.Binaries) > 0 {
		bins = strings.Join(s.Binaries, ", ")
	}
	ports := make([]string, len(s.Ports))
	for i, p := range s.Ports {
		ports[i] = fmt.Sprint(p)
	}
	out := fmt.Sprintf("%s × ports %s × %s × %s", strings.Join(s.Hosts, ", "), strings.Join(ports, ", "), bins, strings.Join(s.Requests, "; "))
	if len(s.AllowedIPs) > 0 {
		out += " (internal addresses: " + strings.Join(s.AllowedIPs, ", ") + ")"
	}
	return out
}

// Result is the outcome of checking one chunk.
type Result struct {
	Verdict Verdict `json:"verdict"`
	// Reason says why the chunk is invalid.
	Reason string `json:"reason,omitempty"`
	// Flags say why the chunk is broad.
	Flags   []string `json:"flags,omitempty"`
	Summary Summary  `json:"summary"`
	// Merged is the current policy with the chunk added, as loaded; nil
	// when the chunk is invalid.
	Merged *policy.Policy `json:"-"`
}

// Options tune a check.
type Options struct {
	// Rules are the sandbox's --policy-rules, nil for the baked-in ones.
	Rules []byte
	// Replace lists network_policies keys the chunk may replace: advisor
	// drafts (NamePrefix) already approved that a refined chunk
	// supersedes. Any other existing key makes the chunk invalid.
	Replace []string
	// Unrelated are further requests that must stay refused unless the
	// current policy already allows them.
	Unrelated []egress.Request
}

// Chunk checks c against the current policy.
func Chunk(ctx context.Context, current *policy.Policy, c propose.Chunk, opts Options) Result {
	return Addition(ctx, current, c.Addition(), c.Wants, opts)
}

func invalid(format string, args ...any) Result {
	return Result{Verdict: Invalid, Reason: fmt.Sprintf(format, args...)}
}

// Addition checks network_policies entries add, answering wants, against
// the current policy.
func Addition(ctx context.Context, current *policy.Policy, add map[string]policy.NetworkPolicy, wants []propose.Want, opts Options) Result {
	if current == nil {
		return invalid("no current policy to add to")
	}
	if len(add) == 0 {
		return invalid("the chunk adds nothing")
	}
	if len(wants) == 0 {
		return invalid("the chunk answers no denied request")
	}
	keys := slices.Sorted(maps.Keys(add))
	for _, k := range keys {
		if _, ok := current.NetworkPolicies[k]; !ok {
			continue
		}
		if !slices.Contains(opts.Replace, k) || !strings.HasPrefix(k, propose.NamePrefix) {
			return invalid("network_policies.%s already exists: a chunk may only add new entries", k)
		}
	}
	for _, k := range keys {
		if r := checkEndpoints(k, add[k], wants); r != "" {
			return invalid("%s", r)
		}
	}
	merged, reason := merge(current, add, keys)
	if reason != "" {
		return invalid("%s", reason)
	}
	now, err := engine(current, opts.Rules)
	if err != nil {
		return invalid("the current policy does not compile: %v", err)
	}
	next, err := engine(merged, opts.Rules)
	if err != nil {
		return invalid("the merged policy does not compile: %v", err)
	}
	for _, w := range wants {
		if r := allows(ctx, next, w); r != "" {
			return invalid("%s", r)
		}
	}
	for _, r := range unrelated(add, opts.Unrelated) {
		if next.Decide(ctx, r).Allow && !now.Decide(ctx, r).Allow {
			return invalid("it would also allow %s for %s, which nothing asked for", r.Target(), binaryName(r.Identity.Binary))
		}
	}
	res := Result{Verdict: Narrow, Merged: merged}
	res.Summary, res.Flags = summarise(add, keys)
	if len(res.Flags) > 0 {
		res.Verdict = Broad
	}
	return res
}

func engine(p *policy.Policy, rules []byte) (*decide.Engine, error) {
	c, err := p.Compile()
	if err != nil {
		return nil, err
	}
	return decide.New(c, rules)
}

// checkEndpoints applies the rules that need no engine: nothing corral
// never connects to, and no host or range wider than the denied ones.
func checkEndpoints(key string, np policy.NetworkPolicy, wants []propose.Want) string {
	var names []string
	var ips []netip.Addr
	var ports []int
	for _, w := range wants {
		ports = append(ports, int(w.Port))
		if ip, err := netip.ParseAddr(w.Host); err == nil {
			ips = append(ips, ip.Unmap())
		} else if h := hostpattern.Normalise(w.Host); !slices.Contains(names, h) {
			names = append(names, h)
		}
	}
	for i, ep := range np.Endpoints {
		at := fmt.Sprintf("network_policies.%s.endpoints[%d]", key, i)
		h := hostpattern.Normalise(ep.Host)
		for _, p := range ep.PortList() {
			if !slices.Contains(ports, p) {
				return fmt.Sprintf("%s: port %d was not denied", at, p)
			}
		}
		if r := neverHost(h); r != "" {
			return fmt.Sprintf("%s.host: %s", at, r)
		}
		for _, s := range ep.AllowedIPs {
			p, err := parsePrefix(s)
			if err != nil {
				return fmt.Sprintf("%s.allowed_ips: %v", at, err)
			}
			if r, ok := netclass.NeverAllowedIn(p); ok {
				return fmt.Sprintf("%s.allowed_ips: %s includes %s addresses (%s), which are never allowed", at, s, r.Class, r.Prefix)
			}
			if h == "" && !slices.ContainsFunc(ips, p.Contains) {
				return fmt.Sprintf("%s.allowed_ips: %s covers none of the denied addresses", at, s)
			}
		}
		if h == "" {
			continue
		}
		if ip, err := netip.ParseAddr(h); err == nil {
			if !slices.Contains(ips, ip.Unmap()) {
				return fmt.Sprintf("%s.host: %s was not denied", at, h)
			}
			continue
		}
		pat, err := hostpattern.Compile(h)
		if err != nil {
			return fmt.Sprintf("%s.host: %v", at, err)
		}
		if !pat.Wildcard() {
			if !slices.Contains(names, h) {
				return fmt.Sprintf("%s.host: %s was not denied", at, h)
			}
			continue
		}
		var matched []string
		for _, n := range names {
			if pat.Match(n) {
				matched = append(matched, n)
			}
		}
		if len(matched) < 2 {
			return fmt.Sprintf("%s.host: the wildcard %s is broader than the denied name(s) %s; name them instead", at, h, strings.Join(matched, ", "))
		}
		if parent := commonParent(matched); pat.Rest != parent || pat.AnyDepth && sameDepth(matched) {
			return fmt.Sprintf("%s.host: the wildcard %s is broader than the denied names %s (their common parent is %s)", at, h, strings.Join(matched, ", "), parent)
		}
	}
	return ""
}

// Names that reach the host or its metadata service without an address
// to check.
var neverNames = []string{"localhost", "metadata", "metadata.google.internal", "instance-data", "instance-data.ec2.internal"}

func neverHost(h string) string {
	if h == "" {
		return ""
	}
	if slices.Contains(neverNames, h) || strings.HasSuffix(h, ".localhost") {
		return fmt.Sprintf("%s names this host or a metadata service, which are never allowed", h)
	}
	if ip, err := netip.ParseAddr(h); err == nil {
		if class, _ := netclass.Classify(ip); netclass.NeverAllowed(class) {
			return fmt.Sprintf("%s is a %s address, which is never allowed", h, class)
		}
	}
	return ""
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		return netip.ParsePrefix(s)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// commonParent returns the labels all names end with.
func commonParent(names []string) string {
	common := strings.Split(names[0], ".")
	for _, n := range names[1:] {
		l := strings.Split(n, ".")
		k := 0
		for k < len(common) && k < len(l) && common[len(common)-1-k] == l[len(l)-1-k] {
			k++
		}
		common = common[len(common)-k:]
	}
	return strings.Join(common, ".")
}

func sameDepth(names []string) bool {
	d := strings.Count(names[0], ".")
	return !slices.ContainsFunc(names, func(n string) bool { return strings.Count(n, ".") != d })
}

// merge adds add to a copy of current and loads the result the way a
// user's policy file is loaded, then makes sure nothing but the added
// keys changed.
func merge(current *policy.Policy, add map[string]policy.NetworkPolicy, keys []string) (*policy.Policy, string) {
	base, err := yaml.Marshal(current)
	if err != nil {
		return nil, fmt.Sprintf("cannot encode the current policy: %v", err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(base, &doc); err != nil {
		return nil, fmt.Sprintf("cannot decode the current policy: %v", err)
	}
	nps, _ := doc["network_policies"].(map[string]any)
	if nps == nil {
		nps = map[string]any{}
	}
	for _, k := range keys {
		nps[k] = add[k]
	}
	doc["network_policies"] = nps
	data, err := yaml.Marshal(doc)
	if err != nil {
		return nil, fmt.Sprintf("cannot encode the merged policy: %v", err)
	}
	merged, err := policy.ParseOnto(data, "advisor check", nil)
	if err != nil {
		return nil, fmt.Sprintf("the merged policy does not load: %v", err)
	}
	for _, w := range merged.Warnings() {
		for _, k := range keys {
			if strings.HasPrefix(w.Path, "network_policies."+k) {
				return nil, fmt.Sprintf("the chunk draws a warning: %s", w)
			}
		}
	}
	if d := current.StaticDiff(merged); len(d) > 0 {
		return nil, fmt.Sprintf("the chunk changes %s, which only network_policies additions may", strings.Join(d, ", "))
	}
	if !sameExcept(current, merged, keys) {
		return nil, "the chunk changes more than the network_policies entries it adds"
	}
	return merged, ""
}

// sameExcept reports whether a and b are equal but for the keys of
// network_policies listed.
func sameExcept(a, b *policy.Policy, keys []string) bool {
	strip := func(p *policy.Policy) []byte {
		c := *p
		c.NetworkPolicies = maps.Clone(p.NetworkPolicies)
		for _, k := range keys {
			delete(c.NetworkPolicies, k)
		}
		if len(c.NetworkPolicies) == 0 {
			c.NetworkPolicies = nil
		}
		// Adding rules turns an unset mode into proxy; StaticDiff has
		// already compared the effective modes.
		c.Network.Mode = ""
		out, err := c.CanonicalJSON()
		if err != nil {
			return nil
		}
		return out
	}
	x, y := strip(a), strip(b)
	return x != nil && bytes.Equal(x, y)
}

// allows says why the engine would still refuse w, or returns "".
func allows(ctx context.Context, e *decide.Engine, w propose.Want) string {
	r := request(w.Host, w.Port, w.Binary)
	d := e.Decide(ctx, r)
	if !d.Allow {
		return fmt.Sprintf("the merged policy still refuses %s for %s: %s", r.Target(), binaryName(w.Binary), d.Reason)
	}
	if w.Method == "" || !d.Inspect {
		return ""
	}
	hd := e.DecideHTTP(ctx, r, egress.HTTPRequest{Method: strings.ToUpper(w.Method), Path: w.Path})
	if !hd.Allow && !hd.Audit {
		return fmt.Sprintf("the merged policy still refuses %s %s on %s: %s", w.Method, w.Path, r.Target(), hd.Reason)
	}
	return ""
}

func request(host string, port uint16, bin string) egress.Request {
	r := egress.Request{Port: port, Identity: egress.Identity{Binary: bin}, Via: egress.ViaTransparent}
	if ip, err := netip.ParseAddr(host); err == nil {
		r.IP = ip.Unmap()
	} else {
		r.Host = hostpattern.Normalise(host)
	}
	return r
}

// Destinations no chunk has reason to open; .invalid can never be a real
// name (RFC 6761) and no valid host pattern covers a whole TLD.
const (
	unrelatedHost   = "advisor-check.invalid"
	unrelatedBinary = "/nonexistent/corral-advisor-check"
)

var unrelatedIPs = []netip.Addr{netip.MustParseAddr("203.0.113.254"), netip.MustParseAddr("10.255.255.254")}

// unrelated returns requests that the chunk has no business allowing:
// another host, another port, another binary, stray addresses.
func unrelated(add map[string]policy.NetworkPolicy, extra []egress.Request) []egress.Request {
	out := slices.Clone(extra)
	for _, np := range add {
		bins := []string{""}
		if len(np.Binaries) > 0 {
			bins = []string{np.Binaries[0].Path}
			out = append(out, request(unrelatedHost, 443, unrelatedBinary))
		}
		for _, ep := range np.Endpoints {
			ports := ep.PortList()
			other := uint16(1)
			for _, p := range []uint16{1, 9, 81, 65535} {
				if !slices.Contains(ports, int(p)) {
					other = p
					break
				}
			}
			for _, b := range bins {
				for _, p := range ports {
					out = append(out, request(unrelatedHost, uint16(p), b))
					for _, ip := range unrelatedIPs {
						out = append(out, request(ip.String(), uint16(p), b))
					}
					if len(np.Binaries) > 0 && ep.Host != "" && !strings.Contains(ep.Host, "*") {
						out = append(out, request(ep.Host, uint16(p), unrelatedBinary))
					}
				}
				if ep.Host != "" && !strings.Contains(ep.Host, "*") {
					out = append(out, request(ep.Host, other, b))
				}
			}
		}
	}
	return out
}

// summarise lists what the addition allows and why a person should look
// at it.
func summarise(add map[string]policy.NetworkPolicy, keys []string) (Summary, []string) {
	var s Summary
	var flags []string
	flag := func(f string) {
		if !slices.Contains(flags, f) {
			flags = append(flags, f)
		}
	}
	addUniq := func(list *[]string, v string) {
		if !slices.Contains(*list, v) {
			*list = append(*list, v)
		}
	}
	for _, k := range keys {
		np := add[k]
		if len(np.Binaries) == 0 {
			flag("any binary may use it")
		}
		for _, b := range np.Binaries {
			addUniq(&s.Binaries, b.Path)
			if strings.ContainsAny(b.Path, "*?[") {
				flag(fmt.Sprintf("binary pattern %s matches many programs", b.Path))
			}
			if propose.IsInterpreter(b.Path) {
				flag(fmt.Sprintf("%s is an interpreter: any script it runs gets this", b.Path))
			}
		}
		for _, ep := range np.Endpoints {
			switch {
			case ep.Host == "":
				for _, ip := range ep.AllowedIPs {
					addUniq(&s.Hosts, ip)
				}
				flag("addresses without a host name")
			case strings.Contains(ep.Host, "*"):
				addUniq(&s.Hosts, ep.Host)
				flag(fmt.Sprintf("wildcard host %s", ep.Host))
			default:
				addUniq(&s.Hosts, hostpattern.Normalise(ep.Host))
			}
			if ep.Host != "" {
				for _, ip := range ep.AllowedIPs {
					addUniq(&s.AllowedIPs, ip)
				}
			}
			for _, p := range ep.PortList() {
				if !slices.Contains(s.Ports, p) {
					s.Ports = append(s.Ports, p)
				}
			}
			for _, r := range requests(ep) {
				addUniq(&s.Requests, r)
			}
			switch {
			case ep.Protocol == "" || ep.TLS == policy.TLSSkip:
				flag("L4: any traffic, no per-request rules")
			case ep.Enforcement == policy.EnforcementAudit:
				flag("audit mode: requests the rules would refuse are forwarded")
			case ep.Access == policy.AccessFull:
				flag("access: full allows every method on every path")
			case slices.ContainsFunc(ep.Rules, func(r policy.L7Rule) bool { return r.Allow.Method == "*" }):
				flag("a rule allows every method")
			}
		}
	}
	slices.Sort(s.Ports)
	return s, flags
}

// requests describes what an endpoint lets through.
func requests(ep policy.Endpoint) []string {
	if ep.Protocol == "" || ep.TLS == policy.TLSSkip {
		return []string{"any traffic"}
	}
	var out []string
	if ep.Enforcement == policy.EnforcementAudit {
		out = append(out, "any request (audited)")
	}
	switch ep.Access {
	case policy.AccessReadOnly:
		out = append(out, "GET, HEAD, OPTIONS on any path")
	case policy.AccessReadWrite:
		out = append(out, "GET, HEAD, OPTIONS, POST, PUT, PATCH on any path")
	case policy.AccessFull:
		out = append(out, "any method on any path")
	}
	for _, r := range ep.Rules {
		out = append(out, strings.ToUpper(r.Allow.Method)+" "+r.Allow.Path)
	}
	return out
}

// ParseAddition reads an agent's proposed addition, written in the
// policy's own shape ({"network_policies": {...}}, YAML or JSON), and
// checks it loads like a user's file. Any other top-level key is an
// error: a proposal may only add network policies.
func ParseAddition(data []byte) (map[string]policy.NetworkPolicy, error) {
	var top map[string]yaml.Node
	if err := yamlsafe.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("parse proposal: %w", err)
	}
	for k := range top {
		if k != "network_policies" {
			return nil, fmt.Errorf("parse proposal: %q is not allowed: a proposal may only add network_policies entries", k)
		}
	}
	nps, ok := top["network_policies"]
	if !ok || len(nps.Content) == 0 {
		return nil, errors.New("parse proposal: no network_policies entries")
	}
	doc, err := yaml.Marshal(map[string]any{"version": policy.SchemaVersion, "extends": policy.ExtendsNone, "network_policies": &nps})
	if err != nil {
		return nil, fmt.Errorf("parse proposal: %w", err)
	}
	p, err := policy.ParseOnto(doc, "proposal", nil)
	if err != nil {
		return nil, fmt.Errorf("parse proposal: %w", err)
	}
	return p.NetworkPolicies, nil
}

// MarshalJSON keeps Merged out and the lists non-null.
func (s Summary) MarshalJSON() ([]byte, error) {
	type plain Summary
	c := plain(s)
	for _, l := range []*[]string{&c.Hosts, &c.Binaries, &c.Requests} {
		if *l == nil {
			*l = []string{}
		}
	}
	if c.Ports == nil {
		c.Ports = []int{}
	}
	return json.Marshal(c)
}

func binaryName(b string) string {
	if b == "" {
		return "any binary"
	}
	return b
}
