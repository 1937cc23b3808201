package policy

import (
	"fmt"
	"maps"
	"net/textproto"
	"regexp"
	"slices"
	"strings"

	"github.com/corral-sandbox/corral/internal/hostpattern"
)

// DefaultSecretHeader is the header a secret is swapped in when it lists
// none: where bearer tokens and basic credentials travel.
const DefaultSecretHeader = "Authorization"

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// gatewaySecretName is what the gateway accepts as a secret's name, and
// so what from_gateway may name, up to 128 bytes. The length is checked
// apart: a bounded repetition compiles into a copy per count, which every
// corral and sandbox init would pay for at start.
var gatewaySecretName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// ValidGatewaySecretName reports whether name can name a secret held by
// the gateway.
func ValidGatewaySecretName(name string) bool {
	return len(name) <= 128 && gatewaySecretName.MatchString(name)
}

// GatewaySecrets returns the gateway secrets the policy's secrets name
// with from_gateway, sorted, each once.
func (p *Policy) GatewaySecrets() []string {
	var out []string
	for _, s := range p.Secrets {
		if s.FromGateway != "" && !slices.Contains(out, s.FromGateway) {
			out = append(out, s.FromGateway)
		}
	}
	slices.Sort(out)
	return out
}

// reservedEnv are variables corral sets in the workload itself: a secret
// of the same name would clash with corral's value, and the proxy and CA
// variables are what route requests through the swap in the first place.
// Any *_PROXY is checked apart.
var reservedEnv = []string{
	"PATH", "HOME", "USER", "LOGNAME", "TERM", "CORRAL_SANDBOX",
	"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "JAVA_TOOL_OPTIONS",
}

// forbiddenHeaders frame or route the request, or concern only one hop; the
// proxy consumes or rewrites them itself, so a surrogate there could never
// be swapped reliably and a real value there could corrupt the stream.
var forbiddenHeaders = []string{
	"Connection", "Host", "Content-Length", "Transfer-Encoding", "Upgrade",
	"Te", "Trailer", "Keep-Alive", "Proxy-Connection",
}

func reservedEnvName(k string) bool {
	return slices.Contains(reservedEnv, k) || strings.HasSuffix(strings.ToUpper(k), "_PROXY")
}

// secretHeaders returns the headers a secret is swapped in: the default
// when none are listed, canonical case, first occurrence kept.
func secretHeaders(hs []string) []string {
	if len(hs) == 0 {
		return []string{DefaultSecretHeader}
	}
	out := make([]string, 0, len(hs))
	for _, h := range hs {
		h = textproto.CanonicalMIMEHeaderKey(h)
		if !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}

// validHeaderName reports whether h is an RFC 9110 field name (a token).
func validHeaderName(h string) bool {
	if h == "" {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

func checkSecrets(p *Policy, r *report) {
	if len(p.Secrets) == 0 {
		return
	}
	keys := slices.Sorted(maps.Keys(p.Secrets))
	for _, key := range keys {
		if scope, ok := checkSecret(r, joinPath("secrets", key), key, p.Secrets[key]); ok {
			r.compiled.Secrets = append(r.compiled.Secrets, scope)
		}
	}
	// The swap happens in the proxy, on requests it has decrypted; where
	// traffic bypasses it the workload is left holding a useless surrogate.
	switch {
	case p.SandboxDisabled():
		r.warnf("secrets", "enable the sandbox, or remove secrets",
			"sandbox disabled: the workload gets surrogates that are never swapped for the real values, so requests using them will fail")
		return
	case p.NetworkMode() == ModeAllow:
		r.warnf("secrets", "use network.mode: proxy with TLS-terminating endpoints for the secrets' hosts, or remove secrets",
			"network mode allow bypasses the proxy: the workload gets surrogates that are never swapped for the real values, so requests using them will fail")
		return
	case p.NetworkMode() == ModeBlock:
		r.errorf("secrets", "allow the secrets' hosts with network_policies endpoints using protocol: rest and tls: terminate, or remove secrets",
			"network mode block leaves no network, so no secret can ever be used")
		return
	}
	eps := swappingHosts(r.compiled)
	for _, key := range keys {
		for i, h := range p.Secrets[key].Hosts {
			if msg, _ := checkHost(h); msg != "" {
				continue // reported by checkSecret
			}
			// A host the matcher refuses is reported as uncovered rather
			// than skipped, so a disagreement with checkHost fails closed.
			pat, err := hostpattern.Compile(h)
			if err == nil && slices.ContainsFunc(eps, func(ep hostpattern.Pattern) bool { return covers(ep, pat) }) {
				continue
			}
			host := hostpattern.Normalise(h)
			r.errorf(fmt.Sprintf("%s.hosts[%d]", joinPath("secrets", key), i),
				fmt.Sprintf("add an endpoint for %s with protocol: rest and tls: terminate", host),
				"secret %s could not be swapped in requests to %q: no endpoint with protocol: rest terminates TLS for it", key, host)
		}
	}
}

// CompileSecret validates one secrets entry on its own, as validation
// does, and returns its scope: for callers holding a secret outside a
// policy (tests, a gateway's store).
func CompileSecret(name string, s Secret) (SecretScope, error) {
	r := &report{}
	scope, ok := checkSecret(r, joinPath("secrets", name), name, s)
	if !ok {
		return SecretScope{}, &ValidationError{Problems: r.errs}
	}
	return scope, nil
}

// SecretHeaders are the headers a secret is swapped in, canonical, with
// the default when none are listed.
func SecretHeaders(s Secret) []string { return secretHeaders(s.Headers) }

// checkSecret validates one secret and, when it is valid, returns its
// compiled scope.
func checkSecret(r *report, at, key string, s Secret) (SecretScope, bool) {
	before := len(r.errs)
	switch {
	case !envName.MatchString(key):
		r.errorf(at, "use letters, digits and underscores, not starting with a digit, e.g. GITHUB_TOKEN",
			"%q is not a valid environment variable name", key)
	case reservedEnvName(key):
		r.errorf(at, "choose another variable name", "%s is set by corral itself", key)
	}
	var sources []string
	for _, src := range []struct{ name, value string }{
		{"from_env", s.FromEnv}, {"from_file", s.FromFile}, {"from_gateway", s.FromGateway},
	} {
		if src.value != "" {
			sources = append(sources, src.name)
		}
	}
	switch {
	case len(sources) == 0:
		r.errorf(at, "add from_env: NAME (a variable in corral's environment), from_file: /path/to/file or from_gateway: NAME (a secret held by the gateway)",
			"secret %s needs from_env, from_file or from_gateway", key)
	case len(sources) > 1:
		r.errorf(at, "keep one of them", "secret %s has %s set; a secret takes its value from exactly one source", key, strings.Join(sources, " and "))
	}
	if s.FromEnv != "" && !envName.MatchString(s.FromEnv) {
		r.errorf(at+".from_env", "write the variable name alone, without $ or =, e.g. GITHUB_TOKEN",
			"%q is not a valid environment variable name", s.FromEnv)
	}
	if s.FromFile != "" {
		if msg, fix := checkPath(s.FromFile); msg != "" {
			r.errorf(at+".from_file", fix, "%s", msg)
		}
	}
	if s.FromGateway != "" && !ValidGatewaySecretName(s.FromGateway) {
		r.errorf(at+".from_gateway", "use the name the secret has at the gateway: letters, digits, '.', '_' and '-' (at most 128), starting with a letter or digit",
			"secret %s: %q is not a valid gateway secret name", key, s.FromGateway)
	}
	if len(s.Hosts) == 0 {
		r.errorf(at+".hosts", "list the hosts that should receive the real value, e.g. [api.github.com]", "no hosts, so the secret could never be used")
	}
	for i, h := range s.Hosts {
		hat := fmt.Sprintf("%s.hosts[%d]", at, i)
		if h == "" {
			r.errorf(hat, "give a host name such as api.github.com, or remove the entry", "empty host")
		} else if msg, fix := checkHost(h); msg != "" {
			r.errorf(hat, fix, "%s", msg)
		}
	}
	for i, h := range s.Headers {
		hat := fmt.Sprintf("%s.headers[%d]", at, i)
		switch {
		case !validHeaderName(h):
			r.errorf(hat, "write a header name such as Authorization or X-Api-Key", "%q is not a valid header name", h)
		case slices.Contains(forbiddenHeaders, textproto.CanonicalMIMEHeaderKey(h)):
			r.errorf(hat, "use the header the API reads the credential from, such as Authorization",
				"%s is a hop-by-hop or framing header, which the proxy does not pass through unchanged", textproto.CanonicalMIMEHeaderKey(h))
		}
	}
	if len(r.errs) > before {
		return SecretScope{}, false
	}
	scope := SecretScope{Name: key, Source: Secret{FromEnv: s.FromEnv, FromFile: s.FromFile, FromGateway: s.FromGateway}, Headers: secretHeaders(s.Headers)}
	for _, h := range s.Hosts {
		pat, err := hostpattern.Compile(h)
		if err != nil {
			r.errorf(at, "report this policy to corral's developers: validation accepted what the compiler refuses", "%v", err)
			return SecretScope{}, false
		}
		scope.Hosts = append(scope.Hosts, pat)
	}
	return scope, true
}

// swappingHosts returns the host patterns of the targets whose requests
// the proxy decrypts and parses: protocol rest with TLS terminated, or
// unset (terminated when the client speaks TLS, plain HTTP read as is).
func swappingHosts(c *Compiled) []hostpattern.Pattern {
	var out []hostpattern.Pattern
	for _, g := range c.Grants {
		for _, t := range g.Targets {
			if t.Host.Host != "" && t.Protocol == ProtocolREST && t.TLS != TLSPassthrough && t.TLS != TLSSkip {
				out = append(out, t.Host)
			}
		}
	}
	return out
}

// covers reports whether every request to a secret host goes through the
// endpoint. A wildcard secret host is covered only by the same pattern:
// deciding whether one pattern contains another is not worth the risk of
// getting it wrong in the permissive direction.
func covers(ep, secret hostpattern.Pattern) bool {
	return ep.Host == secret.Host || (!secret.Wildcard() && ep.Match(secret.Host))
}
