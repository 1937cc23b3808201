package decide

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/egress"
	"github.com/corral-sandbox/corral/internal/policy"
)

const (
	curl    = "/usr/bin/curl"
	python3 = "/usr/bin/python3"
)

func hostPolicy(binaries []string, eps ...policy.Endpoint) *policy.Policy {
	np := policy.NetworkPolicy{Endpoints: eps}
	for _, b := range binaries {
		np.Binaries = append(np.Binaries, policy.Binary{Path: b})
	}
	return &policy.Policy{Version: 1, NetworkPolicies: map[string]policy.NetworkPolicy{"p": np}}
}

// newEngine compiles p as a sandbox would, then prepares it.
func newEngine(p *policy.Policy, rules []byte) (*Engine, error) {
	c, err := p.Compile()
	if err != nil {
		return nil, err
	}
	return New(c, rules)
}

func mustNew(t testing.TB, p *policy.Policy, rules []byte) *Engine {
	t.Helper()
	e, err := newEngine(p, rules)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return e
}

func byName(host string, port uint16, bin string) egress.Request {
	return egress.Request{Host: host, Port: port, Identity: egress.Identity{Binary: bin}}
}

func byIP(ip string, port uint16, bin string) egress.Request {
	return egress.Request{IP: netip.MustParseAddr(ip), Port: port, Identity: egress.Identity{Binary: bin}}
}

func TestHostPatterns(t *testing.T) {
	tests := []struct {
		pattern, host string
		want          bool
	}{
		{"api.github.com", "api.github.com", true},
		{"api.github.com", "API.GitHub.com.", true},
		{"api.github.com", "github.com", false},
		{"api.github.com", "x.api.github.com", false},
		{"*.example.com", "a.example.com", true},
		{"*.example.com", "example.com", false},
		{"*.example.com", "a.b.example.com", false},
		{"*.example.com", ".example.com", false},
		{"*.example.com", "a.example.com.evil.net", false},
		{"*.example.com", "aexample.com", false},
		{"**.example.com", "a.example.com", true},
		{"**.example.com", "a.b.example.com", true},
		{"**.example.com", "a.b.c.example.com", true},
		{"**.example.com", "example.com", false},
		{"**.example.com", "a..example.com", false},
		{"**.example.com", "a.example.org", false},
		{"api-*.example.com", "api-eu.example.com", true},
		{"api-*.example.com", "api-.example.com", true},
		{"api-*.example.com", "api.example.com", false},
		{"api-*.example.com", "x.api-eu.example.com", false},
		{"api-*.example.com", "web-eu.example.com", false},
		{"*-api.example.com", "eu-api.example.com", true},
		{"a*b.example.com", "a1b.example.com", true},
		{"a*b.example.com", "a.b.example.com", false},
		{"*.example.com", "a b.example.com", false},
	}
	for _, tt := range tests {
		t.Run(tt.pattern+"/"+tt.host, func(t *testing.T) {
			e := mustNew(t, hostPolicy(nil, policy.Endpoint{Host: tt.pattern, Port: 443}), nil)
			d := e.Decide(context.Background(), byName(tt.host, 443, curl))
			if d.Allow != tt.want {
				t.Errorf("Decide allow = %v, want %v (%+v)", d.Allow, tt.want, d)
			}
			if !d.Allow && d.Reason != egress.ReasonNoPolicy {
				t.Errorf("reason = %q, want %q", d.Reason, egress.ReasonNoPolicy)
			}
			if got := e.NameAllowed(tt.host); got != tt.want {
				t.Errorf("NameAllowed = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestBadHostPatternsRejected(t *testing.T) {
	for _, h := range []string{"*", "**", "*.com", "**.com", "a.*.example.com", "a**.example.com", "exa mple.com", "a..b.com", "[x].example.com"} {
		if _, err := newEngine(hostPolicy(nil, policy.Endpoint{Host: h, Port: 443}), nil); err == nil {
			t.Errorf("New accepted host %q", h)
		}
	}
}

func TestPorts(t *testing.T) {
	e := mustNew(t, hostPolicy(nil,
		policy.Endpoint{Host: "a.example.com", Port: 443, Ports: []int{8443, 9000}},
	), nil)
	tests := []struct {
		host string
		port uint16
		want bool
	}{
		{"a.example.com", 443, true},
		{"a.example.com", 8443, true},
		{"a.example.com", 9000, true},
		{"a.example.com", 80, false},
		{"a.example.com", 0, false},
		{"noport.example.com", 443, false},
		{"noport.example.com", 80, false},
	}
	for _, tt := range tests {
		d := e.Decide(context.Background(), byName(tt.host, tt.port, curl))
		if d.Allow != tt.want || (!d.Allow && d.Reason != egress.ReasonNoPolicy) {
			t.Errorf("%s:%d = %+v, want allow %v", tt.host, tt.port, d, tt.want)
		}
	}
}

func TestBinaryBinding(t *testing.T) {
	ctx := context.Background()
	gh := policy.Endpoint{Host: "api.github.com", Port: 443}
	tests := []struct {
		name     string
		binaries []string
		id       egress.Identity
		want     bool
	}{
		{"exact binary", []string{curl}, egress.Identity{Binary: curl}, true},
		{"other binary", []string{curl}, egress.Identity{Binary: python3}, false},
		{"unidentified", []string{curl}, egress.Identity{}, false},
		{"ancestor", []string{curl}, egress.Identity{Binary: python3, Ancestors: []string{"/usr/bin/bash", curl}}, true},
		{"cmdline script", []string{"/usr/local/bin/claude"}, egress.Identity{Binary: "/usr/bin/node", CmdlinePaths: []string{"/usr/local/bin/claude"}}, true},
		{"cmdline other script", []string{"/usr/local/bin/claude"}, egress.Identity{Binary: "/usr/bin/node", CmdlinePaths: []string{"/tmp/evil.js"}}, false},
		{"one-segment glob", []string{"/usr/bin/*"}, egress.Identity{Binary: curl}, true},
		{"one-segment glob too deep", []string{"/usr/bin/*"}, egress.Identity{Binary: "/usr/bin/x/curl"}, false},
		{"one-segment glob other dir", []string{"/usr/bin/*"}, egress.Identity{Binary: "/usr/sbin/curl"}, false},
		{"any-depth glob", []string{"/opt/tools/**"}, egress.Identity{Binary: "/opt/tools/a/b/c"}, true},
		{"any-depth glob one level", []string{"/opt/tools/**"}, egress.Identity{Binary: "/opt/tools/x"}, true},
		{"any-depth glob outside", []string{"/opt/tools/**"}, egress.Identity{Binary: "/opt/toolsx/a"}, false},
		{"glob in name", []string{"/usr/bin/python3*"}, egress.Identity{Binary: "/usr/bin/python3.12"}, true},
		{"no binaries: any binary", nil, egress.Identity{Binary: python3}, true},
		{"no binaries: unidentified", nil, egress.Identity{}, true},
		// A process running injected code is not the binary it names.
		{"untrusted binary", []string{curl}, egress.Identity{Binary: curl, Untrusted: "LD_PRELOAD"}, false},
		{"untrusted ancestor", []string{curl}, egress.Identity{Binary: python3, Ancestors: []string{curl}, Untrusted: "x"}, false},
		{"no binaries: untrusted", nil, egress.Identity{Binary: curl, Untrusted: "LD_PRELOAD"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustNew(t, hostPolicy(tt.binaries, gh), nil)
			d := e.Decide(ctx, egress.Request{Host: "api.github.com", Port: 443, Identity: tt.id})
			if d.Allow != tt.want {
				t.Fatalf("allow = %v, want %v (%+v)", d.Allow, tt.want, d)
			}
			if d.Policy != "p" {
				t.Errorf("policy = %q, want p", d.Policy)
			}
			if !d.Allow && (d.Reason != egress.ReasonBinary || !strings.Contains(d.Detail, "api.github.com:443")) {
				t.Errorf("deny = %+v, want reason %q with a detail naming the target", d, egress.ReasonBinary)
			}
		})
	}
}

func TestBinarySymlinksResolved(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.MkdirAll(filepath.Join(real, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(real, "bin", "tool-1.2")
	if err := os.WriteFile(exe, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("tool-1.2", filepath.Join(real, "bin", "tool")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	gh := policy.Endpoint{Host: "api.github.com", Port: 443}
	tests := []struct {
		name, binary string
		id           egress.Identity
		want         bool
	}{
		{"symlinked file matches its target", filepath.Join(real, "bin", "tool"), egress.Identity{Binary: exe}, true},
		{"symlinked file still matches a script path", filepath.Join(real, "bin", "tool"), egress.Identity{Binary: "/usr/bin/node", CmdlinePaths: []string{filepath.Join(real, "bin", "tool")}}, true},
		{"glob under a symlinked directory", filepath.Join(dir, "link", "bin", "*"), egress.Identity{Binary: exe}, true},
		{"glob keeps its literal form", filepath.Join(dir, "link", "bin", "*"), egress.Identity{Binary: filepath.Join(dir, "link", "bin", "x")}, true},
		{"missing path kept as written", "/nonexistent/bin/tool", egress.Identity{Binary: "/nonexistent/bin/tool"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustNew(t, hostPolicy([]string{tt.binary}, gh), nil)
			d := e.Decide(context.Background(), egress.Request{Host: "api.github.com", Port: 443, Identity: tt.id})
			if d.Allow != tt.want {
				t.Errorf("allow = %v, want %v (%+v)", d.Allow, tt.want, d)
			}
		})
	}
	if _, err := newEngine(hostPolicy([]string{"usr/bin/curl"}, gh), nil); err == nil {
		t.Error("New accepted a relative binary path")
	}
	if _, err := newEngine(hostPolicy([]string{"/usr/bin/[ab]*"}, gh), nil); err == nil {
		t.Error("New accepted a glob with character classes")
	}
}

func TestLiteralIP(t *testing.T) {
	p := &policy.Policy{Version: 1, NetworkPolicies: map[string]policy.NetworkPolicy{
		"db":  {Endpoints: []policy.Endpoint{{AllowedIPs: []string{"10.1.0.0/16", "2001:db8::/32"}, Port: 5432}}},
		"ip":  {Endpoints: []policy.Endpoint{{Host: "192.0.2.10", Port: 22}}},
		"web": {Endpoints: []policy.Endpoint{{Host: "api.github.com", Port: 443}}},
		"svc": {
			Endpoints: []policy.Endpoint{{Host: "db.internal", Port: 5432, AllowedIPs: []string{"10.9.0.5"}}},
			Binaries:  []policy.Binary{{Path: curl}},
		},
	}}
	e := mustNew(t, p, nil)
	tests := []struct {
		name    string
		req     egress.Request
		want    bool
		reason  string
		policy  string
		allowed []string
	}{
		{"in CIDR", byIP("10.1.2.3", 5432, python3), true, "", "db", []string{"10.1.0.0/16", "2001:db8::/32"}},
		{"in IPv6 CIDR", byIP("2001:db8::7", 5432, python3), true, "", "db", []string{"10.1.0.0/16", "2001:db8::/32"}},
		{"IPv4-mapped", byIP("::ffff:10.1.2.3", 5432, python3), true, "", "db", nil},
		{"in CIDR wrong port", byIP("10.1.2.3", 5433, python3), false, egress.ReasonNoPolicy, "", nil},
		{"outside CIDR", byIP("10.2.0.1", 5432, python3), false, egress.ReasonNoPolicy, "", nil},
		{"host written as IP", byIP("192.0.2.10", 22, python3), true, "", "ip", []string{}},
		{"IP given as Host", byName("192.0.2.10", 22, python3), true, "", "ip", []string{}},
		{"IP given as Host is not a name", byName("10.1.2.3", 5432, python3), true, "", "db", nil},
		{"bracketed IPv6 given as Host", byName("[2001:db8::7]", 5432, python3), true, "", "db", nil},
		{"IPv4-mapped given as Host", byName("::ffff:192.0.2.10", 22, python3), true, "", "ip", nil},
		{"digits and dots that are no address", byName("10.1.2", 5432, python3), false, egress.ReasonNoPolicy, "", nil},
		{"public IP without allowed_ips", byIP("140.82.112.5", 443, curl), false, egress.ReasonNoPolicy, "", nil},
		{"IPv6 literal", byIP("2606:4700::1", 443, curl), false, egress.ReasonNoPolicy, "", nil},
		{"name with allowed_ips", byName("db.internal", 5432, curl), true, "", "svc", []string{"10.9.0.5/32"}},
		{"IP from a bound endpoint, wrong binary", byIP("10.9.0.5", 5432, python3), false, egress.ReasonBinary, "svc", nil},
		{"no address", egress.Request{Port: 443}, false, egress.ReasonNoPolicy, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := e.Decide(context.Background(), tt.req)
			if d.Allow != tt.want || d.Reason != tt.reason || d.Policy != tt.policy {
				t.Fatalf("got %+v, want allow %v reason %q policy %q", d, tt.want, tt.reason, tt.policy)
			}
			if tt.allowed != nil {
				var got []string
				for _, p := range d.AllowedIPs {
					got = append(got, p.String())
				}
				if !slices.Equal(got, tt.allowed) {
					t.Errorf("allowed_ips = %v, want %v", got, tt.allowed)
				}
			}
		})
	}
	if e.NameAllowed("192.0.2.10") || e.NameAllowed("db") {
		t.Error("NameAllowed matched a literal address or a non-policy name")
	}
}

// A decision's allowed_ips are the policy's own, capped, so that an append
// by a caller copies instead of writing into the policy.
func TestAllowedIPsCannotBeAppendedInto(t *testing.T) {
	p := &policy.Policy{Version: 1, NetworkPolicies: map[string]policy.NetworkPolicy{
		"db": {Endpoints: []policy.Endpoint{{AllowedIPs: []string{"10.1.0.0/16", "10.2.0.0/16", "10.3.0.0/16"}, Port: 5432}}},
	}}
	e := mustNew(t, p, nil)
	d := e.Decide(context.Background(), byIP("10.1.2.3", 5432, python3))
	if !d.Allow || len(d.AllowedIPs) != 3 || cap(d.AllowedIPs) != 3 {
		t.Fatalf("allowed %v, allowed_ips len %d cap %d; want allowed, 3 and 3", d.Allow, len(d.AllowedIPs), cap(d.AllowedIPs))
	}
}

// A decision that allocates touches fresh memory, whose first use costs a
// page fault: tens of microseconds on a VM, the tail of the latency.
func TestAllowedDecisionAllocatesNothing(t *testing.T) {
	e := mustNew(t, bench1000(), nil)
	id := egress.Identity{Binary: "/nonexistent/bin/bash", Ancestors: []string{"/nonexistent/bin/init", "/nonexistent/bin/curl"}, CmdlinePaths: []string{"/work/tool.py"}}
	for _, r := range []egress.Request{
		{Host: "svc1.team42.example.com", Port: 443, Identity: id},
		{Host: "a.b.c.d3.team99.example.com", Port: 443, Identity: id},
		{IP: netip.MustParseAddr("10.50.9.7"), Port: 5432, Identity: id},
	} {
		var d egress.Decision
		if n := testing.AllocsPerRun(100, func() { d = e.Decide(context.Background(), r) }); n != 0 || !d.Allow {
			t.Errorf("%s: %v allocations, allowed %v; want 0 and allowed", r.Target(), n, d.Allow)
		}
	}
}

func TestAllowShortForm(t *testing.T) {
	p := &policy.Policy{Version: 1, Network: policy.Network{Allow: []string{"api.github.com:443", "*.pypi.org", "10.1.0.0/16:5432"}}}
	e := mustNew(t, p, nil)
	tests := []struct {
		req  egress.Request
		want bool
	}{
		{byName("api.github.com", 443, python3), true},
		{byName("api.github.com", 80, python3), false},
		{byName("files.pypi.org", 443, "/opt/whatever"), true},
		{byName("pypi.org", 443, python3), false},
		{byIP("10.1.200.1", 5432, python3), true},
		{byIP("10.1.200.1", 443, python3), false},
	}
	for _, tt := range tests {
		d := e.Decide(context.Background(), tt.req)
		if d.Allow != tt.want {
			t.Errorf("%s = %+v, want allow %v", tt.req.Target(), d, tt.want)
		}
		if d.Allow && d.Policy != policy.AllowPolicyName {
			t.Errorf("%s policy = %q, want %q", tt.req.Target(), d.Policy, policy.AllowPolicyName)
		}
	}
	if !e.NameAllowed("files.pypi.org") || e.NameAllowed("evil.com") {
		t.Error("NameAllowed disagrees with network.allow")
	}
}

func TestPolicyName(t *testing.T) {
	p := &policy.Policy{Version: 1, NetworkPolicies: map[string]policy.NetworkPolicy{
		"b-key": {Name: "github", Endpoints: []policy.Endpoint{{Host: "api.github.com", Port: 443}}},
		"a-key": {Name: "zz-github", Endpoints: []policy.Endpoint{{Host: "api.github.com", Port: 443}}},
	}}
	d := mustNew(t, p, nil).Decide(context.Background(), byName("api.github.com", 443, curl))
	if !d.Allow || d.Policy != "github" {
		t.Errorf("got %+v, want the policy named github (first by name)", d)
	}
}

func TestUserRules(t *testing.T) {
	ctx := context.Background()
	rules := []byte(`package corral.egress

default decision := {"allow": false, "reason": "port_80_only"}

decision := {"allow": true, "policy": "plain-http"} if input.network.port == 80
`)
	e := mustNew(t, hostPolicy(nil, policy.Endpoint{Host: "api.github.com", Port: 443}), rules)
	if d := e.Decide(ctx, byName("anything.example", 80, python3)); !d.Allow || d.Policy != "plain-http" {
		t.Errorf("port 80 = %+v, want allowed", d)
	}
	if d := e.Decide(ctx, byIP("203.0.113.1", 80, python3)); !d.Allow {
		t.Errorf("IP port 80 = %+v, want allowed", d)
	}
	if d := e.Decide(ctx, byName("api.github.com", 443, curl)); d.Allow || d.Reason != "port_80_only" {
		t.Errorf("port 443 = %+v, want denied by the custom rules", d)
	}
	// Rules without name_allowed leave DNS to the policy's host patterns.
	if !e.NameAllowed("api.github.com") || e.NameAllowed("anything.example") {
		t.Error("NameAllowed fallback disagrees with the policy's endpoints")
	}
	// Rules that define name_allowed decide DNS themselves.
	e = mustNew(t, hostPolicy(nil), append(rules, []byte("\nname_allowed if endswith(input.network.host, \".example\")\n")...))
	if !e.NameAllowed("anything.example") || e.NameAllowed("api.github.com") {
		t.Error("NameAllowed ignored the rules' name_allowed")
	}
	// Rules that ignore the candidates can scan the data document instead.
	scan := []byte(`package corral.egress

default decision := {"allow": false}

decision := {"allow": true, "policy": p.name, "allowed_ips": ep.allowed_ips} if {
	some p in data.network_policies
	some ep in p.endpoints
	regex.match(ep.host_regex, input.network.host)
	input.network.port in ep.ports
	"/usr/local/bin/claude" in input.exec.paths
}
`)
	e2 := mustNew(t, hostPolicy(nil, policy.Endpoint{Host: "*.github.com", Port: 443, AllowedIPs: []string{"10.0.0.0/8"}}), scan)
	claude := egress.Identity{Binary: "/usr/bin/node", CmdlinePaths: []string{"/usr/local/bin/claude"}}
	if d := e2.Decide(ctx, egress.Request{Host: "api.github.com", Port: 443, Identity: claude}); !d.Allow || d.Policy != "p" || len(d.AllowedIPs) != 1 || d.AllowedIPs[0] != netip.MustParsePrefix("10.0.0.0/8") {
		t.Errorf("data scan = %+v, want allowed by p with 10.0.0.0/8", d)
	}
	if d := e2.Decide(ctx, egress.Request{Host: "github.com", Port: 443, Identity: claude}); d.Allow || d.Reason != egress.ReasonNoPolicy {
		t.Errorf("data scan = %+v, want denied with the default reason", d)
	}
}

func TestBadRulesRejected(t *testing.T) {
	p := hostPolicy(nil, policy.Endpoint{Host: "api.github.com", Port: 443})
	for name, rules := range map[string]string{
		"syntax":               "package corral.egress\n\ndecision := {",
		"wrong package":        "package other\n\ndecision := {\"allow\": true}\n",
		"unsafe http.send":     "package corral.egress\n\ndecision := {\"allow\": true} if http.send({\"method\": \"get\", \"url\": \"http://x\"})\n",
		"unsafe lookup":        "package corral.egress\n\ndecision := {\"allow\": true} if net.lookup_ip_addr(\"x\")\n",
		"unsafe nested":        "package corral.egress\n\ndecision := {\"allow\": count(net.lookup_ip_addr(\"x\")) > 0}\n",
		"unsafe in a function": "package corral.egress\n\nf(u) := http.send({\"method\": \"get\", \"url\": u})\n\ndecision := {\"allow\": true} if f(\"http://x\")\n",
	} {
		_, err := newEngine(p, []byte(rules))
		switch {
		case err == nil:
			t.Errorf("%s: New accepted the rules", name)
		case strings.HasPrefix(name, "unsafe") && !strings.Contains(err.Error(), "corral leaves out"):
			t.Errorf("%s: %v does not say why the built-in is missing", name, err)
		}
	}
}

func TestFailClosed(t *testing.T) {
	p := hostPolicy(nil, policy.Endpoint{Host: "api.github.com", Port: 443})
	for name, body := range map[string]string{
		"string":            `decision := "allow"`,
		"allow not bool":    `decision := {"allow": "true"}`,
		"no allow":          `decision := {"policy": "x"}`,
		"policy not string": `decision := {"allow": true, "policy": 1}`,
		"ips not array":     `decision := {"allow": true, "allowed_ips": "10.0.0.0/8"}`,
		"ip garbage":        `decision := {"allow": true, "allowed_ips": ["nope"]}`,
		"ip not string":     `decision := {"allow": true, "allowed_ips": [1]}`,
		"undefined":         `decision := {"allow": true} if input.network.port == 1`,
		"no decision rule":  `other := true`,
		"conflict":          "decision := {\"allow\": true} if input.network.port > 0\ndecision := {\"allow\": false} if input.network.port > 1",
		"builtin error":     `decision := {"allow": net.cidr_contains("nope", "1.2.3.4")}`,
		"division by zero":  `decision := {"allow": (input.network.port / 0) > 1}`,
	} {
		t.Run(name, func(t *testing.T) {
			e, err := newEngine(p, []byte("package corral.egress\n\n"+body+"\n"))
			if err != nil {
				return // refusing the rules outright is closed too
			}
			d := e.Decide(context.Background(), byName("api.github.com", 443, curl))
			if d.Allow || d.Reason != egress.ReasonEngine {
				t.Errorf("got %+v, want deny with %q", d, egress.ReasonEngine)
			}
		})
	}
	if (egress.Decision{}).Allow {
		t.Error("the zero Decision allows")
	}
	e := mustNew(t, p, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// A cancelled context may still let evaluation finish, but it must
	// never yield anything but a full decision or a deny.
	if d := e.Decide(ctx, byName("api.github.com", 443, curl)); d.Allow != (d.Policy == "p") || (!d.Allow && d.Reason != egress.ReasonEngine) {
		t.Errorf("cancelled context gave %+v", d)
	}
}

// bench1000 is 100 policies of 10 endpoints each, bound to two binaries, with
// exact, one-label, any-depth and in-label patterns and an IP range mixed in.
func bench1000() *policy.Policy {
	nps := map[string]policy.NetworkPolicy{}
	for i := range 100 {
		var eps []policy.Endpoint
		for j := range 10 {
			var h string
			switch j % 5 {
			case 0, 1:
				h = fmt.Sprintf("svc%d.team%d.example.com", j, i)
			case 2:
				h = fmt.Sprintf("*.w%d.team%d.example.com", j, i)
			case 3:
				h = fmt.Sprintf("**.d%d.team%d.example.com", j, i)
			case 4:
				h = fmt.Sprintf("api-*.team%d.example.com", i)
			}
			ep := policy.Endpoint{Host: h, Port: 443, Ports: []int{8443}}
			if j == 9 {
				ep = policy.Endpoint{AllowedIPs: []string{fmt.Sprintf("10.%d.%d.0/24", i, j)}, Port: 5432}
			}
			eps = append(eps, ep)
		}
		nps[fmt.Sprintf("team%d", i)] = policy.NetworkPolicy{
			Endpoints: eps,
			Binaries:  []policy.Binary{{Path: "/nonexistent/bin/curl"}, {Path: "/nonexistent/tools/**"}},
		}
	}
	return &policy.Policy{Version: 1, NetworkPolicies: nps}
}

// BenchmarkDecide1000 measures a decision with 1000 endpoints, evaluated
// in Go (the baked-in rules) and by OPA (the same rules as a user's).
func BenchmarkDecide1000(b *testing.B) {
	for _, tc := range []struct {
		name  string
		rules []byte
	}{{"go", nil}, {"rego", append(BakedRules(), "\n# as a user's\n"...)}} {
		b.Run(tc.name, func(b *testing.B) { benchDecide1000(b, tc.rules) })
	}
}

func benchDecide1000(b *testing.B, rules []byte) {
	e := mustNew(b, bench1000(), rules)
	id := egress.Identity{Binary: "/nonexistent/bin/bash", Ancestors: []string{"/nonexistent/bin/init", "/nonexistent/bin/bash"}, CmdlinePaths: []string{"/work/tool.py"}}
	allowed := id
	allowed.Ancestors = append(slices.Clone(id.Ancestors), "/nonexistent/bin/curl")
	reqs := []struct {
		r    egress.Request
		want bool
	}{
		{egress.Request{Host: "svc1.team42.example.com", Port: 443, Identity: allowed}, true},
		{egress.Request{Host: "x.w2.team7.example.com", Port: 8443, Identity: allowed}, true},
		{egress.Request{Host: "a.b.c.d3.team99.example.com", Port: 443, Identity: allowed}, true},
		{egress.Request{Host: "api-eu.team5.example.com", Port: 443, Identity: allowed}, true},
		{egress.Request{IP: netip.MustParseAddr("10.50.9.7"), Port: 5432, Identity: allowed}, true},
		{egress.Request{Host: "svc1.team42.example.com", Port: 443, Identity: id}, false},
		{egress.Request{Host: "unknown.example.org", Port: 443, Identity: allowed}, false},
	}
	ctx := context.Background()
	for _, q := range reqs {
		if d := e.Decide(ctx, q.r); d.Allow != q.want {
			b.Fatalf("%s: %+v, want allow %v", q.r.Target(), d, q.want)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		q := reqs[i%len(reqs)]
		start := time.Now()
		d := e.Decide(ctx, q.r)
		lat = append(lat, time.Since(start))
		if d.Reason == egress.ReasonEngine {
			b.Fatal(d.Detail)
		}
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

// A user's rules that would run for long stop when the context of the
// connection asking ends, and the decision is a refusal.
func TestSlowRulesStopWithTheirContext(t *testing.T) {
	p := hostPolicy(nil, policy.Endpoint{Host: "api.github.com", Port: 443})
	// 25 million pairs, none a solution: minutes of evaluation, little memory.
	slow := "package corral.egress\n\ndecision := {\"allow\": true} if {\n\tsome x in numbers.range(1, 5000)\n\tsome y in numbers.range(1, 5000)\n\tx * y == -1\n}\n"
	e := mustNew(t, p, []byte(slow))
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan egress.Decision, 1)
	go func() { got <- e.Decide(ctx, byName("api.github.com", 443, curl)) }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case d := <-got:
		if d.Allow || d.Reason != egress.ReasonEngine {
			t.Errorf("got %+v, want a refusal with %q", d, egress.ReasonEngine)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the evaluation went on after its context ended")
	}
}
