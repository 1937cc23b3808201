package decide

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/policy"
)

func restEndpoint(mod func(*policy.Endpoint)) policy.Endpoint {
	ep := policy.Endpoint{Host: "api.example.com", Port: 443, Protocol: policy.ProtocolREST, TLS: policy.TLSTerminate}
	mod(&ep)
	return ep
}

func req(method, path string, query map[string][]string) egress.HTTPRequest {
	return egress.HTTPRequest{Method: method, Path: path, Query: query}
}

func TestConnectionDecisionReportsInspection(t *testing.T) {
	p := hostPolicy(nil,
		restEndpoint(func(ep *policy.Endpoint) { ep.Access = policy.AccessReadOnly; ep.TLS = "" }),
		policy.Endpoint{Host: "plain.example.com", Port: 443},
	)
	e := mustNew(t, p, nil)
	d := e.Decide(context.Background(), byName("api.example.com", 443, curl))
	if !d.Allow || !d.Inspect || d.TLS != "" {
		t.Errorf("rest endpoint: got %+v, want allowed and inspected", d)
	}
	d = e.Decide(context.Background(), byName("plain.example.com", 443, curl))
	if !d.Allow || d.Inspect {
		t.Errorf("L4 endpoint: got %+v, want allowed, not inspected", d)
	}
	skip := mustNew(t, hostPolicy(nil, restEndpoint(func(ep *policy.Endpoint) { ep.Access = policy.AccessReadOnly; ep.TLS = policy.TLSSkip })), nil)
	if d := skip.Decide(context.Background(), byName("api.example.com", 443, curl)); !d.Allow || d.Inspect {
		t.Errorf("tls: skip endpoint: got %+v, want allowed and carried uninspected", d)
	}
}

func TestRequestRules(t *testing.T) {
	ctx := context.Background()
	conn := byName("api.example.com", 443, curl)
	tests := []struct {
		name string
		ep   func(*policy.Endpoint)
		req  egress.HTTPRequest
		want bool
		rule string
	}{
		{"read-only allows GET", func(ep *policy.Endpoint) { ep.Access = policy.AccessReadOnly }, req("GET", "/repos/x", nil), true, "access: read-only"},
		{"read-only allows HEAD", func(ep *policy.Endpoint) { ep.Access = policy.AccessReadOnly }, req("HEAD", "/", nil), true, "access: read-only"},
		{"read-only blocks POST", func(ep *policy.Endpoint) { ep.Access = policy.AccessReadOnly }, req("POST", "/graphql", nil), false, ""},
		{"read-only blocks DELETE", func(ep *policy.Endpoint) { ep.Access = policy.AccessReadOnly }, req("DELETE", "/repos/x", nil), false, ""},
		{"read-write allows PATCH", func(ep *policy.Endpoint) { ep.Access = policy.AccessReadWrite }, req("PATCH", "/x", nil), true, "access: read-write"},
		{"read-write blocks DELETE", func(ep *policy.Endpoint) { ep.Access = policy.AccessReadWrite }, req("DELETE", "/x", nil), false, ""},
		{"full allows DELETE", func(ep *policy.Endpoint) { ep.Access = policy.AccessFull }, req("DELETE", "/x", nil), true, "access: full"},
		{"rule allows exactly its method and path", ghRules, req("POST", "/graphql", nil), true, "rules[1]"},
		{"rule path is exact", ghRules, req("POST", "/graphql/x", nil), false, ""},
		{"other method on the rule's path", ghRules, req("PUT", "/graphql", nil), false, ""},
		{"* stays in a segment", ghRules, req("GET", "/users/octocat", nil), true, "rules[2]"},
		{"* does not cross segments", ghRules, req("GET", "/users/octocat/repos", nil), false, ""},
		{"** crosses segments", ghRules, req("GET", "/repos/a/b/c", nil), true, "rules[0]"},
		{"? and classes", ghRules, req("GET", "/v1/items", nil), true, "rules[3]"},
		{"class excludes", ghRules, req("GET", "/v9/items", nil), false, ""},
		{"deny rule wins over allow", ghRules, req("GET", "/repos/a/secrets/x", nil), false, "deny_rules[0]"},
		{"query glob matches", ghRules, req("GET", "/search", map[string][]string{"q": {"repo:corral"}}), true, "rules[4]"},
		{"query glob mismatch", ghRules, req("GET", "/search", map[string][]string{"q": {"user:x"}}), false, ""},
		{"query missing", ghRules, req("GET", "/search", nil), false, ""},
		{"every repeated value must match", ghRules, req("GET", "/search", map[string][]string{"q": {"repo:a", "user:x"}}), false, ""},
		{"query any-of", ghRules, req("GET", "/list", map[string][]string{"state": {"closed"}}), true, "rules[5]"},
		{"query any-of mismatch", ghRules, req("GET", "/list", map[string][]string{"state": {"all"}}), false, ""},
		{"extra parameters are fine", ghRules, req("GET", "/list", map[string][]string{"state": {"open"}, "page": {"2"}}), true, "rules[5]"},
		{"any method rule", func(ep *policy.Endpoint) {
			ep.Rules = []policy.L7Rule{{Allow: policy.L7Match{Method: "*", Path: "/any/**"}}}
		}, req("PURGE", "/any/x", nil), true, "rules[0]"},
		{"deny by method only", func(ep *policy.Endpoint) {
			ep.Access = policy.AccessFull
			ep.DenyRules = []policy.L7Match{{Method: "DELETE", Path: "**"}}
		}, req("DELETE", "/x", nil), false, "deny_rules[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustNew(t, hostPolicy([]string{curl}, restEndpoint(tt.ep)), nil)
			d := e.DecideHTTP(ctx, conn, tt.req)
			if d.Allow != tt.want || d.Rule != tt.rule || d.Audit {
				t.Fatalf("got %+v, want allow=%v rule=%q", d, tt.want, tt.rule)
			}
			if !d.Allow && (d.Reason == "" || d.Detail == "" || d.Policy != "p") {
				t.Errorf("denial without reason, detail or policy: %+v", d)
			}
		})
	}
}

// TestQueryMatchersReadEverySpelling: a deny rule's query matcher denies
// when any value of the parameter matches, under any name a framework may
// read as that parameter (case aside, a "[]" or "[0]" list suffix), while
// an allow rule still needs the exact name and every such value to match.
// Go and OPA evaluating policy.rego must agree.
func TestQueryMatchersReadEverySpelling(t *testing.T) {
	p := hostPolicy(nil, restEndpoint(func(ep *policy.Endpoint) {
		ep.Rules = []policy.L7Rule{{Allow: policy.L7Match{Method: "GET", Path: "/api/**", Query: map[string]any{"scope": "read"}}}}
		ep.DenyRules = []policy.L7Match{{Method: "*", Path: "/api/**", Query: map[string]any{"admin": "true"}}}
	}))
	type q = map[string][]string
	tests := []struct {
		name  string
		query q
		rule  string // "" for a refusal no rule names
		allow bool
	}{
		{"allowed", q{"scope": {"read"}}, "rules[0]", true},
		{"denied", q{"scope": {"read"}, "admin": {"true"}}, "deny_rules[0]", false},
		{"denied value first", q{"scope": {"read"}, "admin": {"true", "false"}}, "deny_rules[0]", false},
		{"denied value last", q{"scope": {"read"}, "admin": {"false", "true"}}, "deny_rules[0]", false},
		{"denied name in another case", q{"scope": {"read"}, "Admin": {"true"}}, "deny_rules[0]", false},
		{"denied name as a list", q{"scope": {"read"}, "admin[]": {"false", "true"}}, "deny_rules[0]", false},
		{"denied name as an indexed list", q{"scope": {"read"}, "ADMIN[0]": {"true"}}, "deny_rules[0]", false},
		{"denied beside another spelling", q{"scope": {"read"}, "admin": {"false"}, "admin[]": {"true"}}, "deny_rules[0]", false},
		{"other values pass", q{"scope": {"read"}, "admin": {"false", "no"}}, "rules[0]", true},
		{"values match as written", q{"scope": {"read"}, "admin": {"TRUE"}}, "rules[0]", true},
		{"a keyed name is another parameter", q{"scope": {"read"}, "admin[x]": {"true"}}, "rules[0]", true},
		{"allow: every value", q{"scope": {"read", "write"}}, "", false},
		{"allow: every spelling", q{"scope": {"read"}, "Scope": {"write"}}, "", false},
		{"allow: every list spelling", q{"scope": {"read"}, "scope[]": {"write"}}, "", false},
		{"allow: the exact name present", q{"Scope": {"read"}}, "", false},
		{"allow: other spellings that match", q{"scope": {"read"}, "scope[0]": {"read"}}, "rules[0]", true},
	}
	ctx := context.Background()
	conn := byName("api.example.com", 443, curl)
	for _, eng := range []struct {
		name  string
		rules []byte
	}{{"go", nil}, {"rego", append(BakedRules(), "\n# as a user's\n"...)}} {
		e := mustNew(t, p, eng.rules)
		for _, tt := range tests {
			d := e.DecideHTTP(ctx, conn, req("GET", "/api/x", tt.query))
			if d.Allow != tt.allow || d.Rule != tt.rule {
				t.Errorf("%s: %s: %v: got %+v, want allow=%v rule=%q", eng.name, tt.name, tt.query, d, tt.allow, tt.rule)
			}
		}
	}
}

func ghRules(ep *policy.Endpoint) {
	ep.Rules = []policy.L7Rule{
		{Allow: policy.L7Match{Method: "get", Path: "/repos/**"}},
		{Allow: policy.L7Match{Method: "POST", Path: "/graphql"}},
		{Allow: policy.L7Match{Method: "GET", Path: "/users/*"}},
		{Allow: policy.L7Match{Method: "GET", Path: "/v[1-3]/item?"}},
		{Allow: policy.L7Match{Method: "GET", Path: "/search", Query: map[string]any{"q": "repo:*"}}},
		{Allow: policy.L7Match{Method: "GET", Path: "/list", Query: map[string]any{"state": map[string]any{"any": []any{"open", "closed"}}}}},
	}
	ep.DenyRules = []policy.L7Match{{Method: "*", Path: "/repos/*/secrets/**"}}
}

func TestRequestAuditMode(t *testing.T) {
	e := mustNew(t, hostPolicy(nil, restEndpoint(func(ep *policy.Endpoint) {
		ep.Access = policy.AccessReadOnly
		ep.Enforcement = policy.EnforcementAudit
	})), nil)
	d := e.DecideHTTP(context.Background(), byName("api.example.com", 443, curl), req("POST", "/x", nil))
	if d.Allow || !d.Audit || d.Reason != egress.ReasonL7NoRule {
		t.Fatalf("got %+v, want a would-deny in audit mode", d)
	}
}

func TestRequestBinaryAndDestination(t *testing.T) {
	e := mustNew(t, hostPolicy([]string{curl}, restEndpoint(func(ep *policy.Endpoint) { ep.Access = policy.AccessFull })), nil)
	ctx := context.Background()
	if d := e.DecideHTTP(ctx, byName("api.example.com", 443, python3), req("GET", "/", nil)); d.Allow || d.Reason != egress.ReasonBinary {
		t.Errorf("other binary: got %+v, want binary_not_allowed", d)
	}
	if d := e.DecideHTTP(ctx, byName("other.example.com", 443, curl), req("GET", "/", nil)); d.Allow || d.Reason != egress.ReasonNoPolicy {
		t.Errorf("other host: got %+v, want no_matching_policy", d)
	}
}

func TestEndpointPathSelector(t *testing.T) {
	p := hostPolicy(nil,
		restEndpoint(func(ep *policy.Endpoint) { ep.Access = policy.AccessReadOnly }),
		restEndpoint(func(ep *policy.Endpoint) {
			ep.Path = "/uploads/**"
			ep.Access = policy.AccessReadWrite
			ep.Enforcement = policy.EnforcementAudit
		}),
	)
	e := mustNew(t, p, nil)
	ctx := context.Background()
	conn := byName("api.example.com", 443, curl)
	if d := e.DecideHTTP(ctx, conn, req("POST", "/uploads/a", nil)); !d.Allow || d.Rule != "access: read-write" {
		t.Errorf("selected endpoint: got %+v, want read-write", d)
	}
	if d := e.DecideHTTP(ctx, conn, req("POST", "/other", nil)); d.Allow || d.Audit {
		t.Errorf("unselected path: got %+v, want enforced read-only denial", d)
	}

	only := mustNew(t, hostPolicy(nil, restEndpoint(func(ep *policy.Endpoint) {
		ep.Path = "/api/**"
		ep.Access = policy.AccessFull
	})), nil)
	if d := only.DecideHTTP(ctx, conn, req("GET", "/elsewhere", nil)); d.Allow || d.Reason != egress.ReasonL7NoEndpoint {
		t.Errorf("no selector matches: got %+v, want %s", d, egress.ReasonL7NoEndpoint)
	}
}

func TestL4EndpointBesideRestAllowsEverything(t *testing.T) {
	p := hostPolicy(nil,
		restEndpoint(func(ep *policy.Endpoint) { ep.Path = "/ro/**"; ep.Access = policy.AccessReadOnly }),
		policy.Endpoint{Host: "api.example.com", Port: 443},
	)
	e := mustNew(t, p, nil)
	conn := byName("api.example.com", 443, curl)
	if d := e.DecideHTTP(context.Background(), conn, req("DELETE", "/rw", nil)); !d.Allow {
		t.Errorf("L4 endpoint of the same policy: got %+v, want allowed", d)
	}
	if d := e.DecideHTTP(context.Background(), conn, req("DELETE", "/ro/x", nil)); d.Allow {
		t.Errorf("selected rest endpoint: got %+v, want denied", d)
	}
}

func TestCustomRulesNeedRequestDecision(t *testing.T) {
	rules := []byte("package corral.egress\n\ndecision := {\"allow\": true}\n")
	p := hostPolicy(nil, restEndpoint(func(ep *policy.Endpoint) { ep.Access = policy.AccessFull }))
	if _, err := newEngine(p, rules); err == nil || !strings.Contains(err.Error(), "request_decision") {
		t.Fatalf("rules without request_decision for a rest policy: err = %v", err)
	}
	// Without rest endpoints they still load.
	mustNew(t, hostPolicy(nil, policy.Endpoint{Host: "a.example.com", Port: 443}), rules)
}

// BenchmarkDecideHTTP measures one request decision on an inspected
// connection, each request a different path.
func BenchmarkDecideHTTP(b *testing.B) {
	e := mustNew(b, hostPolicy([]string{curl}, restEndpoint(ghRules)), nil)
	ctx := context.Background()
	conn := byName("api.example.com", 443, curl)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		r := req("GET", fmt.Sprintf("/repos/corral/corral/pulls/%d", i), nil)
		if d := e.DecideHTTP(ctx, conn, r); !d.Allow {
			b.Fatal(d)
		}
	}
}

func BenchmarkDecideRestConnection(b *testing.B) {
	e := mustNew(b, hostPolicy([]string{curl}, restEndpoint(ghRules)), nil)
	ctx := context.Background()
	conn := byName("api.example.com", 443, curl)
	for b.Loop() {
		if d := e.Decide(ctx, conn); !d.Allow {
			b.Fatal(d)
		}
	}
}

// An encoded slash (npm's /@scope%2fname) can only move a request past a
// rule that looks at path segments; where no endpoint that could decide
// the request has one, the connection accepts it.
func TestEncodedSlashWherePathsDoNotMatter(t *testing.T) {
	ctx := context.Background()
	conn := byName("api.example.com", 443, curl)
	for _, tc := range []struct {
		name string
		eps  []policy.Endpoint
		want bool
	}{
		{"access preset", []policy.Endpoint{restEndpoint(func(ep *policy.Endpoint) { ep.Access = policy.AccessReadOnly })}, true},
		{"rules on any path", []policy.Endpoint{restEndpoint(func(ep *policy.Endpoint) {
			ep.Rules = []policy.L7Rule{{Allow: policy.L7Match{Method: "GET", Path: "/**"}}, {Allow: policy.L7Match{Method: "POST", Path: "**"}}}
			ep.DenyRules = []policy.L7Match{{Method: "DELETE", Path: "**"}}
		})}, true},
		{"a rule on a path", []policy.Endpoint{restEndpoint(ghRules)}, false},
		{"a deny rule on a path", []policy.Endpoint{restEndpoint(func(ep *policy.Endpoint) {
			ep.Access = policy.AccessFull
			ep.DenyRules = []policy.L7Match{{Method: "*", Path: "/admin/**"}}
		})}, false},
		{"a sibling endpoint selects by path", []policy.Endpoint{
			restEndpoint(func(ep *policy.Endpoint) { ep.Access = policy.AccessReadOnly }),
			restEndpoint(func(ep *policy.Endpoint) { ep.Path = "/uploads/**"; ep.Access = policy.AccessFull }),
		}, false},
		{"asked for explicitly", []policy.Endpoint{restEndpoint(func(ep *policy.Endpoint) { ghRules(ep); ep.AllowEncodedSlash = true })}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := mustNew(t, hostPolicy(nil, tc.eps...), nil).Decide(ctx, conn)
			if !d.Allow || !d.Inspect || d.AllowEncodedSlash != tc.want || (d.PathRule == "") != tc.want {
				t.Errorf("got %+v, want allowed, inspected, AllowEncodedSlash=%v and the rule that refuses it named otherwise", d, tc.want)
			}
		})
	}
}
