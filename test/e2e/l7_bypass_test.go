package e2e

import (
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/testutil/netlab"
)

// Regression tests for two ways past deny_rules that a red team found:
// repeating (or respelling) a query parameter a deny rule names, and
// naming a denied method in a method override. curl inside the sandbox
// sends each over HTTP/1.1 through the proxy (CONNECT), h2 through the
// transparent listener and plain HTTP; every one must be refused, and the
// upstream, which acts on overrides as Express and Symfony do, must never
// see one.

var addrBypass = netip.MustParseAddr("203.0.113.24")

const l7BypassPolicy = `network_policies:
  bypass:
    endpoints:
      - host: bypass.test
        ports: [443, 80]
        protocol: rest
        rules:
          - allow: {method: GET, path: "/api/**", query: {scope: read}}
          - allow: {method: POST, path: "/items/**"}
        deny_rules:
          - {method: "*", path: "/api/**", query: {admin: "true"}}
          - {method: DELETE, path: "/items/**"}
`

// l7BypassScript prints "CASE name transport status" for each request.
const l7BypassScript = `#!/bin/bash
C="curl -sS -g --max-time 15 -o /dev/null -w %{http_code}"
try() {
  local name=$1 path=$2; shift 2
  echo "CASE $name h1 $($C --http1.1 "$@" "https://bypass.test$path")"
  echo "CASE $name h2 $($C --http2 --noproxy '*' "$@" "https://bypass.test$path")"
  echo "CASE $name plain $($C "$@" "http://bypass.test$path")"
}
try query_allowed '/api/x?scope=read'
try query_denied '/api/x?scope=read&admin=true'
try query_repeated_first '/api/x?scope=read&admin=true&admin=false'
try query_repeated_last '/api/x?scope=read&admin=false&admin=true'
try query_name_case '/api/x?scope=read&Admin=true'
try query_name_list '/api/x?scope=read&admin[]=true'
try post_allowed /items/1 --data x
try delete_denied /items/1 -X DELETE
try override_x_http_method_override /items/1 --data x -H 'X-HTTP-Method-Override: DELETE'
try override_x_http_method /items/1 --data x -H 'X-HTTP-Method: DELETE'
try override_x_method_override /items/1 --data x -H 'X-Method-Override: DELETE'
try override_param '/items/1?_method=DELETE' --data x
echo "=== end"
`

func TestL7RuleBypassesRefused(t *testing.T) {
	requireRoot(t)
	lab := netlab.Start(t, netlab.Host{Name: "bypass.test", Addr: addrBypass})
	lab.Serve("bypass.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "performed %s", performed(r))
	}))
	forEachMode(t, false, func(t *testing.T, m *mode) {
		fx := newFixture(t, m)
		writeOwned(t, m, filepath.Join(fx.W, "bypass.sh"), []byte(l7BypassScript), 0o755)
		caFile := labCAFile(t, fx, lab)
		before := len(lab.HTTPRequests())
		r := runCorral(t, fx, runOpts{
			args:   []string{"/usr/bin/bash", filepath.Join(fx.W, "bypass.sh")},
			policy: basePolicy(l7BypassPolicy),
			flags:  []string{"--upstream-dns", lab.DNS.String(), "--upstream-ca", caFile},
		})
		if r.code != 0 || !strings.Contains(r.stdout, "=== end") {
			t.Fatalf("the script did not complete\n%s", r)
		}
		cases := 0
		for _, l := range strings.Split(r.stdout, "\n") {
			f := strings.Fields(l)
			if len(f) != 4 || f[0] != "CASE" {
				continue
			}
			cases++
			want := "403"
			if strings.HasSuffix(f[1], "_allowed") {
				want = "200"
			}
			if f[3] != want {
				t.Errorf("%s over %s: status %s, want %s", f[1], f[2], f[3], want)
			}
		}
		if cases != 12*3 {
			t.Errorf("%d cases ran, want %d\n%s", cases, 12*3, r)
		}
		for _, s := range lab.HTTPRequests()[before:] {
			q, _ := url.ParseQuery(s.Query)
			if meth := performed(&http.Request{Method: s.Method, Header: s.Header, URL: &url.URL{RawQuery: s.Query}}); meth == http.MethodDelete || adminAsked(q) {
				t.Errorf("the upstream was asked to %s %s (query %q, %s)", meth, s.Path, s.Query, s.Proto)
			}
		}
		// The refusal says which override named the denied method.
		if es := findEvents(r, "http.request", map[string]any{"method": "POST", "path": "/items/1", "decision": "deny", "rule": "deny_rules[1]"}); len(es) == 0 ||
			!strings.HasPrefix(fmt.Sprint(es[0]["detail"]), "X-Http-Method-Override names method DELETE") {
			t.Errorf("override denials %v, want the first naming X-Http-Method-Override\n%s", es, netEvents(r))
		}
	})
}

// performed is the method an upstream that honours overrides acts on.
func performed(r *http.Request) string {
	m := r.Method
	for _, h := range []string{"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"} {
		if v := r.Header.Get(h); v != "" {
			m = v
		}
	}
	if v := r.URL.Query().Get("_method"); v != "" {
		m = v
	}
	return strings.ToUpper(m)
}

// adminAsked reports whether any spelling of the admin parameter says true.
func adminAsked(q url.Values) bool {
	for k, vs := range q {
		if strings.EqualFold(strings.TrimSuffix(k, "[]"), "admin") && strings.Contains(strings.Join(vs, ","), "true") {
			return true
		}
	}
	return false
}
