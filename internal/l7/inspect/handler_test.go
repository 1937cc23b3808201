package inspect_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/policy"
)

// TestMethodOverrideDecidedAsBothMethods: a request that names another
// method in X-HTTP-Method-Override, X-HTTP-Method, X-Method-Override or a
// _method parameter is performed as that method by servers that honour
// them, so it must be allowed as that method too. With DELETE denied, a
// POST or GET standing for a DELETE is refused over HTTP/1.1 (a GET
// decided inline), h2 and in audit mode logged with the override named,
// and never reaches the upstream; overrides to allowed methods pass.
func TestMethodOverrideDecidedAsBothMethods(t *testing.T) {
	up := newUpstream(t)
	items := func(ep *policy.Endpoint) {
		ep.Rules = []policy.L7Rule{
			{Allow: policy.L7Match{Method: "GET", Path: "/items/**"}},
			{Allow: policy.L7Match{Method: "POST", Path: "/items/**"}},
		}
		ep.DenyRules = []policy.L7Match{{Method: "DELETE", Path: "/items/**"}}
	}
	h := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, items))})
	h1, h2 := h.client(false), h.client(true)

	tests := []struct {
		method, target, header, value string
		// rule and reason of the refusal; "" for allowed
		reason, rule string
		// why the detail gives: where the method was named
		from string
	}{
		{"POST", "/items/1", "X-HTTP-Method-Override", "DELETE", egress.ReasonL7DenyRule, "deny_rules[0]", "X-Http-Method-Override names method DELETE"},
		{"POST", "/items/1", "X-HTTP-Method", "delete", egress.ReasonL7DenyRule, "deny_rules[0]", "X-Http-Method names method DELETE"},
		{"POST", "/items/1", "X-Method-Override", "PUT, DELETE", egress.ReasonL7DenyRule, "deny_rules[0]", "X-Method-Override names method DELETE"},
		{"POST", "/items/1", "X-HTTP-Method-Override", "PATCH", egress.ReasonL7NoRule, "", "X-Http-Method-Override names method PATCH"},
		{"POST", "/items/1?_method=DELETE", "", "", egress.ReasonL7DenyRule, "deny_rules[0]", "the _method parameter names method DELETE"},
		{"POST", "/items/1?_method=POST&_method=delete", "", "", egress.ReasonL7DenyRule, "deny_rules[0]", "the _method parameter names method DELETE"},
		{"GET", "/items/1?_method=DELETE", "", "", egress.ReasonL7DenyRule, "deny_rules[0]", "the _method parameter names method DELETE"},
		{"POST", "/items/1", "X-HTTP-Method-Override", "POST", "", "", ""},
		{"POST", "/items/1", "X-HTTP-Method-Override", "get", "", "", ""},
		{"GET", "/items/1?_method=GET", "", "", "", "", ""},
	}
	var want []string
	check := func(name string, r result, method, target, reason, rule, from string) {
		t.Helper()
		if reason == "" {
			path, _, _ := strings.Cut(target, "?")
			wantOK(t, r, "ok "+method+" "+path)
			want = append(want, method+" "+target)
			return
		}
		body := denial(t, r)
		if detail, _ := body["detail"].(string); body["reason"] != reason || body["rule"] != rule || !strings.HasPrefix(detail, from+", which servers that honour it perform instead of "+method+": ") {
			t.Errorf("%s: denied with %v, want reason %q, rule %q and a detail starting %q", name, body, reason, rule, from)
		}
	}
	for _, tt := range tests {
		name := tt.method + " " + tt.target + " " + tt.header + ": " + tt.value
		for _, c := range []struct {
			proto  string
			client *http.Client
		}{{"h1", h1}, {"h2", h2}} {
			var hdr http.Header
			if tt.header != "" {
				hdr = http.Header{tt.header: {tt.value}}
			}
			body := ""
			if tt.method == "POST" {
				body = "{}"
			}
			check(c.proto+" "+name, do(t, c.client, tt.method, h.url(tt.target), hdr, body), tt.method, tt.target, tt.reason, tt.rule, tt.from)
		}
		if tt.method == "GET" && tt.header == "" {
			// A simple GET is read and decided inline, not by net/http's
			// server.
			check("inline "+name, h.raw(t, "GET", tt.target, apiHost), tt.method, tt.target, tt.reason, tt.rule, tt.from)
		}
	}
	// The header spelt as h2 sends it and HTTP/1.1 allows, lower case, on
	// a simple GET.
	check("inline lower-case header", h.raw(t, "GET", "/items/2", apiHost, "x-http-method-override: DELETE"),
		"GET", "/items/2", egress.ReasonL7DenyRule, "deny_rules[0]", "X-Http-Method-Override names method DELETE")
	if got := up.uris(); !slices.Equal(got, want) {
		t.Errorf("upstream saw %q, want exactly the allowed %q", got, want)
	}

	audited := newHarness(t, up, config{policy: restPolicy(rest(apiHost, 443, func(ep *policy.Endpoint) {
		items(ep)
		ep.Enforcement = policy.EnforcementAudit
	}))})
	c := audited.client(true)
	wantOK(t, do(t, c, "POST", audited.url("/items/3"), http.Header{"X-Http-Method-Override": {"DELETE"}}, "{}"), "ok POST /items/3")
	audited.settle(t, c)
	ev := eventFor(t, audited.httpEvents(t), "POST", "/items/3")
	if detail, _ := ev["detail"].(string); ev["decision"] != "audit" || ev["rule"] != "deny_rules[0]" || !strings.HasPrefix(detail, "X-Http-Method-Override names method DELETE") {
		t.Errorf("audited override: event %v, want decision audit by deny_rules[0] with the override in the detail", ev)
	}
}
