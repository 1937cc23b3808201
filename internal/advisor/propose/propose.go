// Package propose turns aggregated denials into policy chunks: the
// smallest network_policies addition that would have allowed them, with
// a rationale, security notes and a confidence a person can judge. The
// Analyser interface is the seam where a model-backed analyser plugs in;
// Mechanistic is the rule-based one that needs no model.
package propose

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/corral-sandbox/corral/internal/advisor/aggregate"
	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/netclass"
	"github.com/corral-sandbox/corral/internal/policy"
	"gopkg.in/yaml.v3"
)

// Stage says how much a chunk knows: StageInitial is built from the
// denial alone; StageRefined from the HTTP requests seen while the host
// was audited, and supersedes the initial chunk for the same name.
type Stage int

// Stages.
const (
	StageInitial Stage = 1
	StageRefined Stage = 2
)

// Authors.
const (
	AuthorAdvisor = "advisor"
	AuthorAgent   = "agent"
)

// NamePrefix starts the network_policies key of every advisor chunk.
const NamePrefix = "draft_"

// DefaultMinSamples is how many HTTP requests a key needs before a
// refined chunk is proposed without being asked for.
const DefaultMinSamples = 5

// Want is one request a chunk must allow: a denied connection, or (with
// Method and Path) a request seen on it.
type Want struct {
	// Host is a name or a literal IP.
	Host   string `json:"host"`
	Port   uint16 `json:"port"`
	Binary string `json:"binary,omitempty"`
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
}

// Chunk is one proposed addition to network_policies.
type Chunk struct {
	// ID is the chunk's content fingerprint: proposing the same addition
	// again gives the same ID.
	ID string `json:"id"`
	// Name is the network_policies key the chunk adds.
	Name          string               `json:"name"`
	Policy        policy.NetworkPolicy `json:"policy"`
	Rationale     string               `json:"rationale"`
	SecurityNotes []string             `json:"security_notes,omitempty"`
	// Confidence is how sure the analyser is that the chunk is what the
	// workload needs, from 0 to 1.
	Confidence float64         `json:"confidence"`
	Denials    []aggregate.Key `json:"denials"`
	Wants      []Want          `json:"wants"`
	Stage      Stage           `json:"stage"`
	Author     string          `json:"author"`
	// Intent is an agent's own summary of why it needs the addition.
	Intent string `json:"intent,omitempty"`
}

// Addition returns the chunk as the network_policies entries it adds.
func (c Chunk) Addition() map[string]policy.NetworkPolicy {
	return map[string]policy.NetworkPolicy{c.Name: c.Policy}
}

// YAML returns the addition in the policy file's own shape.
func (c Chunk) YAML() ([]byte, error) {
	out, err := yaml.Marshal(map[string]any{"network_policies": c.Addition()})
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %w", c.ID, err)
	}
	return out, nil
}

// Fingerprint returns the ID a chunk with this content gets.
func Fingerprint(name string, np policy.NetworkPolicy, stage Stage, author string) string {
	b, _ := json.Marshal(struct {
		N string
		P policy.NetworkPolicy
		S Stage
		A string
	}{name, np, stage, author})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:5])
}

// Observation is what an analyser is given for one key.
type Observation struct {
	Entry aggregate.Entry
	// Refine asks for a refined chunk whatever the number of samples
	// (`corral draft refine`).
	Refine bool
}

// Analyser proposes chunks for observations. It may group several
// observations into one chunk; every chunk lists the keys it answers.
// Chunks are proposals only: the caller validates them (package check)
// and a person approves them.
type Analyser interface {
	Propose(ctx context.Context, obs []Observation) ([]Chunk, error)
}

// Mechanistic proposes one chunk per key by rule, without a model.
type Mechanistic struct {
	// TrustedCIDRs replace per-address /32s in allowed_ips for internal
	// addresses they cover (--trusted-cidr).
	TrustedCIDRs []netip.Prefix
	// MinSamples is DefaultMinSamples when zero.
	MinSamples int
}

var _ Analyser = (*Mechanistic)(nil)

// HTTPPorts are inspected by default: their traffic is HTTP or HTTPS
// often enough that an audited L7 endpoint is the better first step.
var HTTPPorts = []uint16{80, 443, 8080, 8443}

// Propose returns a chunk for each observation that can have one:
// nothing for a destination corral never connects to.
func (m *Mechanistic) Propose(ctx context.Context, obs []Observation) ([]Chunk, error) {
	var out []Chunk
	for _, o := range obs {
		if err := ctx.Err(); err != nil {
			return out, fmt.Errorf("propose: %w", err)
		}
		if c, ok := m.propose(o); ok {
			out = append(out, c)
		}
	}
	return out, nil
}

// Unfixable are deny reasons that no policy addition answers: the
// process is not what it claims, the client lied about its destination,
// the supervisor is out of room, the request is malformed. Proposing a
// chunk for them would only widen the policy for an attacker.
var Unfixable = []string{
	egress.ReasonIntegrity, egress.ReasonIdentityExited, egress.ReasonSNIMismatch, egress.ReasonHostMismatch,
	egress.ReasonEngine, egress.ReasonConnLimit, egress.ReasonFDReserve, egress.ReasonL7BadPath, egress.ReasonL7BadQuery,
	egress.ReasonL7Upgrade,
}

func (m *Mechanistic) propose(o Observation) (Chunk, bool) {
	e := o.Entry
	if slices.Contains(Unfixable, e.Reason) {
		return Chunk{}, false
	}
	c := Chunk{Author: AuthorAdvisor, Stage: StageInitial, Denials: append([]aggregate.Key{e.Key}, e.Absorbed...)}
	var ep policy.Endpoint
	var notes []string
	port := e.Port
	guessed := port == 0
	if guessed {
		port = 443
		notes = append(notes, "only a refused DNS lookup was seen, so port 443 is a guess")
	}
	if ip, err := netip.ParseAddr(e.Host); err == nil {
		ip = ip.Unmap()
		class, internal := netclass.Classify(ip)
		if netclass.NeverAllowed(class) {
			return Chunk{}, false
		}
		ep.AllowedIPs = []string{m.cover(ip)}
		if internal {
			notes = append(notes, fmt.Sprintf("%s is a %s address", ip, strings.ReplaceAll(string(class), "_", "-")))
		}
		notes = append(notes, "the destination is an IP address, not a name")
	} else {
		ep.Host = e.Host
		ips, extra, ok := m.resolved(e)
		if !ok {
			return Chunk{}, false
		}
		ep.AllowedIPs = ips
		notes = append(notes, extra...)
	}
	ep.Port = int(port)
	http := e.Proto != "" || slices.Contains(HTTPPorts, port)
	var rationale string
	minSamples := m.MinSamples
	if minSamples == 0 {
		minSamples = DefaultMinSamples
	}
	switch {
	case http && len(e.Samples) > 0 && (o.Refine || e.Requests >= uint64(minSamples)):
		c.Stage = StageRefined
		rationale = refine(&ep, e)
		c.Confidence = min(0.9, 0.6+float64(e.Requests)/200)
		for _, s := range e.Samples {
			c.Wants = append(c.Wants, Want{Host: e.Host, Port: port, Binary: e.Binary, Method: s.Method, Path: s.Path})
		}
	case http:
		ep.Protocol = policy.ProtocolREST
		if e.Proto == "tls" || port == 443 || port == 8443 {
			ep.TLS = policy.TLSTerminate
		}
		ep.Enforcement = policy.EnforcementAudit
		ep.Access = policy.AccessReadOnly
		rationale = fmt.Sprintf("%s was refused %s. This lets it connect with every HTTP request inspected and logged: reads are allowed, and anything else is forwarded but recorded as would-deny, so that a refined chunk can later allow just the requests seen.",
			describe(e.Binary), target(e.Host, port))
		c.Confidence = 0.6
		notes = append(notes, "audit mode: until a refined chunk replaces it, requests of any method are forwarded")
	default:
		rationale = fmt.Sprintf("%s was refused %s, a port that does not carry HTTP, so only the connection itself can be allowed (no per-request rules).",
			describe(e.Binary), target(e.Host, port))
		c.Confidence = 0.7
	}
	c.Wants = append([]Want{{Host: e.Host, Port: port, Binary: e.Binary}}, c.Wants...)
	if guessed {
		c.Confidence = 0.3
	}
	np := policy.NetworkPolicy{Endpoints: []policy.Endpoint{ep}}
	if e.Binary != "" {
		np.Binaries = []policy.Binary{{Path: e.Binary}}
		if IsInterpreter(e.Binary) {
			notes = append(notes, fmt.Sprintf("%s is an interpreter: any script it runs gets this access", e.Binary))
			c.Confidence -= 0.1
		}
	} else {
		notes = append(notes, "any binary: the denied process was not identified, so every program in the sandbox gets this access")
		c.Confidence -= 0.2
	}
	if e.Count > 0 {
		rationale += fmt.Sprintf(" Seen %d times between %s and %s.", e.Count, e.FirstSeen.UTC().Format("15:04:05"), e.LastSeen.UTC().Format("15:04:05"))
	}
	c.Confidence = max(c.Confidence, 0.05)
	c.Name = Name(e.Host, port, e.Binary)
	c.Policy = np
	c.Rationale = rationale
	c.SecurityNotes = notes
	c.ID = Fingerprint(c.Name, np, c.Stage, c.Author)
	return c, true
}

// resolved turns the probe's addresses into allowed_ips and notes. It
// reports false when every address is one corral never connects to.
func (m *Mechanistic) resolved(e aggregate.Entry) (ips, notes []string, ok bool) {
	var private, never []string
	for _, ip := range e.Probe.Addrs {
		ip = ip.Unmap()
		class, internal := netclass.Classify(ip)
		switch {
		case netclass.NeverAllowed(class):
			never = append(never, ip.String())
		case internal:
			private = append(private, ip.String())
			if c := m.cover(ip); !slices.Contains(ips, c) {
				ips = append(ips, c)
			}
		}
	}
	if len(never) > 0 && len(never) == len(e.Probe.Addrs) {
		return nil, nil, false
	}
	if len(private) > 0 {
		notes = append(notes, fmt.Sprintf("resolves to a private address (%s)", strings.Join(private, ", ")))
	}
	if len(never) > 0 {
		notes = append(notes, fmt.Sprintf("also resolves to %s, which corral never connects to", strings.Join(never, ", ")))
	}
	if !e.Probe.Done {
		notes = append(notes, "not resolved yet: if the name turns out to be internal, the connection will still be refused")
	}
	return ips, notes, true
}

// cover returns the trusted CIDR holding ip, or ip's own /32 (/128).
func (m *Mechanistic) cover(ip netip.Addr) string {
	for _, p := range m.TrustedCIDRs {
		if p.Contains(ip) {
			return p.Masked().String()
		}
	}
	return netip.PrefixFrom(ip, ip.BitLen()).String()
}

var (
	readOnly  = []string{"GET", "HEAD", "OPTIONS"}
	readWrite = []string{"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH"}
)

// refine fills ep's L7 rules from the entry's samples and returns the
// rationale: an access preset when the methods seen fit one, else a rule
// per method and generalised path seen.
func refine(ep *policy.Endpoint, e aggregate.Entry) string {
	ep.Protocol = policy.ProtocolREST
	if e.Proto == "tls" || e.Port == 443 || e.Port == 8443 {
		ep.TLS = policy.TLSTerminate
	}
	var methods []string
	for _, s := range e.Samples {
		if m := strings.ToUpper(s.Method); !slices.Contains(methods, m) {
			methods = append(methods, m)
		}
	}
	slices.Sort(methods)
	seen := fmt.Sprintf("%d requests to %s using %s", e.Requests, target(e.Host, e.Port), strings.Join(methods, ", "))
	subset := func(set []string) bool {
		return !slices.ContainsFunc(methods, func(m string) bool { return !slices.Contains(set, m) })
	}
	switch {
	case subset(readOnly):
		ep.Access = policy.AccessReadOnly
		return fmt.Sprintf("%s made %s: all reads, so the read-only preset (GET, HEAD, OPTIONS on any path) covers them.", describe(e.Binary), seen)
	case subset(readWrite):
		ep.Access = policy.AccessReadWrite
		return fmt.Sprintf("%s made %s, so the read-write preset (GET, HEAD, OPTIONS, POST, PUT, PATCH on any path; no DELETE) covers them.", describe(e.Binary), seen)
	}
	type rule struct{ method, path string }
	var rules []rule
	for _, s := range e.Samples {
		r := rule{strings.ToUpper(s.Method), Generalise(s.Path)}
		if !slices.Contains(rules, r) {
			rules = append(rules, r)
		}
	}
	slices.SortFunc(rules, func(a, b rule) int {
		return strings.Compare(a.path+" "+a.method, b.path+" "+b.method)
	})
	for _, r := range rules {
		ep.Rules = append(ep.Rules, policy.L7Rule{Allow: policy.L7Match{Method: r.method, Path: r.path}})
	}
	return fmt.Sprintf("%s made %s, more than any preset allows without DELETE or other methods on every path, so each method is allowed only on the paths seen, with ids written as *.", describe(e.Binary), seen)
}

// Character sets of id segments. Tested with strings.Trim rather than
// regular expressions: compiling those was a package initialisation
// every corral start paid, proposing or not.
const (
	hexDigits  = "0123456789abcdefABCDEF"
	tokenChars = hexDigits + "ghijklmnopqrstuvwxyzGHIJKLMNOPQRSTUVWXYZ_-"
)

// only reports whether every byte of s is in set.
func only(s, set string) bool { return strings.Trim(s, set) == "" }

// isUUID: 8-4-4-4-12 hex digits.
func isUUID(s string) bool {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return false
	}
	return only(s[:8], hexDigits) && only(s[9:13], hexDigits) && only(s[14:18], hexDigits) &&
		only(s[19:23], hexDigits) && only(s[24:], hexDigits)
}

// IDSegment reports whether a path segment looks like an identifier
// (a number, a UUID, a hex string of 8 or more digits, a long random
// token) rather than a fixed name.
func IDSegment(s string) bool {
	hasDigit := strings.ContainsAny(s, "0123456789")
	hasLetter := strings.IndexFunc(s, func(r rune) bool { return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' }) >= 0
	switch {
	case s == "":
		return false
	case strings.Trim(s, "0123456789") == "":
		return true
	case isUUID(s):
		return true
	case len(s) >= 8 && only(s, hexDigits) && (hasDigit || len(s) >= 16):
		return true
	case len(s) >= 20 && only(s, tokenChars) && hasDigit && hasLetter:
		return true
	}
	return false
}

// Generalise turns a request path into a path glob matching it and the
// same path with other ids: id segments become *, glob metacharacters in
// the rest are escaped, and nothing else is widened.
func Generalise(p string) string {
	if p == "" {
		return "/"
	}
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if IDSegment(s) {
			segs[i] = "*"
			continue
		}
		var b strings.Builder
		for _, r := range s {
			if strings.ContainsRune(`*?[]{}\,!`, r) {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		segs[i] = b.String()
	}
	return strings.Join(segs, "/")
}

var interpreters = []string{"python", "node", "nodejs", "ruby", "perl", "php", "bash", "sh", "dash", "zsh", "fish", "ksh", "ash", "busybox",
	"java", "deno", "bun", "lua", "luajit", "rscript", "pwsh", "powershell", "tclsh", "wish", "osascript", "env", "npx", "uv", "uvx", "pip", "npm"}

// IsInterpreter reports whether the binary runs code it is given (a
// script, -c/-e text): whatever the policy lets it reach, any script can
// reach.
func IsInterpreter(bin string) bool {
	base := strings.ToLower(path.Base(bin))
	// python3.12, pip3, ruby3.2, node18
	base = strings.TrimRight(base, "0123456789.")
	return slices.Contains(interpreters, base)
}

// Name returns the network_policies key for a chunk answering host,
// port and binary.
func Name(host string, port uint16, binary string) string {
	n := NamePrefix + slug(host) + "_" + strconv.Itoa(int(port))
	if binary != "" {
		n += "_" + slug(path.Base(binary))
	}
	return n
}

func slug(s string) string {
	var b strings.Builder
	under := false
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			under = false
		} else if !under {
			b.WriteByte('_')
			under = true
		}
	}
	return strings.Trim(b.String(), "_")
}

func describe(bin string) string {
	if bin == "" {
		return "An unidentified process"
	}
	return bin
}

func target(host string, port uint16) string {
	if strings.Contains(host, ":") {
		return fmt.Sprintf("[%s]:%d", host, port)
	}
	return fmt.Sprintf("%s:%d", host, port)
}
