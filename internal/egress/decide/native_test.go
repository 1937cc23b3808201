package decide

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/policy"
)

// TestNativeMatchesRego is the property that lets the baked-in rules run
// in Go: on random policies and requests, the Go evaluation and OPA
// evaluating policy.rego give the same connection decisions, request
// decisions and DNS answers, field for field.
func TestNativeMatchesRego(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	// A copy of the baked-in rules is a user's rules: OPA evaluates it.
	reference := append(BakedRules(), "\n# the reference\n"...)
	policies, decisions := 0, 0
	for policies < 300 {
		p := randomPolicy(rng)
		c, err := p.Compile()
		if err != nil {
			continue // the generator may draw what validation refuses
		}
		policies++
		native, err := New(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		rego, err := New(c, reference)
		if err != nil {
			t.Fatal(err)
		}
		if native.st.rules != nil || rego.st.rules == nil {
			t.Fatal("the engines do not evaluate the way the test needs")
		}
		for range 40 {
			r := randomRequest(rng)
			decisions++
			if n, o := native.Decide(ctx, r), rego.Decide(ctx, r); !reflect.DeepEqual(n, o) {
				t.Fatalf("policy %s\nrequest %+v\nGo:   %+v\nRego: %+v", describe(p), r, n, o)
			}
			h := randomHTTP(rng)
			if n, o := native.DecideHTTP(ctx, r, h), rego.DecideHTTP(ctx, r, h); !reflect.DeepEqual(n, o) {
				t.Fatalf("policy %s\nrequest %+v %+v\nGo:   %+v\nRego: %+v", describe(p), r, h, n, o)
			}
			if n, o := native.NameAllowed(r.Host), rego.NameAllowed(r.Host); n != o {
				t.Fatalf("policy %s\nNameAllowed(%q): Go %v, Rego %v", describe(p), r.Host, n, o)
			}
		}
	}
	t.Logf("%d policies, %d requests", policies, decisions)
}

func pick[T any](rng *rand.Rand, xs ...T) T { return xs[rng.IntN(len(xs))] }

func some[T any](rng *rand.Rand, max int, xs ...T) []T {
	var out []T
	for range rng.IntN(max + 1) {
		out = append(out, pick(rng, xs...))
	}
	return out
}

func randomPolicy(rng *rand.Rand) *policy.Policy {
	p := &policy.Policy{Version: 1, NetworkPolicies: map[string]policy.NetworkPolicy{}}
	for i := range 1 + rng.IntN(4) {
		np := policy.NetworkPolicy{Name: pick(rng, "", "", "shared", "zeta", "alpha")}
		for _, b := range some(rng, 2, "/usr/bin/curl", "/usr/bin/*", "/opt/**", "/usr/local/bin/claude", "/usr/bin/python3") {
			np.Binaries = append(np.Binaries, policy.Binary{Path: b})
		}
		for range 1 + rng.IntN(3) {
			np.Endpoints = append(np.Endpoints, randomEndpoint(rng))
		}
		p.NetworkPolicies[fmt.Sprintf("p%d", i)] = np
	}
	p.Network.Allow = some(rng, 1, "example.org:443", "10.9.0.0/16:80", "api.example.com:8080")
	return p
}

func randomEndpoint(rng *rand.Rand) policy.Endpoint {
	ep := policy.Endpoint{Port: pick(rng, 80, 443, 8080)}
	ep.Ports = some(rng, 1, 80, 443)
	switch rng.IntN(4) {
	case 0:
		ep.AllowedIPs = some(rng, 2, "10.0.0.0/8", "192.0.2.10", "2001:db8::/32")
		if len(ep.AllowedIPs) == 0 {
			ep.Host = "192.0.2.20"
		}
	default:
		ep.Host = pick(rng, "api.example.com", "*.example.com", "**.example.com", "api-*.example.com", "a.b.example.org", "example.org")
	}
	if rng.IntN(2) == 0 {
		return ep
	}
	ep.Protocol = policy.ProtocolREST
	ep.TLS = pick(rng, "", policy.TLSTerminate, policy.TLSSkip)
	ep.Enforcement = pick(rng, "", policy.EnforcementEnforce, policy.EnforcementAudit)
	ep.Path = pick(rng, "", "", "/api/**", "**")
	ep.AllowEncodedSlash = rng.IntN(4) == 0
	if rng.IntN(3) == 0 {
		ep.Access = pick(rng, policy.AccessReadOnly, policy.AccessReadWrite, policy.AccessFull)
	} else {
		for range 1 + rng.IntN(3) {
			ep.Rules = append(ep.Rules, policy.L7Rule{Allow: randomMatch(rng)})
		}
	}
	for range rng.IntN(2) {
		ep.DenyRules = append(ep.DenyRules, randomMatch(rng))
	}
	return ep
}

func randomMatch(rng *rand.Rand) policy.L7Match {
	m := policy.L7Match{
		Method: pick(rng, "GET", "post", "*", "DELETE"),
		Path:   pick(rng, "/repos/**", "/a/*", "**", "/x", "/api/*/items"),
	}
	if rng.IntN(4) == 0 {
		m.Query = map[string]any{pick(rng, "q", "q", "q[]"): pick[any](rng, "1*", map[string]any{"any": []any{"a", "b*"}})}
	}
	return m
}

func randomRequest(rng *rand.Rand) egress.Request {
	r := egress.Request{Port: pick[uint16](rng, 80, 443, 8080, 22)}
	if rng.IntN(4) == 0 {
		r.IP = netip.MustParseAddr(pick(rng, "10.1.2.3", "10.9.1.1", "192.0.2.10", "192.0.2.20", "2001:db8::1", "203.0.113.5"))
	} else {
		r.Host = pick(rng, "api.example.com", "x.example.com", "a.b.example.com", "api-v2.example.com",
			"example.org", "a.b.example.org", "other.test", "API.Example.com.", "192.0.2.20")
	}
	r.Identity = egress.Identity{
		Binary:       pick(rng, "/usr/bin/curl", "/usr/bin/python3", "/opt/x/y/tool", "/usr/bin/node", ""),
		Ancestors:    some(rng, 2, "/usr/bin/bash", "/usr/bin/curl", "/opt/a"),
		CmdlinePaths: some(rng, 1, "/usr/local/bin/claude", "/tmp/x.py"),
	}
	if rng.IntN(8) == 0 {
		r.Identity.Untrusted = "mapped from a writable mount"
	}
	return r
}

func randomHTTP(rng *rand.Rand) egress.HTTPRequest {
	h := egress.HTTPRequest{
		Method: pick(rng, "GET", "POST", "DELETE", "HEAD"),
		Path:   pick(rng, "/repos/a/b", "/a/x", "/x", "/api/v1", "/api/v1/items", "/"),
	}
	// Names a framework may read as q, each with one or more values, some
	// matching the generated matchers and some not, in either order.
	for range rng.IntN(3) {
		if h.Query == nil {
			h.Query = map[string][]string{}
		}
		name := pick(rng, "q", "q", "Q", "q[]", "q[0]", "q[x]", "qq")
		values := []string{"1", "12", "a", "bz", "c", "2", "x"}
		h.Query[name] = append(h.Query[name], pick(rng, values...))
		h.Query[name] = append(h.Query[name], some(rng, 2, values...)...)
	}
	return h
}

func describe(p *policy.Policy) string {
	b, err := p.CanonicalJSON()
	if err != nil {
		return err.Error()
	}
	return string(b)
}
